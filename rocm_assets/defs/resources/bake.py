"""The build resource: holds the run's builder (waiting in line if it must), then bakes there."""

import contextlib
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType

import dagster as dg

from rocm_assets.core import placement
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
from rocm_assets.core.common.constants import (
    PLACEMENT_PLACED,
    PLACEMENT_WAITING,
    ROCM_BUILD_TAG,
    ROCM_BUILDER_TAG,
    ROCM_MAX_JOBS_TAG,
    ROCM_NODE_TAG,
    ROCM_PLACEMENT_TAG,
    ROCM_REFUSED_TAG,
    ROCM_WAITING_FOR_TAG,
)
from rocm_assets.core.common.settings import bake_file_path
from rocm_assets.core.nodes.fleet import Fleet, FleetError, Node, fleet_path, load_fleet
from rocm_assets.core.nodes.probes import probe_node
from rocm_assets.core.nodes.watch import EVERY_S, UNREACHABLE_S, LinkWatch
from rocm_assets.defs.registry_checks import latest_built_digest, preflight_run
from rocm_assets.defs.resources.registry import RegistryResource

# rocm_assets.instance (the builder claims and the coordinator) is imported inside the functions
# that run a build: the claims' SQL pool tables load alembic, 0.3 s of every code location load
# (`rocm-assets bench`'s code_location_load), which only a build run needs.

# Tags that once placed a run by themselves; they are only logged as ignored now.
_SELF_PLACED_TAGS = (ROCM_NODE_TAG, ROCM_MAX_JOBS_TAG, ROCM_BUILDER_TAG)
# The queued-run daemon heartbeats every 30 s; older than this, nobody places waiting runs.
_DAEMON_HEARTBEAT_MAX_AGE_S = 120.0
_LEASE_RENEW_S = 30.0


def _placement_daemon_alive(instance: dg.DagsterInstance) -> bool:
    """The instance's queued-run daemon runs rocm-assets' coordinator and beat recently."""
    from rocm_assets.instance.coordinator import PlacementRunCoordinator

    if not isinstance(instance.run_coordinator, PlacementRunCoordinator):
        return False
    beat = instance.get_daemon_heartbeats().get("QUEUED_RUN_COORDINATOR")
    return beat is not None and time.time() - beat.timestamp <= _DAEMON_HEARTBEAT_MAX_AGE_S


