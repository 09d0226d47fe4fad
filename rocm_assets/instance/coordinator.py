"""PlacementRunCoordinator: one build per node, earliest finish, dependency-gated, placed at dequeue.

An instance plugin (dagster.yaml `run_coordinator`), loaded by the webserver, the daemon and the
CLI. It reads the bake graph and the fleet from their files and never imports the code location.

- `submit_run` runs in whatever process submits. It stays cheap: it splits a request covering
  several builds into one run per build, tags each build run `rocm/placement=waiting`, and queues it.
- `get_run_queue_config` is called by the queued-run daemon on every iteration, before it reads
  the queue. That is the hook where waiting runs are placed, with the state of that moment:
  a run whose dependencies are still queued or running keeps waiting without blocking others,
  and eligible runs go to free nodes as the placement strategy says. The limits it returns hold
  waiting runs back (limit 0) and allow one run per node (`rocm/node`, per unique value).
- SSH probes run in a background thread of the daemon; placement reads their cached results
  of bounded age and never waits on the network.
"""

import logging
import os
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from statistics import median
from typing import Any, Self

import dagster as dg

from rocm_assets.core import placement
from rocm_assets.core.bake import BakeError, BakeGraph, load_graph
from rocm_assets.core.builds import Build, build_deps, builds_for, op_name, run_partitions
from rocm_assets.core.constants import (
    FANOUT_PARENT,
    PARTITION_RANGE_END_TAG,
    PARTITION_RANGE_START_TAG,
    PARTITION_TAG,
    PLACEMENT_PLACED,
    PLACEMENT_WAITING,
    REGISTRY_URL_ENV,
    ROCM_BUILD_TAG,
    ROCM_EST_FINISH_TAG,
    ROCM_EST_START_TAG,
    ROCM_FANOUT_OF_TAG,
    ROCM_FANOUT_TAG,
    ROCM_MAX_JOBS_TAG,
    ROCM_NODE_TAG,
    ROCM_PLACEMENT_TAG,
    ROCM_WAITING_FOR_TAG,
)
from rocm_assets.core.fleet import Fleet, fleet_path, load_fleet
from rocm_assets.core.preflight import PreflightError, preflight
from rocm_assets.core.probes import ProbeCache
from rocm_assets.core.registry import RegistryClient, RegistryError
from rocm_assets.core.settings import bake_file_path
from rocm_assets.core.timefmt import from_iso, to_iso
from rocm_assets.instance.dagster_internals import (
    ConfigurableClassData,
    RunQueueConfig,
    UserConfigSchema,
    subset_run,
)
from rocm_assets.instance.runs import IN_FLIGHT_STATUSES

logger = logging.getLogger("rocm_assets.instance.coordinator")

_MEASURED_TTL_S = 300.0
# How far back a finished build's node still counts for locality (its layers are cached there).
_BUILT_ON_WINDOW_S = 86400.0
# Estimates age as builds run: an unchanged queue is re-planned at least this often.
_REPLAN_AFTER_S = 60.0
# Submission runs in the webserver: a slow registry must not hold the UI for long.
_SUBMIT_REGISTRY_OPTIONS = {"connect_timeout": 2.0, "read_timeout": 5.0, "retries": 0}
# Tags a child run must not inherit from the request it was split from.
_NOT_INHERITED = (
    PARTITION_TAG,
    PARTITION_RANGE_START_TAG,
    PARTITION_RANGE_END_TAG,
    ROCM_FANOUT_TAG,
    ROCM_BUILD_TAG,
    ROCM_NODE_TAG,
    ROCM_PLACEMENT_TAG,
    ROCM_MAX_JOBS_TAG,
    ROCM_EST_START_TAG,
    ROCM_EST_FINISH_TAG,
    ROCM_WAITING_FOR_TAG,
)


