"""The farm as its supervisor runs it, for the fault tests: a code server, the real daemon, builds.

The shape of deploy/docker-compose.yaml on one machine: a Dagster home (SQLite, or PostgreSQL)
with rocm-assets' coordinator and run monitoring, the code location served by its own
`dagster code-server start` (so every run worker is the code server's child, never the
daemon's), and the real `dagster-daemon run` over a workspace that points at that server. The
daemon can be SIGKILLed and started again as a supervisor (docker's `restart:`, systemd's
`Restart=`) would. The test process submits and terminates runs through the same code server,
as the webserver does (GraphQL's `terminateRun` is the UI's Terminate button).

Every process is started in a session of its own with its output in `logs/NAME.log`, and is
stopped by its process group when the test ends.
"""

import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dagster as dg
import yaml
from dagster._core.definitions.repository_definition.valid_definitions import (
    SINGLETON_REPOSITORY_NAME,
)
from dagster._core.definitions.selector import JobSubsetSelector
from dagster._core.errors import DagsterUserCodeUnreachableError
from dagster._core.instance.ref import InstanceRef
from dagster._core.workspace.context import BaseWorkspaceRequestContext, WorkspaceProcessContext
from dagster._core.workspace.load_target import WorkspaceFileTarget
from dagster._grpc.client import DagsterGrpcClient
from dagster_graphql.test.utils import execute_dagster_graphql

from rocm_assets.core.build.invocation import HistoryRecord
from rocm_assets.core.common.constants import ROCM_BUILD_TAG, ROCM_BUILDER_TAG, ROCM_FANOUT_TAG
from rocm_assets.instance import claims
from rocm_assets_tests.helpers import PROJECT_ROOT, free_port, wait_until, write_fleet
from rocm_assets_tests.servers.dockerd import Builders
from rocm_assets_tests.servers.netns import HostRegistry
from rocm_assets_tests.servers.registry import RegistryServer

LOCATION = "rocm_assets"
ASSET_JOB = "__ASSET_JOB"
BUILD_PREFIX = "rocm-pytorch-build/"
_START_GUARD_S = 180.0
_STOP_TIMEOUT_S = 30.0
_LOG_TAIL_LINES = 15
# The coordinator's engine event on a run it placed (rocm_assets.instance.placer).
_PLACED = re.compile(r"placed \S+ on (\S+) \(builder ")
_TERMINATE = """
mutation Terminate($runId: String!) {
  terminateRun(runId: $runId) {
    __typename
    ... on TerminateRunFailure { message }
    ... on PythonError { message }
  }
}
"""


@dataclass
class DaemonFarm:
    """One test's farm: the environment its processes run in, its files and its builders."""

    root: Path
    env: dict[str, str]
    home: Path
    workspace: Path
    fleet_file: Path
    bake_file: Path
    builders: Builders
    logs: Path
    port: int
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def start(self, name: str, *argv: str) -> subprocess.Popen[bytes]:
        """`python -m ARGV` in the farm's environment, in a session of its own, logged."""
        with (self.logs / f"{name}.log").open("ab") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", *argv],
                cwd=PROJECT_ROOT,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.processes[name] = process
        return process

    def start_daemon(self, name: str = "daemon") -> subprocess.Popen[bytes]:
        return self.start(name, "dagster._daemon", "run", "-w", str(self.workspace))

    def log(self, name: str) -> str:
        path = self.logs / f"{name}.log"
        return path.read_text(errors="replace") if path.is_file() else ""

    def logs_tail(self) -> str:
        return "\n".join(
            f"--- {p.name}\n"
            + "\n".join(p.read_text(errors="replace").splitlines()[-_LOG_TAIL_LINES:])
            for p in sorted(self.logs.glob("*.log"))
        )

    def set_nodes(self, nodes: Mapping[str, str]) -> None:
        """Rewrite fleet.yaml with `nodes` (name -> builder), as an operator edits it."""
        _write_fleet(self.fleet_file, nodes, {})


