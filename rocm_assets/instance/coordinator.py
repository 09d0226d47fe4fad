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
  (`rocm_assets.instance.authority`), held until the build ends; the limits hold waiting runs back
  (limit 0) and allow one run per node.
"""

import logging
import os
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, Self

import dagster as dg

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
)
from rocm_assets.core.nodes.probes import ProbeCache
from rocm_assets.core.registry.client import RegistryClient, RegistryError
from rocm_assets.core.registry.preflight import PreflightError, preflight
from rocm_assets.instance import authority
from rocm_assets.instance.dagster_internals import (
    ConfigurableClassData,
    RunQueueConfig,
    UserConfigSchema,
    called_by_run_queue_daemon,
    subset_run,
)
from rocm_assets.instance.placer import Placer
from rocm_assets.instance.runs import IN_FLIGHT_STATUSES, builds_of_run
from rocm_assets.instance.settings import CoordinatorSettings
from rocm_assets.instance.watched_files import WatchedFiles

logger = logging.getLogger("rocm_assets.instance")

# Submission runs in the webserver: a slow registry must not hold the UI for long.
_SUBMIT_REGISTRY_OPTIONS = {
    "connect_timeout": 2.0,
    "read_timeout": 5.0,
    "retries": 0,
    "deadline": 3.0,
}
# Dagster's partition tags a child run must not inherit from the request it was split from.
_PARTITION_TAGS = (PARTITION_TAG, PARTITION_RANGE_START_TAG, PARTITION_RANGE_END_TAG)


class PlacementRunCoordinator(dg.QueuedRunCoordinator):
    """Queues build runs; the daemon places each on one machine when it can start."""

    def __init__(self, **config: Any):
        """`config`: Dagster's queued-run settings and ours (`CoordinatorSettings`), as
        dagster.yaml gives them."""
        ours = {k: config.pop(k) for k in CoordinatorSettings.names() & config.keys()}
        super().__init__(**config)
        self._settings = CoordinatorSettings.from_config(ours)
        # Read in the submitting process and in the daemon, each keeping its own cache.
        self.files = WatchedFiles(self._settings.bake_file, self._settings.fleet_file)
        self._probes = ProbeCache(
            self._settings.probe_interval_seconds, self._settings.probe_max_age_seconds
        )
        self._placer: Placer | None = None

    @classmethod
    def config_type(cls) -> UserConfigSchema:
        return {**super().config_type(), **CoordinatorSettings.config_schema()}

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
    def settings(self) -> CoordinatorSettings:
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

    def in_process_placer(self) -> Placer:
        """The placer of an in-process run placing itself with no placement daemon alive
        (`authority`): the heuristics alone, no CP-SAT threads in a run worker, and the nodes
        probed right before each decision."""
        settings = replace(self._settings, strategy="default", solver=False)
        probes = ProbeCache(settings.probe_interval_seconds, settings.probe_max_age_seconds)
        return Placer(self._instance, settings, files=self.files, probes=probes, probe_first=True)

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
        supplied = authority.blank_supplied(self._instance, run)
        if not supplied:
            return run
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
        authority.queue(self._instance, run.run_id, build)
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