class PlacementRunCoordinator(dg.QueuedRunCoordinator):
    """Queues build runs and places each on one node at dequeue time: earliest finish, one per node."""

    def __init__(
        self,
        bake_file: str | None = None,
        fleet_file: str | None = None,
        strategy: str = "default",
        probe_interval_seconds: int = 60,
        probe_max_age_seconds: int = 300,
        probe_nodes: bool = True,
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        if strategy not in placement.STRATEGIES:
            # dagster.yaml's Enum already refuses it; a direct construction gets the same word.
            raise placement.PlacementError(f"unknown placement strategy {strategy!r}")
        self._bake_file = bake_file
        self._fleet_file = fleet_file
        self._strategy = strategy
        self._probe_nodes = probe_nodes
        self._probes = ProbeCache(probe_interval_seconds, probe_max_age_seconds)
        self._files: dict[str, tuple[float, Any]] = {}
        self._measured: tuple[float, dict[tuple[str, str, int], float]] = (0.0, {})
        self._last_error: str | None = None
        self._last_state: tuple[frozenset, ...] | None = None
        self._last_state_at = 0.0

    @classmethod
    def config_type(cls) -> UserConfigSchema:
        return {
            **super().config_type(),
            "bake_file": dg.Field(
                dg.StringSource,
                is_required=False,
                description="Bake file. Default: $ROCM_BAKE_FILE, else ./rocm-bake.hcl.",
            ),
            "fleet_file": dg.Field(
                dg.StringSource,
                is_required=False,
                description="Fleet manifest. Default: $ROCM_FLEET_FILE, else ./fleet.yaml.",
            ),
            "strategy": dg.Field(
                dg.Enum("PlacementStrategy", [dg.EnumValue(name) for name in placement.STRATEGIES]),
                default_value="default",
                description="Placement strategy: default (the best plan of the heuristics), greedy "
                "(the seed's rule), critical-path or peft.",
            ),
            "probe_interval_seconds": dg.Field(
                dg.IntSource,
                default_value=60,
                description="How often the daemon probes the nodes over SSH.",
            ),
            "probe_max_age_seconds": dg.Field(
                dg.IntSource,
                default_value=300,
                description="Older probe results are ignored and the fleet's figures stand in.",
            ),
            "probe_nodes": dg.Field(
                bool, default_value=True, description="False: never probe; use the fleet's figures."
            ),
        }

    @classmethod
    def from_config_value(
        cls, inst_data: ConfigurableClassData, config_value: Mapping[str, Any]
    ) -> Self:
        return cls(inst_data=inst_data, **config_value)

    def dispose(self) -> None:
        self._probes.stop()
        super().dispose()

    # ---- files, reloaded when they change ----
    def _load(self, path: Path, loader: Any) -> Any:
        mtime = path.stat().st_mtime if path.exists() else -1.0
        cached = self._files.get(str(path))
        if cached is None or cached[0] != mtime:
            cached = (mtime, loader(path))
            self._files[str(path)] = cached
        return cached[1]

    def graph(self) -> BakeGraph:
        return self._load(bake_file_path(self._bake_file), load_graph)

    def fleet(self) -> Fleet:
        return self._load(fleet_path(self._fleet_file), load_fleet)

    # ---- submission ----
    def submit_run(self, context: dg.SubmitRunContext) -> dg.DagsterRun:
        run = context.dagster_run
        if run.status != dg.DagsterRunStatus.NOT_STARTED:
            return super().submit_run(context)
        try:
            graph = self.graph()
            builds = self._builds_of(run, graph)
        except (BakeError, OSError) as exc:
            self._event(
                run, f"rocm-assets cannot read the build graph, so this run is not placed: {exc}"
            )
            return super().submit_run(context)
        if not builds:
            return super().submit_run(context)  # checks, sensors' runs: they take no build node
        # A split request's runs were checked together, as the request.
        if ROCM_FANOUT_OF_TAG not in run.tags and not self._preflight(run, graph, builds):
            return self._reload(run)
        if len(builds) > 1:
            if context.workspace is not None:
                return self._fan_out(context, run, graph, builds)
            self._event(
                run,
                f"{len(builds)} builds in one run: no workspace to split it, so they run in order",
            )
        return self._queue_build(context, run, builds[0])

    def _builds_of(self, run: dg.DagsterRun, graph: BakeGraph) -> list[Build]:
        if run.asset_selection is not None:
            keys = run.asset_selection
            targets = {k.path[0] for k in keys if len(k.path) == 1}
        else:
            ops = {op_name(t): t for t in graph.asset_targets}
            snapshot = self._instance.get_execution_plan_snapshot(run.execution_plan_snapshot_id)
            targets = {ops[s.key] for s in snapshot.steps if s.key in ops} if snapshot else set()
        return builds_for(graph, targets, run_partitions(run.tags, graph.arches))

    def _preflight(self, run: dg.DagsterRun, graph: BakeGraph, builds: list[Build]) -> bool:
        """Check the request's registry inputs now, so the UI shows a missing one at once.

        Builds already queued or running count as published: they will be before this starts.
        Returns False when the run was failed for missing inputs. A registry that cannot answer
        only delays the check to the run itself, which checks again before it builds.
        """
        if not os.environ.get(REGISTRY_URL_ENV):
            return True
        in_flight = [
            b for b in map(Build.parse, self._in_flight_build_tags()) if b.target in graph.deps
        ]
        try:
            with RegistryClient.from_env(**_SUBMIT_REGISTRY_OPTIONS) as client:
                report = preflight(graph, builds, client, published_by_request=in_flight)
        except (RegistryError, PreflightError) as exc:
            self._event(
                run, f"preflight at submission skipped: {exc}; the run checks before it builds"
            )
            return True
        if report.ok:
            self._event(run, report.summary())
            return True
        message = "\n".join([report.summary(), *(m.line() for m in report.missing)])
        self._event(run, message)
        self._instance.report_run_failed(run, message)
        return False

    def _in_flight_build_tags(self) -> list[str]:
        records = self._instance.get_run_records(dg.RunsFilter(statuses=list(IN_FLIGHT_STATUSES)))
        return [
            r.dagster_run.tags[ROCM_BUILD_TAG]
            for r in records
            if r.dagster_run.tags.get(ROCM_BUILD_TAG)
        ]

    def _queue_build(
        self, context: dg.SubmitRunContext, run: dg.DagsterRun, build: Build
    ) -> dg.DagsterRun:
        inherited = run.tags.get(ROCM_NODE_TAG)
        self._instance.add_run_tags(
            run.run_id,
            {
                ROCM_BUILD_TAG: str(build),
                ROCM_PLACEMENT_TAG: PLACEMENT_WAITING,
                # A retry or re-execution carries its parent's node; it is placed afresh.
                ROCM_NODE_TAG: "",
                ROCM_WAITING_FOR_TAG: "placement at dequeue time",
            },
        )
        note = (
            f" (not {inherited}, its parent's node: retries are placed afresh)" if inherited else ""
        )
        self._event(run, f"build {build} queued; its node is chosen when it can start{note}")
        return super().submit_run(dg.SubmitRunContext(self._reload(run), context.workspace))

    def _fan_out(
        self,
        context: dg.SubmitRunContext,
        run: dg.DagsterRun,
        graph: BakeGraph,
        builds: list[Build],
    ) -> dg.DagsterRun:
        """One run per build, each placed on its own; the request's run records them and builds nothing."""
        workspace = context.workspace
        if workspace is None:
            raise dg.DagsterInvariantViolationError("a fan-out needs the submitting workspace")
        base_tags = {k: v for k, v in run.tags.items() if k not in _NOT_INHERITED}
        children: list[dg.DagsterRun] = []
        for build in builds:
            tags = {**base_tags, ROCM_FANOUT_OF_TAG: run.run_id}
            if build.target in graph.per_arch and build.arch is not None:
                tags[PARTITION_TAG] = build.arch
            children.append(
                subset_run(self._instance, workspace, run, dg.AssetKey(build.target), tags)
            )
        self._instance.add_run_tags(run.run_id, {ROCM_FANOUT_TAG: FANOUT_PARENT})
        listing = ", ".join(f"{b} -> {c.run_id[:8]}" for b, c in zip(builds, children, strict=True))
        self._event(
            run,
            f"split into {len(children)} runs, one per build, each placed when its inputs are pushed: {listing}",
        )
        queued = super().submit_run(dg.SubmitRunContext(self._reload(run), context.workspace))
        for child in children:
            self.submit_run(dg.SubmitRunContext(child, context.workspace))
        return queued

    # ---- placement at dequeue time ----
    def get_run_queue_config(self) -> RunQueueConfig:
        config = super().get_run_queue_config()
        try:
            self.place_waiting_runs()
        except Exception as exc:
            # A bad file or a storage hiccup must never stop the daemon; nothing is placed now.
            message = f"placement skipped this iteration: {type(exc).__name__}: {exc}"
            if message != self._last_error:
                logger.exception(message)
            self._last_error = message
        limits = [
            *(config.tag_concurrency_limits or []),
            {"key": ROCM_PLACEMENT_TAG, "value": PLACEMENT_WAITING, "limit": 0},
            {"key": ROCM_NODE_TAG, "value": {"applyLimitPerUniqueValue": True}, "limit": 1},
        ]
        return config._replace(tag_concurrency_limits=limits)

    def place_waiting_runs(self, now: float | None = None) -> placement.Decision | None:
        """Place every waiting build run that can start now; tag the rest with what they wait for."""
        now = time.time() if now is None else now
        graph, fleet = self.graph(), self.fleet()
        if self._probe_nodes:
            self._probes.watch(fleet)
        probes = self._probes.fresh(now)
        waiting: dict[Build, dg.DagsterRun] = {}
        duplicates: dict[str, str] = {}
        running: dict[Build, tuple[str, float]] = {}
        cost = placement.CostModel(
            fleet,
            probes=[p for p in probes.values() if p.ok],
            measured=self._measured_durations(graph, fleet),
        )
        node_names = {n.name for n in fleet.nodes}
        for record in self._instance.get_run_records(
            dg.RunsFilter(statuses=list(IN_FLIGHT_STATUSES))
        ):
            run = record.dagster_run
            tags = run.tags
            build = Build.parse(tags[ROCM_BUILD_TAG]) if tags.get(ROCM_BUILD_TAG) else None
            if tags.get(ROCM_PLACEMENT_TAG) == PLACEMENT_WAITING:
                if build is None or run.status != dg.DagsterRunStatus.QUEUED:
                    continue
                if build in waiting:
                    duplicates[run.run_id] = (
                        f"the same build is queued in run {waiting[build].run_id[:8]}"
                    )
                else:
                    waiting[build] = run
                continue
            node = tags.get(ROCM_NODE_TAG)
            if node in node_names:
                # A run that placed itself (`dagster asset materialize`) has no build tag.
                builds = [build] if build else self._builds_of(run, graph)
                end = from_iso(tags.get(ROCM_EST_FINISH_TAG))
                if end is None:
                    host = fleet.node(node)
                    work = sum(
                        cost.build_s(b.target, host) + cost.push_s(b.target, host) for b in builds
                    )
                    end = (record.start_time or now) + work
                running[build or Build(f"run:{run.run_id}", None)] = (node, end)
        for build in [b for b in waiting if b in running]:
            duplicates[waiting.pop(build).run_id] = (
                f"{build} is already running on {running[build][0]}"
            )
        for run_id, reason in duplicates.items():
            self._tag_waiting(run_id, reason)
        if not waiting:
            return None
        excluded = {n: p.reason for n, p in probes.items() if not p.ok}
        # Nothing changed since the last tick, which started nothing: the answer is the same, and
        # the full plan costs ~0.1 s at 1,000 queued builds (docs/benchmarks.md).
        state = (
            frozenset((b, r.run_id) for b, r in waiting.items()),
            frozenset(running.items()),
            frozenset(excluded),
        )
        if state == self._last_state and now - self._last_state_at < _REPLAN_AFTER_S:
            return None
        nodes = [n for n in fleet.nodes if n.name not in excluded]
        deps = {b: build_deps(graph, b) for b in waiting}
        inputs = {d for ds in deps.values() for d in ds} - waiting.keys() - running.keys()
        decision = placement.choose_placements(
            list(waiting),
            running,
            nodes,
            cost,
            now,
            deps,
            pushed=self._built_on(inputs, node_names, now),
            strategy=self._strategy,
        )
        self._last_state, self._last_state_at = (None, 0.0) if decision.starts else (state, now)
        for start in decision.starts:
            run = waiting[start.build]
            node = fleet.node(start.node)
            self._instance.add_run_tags(
                run.run_id,
                {
                    ROCM_NODE_TAG: node.name,
                    ROCM_PLACEMENT_TAG: PLACEMENT_PLACED,
                    ROCM_MAX_JOBS_TAG: str(cost.max_jobs(node)),
                    ROCM_EST_START_TAG: to_iso(start.est_start_s),
                    ROCM_EST_FINISH_TAG: to_iso(start.est_finish_s),
                    ROCM_WAITING_FOR_TAG: "",
                },
            )
            skipped = (
                f"; excluded: {', '.join(f'{n} ({r})' for n, r in excluded.items())}"
                if excluded
                else ""
            )
            self._event(
                run,
                f"placed {start.build} on {node.name} (builder {node.builder}, MAX_JOBS={cost.max_jobs(node)}), "
                f"estimated finish {to_iso(start.est_finish_s)}, strategy {decision.strategy}{skipped}",
            )
        for build, why in decision.waiting.items():
            extra = {ROCM_EST_START_TAG: to_iso(why.est_start_s)} if why.est_start_s else {}
            self._tag_waiting(waiting[build].run_id, why.reason, extra)
        return decision

    def _built_on(self, builds: set[Build], nodes: set[str], now: float) -> dict[Build, str]:
        """The node each finished input was built on: a dependent there pulls nothing.

        Read from the build runs that succeeded in the last day (their rocm/build and rocm/node
        tags); without it every input looks like a registry pull on every node, and the online
        plan loses to greedy on some fleets (docs/benchmarks.md, `default-locality`).
        """
        if not builds:
            return {}
        records = self._instance.get_run_records(
            dg.RunsFilter(
                statuses=[dg.DagsterRunStatus.SUCCESS],
                updated_after=datetime.fromtimestamp(now - _BUILT_ON_WINDOW_S, UTC),
            ),
            order_by="update_timestamp",
            ascending=True,
        )
        wanted = {str(b): b for b in builds}
        built: dict[Build, str] = {}
        for record in records:  # oldest first: the newest build of each wins
            tags = record.dagster_run.tags
            build = wanted.get(tags.get(ROCM_BUILD_TAG, ""))
            if build is not None and tags.get(ROCM_NODE_TAG) in nodes:
                built[build] = tags[ROCM_NODE_TAG]
        return built

    def _tag_waiting(
        self, run_id: str, reason: str, extra: Mapping[str, str] | None = None
    ) -> None:
        run = self._instance.get_run_by_id(run_id)
        if run is None:
            return
        wanted = {ROCM_WAITING_FOR_TAG: reason[:255], **(extra or {})}
        # Only write what changed: the daemon calls this every few seconds.
        if any(run.tags.get(k) != v for k, v in wanted.items()):
            self._instance.add_run_tags(run_id, wanted)

    def _measured_durations(
        self, graph: BakeGraph, fleet: Fleet
    ) -> dict[tuple[str, str, int], float]:
        """Median build seconds by (target, node, MAX_JOBS), from recent materializations."""
        stamp, cached = self._measured
        if time.time() - stamp < _MEASURED_TTL_S:
            return cached
        cost = placement.CostModel(fleet)
        names = {n.name for n in fleet.nodes}
        samples: dict[tuple[str, str, int], list[float]] = {}
        for target in graph.asset_targets:
            result = self._instance.fetch_materializations(dg.AssetKey(target), limit=50)
            for record in result.records:
                meta = record.asset_materialization.metadata if record.asset_materialization else {}
                node, jobs, seconds = (
                    getattr(meta.get(k), "value", None) for k in ("node", "max_jobs", "duration_s")
                )
                if (
                    isinstance(node, str)
                    and isinstance(jobs, int)
                    and isinstance(seconds, float | int)
                ):
                    # A bake's wall time includes its push; the model adds the push itself.
                    pushed = fleet.node(node) if node in names else None
                    own = float(seconds) - (cost.push_s(target, pushed) if pushed else 0.0)
                    samples.setdefault((target, node, jobs), []).append(max(own, 1.0))
        measured = {key: median(values) for key, values in samples.items()}
        self._measured = (time.time(), measured)
        return measured

    # ---- helpers ----
    def _reload(self, run: dg.DagsterRun) -> dg.DagsterRun:
        reloaded = self._instance.get_run_by_id(run.run_id)
        if reloaded is None:
            raise dg.DagsterRunNotFoundError(
                f"run {run.run_id} vanished", invalid_run_id=run.run_id
            )
        return reloaded

    def _event(self, run: dg.DagsterRun, message: str) -> None:
        self._instance.report_engine_event(message, run, cls=self.__class__)
