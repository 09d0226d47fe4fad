"""Materializing bake assets through Dagster: one bake per asset partition, recorded, cancellable.

Real parts, in every test: Dagster itself (the `dagster asset materialize` CLI as a subprocess of
this repository, or a persistent SQLite instance with the default QueuedRunCoordinator whose run
is dequeued by the real QueuedRunCoordinatorDaemon and launched by the DefaultRunLauncher through
a gRPC code server into a run-worker process), the project's code location
`rocm_assets.definitions` as shipped, and Debian's docker-registry (`registry_server`), which the
in-run preflight reads. Fleets have no `ssh`, so no node is probed.

Stood in for: buildx only. The `docker` first on PATH is rocm_assets_tests/shim/docker, either
recording (no engine: it records argv and env as JSON, writes the metadata keys bake writes, or
hangs until signalled) or, in the tests marked `real`, building for real with BuildKit on the
session's dockerd (Debian docker.io, vfs) and pushing to the registry.
"""

import json
import os
import shlex
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

import dagster as dg
import httpx
import pytest
from dagster._core.definitions.repository_definition.valid_definitions import (
    SINGLETON_REPOSITORY_NAME,
)
from dagster._core.test_utils import create_test_daemon_workspace_context
from dagster._core.workspace.context import WorkspaceProcessContext
from dagster._core.workspace.load_target import ModuleTarget
from dagster._daemon.run_coordinator.queued_run_coordinator_daemon import QueuedRunCoordinatorDaemon

from rocm_assets.core.bake import load_graph
from rocm_assets.core.constants import ROCM_MAX_JOBS_TAG, ROCM_NODE_TAG
from rocm_assets_tests.helpers import alive
from rocm_assets_tests.servers.dockerd import (
    E2E_BAKE_FILE,
    PROJECT_ROOT,
    SHIM_BUILDER,
    DockerShim,
    RecordingShim,
)
from rocm_assets_tests.servers.registry import RegistryServer

DEFINITIONS = "rocm_assets.definitions"
LOCATION = "rocm_assets"
SHIPPED_BAKE_FILE = PROJECT_ROOT / "rocm-bake.hcl"
NODE = "node-a"
# node-a has 8 cores and 12 GB: 2 GB a job gives 6, under the core cap.
MAX_JOBS = 6
ARCH = "gfx942"
E2E_TARGETS = ("base", "tool-wheel", "lib", "app-wheel")
E2E_DEPS = {"lib": ("base", "tool-wheel"), "app-wheel": ("lib",)}
# Characters a shell would act on: each must reach bake as one literal value.
TRICKY = "a b;$(touch pwned)|&'\"`x` *"
ACCEPT = ", ".join(
    [
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.oci.image.index.v1+json",
        "application/vnd.docker.distribution.manifest.v2+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
    ]
)
# Guards against a hung run, not timings: vfs builds of the e2e images take seconds each.
HANG_GUARD_S = 600.0


@dataclass(frozen=True)
class Farm:
    """One test's farm: the environment Dagster runs in, its instance home and registry prefix."""

    env: dict[str, str]
    home: Path
    registry: RegistryServer
    prefix: str

    @property
    def registry_var(self) -> str:
        return f"{self.registry.host}/{self.prefix}"

    def digest(self, ref: str) -> str | None:
        """The registry's digest for a pushed `host/repo:tag`, or None when it has no such tag."""
        repo, _, tag = ref.removeprefix(f"{self.registry.host}/").rpartition(":")
        head = httpx.head(
            f"{self.registry.url}/v2/{repo}/manifests/{tag}",
            headers={"Accept": ACCEPT},
            trust_env=False,
        )
        if head.status_code == 404:
            return None
        head.raise_for_status()
        return head.headers["Docker-Content-Digest"]


def make_farm(
    base_env: Mapping[str, str],
    tmp_path: Path,
    registry: RegistryServer,
    *,
    builder: str,
    bake_file: Path | None,
) -> Farm:
    """A fleet of one unprobed node, a fresh Dagster home, and a registry prefix of its own."""
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(
        textwrap.dedent(
            f"""\
            nodes:
              - name: {NODE}
                builder: {builder}
                cores: 8
                mem_gb: 12
                link_mbps: 1000
            target_costs:
              reference: {{cores: 8, mem_gb: 12}}
            """
        )
    )
    home = tmp_path / "dagster-home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    # The registry is shared by the session: each test pushes under a path of its own.
    prefix = registry.new_repo("materialize")
    # The shim's settings stay; the caller's own farm settings (bake file, registry) do not.
    env = {
        k: v for k, v in base_env.items() if not k.startswith("ROCM_") or k.startswith("ROCM_SHIM_")
    }
    env.update(
        DAGSTER_HOME=str(home),
        ROCM_FLEET_FILE=str(fleet),
        ROCM_SHIM_BUILDERS=builder,
        REGISTRY=f"{registry.host}/{prefix}",
        ROCM_REGISTRY_URL=registry.url,
    )
    if bake_file is not None:
        env["ROCM_BAKE_FILE"] = str(bake_file)
    return Farm(env, home, registry, prefix)