class _LeaseKeeper:
    """Renews the run's claim lease while a bake runs, so the daemon knows the worker lives."""

    def __init__(self, instance: dg.DagsterInstance, run_id: str) -> None:
        from rocm_assets.instance.coordinator import PlacementRunCoordinator
        from rocm_assets.instance.placer import PlacerSettings

        self._instance, self._run_id = instance, run_id
        coordinator = instance.run_coordinator
        settings = (
            coordinator.settings
            if isinstance(coordinator, PlacementRunCoordinator)
            else PlacerSettings()
        )
        lease_s = settings.lease_seconds
        self._every_s = min(_LEASE_RENEW_S, max(lease_s / 5, 0.5))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="rocm-lease", daemon=True)

    def _loop(self) -> None:
        from rocm_assets.instance import claims

        while not self._stop.wait(self._every_s):
            claims.renew_lease(self._instance, self._run_id, time.time())

    def __enter__(self) -> "_LeaseKeeper":
        from rocm_assets.instance import claims

        claims.renew_lease(self._instance, self._run_id, time.time())
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join()


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

    # ---- the machine: held through a builder claim, placed by the coordinator's rules ----
    def hold_builder(
        self, context: dg.AssetExecutionContext, graph: BakeGraph, fleet: Fleet, build: Build
    ) -> tuple[Node, int]:
        """The node whose builder this run holds, and MAX_JOBS from that node's probe or figures.

        A run the coordinator placed already holds its builder. Any other run (an in-process
        `dagster asset materialize`, or one whose claim the daemon has not made yet) tags itself
        waiting and waits in line: the daemon places it by the same rules as a queued run. With
        no placement daemon alive it places itself with the same core decision, through the
        same atomic claim. Placement tags are never read here: only the claim says where.
        """
        from rocm_assets.instance import claims

        instance, run_id = context.instance, context.run.run_id
        supplied = {k: v for k, v in context.run.tags.items() if k in _SELF_PLACED_TAGS and v}
        if not claims.supported(instance):
            # An in-memory instance (`dg.materialize` in a script): nothing else can share it.
            builder = None
            while builder is None:
                builder = self._place_self(context, fleet, build, claim=False)
                if builder is None:
                    time.sleep(self.node_poll_s)
        else:
            builder = claims.builder_of(instance, run_id)
        if builder is None:
            if supplied:
                context.log.warning(
                    "ignoring placement tags this run carries (%s): the coordinator places builds",
                    ", ".join(f"{k}={v}" for k, v in sorted(supplied.items())),
                )
            builder = self._wait_in_line(context, graph, fleet, build)
        node = next((n for n in fleet.nodes if n.builder == builder), None)
        if node is None:
            claims.release_run(instance, run_id)
            raise dg.Failure(
                description=f"builder {builder} was claimed for this run but is no longer in "
                f"{fleet_path(self.fleet_file)}: nothing was built"
            )
        probe = probe_node(node)
        jobs = placement.max_jobs(node, probe)
        # What this build uses, for the UI and watch; never read back to decide anything.
        instance.add_run_tags(run_id, {ROCM_MAX_JOBS_TAG: str(jobs)})
        source = (
            "its probe"
            if probe.ok and probe.probed
            else f"the fleet's figures ({probe.reason or 'no ssh address'})"
        )
        context.log.info(
            "building %s on %s (builder %s held), MAX_JOBS=%d from %s",
            build,
            node.name,
            builder,
            jobs,
            source,
        )
        return node, jobs

    def _wait_in_line(
        self, context: dg.AssetExecutionContext, graph: BakeGraph, fleet: Fleet, build: Build
    ) -> str:
        from rocm_assets.instance import claims

        instance, run_id = context.instance, context.run.run_id
        instance.add_run_tags(
            run_id,
            {
                ROCM_BUILD_TAG: str(build),
                ROCM_PLACEMENT_TAG: PLACEMENT_WAITING,
                ROCM_WAITING_FOR_TAG: "a builder: placed by the coordinator",
                ROCM_NODE_TAG: "",
                ROCM_BUILDER_TAG: "",
            },
        )
        claims.ensure_builder_pools(instance, {n.builder for n in fleet.nodes})
        last_said = ""
        while True:
            claims.renew_lease(instance, run_id, time.time())
            builder = claims.builder_of(instance, run_id)
            if builder is not None:
                return builder
            run = instance.get_run_by_id(run_id)
            refused = run.tags.get(ROCM_REFUSED_TAG) if run else None
            if refused:
                raise dg.Failure(description=refused)
            if not _placement_daemon_alive(instance):
                builder = self._place_self(context, fleet, build)
                if builder is not None:
                    return builder
            waiting_for = (run.tags.get(ROCM_WAITING_FOR_TAG) if run else "") or "placement"
            held = claims.claims(instance)
            said = f"waiting in line for a builder: {waiting_for} ({len(held)} of {len(fleet.nodes)} held)"
            if said != last_said:
                context.log.info(said)
                last_said = said
            time.sleep(self.node_poll_s)

    def _place_self(
        self, context: dg.AssetExecutionContext, fleet: Fleet, build: Build, claim: bool = True
    ) -> str | None:
        """No placement daemon: the coordinator's decision for this one build, then its claim."""
        from rocm_assets.instance import claims

        instance, run_id = context.instance, context.run.run_id
        held = claims.claims(instance) if claim else {}
        free = [n for n in fleet.nodes if n.builder not in held]
        if not free:
            return None
        with ThreadPoolExecutor(max_workers=len(free)) as pool:
            probes = list(pool.map(probe_node, free))
        usable = [n for n, p in zip(free, probes, strict=True) if p.ok]
        if not usable:
            context.log.warning(
                "no free node answered its probe (%s); waiting",
                "; ".join(f"{p.node}: {p.reason}" for p in probes),
            )
            return None
        now = time.time()
        by_builder = {n.builder: n.name for n in fleet.nodes}
        running = {
            Build(f"run:{holder}"): (by_builder.get(b, f"builder:{b}"), now + 1.0)
            for b, holder in held.items()
        }
        decision = placement.choose_placements(
            [build],
            running,
            usable,
            placement.CostModel(fleet, probes=[p for p in probes if p.ok]),
            now,
            {build: frozenset()},
        )
        if not decision.starts:
            return None
        node = fleet.node(decision.starts[0].node)
        if claim:
            if not claims.claim_builder(instance, node.builder, run_id):
                return None  # another run took it first: look again
            claims.renew_lease(instance, run_id, now)
        instance.add_run_tags(
            run_id,
            {
                ROCM_NODE_TAG: node.name,
                ROCM_BUILDER_TAG: node.builder,
                ROCM_PLACEMENT_TAG: PLACEMENT_PLACED,
                ROCM_WAITING_FOR_TAG: "",
            },
        )
        context.log.info(
            "no placement daemon is running: placed on %s by the coordinator's rules, "
            "builder %s claimed",
            node.name,
            node.builder,
        )
        return node.builder

    @contextmanager
    def holding(self, context: dg.AssetCheckExecutionContext, node: Node) -> Iterator[int]:
        """Hold `node`'s builder for a bake this run must make there (a GPU test image); MAX_JOBS.

        The same claim a placed build holds, so a test image never shares a machine with a
        build: the run waits until the builder is free.
        """
        from rocm_assets.instance import claims

        instance, run_id = context.instance, context.run.run_id
        if claims.supported(instance):
            claims.ensure_builder_pools(instance, [node.builder])
            while not claims.claim_builder(instance, node.builder, run_id):
                holder = claims.holder(instance, node.builder)
                context.log.info("waiting for builder %s, held by run %s", node.builder, holder)
                time.sleep(self.node_poll_s)
        try:
            with _LeaseKeeper(instance, run_id):
                yield placement.max_jobs(node, probe_node(node))
        finally:
            if claims.supported(instance):
                claims.release_run(instance, run_id)

    # ---- the build ----
    def materialize(
        self, context: dg.AssetExecutionContext, target: str, registry: RegistryResource
    ) -> dg.MaterializeResult:
        from rocm_assets.instance import claims

        graph = self.graph()
        # Before placement and bake: a missing input fails here, not at step 1 of a build.
        preflight_run(context, registry, graph)
        # What this build is defined by, read before bake reads it: `rocm-assets stale` names
        # what changed since.
        built_from = definition(graph, target)
        fleet = self.fleet()
        partition = context.partition_key if target in graph.per_arch else None
        build = Build(target, partition)
        try:
            node, jobs = self.hold_builder(context, graph, fleet, build)
            with _LeaseKeeper(context.instance, context.run.run_id):
                inv, result = self.bake(context, graph, target, partition, node, jobs)
        finally:
            # The machine is free once its bake is over; the daemon frees it too if we die.
            if claims.supported(context.instance):
                claims.release_run(context.instance, context.run.run_id)
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
