"""A farm run by rocm-assets' coordinator the way the daemon runs it, for the fault tests.

A persistent SQLite instance with the PlacementRunCoordinator and Dagster's DefaultRunLauncher,
the code location `rocm_assets.definitions` served by a real gRPC code server whose run workers
bake for real on the test's builders, and the queued-run daemon's own `run_iteration`, driven by
the test (`daemon_until`) so that each test says when the daemon looks.
"""

import os
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
import pytest
import yaml
from dagster._core.definitions.repository_definition.valid_definitions import (
    SINGLETON_REPOSITORY_NAME,
)
from dagster._core.definitions.selector import JobSubsetSelector
from dagster._core.test_utils import create_test_daemon_workspace_context, instance_for_test
from dagster._core.workspace.context import WorkspaceProcessContext
from dagster._core.workspace.load_target import ModuleTarget
from dagster._daemon.run_coordinator.queued_run_coordinator_daemon import QueuedRunCoordinatorDaemon

from rocm_assets.core.build.invocation import HistoryRecord
from rocm_assets_tests.helpers import PROJECT_ROOT
from rocm_assets_tests.servers.dockerd import Builders
from rocm_assets_tests.servers.registry import RegistryServer

DEFINITIONS = "rocm_assets.definitions"
LOCATION = "rocm_assets"
ASSET_JOB = "__ASSET_JOB"
BUILD_PREFIX = "rocm-pytorch-build/"
# Guards against a hung run, not timings.
HANG_GUARD_S = 600.0


@dataclass(frozen=True)
class QueuedFarm:
    """One test's farm: the environment its code server and run workers inherit, its nodes."""

    env: dict[str, str]
    home: Path
    registry: RegistryServer
    builders: Builders
    bake_file: Path
    # node name -> builder
    nodes: dict[str, str]

    @property
    def registry_var(self) -> str:
        return self.env["REGISTRY"]


def make_queued_farm(
    builders: Builders,
    tmp_path: Path,
    registry: RegistryServer,
    bake_file: Path,
    nodes: Mapping[str, str],
    **env: str,
) -> QueuedFarm:
    """Unprobed nodes (name -> builder) of equal figures, a Dagster home and a registry prefix
    of the test's own; `env` adds bake variables (HOLD_S, FAIL)."""
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(
        yaml.safe_dump(
            {
                "nodes": [
                    {"name": n, "builder": b, "cores": 8, "mem_gb": 16, "link_mbps": 1000}
                    for n, b in nodes.items()
                ],
                "target_costs": {"reference": {"cores": 8, "mem_gb": 16}},
            }
        )
    )
    home = tmp_path / "dagster-home"
    home.mkdir()
    farm_env = {
        k: v
        for k, v in builders.env.items()
        if not k.startswith(("ROCM_", "DAGSTER_"))
        and k not in ("PUBLISHED_INPUTS", "GPU_ARCH", "RUN_ID")
    }
    farm_env.update(
        DAGSTER_HOME=str(home),
        ROCM_FLEET_FILE=str(fleet),
        ROCM_BAKE_FILE=str(bake_file),
        REGISTRY=f"{registry.host}/{registry.new_repo('faults')}",
        ROCM_REGISTRY_URL=registry.url,
        **env,
    )
    return QueuedFarm(farm_env, home, registry, builders, bake_file, dict(nodes))


@contextmanager
def placement_instance(
    farm: QueuedFarm, monkeypatch: pytest.MonkeyPatch, **config: object
) -> Iterator[tuple[dg.DagsterInstance, WorkspaceProcessContext]]:
    """The farm's instance with rocm-assets' coordinator (unprobed nodes, `config` on top) and
    the DefaultRunLauncher, and the daemon's workspace: its code server, and the run workers it
    starts, inherit this process's environment, set to the farm's."""
    for key in [k for k in os.environ if k.startswith("ROCM_")]:
        monkeypatch.delenv(key)
    for key in ("DOCKER_HOST", "DOCKER_CONTEXT", "PUBLISHED_INPUTS", "GPU_ARCH", "RUN_ID"):
        monkeypatch.delenv(key, raising=False)
    for key, value in farm.env.items():
        monkeypatch.setenv(key, value)
    overrides = {
        "run_coordinator": {
            "module": "rocm_assets.instance.coordinator",
            "class": "PlacementRunCoordinator",
            "config": {"probe_nodes": False, "dequeue_interval_seconds": 1, **config},
        },
    }
    target = ModuleTarget(
        module_name=DEFINITIONS,
        attribute=None,
        working_directory=str(PROJECT_ROOT),
        location_name=LOCATION,
    )
    with instance_for_test(temp_dir=str(farm.home), overrides=overrides) as instance:
        with create_test_daemon_workspace_context(target, instance) as workspace:
            yield instance, workspace


