"""A real Dagster instance (SQLite) with rocm-assets' coordinator, and the daemon's iteration.

A pytest plugin (conftest.py): its `fleet_file` and `instance` fixtures serve every module that
does not define its own.

`instance_for_test` storage, `QueuedRunCoordinatorDaemon.run_iteration` as the daemon runs it,
and Dagster's MockedRunLauncher (it records launches; tests finish runs by reporting events).
"""

from collections.abc import Iterator, Mapping
from pathlib import Path

import dagster as dg
import pytest
from dagster._core.events import DagsterEvent, DagsterEventType
from dagster._core.remote_origin import (
    RegisteredCodeLocationOrigin,
    RemoteJobOrigin,
    RemoteRepositoryOrigin,
)
from dagster._core.test_utils import (
    create_run_for_test,
    create_test_daemon_workspace_context,
    instance_for_test,
)
from dagster._core.workspace.load_target import EmptyWorkspaceTarget
from dagster._daemon.run_coordinator.queued_run_coordinator_daemon import QueuedRunCoordinatorDaemon

from rocm_assets_tests.helpers import PROJECT_ROOT

BAKE = PROJECT_ROOT / "rocm-bake.hcl"
FLEET = """
nodes:
  - {name: big, builder: big, cores: 32, mem_gb: 122, link_mbps: 1000}
  - {name: small, builder: small, cores: 16, mem_gb: 15, link_mbps: 40}
  - {name: mid, builder: mid, cores: 24, mem_gb: 64, link_mbps: 500}
target_costs:
  reference: {cores: 32, mem_gb: 122}
  pytorch: {seconds: 7200, size_gb: 6.0}
  rocm-runtime: {seconds: 600, size_gb: 10.0}
  pytorch-base: {seconds: 900, size_gb: 2.0}
"""
ORIGIN = RemoteJobOrigin(
    RemoteRepositoryOrigin(RegisteredCodeLocationOrigin("rocm_assets"), "__repository__"),
    "__ASSET_JOB",
)
HOLDING = (dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED)


def coordinator_config(fleet_file: Path, **extra: object) -> dict:
    return {
        "run_coordinator": {
            "module": "rocm_assets.instance.coordinator",
            "class": "PlacementRunCoordinator",
            "config": {
                "bake_file": str(BAKE),
                "fleet_file": str(fleet_file),
                "probe_nodes": False,
                # FLEET's builders exist nowhere: their histories are read only where a test
                # asks for it (test_foreign.py).
                "foreign_check_seconds": 0,
                **extra,
            },
        },
        "run_launcher": {"module": "dagster._core.test_utils", "class": "MockedRunLauncher"},
    }


def submit(
    instance: dg.DagsterInstance,
    target: str,
    arch: str | None,
    tags: Mapping[str, str] | None = None,
    **kwargs: object,
) -> dg.DagsterRun:
    """A run of one asset partition through the coordinator, as the UI submits it."""
    run = create_run_for_test(
        instance,
        job_name="__ASSET_JOB",
        status=dg.DagsterRunStatus.NOT_STARTED,
        remote_job_origin=ORIGIN,
        asset_selection=frozenset({dg.AssetKey(target)}),
        tags={**({"dagster/partition": arch} if arch else {}), **(tags or {})},
        **kwargs,
    )
    return instance.run_coordinator.submit_run(dg.SubmitRunContext(run, workspace=None))


def iterate(instance: dg.DagsterInstance) -> None:
    """One iteration of the queued-run daemon, as `dagster-daemon run` makes it."""
    with create_test_daemon_workspace_context(EmptyWorkspaceTarget(), instance) as context:
        list(QueuedRunCoordinatorDaemon(interval_seconds=1).run_iteration(context))


def end(
    instance: dg.DagsterInstance,
    run: dg.DagsterRun,
    event: DagsterEventType = DagsterEventType.RUN_SUCCESS,
) -> None:
    instance.report_dagster_event(
        DagsterEvent(event.value, job_name=run.job_name, message="done"), run_id=run.run_id
    )


def runs_in(instance: dg.DagsterInstance, *statuses: dg.DagsterRunStatus) -> list[dg.DagsterRun]:
    return list(instance.get_runs(dg.RunsFilter(statuses=list(statuses))))


def messages(instance: dg.DagsterInstance, run_id: str) -> str:
    return "\n".join(e.message or "" for e in instance.all_logs(run_id))


@pytest.fixture
def fleet_file(tmp_path: Path) -> Path:
    """FLEET in a file: three unprobed nodes, one builder each."""
    path = tmp_path / "fleet.yaml"
    path.write_text(FLEET)
    return path


@pytest.fixture
def instance(fleet_file: Path) -> Iterator[dg.DagsterInstance]:
    """A SQLite instance with rocm-assets' coordinator over `fleet_file` and the shipped bake file."""
    with instance_for_test(overrides=coordinator_config(fleet_file)) as instance:
        yield instance
