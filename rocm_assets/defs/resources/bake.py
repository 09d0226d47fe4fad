"""The build resource: places a run on a node when nothing else did, then bakes one target there."""

import os
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import dagster as dg

from rocm_assets.core import placement
from rocm_assets.core.bake import BakeGraph, load_graph
from rocm_assets.core.build import (
    BakeInvocation,
    BuildError,
    BuildResult,
    bake_invocation,
    metadata_summary,
    run_bake,
)
from rocm_assets.core.constants import (
    PLACEMENT_WAITING,
    ROCM_MAX_JOBS_TAG,
    ROCM_NODE_TAG,
    ROCM_PLACEMENT_TAG,
)
from rocm_assets.core.fleet import Fleet, Node, load_fleet
from rocm_assets.core.probes import probe_node
from rocm_assets.core.settings import bake_file_path
from rocm_assets.defs.registry_checks import preflight_run
from rocm_assets.defs.resources.registry import RegistryResource

# Runs in these states hold their node: STARTING and STARTED are the dequeued, running ones.
_HOLDING = [dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED]


def md_block(lines: tuple[str, ...] | list[str]) -> dg.MetadataValue:
    """Log lines as a code block in the UI's metadata panel."""
    return dg.MetadataValue.md("```\n" + "\n".join(lines) + "\n```")


class BakeResource(dg.ConfigurableResource):
    """Runs `docker buildx bake` for one target and arch on the run's node, inputs from the registry."""

    bake_file: str | None = None
    fleet_file: str | None = None
    docker: str = "docker"
    progress: str = "plain"
    # How often an unplaced in-process run looks again for a free node.
    node_poll_s: float = 10.0

    def graph(self) -> BakeGraph:
        return load_graph(bake_file_path(self.bake_file))

    def fleet(self) -> Fleet:
        return load_fleet(self.fleet_file)

    # ---- placement of runs that no coordinator placed ----
    def claim_node(
        self, context: dg.AssetExecutionContext, fleet: Fleet, target: str
    ) -> tuple[Node, int]:
        """The run's node and MAX_JOBS: from the coordinator's tags, or chosen here and tagged.

        `dagster asset materialize` runs in-process and bypasses the coordinator, so it places
        itself: the free node that would finish this target soonest, waiting while every node
        holds a build. The choice is written as run tags before the build starts, which is what
        the coordinator and other in-process runs read.
        """
        tags = context.run.tags
        if tags.get(ROCM_NODE_TAG) and tags.get(ROCM_PLACEMENT_TAG) != PLACEMENT_WAITING:
            node = fleet.node(tags[ROCM_NODE_TAG])
            jobs = tags.get(ROCM_MAX_JOBS_TAG)
            return node, int(jobs) if jobs and jobs.isdigit() else placement.max_jobs(
                node, probe_node(node)
            )
        instance = context.instance
        while True:
            busy = self._busy_nodes(instance, context.run_id)
            free = [n for n in fleet.nodes if n.name not in busy]
            if free:
                with ThreadPoolExecutor(max_workers=len(free)) as pool:
                    probes = list(pool.map(probe_node, free))
                usable = [n for n, p in zip(free, probes, strict=True) if p.ok] or free
                cost = placement.CostModel(fleet, probes=[p for p in probes if p.ok])
                node = min(
                    usable, key=lambda n: (cost.build_s(target, n) + cost.push_s(target, n), n.name)
                )
                jobs = cost.max_jobs(node)
                instance.add_run_tags(
                    context.run_id, {ROCM_NODE_TAG: node.name, ROCM_MAX_JOBS_TAG: str(jobs)}
                )
                if self._won(instance, context.run_id, node.name):
                    context.log.info(
                        "placed on %s (MAX_JOBS=%d): no coordinator placed this run",
                        node.name,
                        jobs,
                    )
                    return node, jobs
                continue
            context.log.info(
                "all %d nodes hold a build (%s); waiting for one",
                len(fleet.nodes),
                ", ".join(sorted(busy)),
            )
            time.sleep(self.node_poll_s)

    @staticmethod
    def _busy_nodes(instance: dg.DagsterInstance, run_id: str) -> set[str]:
        records = instance.get_run_records(dg.RunsFilter(statuses=_HOLDING))
        return {
            r.dagster_run.tags[ROCM_NODE_TAG]
            for r in records
            if r.dagster_run.run_id != run_id and r.dagster_run.tags.get(ROCM_NODE_TAG)
        }

    @staticmethod
    def _won(instance: dg.DagsterInstance, run_id: str, node: str) -> bool:
        """Two in-process runs may tag the same node at once: the earlier-created run keeps it."""
        records = instance.get_run_records(
            dg.RunsFilter(statuses=_HOLDING, tags={ROCM_NODE_TAG: node})
        )
        mine = [r for r in records if r.dagster_run.run_id == run_id]
        if not mine:
            return True
        return all(
            (r.create_timestamp, r.dagster_run.run_id) > (mine[0].create_timestamp, run_id)
            for r in records
            if r.dagster_run.run_id != run_id
        )

    # ---- the build ----
    def materialize(
        self, context: dg.AssetExecutionContext, target: str, registry: RegistryResource
    ) -> dg.MaterializeResult:
        graph = self.graph()
        # Before placement and bake: a missing input fails here, not at step 1 of a build.
        preflight_run(context, registry, graph)
        fleet = self.fleet()
        partition = context.partition_key if target in graph.per_arch else None
        node, jobs = self.claim_node(context, fleet, target)
        inv, result = self.bake(context, graph, target, partition, node, jobs)
        summary = metadata_summary(inv, result, node.name)
        summary["tags"] = summary["tags"] or list(graph.tags(target, inv.arch))
        metadata = {
            **{k: v for k, v in summary.items() if k not in ("started_at", "finished_at", "tags")},
            "tags": dg.MetadataValue.json(summary["tags"]),
            "started_at": dg.MetadataValue.timestamp(summary["started_at"]),
            "finished_at": dg.MetadataValue.timestamp(summary["finished_at"]),
        }
        return dg.MaterializeResult(metadata=metadata, data_version=dg.DataVersion(result.digest))

    def bake(
        self,
        context: dg.AssetExecutionContext | dg.AssetCheckExecutionContext,
        graph: BakeGraph,
        target: str,
        partition: str | None,
        node: Node,
        jobs: int,
    ) -> tuple[BakeInvocation, BuildResult]:
        """One bake of `target` for `partition` on `node`, its output streamed to the run log."""
        arch = graph.build_arch(target, partition or graph.arches[0])
        with tempfile.TemporaryDirectory(prefix="rocm-bake-") as tmp:
            inv = bake_invocation(
                bake_file=graph.path,
                target=target,
                arch=arch,
                partition=partition,
                builder=node.builder,
                max_jobs=jobs,
                run_id=context.run.run_id,
                metadata_file=Path(tmp) / "metadata.json",
                base_env=os.environ,
                docker=self.docker,
                progress=self.progress,
            )
            context.log.info("baking %s for %s on %s: %s", target, arch, node.name, inv.command())
            try:
                result = run_bake(inv, on_output=lambda lines: context.log.info("\n".join(lines)))
            except BuildError as exc:
                metadata = {"command": dg.MetadataValue.text(inv.command()), "node": node.name}
                if exc.log_tail:
                    metadata["log_tail"] = md_block(exc.log_tail)
                if exc.history_ref:
                    metadata["history_ref"] = dg.MetadataValue.text(exc.history_ref)
                raise dg.Failure(
                    description=f"{target} ({arch}) on {node.name}: {exc}", metadata=metadata
                ) from None
        return inv, result
