"""The private Dagster APIs the coordinator cannot do without, kept in this one module.

Each is here because no public API does the job in Dagster 1.13:
- `RunQueueConfig` is the return type of `QueuedRunCoordinator.get_run_queue_config`, the hook
  the queued-run daemon calls every iteration; the coordinator overrides it.
- `ConfigurableClassData` and `UserConfigSchema` are what an instance plugin's
  `from_config_value` / `config_type` take and return (dagster.yaml `run_coordinator:`).
- `UnresolvedAssetJobDefinition` is what `dg.define_asset_job` returns, which Dagster does not
  export by name; the code location uses it only to type its job factories.
- `ConcurrencySlotsTable`, `PendingStepsTable` and `SqlEventLogStorage` are the pool tables and
  the storage's SQL connection: the only way to claim a builder atomically in the instance's own
  storage, since Dagster's public `claim_concurrency_slot` is not atomic across processes
  (`rocm_assets.instance.claims`).
- `called_by_run_queue_daemon` tells the queued-run daemon's call of `get_run_queue_config` from
  the same call made by a run worker or the webserver: Dagster gives the hook no caller, and only
  the daemon may place runs. It looks for the daemon's `run_iteration` on the call stack.
- `stale_resolver`, `stale_view`, `AssetGraph` and the `Stale*` types are Dagster's staleness (the
  UI's "unsynced"): the automation condition and `rocm-assets stale` ask the resolver the UI
  asks, as no public API gives an asset partition's stale status or its causes.
- `subset_run` creates a run of one asset of a job (the fan-out of a multi-build request):
  there is no public way to subset a remote job and create its run from inside a coordinator.
"""

import inspect
from collections.abc import Mapping
from datetime import UTC, datetime
from functools import cache
from types import CodeType

import dagster as dg
from dagster._config import UserConfigSchema as UserConfigSchema
from dagster._core.asset_graph_view.asset_graph_view import AssetGraphView, TemporalContext
from dagster._core.definitions.assets.graph.asset_graph import AssetGraph as AssetGraph
from dagster._core.definitions.assets.graph.base_asset_graph import BaseAssetGraph
from dagster._core.definitions.data_version import (
    CachingStaleStatusResolver,
    StaleCause as StaleCause,
    StaleCauseCategory as StaleCauseCategory,
    StaleStatus as StaleStatus,
)
from dagster._core.definitions.events import AssetKeyPartitionKey as AssetKeyPartitionKey
from dagster._core.definitions.selector import JobSubsetSelector
from dagster._core.definitions.unresolved_asset_job_definition import (
    UnresolvedAssetJobDefinition as UnresolvedAssetJobDefinition,
)
from dagster._core.run_coordinator.queued_run_coordinator import RunQueueConfig as RunQueueConfig
from dagster._core.storage.event_log.schema import (
    ConcurrencySlotsTable as ConcurrencySlotsTable,
    PendingStepsTable as PendingStepsTable,
)
from dagster._core.storage.event_log.sql_event_log import SqlEventLogStorage as SqlEventLogStorage
from dagster._core.workspace.context import BaseWorkspaceRequestContext
from dagster._serdes import ConfigurableClassData as ConfigurableClassData


def subset_run(
    instance: dg.DagsterInstance,
    workspace: BaseWorkspaceRequestContext,
    run: dg.DagsterRun,
    key: dg.AssetKey,
    tags: Mapping[str, str],
) -> dg.DagsterRun:
    """A NOT_STARTED run of `run`'s job that materializes `key` alone, with `tags`."""
    origin = run.remote_job_origin
    if origin is None:
        raise dg.DagsterInvariantViolationError(f"run {run.run_id} has no remote job origin")
    location_name = origin.repository_origin.code_location_origin.location_name
    repo_name = origin.repository_origin.repository_name
    location = workspace.get_code_location(location_name)
    remote_job = location.get_job(
        JobSubsetSelector(location_name, repo_name, run.job_name, None, [key], None)
    )
    plan = location.get_execution_plan(
        remote_job, run.run_config, step_keys_to_execute=None, known_state=None, instance=instance
    )
    return instance.create_run(
        job_name=run.job_name,
        run_id=None,
        run_config=run.run_config,
        resolved_op_selection=None,
        step_keys_to_execute=None,
        status=dg.DagsterRunStatus.NOT_STARTED,
        op_selection=None,
        root_run_id=None,
        parent_run_id=None,
        tags=dict(tags),
        job_snapshot=remote_job.job_snapshot,
        execution_plan_snapshot=plan.execution_plan_snapshot,
        parent_job_snapshot=remote_job.parent_job_snapshot,
        remote_job_origin=remote_job.get_remote_origin(),
        job_code_origin=remote_job.get_python_origin(),
        asset_selection=frozenset({key}),
        asset_check_selection=None,
        asset_graph=location.get_repository(repo_name).asset_graph,
    )


@cache
def _daemon_iteration_code() -> CodeType:
    # Imported on first use: only the daemon's process ever finds it on its stack.
    from dagster._daemon.run_coordinator.queued_run_coordinator_daemon import (
        QueuedRunCoordinatorDaemon,
    )

    return QueuedRunCoordinatorDaemon.run_iteration.__code__


def called_by_run_queue_daemon() -> bool:
    """True when the queued-run daemon's iteration is on this thread's call stack."""
    code = _daemon_iteration_code()
    frame = inspect.currentframe()
    while frame is not None:
        if frame.f_code is code:
            return True
        frame = frame.f_back
    return False


def stale_view(instance: dg.DagsterInstance, asset_graph: BaseAssetGraph) -> AssetGraphView:
    """The asset graph as of now, over the instance's latest event."""
    return AssetGraphView(
        temporal_context=TemporalContext(
            effective_dt=datetime.now(UTC),
            last_event_id=instance.event_log_storage.get_maximum_record_id(),
        ),
        instance=instance,
        asset_graph=asset_graph,
    )


def stale_resolver(
    instance: dg.DagsterInstance, asset_graph: BaseAssetGraph, view: AssetGraphView
) -> CachingStaleStatusResolver:
    """Dagster's stale-status resolver, sharing `view`'s cached instance queries."""
    return CachingStaleStatusResolver(
        instance,
        asset_graph,
        loading_context=view,
        instance_queryer=view.get_inner_queryer_for_back_compat(),
    )