def submit_build(
    instance: dg.DagsterInstance,
    workspace: WorkspaceProcessContext,
    target: str,
    partition: str | None,
) -> str:
    """A run of one asset (partition) submitted to the coordinator, as the UI's Materialize
    button makes it; the run id."""
    request = workspace.create_request_context()
    location = request.get_code_location(LOCATION)
    repository = location.get_repository(SINGLETON_REPOSITORY_NAME)
    key = dg.AssetKey(target)
    remote_job = location.get_job(
        JobSubsetSelector(LOCATION, SINGLETON_REPOSITORY_NAME, ASSET_JOB, None, [key], None)
    )
    plan = location.get_execution_plan(
        remote_job, {}, step_keys_to_execute=None, known_state=None, instance=instance
    ).execution_plan_snapshot
    run = instance.create_run(
        job_name=ASSET_JOB,
        run_id=None,
        run_config={},
        status=None,
        tags={**remote_job.tags, **({"dagster/partition": partition} if partition else {})},
        root_run_id=None,
        parent_run_id=None,
        step_keys_to_execute=None,
        execution_plan_snapshot=plan,
        job_snapshot=remote_job.job_snapshot,
        parent_job_snapshot=remote_job.parent_job_snapshot,
        asset_selection=frozenset({key}),
        asset_check_selection=None,
        resolved_op_selection=None,
        op_selection=None,
        remote_job_origin=remote_job.get_remote_origin(),
        job_code_origin=remote_job.get_python_origin(),
        asset_graph=repository.asset_graph,
    )
    instance.submit_run(run.run_id, request)
    return run.run_id


def daemon_iteration(workspace: WorkspaceProcessContext) -> None:
    """One iteration of the queued-run daemon: the coordinator's tick, then its launches."""
    list(QueuedRunCoordinatorDaemon(interval_seconds=1).run_iteration(workspace))


def daemon_until(
    workspace: WorkspaceProcessContext,
    condition: Callable[[], bool],
    what: str,
    *,
    timeout_s: float = HANG_GUARD_S,
    every_s: float = 1.0,
) -> float:
    """Iterate the daemon every `every_s` (its dequeue interval here) until `condition` holds
    after an iteration; the monotonic time it first held. Fails naming `what` on timeout."""
    deadline = time.monotonic() + timeout_s
    while True:
        daemon_iteration(workspace)
        if condition():
            return time.monotonic()
        assert time.monotonic() < deadline, f"{what} did not happen within {timeout_s:g} s"
        time.sleep(every_s)


def run_log(instance: dg.DagsterInstance, run_id: str) -> str:
    """The run's event log as text: each event's message, and each step failure's error."""
    lines = []
    for entry in instance.all_logs(run_id):
        lines.append(f"{entry.dagster_event_type}: {entry.message}")
        event = entry.dagster_event
        if event is not None and event.event_type == dg.DagsterEventType.STEP_FAILURE:
            lines.append(event.step_failure_data.error.to_string())
    return "\n".join(lines)


def run_records(builders: Builders, builder: str, run_id: str) -> list[HistoryRecord]:
    """The builder's BuildKit history records of one run (its id ends each name), newest first."""
    return [r for r in builders.history(builder, BUILD_PREFIX) if r.name.endswith(f"/{run_id}")]


def status(instance: dg.DagsterInstance, run_id: str) -> dg.DagsterRunStatus:
    run = instance.get_run_by_id(run_id)
    assert run is not None
    return run.status
