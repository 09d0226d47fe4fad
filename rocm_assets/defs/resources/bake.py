"""The build resource: holds the run's builder (waiting in line if it must), then bakes there."""

import contextlib
import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import dagster as dg

from rocm_assets.core.bake import BakeError, BakeGraph, load_graph
from rocm_assets.core.build.builds import Build
from rocm_assets.core.build.invocation import (
    BakeInvocation,
    BuildError,
    BuildResult,
    bake_invocation,
    metadata_summary,
    run_bake,
)
from rocm_assets.core.build.output import PROGRESS_S, BakeLog
from rocm_assets.core.build.versions import DEFINITION_METADATA, definition
from rocm_assets.core.common.settings import bake_file_path
from rocm_assets.core.nodes.fleet import Fleet, FleetError, Node, load_fleet
from rocm_assets.core.nodes.watch import EVERY_S, UNREACHABLE_S, LinkWatch
from rocm_assets.defs.registry_checks import latest_built_digest, preflight_run
from rocm_assets.defs.resources.registry import RegistryResource

# The placement authority (rocm_assets.instance.authority) is imported inside the two functions
# that hold a machine: its claims' SQL tables load alembic, 0.3 s of every code location load
# (`rocm-assets bench`'s code_location_load), which only a build run needs.


def md_block(lines: tuple[str, ...] | list[str]) -> dg.MetadataValue:
    """Log lines as a code block in the UI's metadata panel."""
    return dg.MetadataValue.md("```\n" + "\n".join(lines) + "\n```")


def run_logged_bake(
    inv: BakeInvocation,
    log: dg.DagsterLogManager,
    progress_s: float = PROGRESS_S,
    stop_when: Callable[[], str | None] | None = None,
) -> BuildResult:
    """`run_bake` with its output on stdout, which Dagster keeps as the step's compute log, and
    only its steps, a progress line every `progress_s` and a summary in the run's events."""
    output = BakeLog(sys.stdout, log.info, progress_s=progress_s)
    try:
        return run_bake(inv, on_output=output, on_retry=log.warning, stop_when=stop_when)
    finally:
        output.close()


class BakeResource(dg.ConfigurableResource):
    """Runs `docker buildx bake` for one target and arch on the run's node, inputs from the registry."""

    bake_file: str | None = None
    fleet_file: str | None = None
    docker: str = "docker"
    progress: str = "plain"
    # Seconds between one-line progress events while bake prints; its output itself goes to
    # the step's compute log, not the event log.
    output_progress_s: float = PROGRESS_S
    # How often an unplaced in-process run looks again for a free node.
    node_poll_s: float = 10.0
    # A node with an ssh address is probed this often while it builds; after this long without
    # an answer its bake is stopped and the build failed (a cut link, a dead node).
    link_check_s: float = EVERY_S
    unreachable_s: float = UNREACHABLE_S

    def graph(self) -> BakeGraph:
        try:
            return load_graph(bake_file_path(self.bake_file))
        except BakeError as exc:
            raise dg.Failure(description=f"nothing was built: {exc}") from None

    def fleet(self) -> Fleet:
        try:
            return load_fleet(self.fleet_file)
        except FleetError as exc:
            raise dg.Failure(description=f"nothing was built: {exc}") from None

    @contextmanager
    def holding(self, context: dg.AssetCheckExecutionContext, node: Node) -> Iterator[int]:
        """Hold `node`'s builder for a bake this run must make there (a GPU test image); MAX_JOBS."""
        from rocm_assets.instance import authority

        with authority.machine_for_test(context, node, self.fleet(), self.node_poll_s) as jobs:
            yield jobs

    # ---- the build ----
    def materialize(
        self, context: dg.AssetExecutionContext, target: str, registry: RegistryResource
    ) -> dg.MaterializeResult:
        from rocm_assets.instance import authority

        graph = self.graph()
        # Before placement and bake: a missing input fails here, not at step 1 of a build.
        preflight_run(context, registry, graph)
        # What this build is defined by, read before bake reads it: `rocm-assets stale` names
        # what changed since.
        built_from = definition(graph, target)
        fleet = self.fleet()
        partition = context.partition_key if target in graph.per_arch else None
        build = Build(target, partition)
        # The machine is free once its bake is over; the daemon frees it too if we die.
        with authority.machine_for_build(
            context, build, fleet, self.fleet_file, self.node_poll_s
        ) as machine:
            node = machine.node
            context.log.info(
                "building %s on %s (builder %s held), MAX_JOBS=%d from %s",
                build,
                node.name,
                node.builder,
                machine.jobs,
                machine.jobs_from,
            )
            inv, result = self.bake(context, graph, target, partition, node, machine.jobs)
        previous = latest_built_digest(context.instance, target, partition)
        summary = metadata_summary(inv, result, node.name)
        # Nothing new pushed: the bake was a cache hit and says nothing about build time.
        summary["cache_hit"] = previous == result.digest
        summary["tags"] = summary["tags"] or list(graph.tags(target, inv.arch))
        metadata = {
            **{k: v for k, v in summary.items() if k not in ("started_at", "finished_at", "tags")},
            "tags": dg.MetadataValue.json(summary["tags"]),
            "started_at": dg.MetadataValue.timestamp(summary["started_at"]),
            "finished_at": dg.MetadataValue.timestamp(summary["finished_at"]),
            DEFINITION_METADATA: dg.MetadataValue.json(built_from.to_json()),
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
        """One bake of `target` for `partition` on `node`, its output streamed to the compute log."""
        arch = graph.build_arch(target, partition or graph.arches[0])
        # The bake's guard removes it if this worker dies mid-bake.
        with tempfile.TemporaryDirectory(prefix="rocm-bake-", ignore_cleanup_errors=True) as tmp:
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
                scratch=Path(tmp),
            )
            context.log.info("baking %s for %s on %s: %s", target, arch, node.name, inv.command())
            # A node reached over SSH is probed while it builds: a cut link ends the bake.
            watch = (
                LinkWatch(node, every_s=self.link_check_s, unreachable_s=self.unreachable_s)
                if node.ssh
                else None
            )
            try:
                with watch or contextlib.nullcontext():
                    result = run_logged_bake(
                        inv,
                        context.log,
                        self.output_progress_s,
                        stop_when=watch.verdict if watch else None,
                    )
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
