"""PlacementRunCoordinator: one build per machine, earliest finish, dependency-gated, one authority.

An instance plugin (dagster.yaml `run_coordinator`), loaded by the webserver, the daemon, run
workers and the CLI. It reads the bake graph and the fleet from their files and never imports the
code location.

- `submit_run` runs in whatever process submits. It stays cheap and never loses a run: it blanks
  any `rocm/` placement tag the submitter supplied (they belong to the coordinator), splits a
  request covering several builds into one run per build, tags each build run
  `rocm/placement=waiting` and queues it; any exception fails the run with a one-line reason.
- `get_run_queue_config` is Dagster's per-iteration hook of the queued-run daemon, but Dagster
  also calls it from run workers and the webserver. Only the daemon's call places runs
  (`rocm_assets.instance.placer`); every other call returns the limits and does nothing else.
- A placement is an atomic claim on the node's builder in the instance's storage
  (`rocm_assets.instance.claims`), held until the build ends; the limits hold waiting runs back
  (limit 0) and allow one run per node.
"""

import logging
import os
from collections.abc import Mapping
from typing import Any, Self

import dagster as dg

from rocm_assets.core import placement
from rocm_assets.core.bake import BakeGraph
from rocm_assets.core.build.builds import Build
from rocm_assets.core.common.constants import (
    FANOUT_PARENT,
    PARTITION_RANGE_END_TAG,
    PARTITION_RANGE_START_TAG,
    PARTITION_TAG,
    PLACEMENT_WAITING,
    REGISTRY_URL_ENV,
    ROCM_BUILD_TAG,
    ROCM_FANOUT_OF_TAG,
    ROCM_FANOUT_TAG,
    ROCM_NODE_TAG,
    ROCM_PLACEMENT_TAG,
    ROCM_TAG_PREFIX,
    ROCM_WAITING_FOR_TAG,
)
from rocm_assets.core.nodes.probes import ProbeCache
from rocm_assets.core.placement.farm import FollowSettings
from rocm_assets.core.placement.follow import COORDINATOR_STRATEGY
from rocm_assets.core.registry.client import RegistryClient, RegistryError
from rocm_assets.core.registry.preflight import PreflightError, preflight
from rocm_assets.instance.dagster_internals import (
    ConfigurableClassData,
    RunQueueConfig,
    UserConfigSchema,
    called_by_run_queue_daemon,
    subset_run,
)
from rocm_assets.instance.farm_files import FarmFiles
from rocm_assets.instance.placer import Placer, PlacerSettings
from rocm_assets.instance.runs import IN_FLIGHT_STATUSES, builds_of_run

logger = logging.getLogger("rocm_assets.instance")

# Submission runs in the webserver: a slow registry must not hold the UI for long.
_SUBMIT_REGISTRY_OPTIONS = {
    "connect_timeout": 2.0,
    "read_timeout": 5.0,
    "retries": 0,
    "deadline": 3.0,
}
_STRATEGIES = (COORDINATOR_STRATEGY, *placement.STRATEGIES)
# Each default lives once: the core's settings, and these two for the probes.
_FOLLOW = FollowSettings()
_PLACER = PlacerSettings()
_PROBE_INTERVAL_S = 60
_PROBE_MAX_AGE_S = 300
# Dagster's partition tags a child run must not inherit from the request it was split from.
_PARTITION_TAGS = (PARTITION_TAG, PARTITION_RANGE_START_TAG, PARTITION_RANGE_END_TAG)