def materialize_cli(env: Mapping[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """The real CLI, run from the repository root as a user would."""
    return subprocess.run(
        [sys.executable, "-m", "dagster", "asset", "materialize", "-m", DEFINITIONS, *args],
        env=dict(env),
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
        check=False,
    )


@contextmanager
def open_instance(home: Path) -> Iterator[dg.DagsterInstance]:
    with dg.DagsterInstance.from_config(str(home)) as instance:
        yield instance


def run_events(
    instance: dg.DagsterInstance, run_id: str, kind: dg.DagsterEventType
) -> list[dg.EventLogEntry]:
    return list(instance.all_logs(run_id, of_type=kind))


def materializations(
    instance: dg.DagsterInstance, run_id: str
) -> dict[str, dg.AssetMaterialization]:
    """The run's materializations by asset key; each asset at most once."""
    found: dict[str, dg.AssetMaterialization] = {}
    for entry in run_events(instance, run_id, dg.DagsterEventType.ASSET_MATERIALIZATION):
        materialization = entry.asset_materialization
        assert materialization is not None
        key = materialization.asset_key.to_user_string()
        assert key not in found, f"{key} materialized twice"
        found[key] = materialization
    return found


def run_log(instance: dg.DagsterInstance, run_id: str) -> str:
    """The run's event log as text: each event's message, and each step failure's error."""
    lines = []
    for entry in instance.all_logs(run_id):
        lines.append(f"{entry.dagster_event_type}: {entry.message}")
        event = entry.dagster_event
        if event is not None and event.event_type == dg.DagsterEventType.STEP_FAILURE:
            lines.append(event.step_failure_data.error.to_string())
    return "\n".join(lines)


def shim_history(state_dir: Path) -> dict[str, dict]:
    """The shim's BuildKit history records by name; a record's last line is its final state."""
    records: dict[str, dict] = {}
    for line in (state_dir / "history.jsonl").read_text().splitlines():
        record = json.loads(line)
        records[record["name"]] = record
    return records


def build_name(target: str, run_id: str) -> str:
    return f"rocm-pytorch-build/{target}/{'noarch' if target == 'tool-wheel' else ARCH}/{run_id}"


# ##### QUEUED RUNS


def workspace_target() -> ModuleTarget:
    """The code location as the shipped workspace.yaml loads it (bake file from ROCM_BAKE_FILE)."""
    return ModuleTarget(
        module_name=DEFINITIONS,
        attribute=None,
        working_directory=str(PROJECT_ROOT),
        location_name=LOCATION,
    )


def submit_run(
    instance: dg.DagsterInstance,
    workspace: WorkspaceProcessContext,
    job_name: str,
    tags: Mapping[str, str],
) -> str:
    """Create a run of `job_name` and submit it to the instance's coordinator.

    What `dagster job launch` does, against the daemon's own workspace rather than a second one.
    """
    request = workspace.create_request_context()
    location = request.get_code_location(LOCATION)
    repository = location.get_repository(SINGLETON_REPOSITORY_NAME)
    remote_job = repository.get_full_job(job_name)
    plan = location.get_execution_plan(
        remote_job, {}, step_keys_to_execute=None, known_state=None, instance=instance
    ).execution_plan_snapshot
    run = instance.create_run(
        job_name=job_name,
        run_id=None,
        run_config={},
        status=None,
        tags={**remote_job.tags, **tags},
        root_run_id=None,
        parent_run_id=None,
        step_keys_to_execute=plan.step_keys_to_execute,
        execution_plan_snapshot=plan,
        job_snapshot=remote_job.job_snapshot,
        parent_job_snapshot=remote_job.parent_job_snapshot,
        asset_selection=None,
        asset_check_selection=None,
        resolved_op_selection=None,
        op_selection=None,
        remote_job_origin=remote_job.get_remote_origin(),
        job_code_origin=remote_job.get_python_origin(),
        asset_graph=repository.asset_graph,
    )
    instance.submit_run(run.run_id, request)
    return run.run_id


def dequeue(instance: dg.DagsterInstance, workspace: WorkspaceProcessContext, run_id: str) -> None:
    """One iteration of the queued-run daemon: it launches the run with the DefaultRunLauncher."""
    assert isinstance(instance.run_coordinator, dg.QueuedRunCoordinator)
    assert isinstance(instance.run_launcher, dg.DefaultRunLauncher)
    queued = instance.get_run_by_id(run_id)
    assert queued is not None
    assert queued.status == dg.DagsterRunStatus.QUEUED
    list(QueuedRunCoordinatorDaemon(interval_seconds=1).run_iteration(workspace))
    launched = instance.get_run_by_id(run_id)
    assert launched is not None
    assert launched.status != dg.DagsterRunStatus.QUEUED, run_log(instance, run_id)


def wait_for_end(instance: dg.DagsterInstance, run_id: str) -> dg.DagsterRun:
    deadline = time.monotonic() + HANG_GUARD_S
    while True:
        run = instance.get_run_by_id(run_id)
        assert run is not None
        if run.is_finished:
            return run
        assert time.monotonic() < deadline, f"run {run_id} still {run.status}"
        time.sleep(0.2)


@contextmanager
def queued_instance(
    farm: Farm, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[dg.DagsterInstance, WorkspaceProcessContext]]:
    """A persistent instance with the default coordinator and launcher, and the daemon's workspace.

    The code server, and the run workers it starts, inherit this process's environment.
    """
    for key in [k for k in os.environ if k.startswith("ROCM_")]:
        monkeypatch.delenv(key)
    for key, value in farm.env.items():
        monkeypatch.setenv(key, value)
    with dg.instance_for_test(temp_dir=str(farm.home)) as instance:
        with create_test_daemon_workspace_context(workspace_target(), instance) as workspace:
            yield instance, workspace


def bake_processes(run_id: str) -> list[int]:
    """Live processes whose command line is a bake of this run: its history name holds the id."""
    marker = run_id.encode()
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(b".args.BUILDKIT_BUILD_NAME=" in a and marker in a for a in argv):
            if alive(int(proc.name)):
                found.append(int(proc.name))
    return found


# ##### DONE WHEN


def test_cli_materialize_bakes_exactly_vllm_wheel_for_the_partition(
    docker_shim_record: RecordingShim, registry_server: RegistryServer, tmp_path: Path
) -> None:
    farm = make_farm(
        docker_shim_record.env, tmp_path, registry_server, builder="builder-a", bake_file=None
    )
    passed = {
        "SCCACHE_LOG": "debug sccache=trace",
        "CACHE_TAG_SUFFIX": TRICKY,
        "SDE_MIRROR": "http://mirror a/b?c=1&d=2",
        "SDE_EMPTY": "",
    }
    env = {**farm.env, **passed, "UNRELATED": "not part of the build environment"}
    # The one input bake pulls for vllm-wheel is in the registry, so the preflight passes.
    [needed] = load_graph(SHIPPED_BAKE_FILE, env).published_inputs("vllm-wheel", ARCH)
    assert needed.producer == "vllm"
    repo, _, tag = needed.ref.removeprefix(f"{registry_server.host}/").rpartition(":")
    assert repo == f"{farm.prefix}/rocm-pytorch/vllm"
    registry_server.push_image(repo, tag)

    done = materialize_cli(env, "--select", "vllm-wheel", "--partition", ARCH)
    assert done.returncode == 0, done.stdout + done.stderr

    with open_instance(farm.home) as instance:
        [run] = instance.get_runs()
        assert run.status == dg.DagsterRunStatus.SUCCESS, run_log(instance, run.run_id)
        found = materializations(instance, run.run_id)
    run_id = run.run_id
    assert run.tags[ROCM_NODE_TAG] == NODE
    assert run.tags[ROCM_MAX_JOBS_TAG] == str(MAX_JOBS)

    # Exactly one bake, of vllm-wheel only, with the argv and environment.
    [record] = docker_shim_record.records()
    metadata_file = record["argv"][8]
    assert record["argv"] == [
        "buildx", "bake", "-f", str(SHIPPED_BAKE_FILE), "--builder", "builder-a", "--push",
        "--metadata-file", metadata_file, "--progress=plain",
        "--set", f"vllm-wheel.args.BUILDKIT_BUILD_NAME={build_name('vllm-wheel', run_id)}",
        "--set", f"vllm-wheel.args.MAX_JOBS={MAX_JOBS}",
        "--", "vllm-wheel",
    ]  # fmt: skip
    assert Path(metadata_file).is_absolute()
    assert record["env"] == {"PUBLISHED_INPUTS": "1", "GPU_ARCH": ARCH, "RUN_ID": run_id, **passed}
    assert record["cwd"] == str(PROJECT_ROOT)
    assert not (PROJECT_ROOT / "pwned").exists()
    written = record["metadata"]["vllm-wheel"]

    # The materialization carries what the stand-in reported.
    assert set(found) == {"vllm-wheel"}
    materialization = found["vllm-wheel"]
    assert materialization.partition == ARCH
    metadata = {k: v.value for k, v in materialization.metadata.items()}
    assert metadata["history_ref"] == written["buildx.build.ref"]
    assert metadata["history_name"] == build_name("vllm-wheel", run_id)
    assert metadata["digest"] == written["containerimage.digest"]
    assert materialization.tags["dagster/data_version"] == written["containerimage.digest"]
    assert metadata["tags"] == written["image.name"].split(",")
    assert metadata["tags"] == list(load_graph(SHIPPED_BAKE_FILE, env).tags("vllm-wheel", ARCH))
    assert (metadata["node"], metadata["builder"]) == (NODE, "builder-a")
    assert (metadata["max_jobs"], metadata["run_id"]) == (MAX_JOBS, run_id)
    assert metadata["started_at"] <= metadata["finished_at"]
    # The command is copyable: a shell splits it into the farm's settings and the exact argv.
    words = shlex.split(metadata["command"])
    assert words[-len(record["argv"]) - 1 :] == ["docker", *record["argv"]]
    assert dict(w.split("=", 1) for w in words[: -len(record["argv"]) - 1]) == {
        **record["env"],
        "REGISTRY": farm.registry_var,
    }


# ##### END TO END WITH REAL BUILDS


def e2e_farm(docker_shim: DockerShim, registry: RegistryServer, tmp_path: Path) -> Farm:
    return make_farm(
        docker_shim.env, tmp_path, registry, builder=SHIM_BUILDER, bake_file=E2E_BAKE_FILE
    )


def assert_chain_published(
    instance: dg.DagsterInstance, run_id: str, farm: Farm, state_dir: Path
) -> None:
    """Each target baked once, in dependency order, one at a time; its digest is the registry's."""
    found = materializations(instance, run_id)
    assert set(found) == set(E2E_TARGETS), run_log(instance, run_id)
    # Bake evaluates the tags with the run's id; so does this check.
    graph = load_graph(E2E_BAKE_FILE, {**farm.env, "RUN_ID": run_id})
    history = shim_history(state_dir)
    log = run_log(instance, run_id)
    for target, materialization in found.items():
        metadata = {k: v.value for k, v in materialization.metadata.items()}
        digest = metadata["digest"]
        assert materialization.tags["dagster/data_version"] == digest
        assert materialization.partition == (None if target == "tool-wheel" else ARCH)
        assert (metadata["node"], metadata["builder"]) == (NODE, SHIM_BUILDER)
        assert metadata["tags"] == list(graph.tags(target, ARCH))
        assert all(t.startswith(f"{farm.registry_var}/e2e/") for t in metadata["tags"])
        for tag in metadata["tags"]:
            assert farm.digest(tag) == digest, tag
        # BuildKit's own output reached the run log.
        assert f"naming to {metadata['tags'][0]}" in log
        record = history[build_name(target, run_id)]
        assert (record["status"], record["ref"]) == ("Completed", metadata["history_ref"])
    ordered = sorted(history.values(), key=lambda r: r["created_at"])
    # Never two builds at once on the node: each starts after the previous one completed.
    for before, after in pairwise(ordered):
        assert before["completed_at"] <= after["created_at"]
    position = {r["name"]: i for i, r in enumerate(ordered)}
    for target, deps in E2E_DEPS.items():
        for dep in deps:
            assert position[build_name(dep, run_id)] < position[build_name(target, run_id)]


@pytest.mark.real
def test_e2e_chain_through_the_cli(
    docker_shim: DockerShim, registry_server: RegistryServer, tmp_path: Path
) -> None:
    farm = e2e_farm(docker_shim, registry_server, tmp_path)
    done = materialize_cli(farm.env, "--select", ",".join(E2E_TARGETS), "--partition", ARCH)
    assert done.returncode == 0, done.stdout + done.stderr
    with open_instance(farm.home) as instance:
        [run] = instance.get_runs()
        assert run.status == dg.DagsterRunStatus.SUCCESS, run_log(instance, run.run_id)
        assert run.tags[ROCM_NODE_TAG] == NODE
        assert_chain_published(instance, run.run_id, farm, docker_shim.state_dir)


@pytest.mark.real
def test_e2e_chain_through_a_queued_run(
    docker_shim: DockerShim,
    registry_server: RegistryServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    farm = e2e_farm(docker_shim, registry_server, tmp_path)
    with queued_instance(farm, monkeypatch) as (instance, workspace):
        # The bake file's default group, as the UI's job launchpad would submit it.
        run_id = submit_run(instance, workspace, "default", {"dagster/partition": ARCH})
        dequeue(instance, workspace, run_id)
        run = wait_for_end(instance, run_id)
        assert run.status == dg.DagsterRunStatus.SUCCESS, run_log(instance, run_id)
        assert run.tags[ROCM_NODE_TAG] == NODE
        assert_chain_published(instance, run_id, farm, docker_shim.state_dir)


@pytest.mark.real
def test_failing_build_fails_its_step_and_pushes_nothing(
    docker_shim: DockerShim, registry_server: RegistryServer, tmp_path: Path
) -> None:
    farm = e2e_farm(docker_shim, registry_server, tmp_path)
    # FAIL is a bake variable: non-empty makes tool-wheel's COPY name a missing file.
    done = materialize_cli({**farm.env, "FAIL": "1"}, "--select", "tool-wheel")
    assert done.returncode != 0
    with open_instance(farm.home) as instance:
        [run] = instance.get_runs()
        assert run.status == dg.DagsterRunStatus.FAILURE
        assert materializations(instance, run.run_id) == {}
        [failure] = run_events(instance, run.run_id, dg.DagsterEventType.STEP_FAILURE)
    assert failure.step_key == "tool_wheel"
    event = failure.dagster_event
    assert event is not None
    user_failure = event.step_failure_data.user_failure_data
    assert user_failure is not None
    metadata = {k: v.value for k, v in user_failure.metadata.items()}
    record = shim_history(docker_shim.state_dir)[build_name("tool-wheel", run.run_id)]
    assert record["status"] == "Error"
    assert metadata["history_ref"] == record["ref"]
    assert f"failed (exit 1); history ref {record['ref']}" in (user_failure.description or "")
    # The log tail names the failing step: the file FAIL asked for.
    assert "tool.txt.missing" in metadata["log_tail"]
    assert farm.digest(f"{farm.registry_var}/e2e/tool-wheel:1.0") is None


# ##### CANCELLATION


@pytest.mark.real
def test_cancelling_a_run_ends_its_bake(
    docker_shim_record: RecordingShim,
    registry_server: RegistryServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    farm = make_farm(
        {**docker_shim_record.env, "ROCM_SHIM_RECORD_MODE": "hang"},
        tmp_path,
        registry_server,
        builder=SHIM_BUILDER,
        bake_file=E2E_BAKE_FILE,
    )
    history = docker_shim_record.state_dir / "history.jsonl"
    with queued_instance(farm, monkeypatch) as (instance, workspace):
        run_id = submit_run(instance, workspace, "default", {"dagster/partition": ARCH})
        try:
            dequeue(instance, workspace, run_id)
            deadline = time.monotonic() + HANG_GUARD_S
            # The first bake prints a line, then hangs until signalled: the line reaches the
            # run log while bake still runs, not when it ends.
            while "recorded bake of" not in run_log(instance, run_id):
                run = instance.get_run_by_id(run_id)
                assert run is not None
                assert not run.is_finished, run_log(instance, run_id)
                assert time.monotonic() < deadline, "no bake output in the run log"
                time.sleep(0.1)
            [bake] = bake_processes(run_id)
            assert "Running" in history.read_text()

            assert instance.run_coordinator.cancel_run(run_id)
            run = wait_for_end(instance, run_id)
            assert run.status == dg.DagsterRunStatus.CANCELED, run_log(instance, run_id)
            # The run ended only after its bake had: no build of it keeps the node busy.
            assert not alive(bake)
            assert bake_processes(run_id) == []
        finally:
            # A failed check must not leave a hung bake behind.
            for pid in bake_processes(run_id):
                os.kill(pid, signal.SIGKILL)

    # One bake started (the first root the executor took); the rest of the run never did.
    [record] = docker_shim_record.records()
    target = record["argv"][-1]
    assert target in ("base", "tool-wheel")
    assert record["env"]["RUN_ID"] == run_id
    # bake got SIGTERM and ended its build itself, as buildx does when cancelled.
    states = {n: r["status"] for n, r in shim_history(docker_shim_record.state_dir).items()}
    assert states == {build_name(target, run_id): "Canceled"}