def stop(process: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> None:
    """Signal the process's group, then SIGKILL the group if it has not ended in time."""
    if process.poll() is not None:
        return
    try:
        os.killpg(process.pid, sig)
        process.wait(timeout=_STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    except ProcessLookupError:
        process.wait()


def _write_fleet(path: Path, nodes: Mapping[str, str], ssh: Mapping[str, str]) -> None:
    write_fleet(
        path,
        [
            {"name": name, "builder": builder, **({"ssh": ssh[name]} if name in ssh else {})}
            for name, builder in nodes.items()
        ],
        {"reference": {"cores": 8, "mem_gb": 16}},
        cores=8,
        mem_gb=16,
        link_mbps=1000,
    )


def make_daemon_farm(
    root: Path,
    builders: Builders,
    registry: RegistryServer | HostRegistry,
    bake_file: Path,
    nodes: Mapping[str, str],
    *,
    ssh: Mapping[str, str] | None = None,
    storage: Mapping[str, Any] | None = None,
    coordinator: Mapping[str, Any] | None = None,
    **env: str,
) -> DaemonFarm:
    """A farm of nodes (name -> builder) of equal figures, probed over `ssh` (name -> address)
    where given, a Dagster home, a workspace pointing at a code server on a free port, and a
    registry prefix of its own; `coordinator` adds to the coordinator's config, `env` to the
    processes' environment (HOLD_S, ...)."""
    root.mkdir(parents=True, exist_ok=True)
    fleet_file = root / "fleet.yaml"
    _write_fleet(fleet_file, nodes, ssh or {})
    home = root / "home"
    home.mkdir()
    config: dict[str, Any] = {
        "run_coordinator": {
            "module": "rocm_assets.instance.coordinator",
            "class": "PlacementRunCoordinator",
            "config": {
                # Named here, not only in the environment: the test process submits too.
                "bake_file": str(bake_file),
                "fleet_file": str(fleet_file),
                "max_concurrent_runs": 25,
                "dequeue_interval_seconds": 1,
                "probe_nodes": False,
                **(coordinator or {}),
            },
        },
        "run_monitoring": {
            "enabled": True,
            "start_timeout_seconds": 300,
            "poll_interval_seconds": 5,
            "free_slots_after_run_end_seconds": 5,
        },
        "telemetry": {"enabled": False},
    }
    if storage is not None:
        config["storage"] = dict(storage)
    (home / "dagster.yaml").write_text(yaml.safe_dump(config))
    port = free_port()
    workspace = root / "workspace.yaml"
    workspace.write_text(
        yaml.safe_dump(
            {
                "load_from": [
                    {"grpc_server": {"host": "127.0.0.1", "port": port, "location_name": LOCATION}}
                ]
            }
        )
    )
    farm_env = {
        k: v
        for k, v in builders.env.items()
        if not k.startswith(("ROCM_", "DAGSTER_"))
        and k not in ("PUBLISHED_INPUTS", "GPU_ARCH", "RUN_ID")
    }
    farm_env.update(
        PATH=os.pathsep.join([str(Path(sys.executable).parent), farm_env["PATH"]]),
        PYTHONPATH=os.pathsep.join(p for p in [str(PROJECT_ROOT), farm_env.get("PYTHONPATH")] if p),
        DAGSTER_HOME=str(home),
        ROCM_BAKE_FILE=str(bake_file),
        ROCM_FLEET_FILE=str(fleet_file),
        ROCM_REGISTRY_URL=registry.url,
        REGISTRY=f"{registry.host}/{_repo(registry)}",
        # Only the test's own requests build: the rebuild automation would add the rest.
        ROCM_AUTOMATION="off",
    )
    farm_env.update(env)
    logs = root / "logs"
    logs.mkdir()
    return DaemonFarm(root, farm_env, home, workspace, fleet_file, bake_file, builders, logs, port)


def _repo(registry: RegistryServer | HostRegistry) -> str:
    if isinstance(registry, RegistryServer):
        return registry.new_repo("faults")
    return f"faults-{uuid.uuid4().hex[:8]}"


@contextmanager
def open_instance(farm: DaemonFarm) -> Iterator[dg.DagsterInstance]:
    with dg.DagsterInstance.from_ref(InstanceRef.from_dir(str(farm.home))) as instance:
        yield instance


def daemon_beat(instance: dg.DagsterInstance) -> float:
    """When the queued-run daemon last beat (epoch s), 0 if never."""
    beat = instance.get_daemon_heartbeats().get("QUEUED_RUN_COORDINATOR")
    return beat.timestamp if beat is not None else 0.0


@contextmanager
def running_farm(farm: DaemonFarm) -> Iterator[tuple[dg.DagsterInstance, WorkspaceProcessContext]]:
    """The farm's storage created, its code server and daemon up (first heartbeat seen), and a
    workspace on the same code server for the test to submit through; everything stopped after."""
    # Create the storage before anything else opens it: SQLite's first migration is not safe
    # against processes initialising the same new files at once.
    with open_instance(farm):
        pass
    farm.start(
        "code-server",
        "dagster",
        "code-server",
        "start",
        "-m",
        "rocm_assets.definitions",
        "-h",
        "127.0.0.1",
        "-p",
        str(farm.port),
        "--location-name",
        LOCATION,
    )
    try:
        client = DagsterGrpcClient(port=farm.port, host="127.0.0.1")
        wait_until(
            lambda: _serves(client),
            f"the code server to load the code location\n{farm.logs_tail()}",
            timeout_s=_START_GUARD_S,
            poll_s=0.5,
        )
        with open_instance(farm) as instance:
            daemon = farm.start_daemon()
            wait_until(
                lambda: daemon.poll() is None and daemon_beat(instance) > 0,
                f"the daemon's first heartbeat\n{farm.logs_tail()}",
                timeout_s=_START_GUARD_S,
                poll_s=0.5,
            )
            with WorkspaceProcessContext(
                instance, WorkspaceFileTarget([str(farm.workspace)])
            ) as ws:
                yield instance, ws
    finally:
        for process in reversed(list(farm.processes.values())):
            stop(process)


def _serves(client: DagsterGrpcClient) -> bool:
    try:
        client.list_repositories()
    except DagsterUserCodeUnreachableError:
        return False
    return True


def submit(
    instance: dg.DagsterInstance,
    workspace: WorkspaceProcessContext,
    job_name: str = ASSET_JOB,
    *,
    target: str | None = None,
    partition: str | None = None,
) -> str:
    """A run submitted to the instance's coordinator as the UI's Materialize (of one asset
    `target`) or Launch (of a job) makes it; the run id."""
    request = workspace.create_request_context()
    location = request.get_code_location(LOCATION)
    repository = location.get_repository(SINGLETON_REPOSITORY_NAME)
    keys = [dg.AssetKey(target)] if target else None
    remote_job = location.get_job(
        JobSubsetSelector(LOCATION, SINGLETON_REPOSITORY_NAME, job_name, None, keys, None)
    )
    plan = location.get_execution_plan(
        remote_job, {}, step_keys_to_execute=None, known_state=None, instance=instance
    ).execution_plan_snapshot
    run = instance.create_run(
        job_name=job_name,
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
        asset_selection=frozenset(keys) if keys else None,
        asset_check_selection=None,
        resolved_op_selection=None,
        op_selection=None,
        remote_job_origin=remote_job.get_remote_origin(),
        job_code_origin=remote_job.get_python_origin(),
        asset_graph=repository.asset_graph,
    )
    instance.submit_run(run.run_id, request)
    return run.run_id


def terminate_from_ui(request: BaseWorkspaceRequestContext, run_id: str) -> str:
    """The UI's Terminate button: GraphQL `terminateRun`; its result's type (or its message)."""
    result = execute_dagster_graphql(request, _TERMINATE, {"runId": run_id})  # type: ignore[arg-type]
    assert not result.errors, result.errors
    answer = result.data["terminateRun"]
    return answer.get("message") or answer["__typename"]


def build_runs(instance: dg.DagsterInstance) -> list[dg.DagsterRun]:
    """Every run that makes a build (not a fanned-out request's own run)."""
    return [
        r
        for r in instance.get_runs()
        if r.tags.get(ROCM_BUILD_TAG) and r.tags.get(ROCM_FANOUT_TAG) != "parent"
    ]


def history_name(run: dg.DagsterRun) -> str:
    """The BuildKit history name of a build run's bake."""
    target, _, arch = run.tags[ROCM_BUILD_TAG].partition("@")
    return f"{BUILD_PREFIX}{target}/{arch or 'noarch'}/{run.run_id}"


def records_by_name(
    farm: DaemonFarm, builders: list[str]
) -> dict[str, list[tuple[str, HistoryRecord]]]:
    """Every farm build record on `builders`, by name: (builder, record) for each."""
    found: dict[str, list[tuple[str, HistoryRecord]]] = {}
    for builder in builders:
        for record in farm.builders.history(builder, BUILD_PREFIX):
            found.setdefault(record.name, []).append((builder, record))
    return found


def placement(instance: dg.DagsterInstance, run_id: str) -> tuple[float, str] | None:
    """When (epoch s) and on which node the coordinator placed the run: its engine event."""
    for entry in instance.all_logs(run_id, of_type=dg.DagsterEventType.ENGINE_EVENT):
        placed = _PLACED.match(entry.message or "")
        if placed:
            return entry.timestamp, placed.group(1)
    return None


def assert_each_success_baked_once(
    farm: DaemonFarm, runs: list[dg.DagsterRun], builders: list[str]
) -> None:
    """Each successful build run baked exactly once, on the builder it held, and BuildKit
    completed it: nothing published was built (or pushed) twice."""
    records = records_by_name(farm, builders)
    for run in runs:
        if run.status != dg.DagsterRunStatus.SUCCESS:
            continue
        found = [(b, r.status) for b, r in records.get(history_name(run), [])]
        assert found == [(run.tags[ROCM_BUILDER_TAG], "Completed")], (run.run_id, found)


def assert_nothing_held(instance: dg.DagsterInstance) -> None:
    """Every run ended, and none holds a builder claim or a lease."""
    runs = instance.get_runs()
    assert [r.run_id for r in runs if not r.is_finished] == []
    assert claims.claims(instance) == {}
    assert claims.leases(instance, [r.run_id for r in runs]) == {}


def wait_for_runs(
    instance: dg.DagsterInstance, farm: DaemonFarm, count: int, timeout_s: float
) -> float:
    """Wait until `count` build runs exist and every run has ended; the seconds it took."""
    started = time.monotonic()

    def settled() -> bool:
        runs = instance.get_runs()
        return len(build_runs(instance)) >= count and all(r.is_finished for r in runs)

    wait_until(settled, f"every run ended\n{farm.logs_tail()}", timeout_s=timeout_s, poll_s=1.0)
    return time.monotonic() - started