class PlacementRunCoordinator(dg.QueuedRunCoordinator):
    """Queues build runs; the daemon places each on one machine when it can start."""

    def __init__(
        self,
        bake_file: str | None = None,
        fleet_file: str | None = None,
        strategy: str = COORDINATOR_STRATEGY,
        replan_drift_margin: float = _FOLLOW.replan_drift_margin,
        replan_early_margin: float | None = _FOLLOW.replan_early_margin,
        fill_idle_nodes: bool = _FOLLOW.fill_idle_nodes,
        solver: bool = _PLACER.solver,
        solver_min_seconds: float = _FOLLOW.solver_min_seconds,
        solver_seconds_per_build: float = _FOLLOW.solver_seconds_per_build,
        solver_time_limit_seconds: float = _FOLLOW.solver_time_limit_seconds,
        solver_workers: int = _PLACER.solver_workers,
        probe_interval_seconds: int = _PROBE_INTERVAL_S,
        probe_max_age_seconds: int = _PROBE_MAX_AGE_S,
        probe_nodes: bool = _PLACER.probe_nodes,
        lease_seconds: int = int(_PLACER.lease_seconds),
        input_wait_seconds: int = int(_PLACER.input_wait_seconds),
        bake_end_wait_seconds: int = int(_PLACER.bake_end_wait_seconds),
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        if strategy not in _STRATEGIES:
            # dagster.yaml's Enum already refuses it; a direct construction gets the same word.
            raise placement.PlacementError(f"unknown placement strategy {strategy!r}")
        # Read in the submitting process and in the daemon, each keeping its own cache.
        self.files = FarmFiles(bake_file, fleet_file)
        self._probes = ProbeCache(probe_interval_seconds, probe_max_age_seconds)
        self._settings = PlacerSettings(
            strategy=strategy,
            follow=FollowSettings(
                replan_drift_margin=replan_drift_margin,
                replan_early_margin=replan_early_margin,
                fill_idle_nodes=fill_idle_nodes,
                solver_min_seconds=solver_min_seconds,
                solver_seconds_per_build=solver_seconds_per_build,
                solver_time_limit_seconds=solver_time_limit_seconds,
            ),
            solver=solver,
            solver_workers=solver_workers,
            probe_nodes=probe_nodes,
            lease_seconds=float(lease_seconds),
            input_wait_seconds=float(input_wait_seconds),
            bake_end_wait_seconds=float(bake_end_wait_seconds),
        )
        self._placer: Placer | None = None

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
                dg.Enum("PlacementStrategy", [dg.EnumValue(name) for name in _STRATEGIES]),
                default_value=COORDINATOR_STRATEGY,
                description="coordinator: follow the best plan found (the heuristics at once, CP-SAT in "
                "the background), re-planned on drift. Or re-decide every tick with one heuristic: "
                "default (the best of the three), greedy (the seed's rule), critical-path, peft.",
            ),
            "replan_drift_margin": dg.Field(
                float,
                default_value=_FOLLOW.replan_drift_margin,
                description="Re-plan when a build has run this share past its estimate.",
            ),
            "replan_early_margin": dg.Field(
                dg.Noneable(float),
                default_value=_FOLLOW.replan_early_margin,
                description="Re-plan when a build ends this share of its estimate early (its "
                "machine is free sooner than planned); null: never.",
            ),
            "fill_idle_nodes": dg.Field(
                bool,
                default_value=_FOLLOW.fill_idle_nodes,
                description="When a machine is free and its next planned build cannot start yet, "
                "move a ready build planned elsewhere onto it if the plan finishes no later.",
            ),
            "solver": dg.Field(
                bool,
                default_value=_PLACER.solver,
                description="False: the plan is the heuristics' alone (no CP-SAT).",
            ),
            "solver_min_seconds": dg.Field(
                float,
                default_value=_FOLLOW.solver_min_seconds,
                description="The solver's budget for a small re-plan.",
            ),
            "solver_seconds_per_build": dg.Field(
                float,
                default_value=_FOLLOW.solver_seconds_per_build,
                description="The solver's budget grows by this per build at stake.",
            ),
            "solver_time_limit_seconds": dg.Field(
                float,
                default_value=_FOLLOW.solver_time_limit_seconds,
                description="The most the solver gets for one re-plan (a 100-build backfill).",
            ),
            "solver_workers": dg.Field(
                int,
                default_value=_PLACER.solver_workers,
                description="CP-SAT threads in the daemon; the daemon's tick never waits for them.",
            ),
            "probe_interval_seconds": dg.Field(
                dg.IntSource,
                default_value=_PROBE_INTERVAL_S,
                description="How often the daemon probes the nodes over SSH.",
            ),
            "probe_max_age_seconds": dg.Field(
                dg.IntSource,
                default_value=_PROBE_MAX_AGE_S,
                description="Older probe results are ignored and the fleet's figures stand in.",
            ),
            "probe_nodes": dg.Field(
                bool,
                default_value=_PLACER.probe_nodes,
                description="False: never probe; use the fleet's figures.",
            ),
            "lease_seconds": dg.Field(
                dg.IntSource,
                default_value=int(_PLACER.lease_seconds),
                description="A started build whose worker stops renewing its builder claim for "
                "this long is taken as dead: its builder is freed and its run failed.",
            ),
            "input_wait_seconds": dg.Field(
                dg.IntSource,
                default_value=int(_PLACER.input_wait_seconds),
                description="How long a build waits on an input whose last run failed or was "
                "cancelled (for someone to rebuild it) before it fails, naming the input and "
                "that run. Default 0: it fails at once, so nothing queues behind a failed input.",
            ),
            "bake_end_wait_seconds": dg.Field(
                dg.IntSource,
                default_value=int(_PLACER.bake_end_wait_seconds),
                description="A run that ended still holding its builder (its worker died "
                "mid-bake) keeps it until the builder's BuildKit history shows no running build "
                "of the run, or for this long at most, when the builder is freed anyway.",
            ),
        }

    @classmethod
    def from_config_value(
        cls, inst_data: ConfigurableClassData, config_value: Mapping[str, Any]
    ) -> Self:
        return cls(inst_data=inst_data, **config_value)

    def dispose(self) -> None:
        self._probes.stop()
        if self._placer is not None:
            self._placer.close()
        super().dispose()

    @property
    def settings(self) -> PlacerSettings:
        """What the placement authority was configured with (dagster.yaml, resolved)."""
        return self._settings

    @property
    def placer(self) -> Placer:
        """The placement authority's state; created on the daemon's first tick."""
        if self._placer is None:
            self._placer = Placer(
                self._instance,
                self._settings,
                files=self.files,
                probes=self._probes,
            )
        return self._placer

    # ---- submission ----
    def submit_run(self, context: dg.SubmitRunContext) -> dg.DagsterRun:
        run = context.dagster_run
        if run.status != dg.DagsterRunStatus.NOT_STARTED:
            return super().submit_run(context)
        try:
            return self._submit(context, run)
        except Exception as exc:
            # A run that cannot be queued must not stay NOT_STARTED forever.
            message = f"rocm-assets could not queue this run: {type(exc).__name__}: {exc}"
            message = " ".join(message.split())[:500]
            logger.exception("run %s: %s", run.run_id, message)
            current = self._instance.get_run_by_id(run.run_id) or run
            if current.status in (dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.QUEUED):
                self._instance.report_run_failed(current, message)
            return self._instance.get_run_by_id(run.run_id) or run

    def _submit(self, context: dg.SubmitRunContext, run: dg.DagsterRun) -> dg.DagsterRun:
        run = self._blank_placement_tags(run)
        graph = self.files.graph()
        builds = builds_of_run(self._instance, run, graph)
        if not builds:
            return super().submit_run(dg.SubmitRunContext(run, context.workspace))
        if not self._preflight(run, graph, builds):
            return self._reload(run)
        if len(builds) > 1:
            if context.workspace is not None:
                return self._fan_out(context, run, graph, builds)
            self._event(
                run,
                f"{len(builds)} builds in one run: no workspace to split it, so they run in order",
            )
        return self._queue_build(context, run, builds[0])

    def _blank_placement_tags(self, run: dg.DagsterRun) -> dg.DagsterRun:
        """Placement tags belong to the coordinator: those supplied at submission are blanked."""
        supplied = {k: v for k, v in run.tags.items() if k.startswith(ROCM_TAG_PREFIX) and v}
        if not supplied:
            return run
        self._instance.add_run_tags(run.run_id, dict.fromkeys(supplied, ""))
        shown = ", ".join(f"{k}={v}"[:80] for k, v in sorted(supplied.items()))
        node = supplied.get(ROCM_NODE_TAG)
        retry = f" (not {node}, its parent's node: retries are placed afresh)" if node else ""
        self._event(
            run,
            f"ignored placement tags supplied at submission: {shown}; the coordinator places "
            f"every build and MAX_JOBS comes from the node{retry}",
        )
        return self._reload(run)

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
        self._instance.add_run_tags(
            run.run_id,
            {
                ROCM_BUILD_TAG: str(build),
                ROCM_PLACEMENT_TAG: PLACEMENT_WAITING,
                ROCM_NODE_TAG: "",
                ROCM_WAITING_FOR_TAG: "placement at dequeue time",
            },
        )
        self._event(run, f"build {build} queued; its node is chosen when it can start")
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
        base_tags = {
            k: v
            for k, v in run.tags.items()
            if k not in _PARTITION_TAGS and not k.startswith(ROCM_TAG_PREFIX)
        }
        children: list[tuple[Build, dg.DagsterRun]] = []
        for build in builds:
            tags = {**base_tags, ROCM_FANOUT_OF_TAG: run.run_id}
            if build.target in graph.per_arch and build.arch is not None:
                tags[PARTITION_TAG] = build.arch
            child = subset_run(self._instance, workspace, run, dg.AssetKey(build.target), tags)
            children.append((build, child))
        self._instance.add_run_tags(run.run_id, {ROCM_FANOUT_TAG: FANOUT_PARENT})
        listing = ", ".join(f"{b} -> {c.run_id[:8]}" for b, c in children)
        self._event(
            run,
            f"split into {len(children)} runs, one per build, each placed when its inputs are pushed: {listing}",
        )
        queued = super().submit_run(dg.SubmitRunContext(self._reload(run), context.workspace))
        # The children's tags are the coordinator's own; they were checked as the request.
        for build, child in children:
            try:
                self._queue_build(dg.SubmitRunContext(child, workspace), child, build)
            except Exception as exc:
                self._instance.report_run_failed(
                    child, f"rocm-assets could not queue this run: {type(exc).__name__}: {exc}"
                )
        return queued

    # ---- placement at dequeue time ----
    def get_run_queue_config(self) -> RunQueueConfig:
        config = super().get_run_queue_config()
        # Dagster asks for this from run workers and the webserver too; only the daemon places.
        if called_by_run_queue_daemon():
            try:
                self.placer.tick(max_concurrent_runs=config.max_concurrent_runs)
            except Exception:
                # Per-run errors fail their run inside the tick; this is the storage or a bug.
                logger.exception("placement skipped this iteration")
        limits = [
            *(config.tag_concurrency_limits or []),
            {"key": ROCM_PLACEMENT_TAG, "value": PLACEMENT_WAITING, "limit": 0},
            {"key": ROCM_NODE_TAG, "value": {"applyLimitPerUniqueValue": True}, "limit": 1},
        ]
        return config._replace(tag_concurrency_limits=limits)

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
