"""Materializing bake assets through Dagster: one real bake per asset partition, cancellable.

Real, in every test: Dagster (the `dagster asset materialize` CLI as a subprocess of this
repository, or a persistent SQLite instance with the default QueuedRunCoordinator whose run is
dequeued by the real QueuedRunCoordinatorDaemon and launched by the DefaultRunLauncher through a
gRPC code server into a run-worker process), the project's code location `rocm_assets.definitions`
as shipped, and every build: Debian's `docker buildx bake` (buildx 0.29) on Debian 13's dockerd 26,
reached through the docker context that is the fleet node's builder, pushing to Debian's
docker-registry, which the in-run preflight reads too. The bake file is the e2e farm
(rocm_assets_tests/fixtures/e2e: FROM scratch plus Debian's static busybox), or a copy of it with
one more target. What a test says about a build it reads from that build's own artifacts: the
registry's digests and image labels, and BuildKit's history (`docker buildx history ls` and
`inspect`: the record's name, final state, times, build args and named contexts).

The UI-terminate test runs the farm as deployed instead (rocm_assets_tests/helpers/daemon_farm.py):
rocm-assets' placement coordinator, the real `dagster-daemon run`, its own code server, and the
UI's GraphQL `terminateRun`.

Stand-ins: none. The fleet's one node has no `ssh`, so it is not probed (MAX_JOBS comes from its
figures).
"""

import os
import re
import shlex
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
import pytest
from dagster._core.definitions.repository_definition.valid_definitions import (
    SINGLETON_REPOSITORY_NAME,
)
from dagster._core.test_utils import create_test_daemon_workspace_context
from dagster._core.workspace.context import WorkspaceProcessContext
from dagster._core.workspace.load_target import ModuleTarget
from dagster._daemon.run_coordinator.queued_run_coordinator_daemon import QueuedRunCoordinatorDaemon

from rocm_assets.core.bake import load_graph
from rocm_assets.core.build.invocation import HistoryRecord
from rocm_assets.core.common.constants import ROCM_BUILD_TAG, ROCM_MAX_JOBS_TAG, ROCM_NODE_TAG
from rocm_assets.instance import claims
from rocm_assets_tests.helpers import alive, wait_until
from rocm_assets_tests.helpers.daemon_farm import (
    assert_nothing_held,
    build_runs,
    make_daemon_farm,
    running_farm,
    submit,
    terminate_from_ui,
    wait_for_runs,
)
from rocm_assets_tests.servers.dockerd import (
    E2E_BAKE_FILE,
    E2E_BUILDER,
    PROJECT_ROOT,
    Builders,
    bake_push,
    copy_e2e,
    record_span,
)
from rocm_assets_tests.servers.registry import RegistryServer

DEFINITIONS = "rocm_assets.definitions"
LOCATION = "rocm_assets"
NODE = "node-a"
# node-a has 8 cores and 12 GB: 2 GB a job gives 6, under the core cap.
MAX_JOBS = 6
ARCH = "gfx942"
E2E_TARGETS = ("base", "tool-wheel", "lib", "app-wheel")
E2E_DEPS = {"lib": ("base", "tool-wheel"), "app-wheel": ("lib",)}
# Characters a shell would act on: each must reach bake as one literal value.
TRICKY = "a b;$(touch pwned)|&'\"`x` *"
# The farm's pass-through settings (build.PASSTHROUGH_VARS, SDE_*), as the caller sets them.
PASSED = {
    "SCCACHE_LOG": "debug sccache=trace",
    "CACHE_TAG_SUFFIX": TRICKY,
    "SDE_MIRROR": "http://mirror a/b?c=1&d=2",
    "SDE_EMPTY": "",
}
# app-wheel's build again, with the pass-through settings as build args: BuildKit's record of
# the build then shows what reached bake.
SETTINGS_TARGET = "app-settings"
SETTINGS_HCL = "".join(f'\nvariable "{name}" {{\n  default = ""\n}}\n' for name in PASSED) + (
    f'\ntarget "{SETTINGS_TARGET}" {{\n  inherits = ["app-wheel"]\n'
    f'  tags     = ["${{REGISTRY}}/e2e/{SETTINGS_TARGET}:${{GPU_ARCH}}"]\n'
    f"  args     = {{ {', '.join(f'{name} = {name}' for name in PASSED)} }}\n}}\n"
)
BUILD_PREFIX = "rocm-pytorch-build/"
# Guards against a hung run, not timings: vfs builds of the e2e images take seconds each.
HANG_GUARD_S = 600.0
# The cancelled build's hold: far longer than the test waits for it.
CANCEL_HOLD_S = "120"


@dataclass(frozen=True)
class Farm:
    """One test's farm: the environment Dagster runs in, its instance home and registry prefix."""

    env: dict[str, str]
    home: Path
    registry: RegistryServer
    builders: Builders
    bake_file: Path

    @property
    def registry_var(self) -> str:
        return self.env["REGISTRY"]


def make_farm(
    builders: Builders, tmp_path: Path, registry: RegistryServer, bake_file: Path = E2E_BAKE_FILE
) -> Farm:
    """A fleet of one unprobed node on the test's builder, a fresh Dagster home, and a registry
    prefix of its own (the registry and the engine are the session's)."""
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(
        textwrap.dedent(
            f"""\
            nodes:
              - name: {NODE}
                builder: {E2E_BUILDER}
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
    # The caller's own farm settings (bake file, registry, arch) do not leak in.
    env = {
        k: v
        for k, v in builders.env.items()
        if not k.startswith("ROCM_") and k not in ("PUBLISHED_INPUTS", "GPU_ARCH", "RUN_ID")
    }
    env.update(
        DAGSTER_HOME=str(home),
        ROCM_FLEET_FILE=str(fleet),
        ROCM_BAKE_FILE=str(bake_file),
        REGISTRY=f"{registry.host}/{registry.new_repo('materialize')}",
        ROCM_REGISTRY_URL=registry.url,
    )
    return Farm(env, home, registry, builders, bake_file)


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


def publish(farm: Farm, target: str) -> None:
    """`target` built and pushed outside Dagster: the input a later build finds in the registry."""
    bake_push(E2E_BUILDER, farm.bake_file, {**farm.env, "GPU_ARCH": ARCH}, target)


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


def build_name(target: str, run_id: str) -> str:
    return f"{BUILD_PREFIX}{target}/{'noarch' if target == 'tool-wheel' else ARCH}/{run_id}"


def records_of_run(builders: Builders, run_id: str) -> dict[str, HistoryRecord]:
    """The builder's history records of one Dagster run (its id ends each name), by name."""
    records = [r for r in builders.history(E2E_BUILDER, BUILD_PREFIX) if r.name.endswith(run_id)]
    by_name = {r.name: r for r in records}
    assert len(by_name) == len(records), f"a build of run {run_id} is recorded twice"
    return by_name


def build_args(builders: Builders, record: HistoryRecord) -> dict[str, str]:
    """The build args BuildKit recorded for a build (an empty value has no Value)."""
    inspected = builders.inspect(E2E_BUILDER, record.ref)
    return {a["Name"]: a.get("Value", "") for a in inspected.get("BuildArgs") or []}


def named_contexts(builders: Builders, record: HistoryRecord) -> list[dict]:
    return builders.inspect(E2E_BUILDER, record.ref).get("NamedContexts") or []


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
    for key in ("DOCKER_HOST", "DOCKER_CONTEXT", "PUBLISHED_INPUTS", "GPU_ARCH", "RUN_ID"):
        monkeypatch.delenv(key, raising=False)
    for key, value in farm.env.items():
        monkeypatch.setenv(key, value)
    with dg.instance_for_test(temp_dir=str(farm.home)) as instance:
        with create_test_daemon_workspace_context(workspace_target(), instance) as workspace:
            yield instance, workspace


def bake_processes(run_id: str) -> list[int]:
    """Live processes whose command line is a bake of this run (the docker CLI and the buildx
    plugin it runs): the build's history name holds the run id."""
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


def test_cli_materialize_bakes_exactly_the_target_for_the_partition(
    builders: Builders, registry_server: RegistryServer, tmp_path: Path
) -> None:
    bake_file = copy_e2e(tmp_path / "farm", extra=SETTINGS_HCL)
    farm = make_farm(builders, tmp_path, registry_server, bake_file)
    env = {**farm.env, **PASSED, "UNRELATED": "not part of the build environment"}
    # The one input bake pulls is in the registry, so the preflight passes: published from a
    # build outside Dagster.
    [needed] = load_graph(bake_file, env).published_inputs(SETTINGS_TARGET, ARCH)
    assert (needed.producer, needed.ref) == ("lib", f"{farm.registry_var}/e2e/lib:{ARCH}")
    publish(farm, "lib")
    input_digest = registry_server.digest(needed.ref)
    assert input_digest is not None
    before = {r.ref for r in builders.history(E2E_BUILDER)}

    done = materialize_cli(env, "--select", SETTINGS_TARGET, "--partition", ARCH)
    assert done.returncode == 0, done.stdout + done.stderr

    with open_instance(farm.home) as instance:
        [run] = instance.get_runs()
        assert run.status == dg.DagsterRunStatus.SUCCESS, run_log(instance, run.run_id)
        found = materializations(instance, run.run_id)
    run_id = run.run_id
    assert run.tags[ROCM_NODE_TAG] == NODE
    assert run.tags[ROCM_MAX_JOBS_TAG] == str(MAX_JOBS)

    # Exactly one build on the node: this target's, named for the run, with nothing linked in.
    [record] = [r for r in builders.history(E2E_BUILDER) if r.ref not in before]
    assert (record.name, record.status) == (build_name(SETTINGS_TARGET, run_id), "Completed")
    assert named_contexts(builders, record) == []
    # Every value reached the build literally: the input as its registry reference, MAX_JOBS
    # and RUN_ID from the run, and the caller's pass-through settings.
    assert build_args(builders, record) == {
        "BUILDKIT_BUILD_NAME": record.name,
        "LIB_IMAGE": needed.ref,
        "RUN_ID": run_id,
        "MAX_JOBS": str(MAX_JOBS),
        "HOLD_S": "0",
        **PASSED,
    }
    assert not (PROJECT_ROOT / "pwned").exists() and not (bake_file.parent / "pwned").exists()
    # The input was read, not rebuilt or pushed again.
    assert registry_server.digest(needed.ref) == input_digest

    assert set(found) == {SETTINGS_TARGET}
    materialization = found[SETTINGS_TARGET]
    assert materialization.partition == ARCH
    metadata = {k: v.value for k, v in materialization.metadata.items()}
    assert metadata["history_ref"] == record.ref
    assert metadata["history_name"] == record.name
    tags = list(load_graph(bake_file, {**env, "RUN_ID": run_id}).tags(SETTINGS_TARGET, ARCH))
    assert metadata["tags"] == tags == [f"{farm.registry_var}/e2e/{SETTINGS_TARGET}:{ARCH}"]
    # The digest, and the data version, are what the registry holds for the pushed tag.
    assert metadata["digest"] == registry_server.digest(tags[0])
    assert materialization.tags["dagster/data_version"] == metadata["digest"]
    labels = registry_server.image_config(tags[0])["config"]["Labels"]
    assert labels["org.rocm.e2e.run-id"] == run_id
    assert (metadata["node"], metadata["builder"]) == (NODE, E2E_BUILDER)
    assert (metadata["max_jobs"], metadata["run_id"]) == (MAX_JOBS, run_id)
    assert metadata["started_at"] <= metadata["finished_at"]
    # The command is copyable: a shell splits it into the farm's settings and the exact argv,
    # which reaches the node through its docker context.
    words = shlex.split(metadata["command"])
    argv = words[words.index("docker") :]
    metadata_file = argv[9]
    assert Path(metadata_file).is_absolute()
    assert argv == [
        "docker", "buildx", "bake", "-f", str(bake_file), "--builder", E2E_BUILDER, "--push",
        "--metadata-file", metadata_file, "--progress=plain",
        "--set", f"{SETTINGS_TARGET}.args.BUILDKIT_BUILD_NAME={record.name}",
        "--set", f"{SETTINGS_TARGET}.args.MAX_JOBS={MAX_JOBS}",
        "--", SETTINGS_TARGET,
    ]  # fmt: skip
    assert dict(w.split("=", 1) for w in words[: words.index("docker")]) == {
        "PUBLISHED_INPUTS": "1",
        "GPU_ARCH": ARCH,
        "RUN_ID": run_id,
        "DOCKER_CONTEXT": E2E_BUILDER,
        "REGISTRY": farm.registry_var,
        **PASSED,
    }


# ##### THE CHAIN, ONE BAKE PER ASSET


def assert_chain_published(instance: dg.DagsterInstance, run_id: str, farm: Farm) -> None:
    """Each target baked once, from its inputs in the registry, in dependency order, one at a
    time on the node; its digest is the registry's."""
    found = materializations(instance, run_id)
    assert set(found) == set(E2E_TARGETS), run_log(instance, run_id)
    # Bake evaluates the tags with the run's id; so does this check.
    graph = load_graph(E2E_BAKE_FILE, {**farm.env, "RUN_ID": run_id})
    records = records_of_run(farm.builders, run_id)
    assert set(records) == {build_name(t, run_id) for t in E2E_TARGETS}
    log = run_log(instance, run_id)
    for target, materialization in found.items():
        metadata = {k: v.value for k, v in materialization.metadata.items()}
        digest = metadata["digest"]
        assert materialization.tags["dagster/data_version"] == digest
        assert materialization.partition == (None if target == "tool-wheel" else ARCH)
        assert (metadata["node"], metadata["builder"]) == (NODE, E2E_BUILDER)
        assert metadata["tags"] == list(graph.tags(target, ARCH))
        assert all(t.startswith(f"{farm.registry_var}/e2e/") for t in metadata["tags"])
        for tag in metadata["tags"]:
            assert farm.registry.digest(tag) == digest, tag
        # BuildKit's own output reached the run log.
        assert f"naming to {metadata['tags'][0]}" in log
        record = records[build_name(target, run_id)]
        assert (record.status, record.ref) == ("Completed", metadata["history_ref"])
        # Its own bake: inputs as registry references, never a target: context rebuilt here.
        assert named_contexts(farm.builders, record) == []
    args = build_args(farm.builders, records[build_name("lib", run_id)])
    assert args["BASE_IMAGE"] == graph.tags("base", ARCH)[0]
    assert args["TOOL_IMAGE"] == graph.tags("tool-wheel", ARCH)[0]
    # Never two builds at once on the node, as its own history shows.
    assert farm.builders.overlaps(BUILD_PREFIX, set(records)) == []
    for target, deps in E2E_DEPS.items():
        started, _ = record_span(records[build_name(target, run_id)])
        for dep in deps:
            _, ended = record_span(records[build_name(dep, run_id)])
            assert ended <= started, f"{target} started before {dep} ended"


def test_e2e_chain_through_the_cli(
    builders: Builders, registry_server: RegistryServer, tmp_path: Path
) -> None:
    farm = make_farm(builders, tmp_path, registry_server)
    done = materialize_cli(farm.env, "--select", ",".join(E2E_TARGETS), "--partition", ARCH)
    assert done.returncode == 0, done.stdout + done.stderr
    with open_instance(farm.home) as instance:
        [run] = instance.get_runs()
        assert run.status == dg.DagsterRunStatus.SUCCESS, run_log(instance, run.run_id)
        assert run.tags[ROCM_NODE_TAG] == NODE
        assert_chain_published(instance, run.run_id, farm)


def test_e2e_chain_through_a_queued_run(
    builders: Builders,
    registry_server: RegistryServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    farm = make_farm(builders, tmp_path, registry_server)
    with queued_instance(farm, monkeypatch) as (instance, workspace):
        # The bake file's default group, as the UI's job launchpad would submit it.
        run_id = submit_run(instance, workspace, "default", {"dagster/partition": ARCH})
        dequeue(instance, workspace, run_id)
        run = wait_for_end(instance, run_id)
        assert run.status == dg.DagsterRunStatus.SUCCESS, run_log(instance, run_id)
        assert run.tags[ROCM_NODE_TAG] == NODE
        assert_chain_published(instance, run_id, farm)


def test_failing_build_fails_its_step_with_bakes_reason_and_pushes_nothing(
    builders: Builders, registry_server: RegistryServer, tmp_path: Path
) -> None:
    farm = make_farm(builders, tmp_path, registry_server)
    # FAIL is a bake variable: non-empty makes tool-wheel's RUN step exit 1.
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
    # BuildKit recorded the build as failed; the failure points at that record.
    record = records_of_run(builders, run.run_id)[build_name("tool-wheel", run.run_id)]
    assert record.status == "Error"
    assert metadata["history_ref"] == record.ref
    error = (
        'ERROR: failed to solve: process "/bin/busybox sh -c sleep \\"$HOLD_S\\" && test -z '
        '\\"$FAIL\\"" did not complete successfully: exit code: 1'
    )
    assert user_failure.description == (
        f"tool-wheel ({ARCH}) on {NODE}: bake of tool-wheel for {ARCH} on builder {E2E_BUILDER} "
        f"failed (exit 1): {error}; history ref {record.ref} (docker buildx history logs "
        f"{record.ref.rsplit('/', 1)[1]})"
    )
    # The log tail ends with bake's reason, naming the step that failed.
    assert error in metadata["log_tail"]
    assert registry_server.digest(f"{farm.registry_var}/e2e/tool-wheel:1.0") is None


# ##### A CHATTY BUILD


CHATTY_LINES = 100_000
# A build that prints CHATTY_LINES numbered lines in a few seconds: a thousand at a time, paced
# under the 200 KiB/s past which BuildKit clips a step's log. RUN_ID is in the step's
# environment, so every run's step is new to BuildKit's cache and prints them again.
CHATTY_SCRIPT = (
    f"echo run $RUN_ID; i=0; while [ $i -lt {CHATTY_LINES // 1000} ]; do "
    "seq $((i * 1000 + 1)) $((i * 1000 + 1000)); sleep 0.05; i=$((i + 1)); done"
)
CHATTY_DOCKERFILE = f"""\
FROM scratch
ARG RUN_ID
COPY busybox /bin/busybox
RUN --network=none ["/bin/busybox", "sh", "-c", "{CHATTY_SCRIPT}"]
"""
CHATTY_HCL = """
target "chatty" {
  context    = "."
  dockerfile = "chatty.Dockerfile"
  tags       = ["${REGISTRY}/e2e/chatty:${GPU_ARCH}"]
  args       = { RUN_ID = RUN_ID }
}
"""
# The run's whole event log for a 100k-line bake: Dagster's own records (21 for the step and its
# check) plus the bake's (6 steps and a summary), 28 in all. Sent as batches, it was 522.
CHATTY_MAX_EVENTS = 40
# `#6 0.104 35977`: one line the chatty step printed, in bake's plain progress.
NUMBERED = re.compile(r"^#\d+ \d+\.\d+ (\d+)$", re.MULTILINE)


def compute_log(instance: dg.DagsterInstance, run_id: str) -> str:
    """Everything the run's process wrote to stdout, as Dagster captured it."""
    [captured] = run_events(instance, run_id, dg.DagsterEventType.LOGS_CAPTURED)
    assert captured.dagster_event is not None
    file_key = captured.dagster_event.logs_captured_data.file_key
    manager = instance.compute_log_manager
    data = manager.get_log_data(manager.build_log_key_for_run(run_id, file_key))
    return (data.stdout or b"").decode()


def test_a_100k_line_bake_keeps_its_output_in_the_compute_log_not_the_event_log(
    builders: Builders, registry_server: RegistryServer, tmp_path: Path
) -> None:
    bake_file = copy_e2e(tmp_path / "farm", extra=CHATTY_HCL)
    (bake_file.parent / "chatty.Dockerfile").write_text(CHATTY_DOCKERFILE)
    farm = make_farm(builders, tmp_path, registry_server, bake_file)
    done = materialize_cli(farm.env, "--select", "chatty", "--partition", ARCH)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    with open_instance(farm.home) as instance:
        [run] = instance.get_runs()
        assert run.status == dg.DagsterRunStatus.SUCCESS, run_log(instance, run.run_id)
        records = instance.all_logs(run.run_id)
        stdout = compute_log(instance, run.run_id)
    # Every line bake printed is in the compute log, once and in order.
    printed = [int(n) for n in NUMBERED.findall(stdout)]
    assert printed == list(range(1, CHATTY_LINES + 1))
    # The event log holds a bounded digest: the steps, then one summary with the last lines.
    assert len(records) <= CHATTY_MAX_EVENTS, len(records)
    messages = [r.message for r in records]
    assert sum(len(NUMBERED.findall(m)) for m in messages) <= 40
    assert any(m.startswith("step #") and "RUN --network=none" in m for m in messages)
    [summary] = [m for m in messages if m.startswith("bake output: ")]
    total = len(stdout.splitlines())
    assert summary.startswith(f"bake output: {total:,} lines in ")
    assert "all of them in this step's compute log (stdout); the last 40:" in summary
    assert "naming to " in summary


# ##### CANCELLATION


def test_cancelling_a_run_cancels_its_build_on_the_node(
    builders: Builders,
    registry_server: RegistryServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    farm = make_farm(builders, tmp_path, registry_server)
    # Every build of the run holds the node far longer than the test waits.
    farm.env["HOLD_S"] = CANCEL_HOLD_S
    with queued_instance(farm, monkeypatch) as (instance, workspace):
        run_id = submit_run(instance, workspace, "default", {"dagster/partition": ARCH})
        try:
            dequeue(instance, workspace, run_id)
            # The first bake reaches its long RUN step; its output reaches the run log while
            # bake still runs, not when it ends.
            wait_until(
                lambda: f'sleep "{CANCEL_HOLD_S}"' in run_log(instance, run_id),
                "the held RUN step in the run log",
                timeout_s=HANG_GUARD_S,
            )
            bakes = bake_processes(run_id)
            assert bakes
            [record] = records_of_run(builders, run_id).values()
            assert record.status == "Running"

            assert instance.run_coordinator.cancel_run(run_id)
            run = wait_for_end(instance, run_id)
            assert run.status == dg.DagsterRunStatus.CANCELED, run_log(instance, run_id)
            # The run ended only after its bake had: no bake of it is left behind.
            assert not any(alive(pid) for pid in bakes)
            assert bake_processes(run_id) == []
        finally:
            # A failed check must not leave a held bake behind.
            for pid in bake_processes(run_id):
                os.kill(pid, signal.SIGKILL)

    # One build started (the first root the executor took), and BuildKit ended it cancelled,
    # well before its hold was over; the rest of the run never started.
    wait_until(
        lambda: builders.status(E2E_BUILDER, record.name) == "canceled",
        f"the node to record {record.name} as cancelled",
        timeout_s=HANG_GUARD_S,
    )
    [(name, ended)] = records_of_run(builders, run_id).items()
    assert name in (build_name("base", run_id), build_name("tool-wheel", run_id))
    started, finished = record_span(ended)
    assert (finished - started).total_seconds() < float(CANCEL_HOLD_S)


# How long a build waits on an input that was cancelled before it fails (dagster.yaml's
# input_wait_seconds: 30 min by default, for someone to rebuild the input).
INPUT_WAIT_S = 10
# A run ends this long after it is terminated, or its dependents after their input wait.
TERMINATED_BOUND_S = 60.0


def test_terminating_a_queued_and_a_running_build_from_the_ui(
    builders: Builders,
    registry_server: RegistryServer,
    tmp_path: Path,
    record_property: Callable[[str, object], None],
) -> None:
    # The default group for one arch on one node, through the placement coordinator and the
    # real daemon: one root builds, the other root waits for the node, lib and app-wheel wait
    # for their inputs. The UI's Terminate (GraphQL terminateRun) ends the queued root, then
    # the running one.
    farm = make_daemon_farm(
        tmp_path / "farm",
        builders,
        registry_server,
        E2E_BAKE_FILE,
        {NODE: E2E_BUILDER},
        coordinator={"input_wait_seconds": INPUT_WAIT_S},
        HOLD_S=CANCEL_HOLD_S,
    )
    with running_farm(farm) as (instance, workspace):
        submit(instance, workspace, "default", partition=ARCH)
        by_target: dict[str, str] = {}

        def one_bake_holds_the_node() -> bool:
            runs = build_runs(instance)
            by_target.update({r.tags[ROCM_BUILD_TAG].split("@")[0]: r.run_id for r in runs})
            return len(runs) == len(E2E_TARGETS) and any(
                r.status == dg.DagsterRunStatus.STARTED
                and f'sleep "{CANCEL_HOLD_S}"' in run_log(instance, r.run_id)
                for r in runs
            )

        wait_until(one_bake_holds_the_node, f"a held bake\n{farm.logs_tail()}", HANG_GUARD_S)
        status = {t: instance.get_run_by_id(i).status for t, i in by_target.items()}
        [running] = [t for t, s in status.items() if s == dg.DagsterRunStatus.STARTED]
        [queued] = {"base", "tool-wheel"} - {running}
        assert status[queued] == status["lib"] == status["app-wheel"] == dg.DagsterRunStatus.QUEUED
        [record] = records_of_run(builders, by_target[running]).values()
        assert record.status == "Running"
        bakes = bake_processes(by_target[running])
        assert bakes

        request = workspace.create_request_context()
        # The queued one: cancelled in the queue at once; it never starts.
        assert terminate_from_ui(request, by_target[queued]) == "TerminateRunSuccess"
        assert instance.get_run_by_id(by_target[queued]).status == dg.DagsterRunStatus.CANCELED
        # The running one: its worker stops the bake, BuildKit cancels it, the claim goes.
        terminated = time.monotonic()
        assert terminate_from_ui(request, by_target[running]) == "TerminateRunSuccess"
        wait_until(
            lambda: instance.get_run_by_id(by_target[running]).is_finished,
            "the terminated run to end",
            TERMINATED_BOUND_S,
            poll_s=0.2,
        )
        run_ended_s = time.monotonic() - terminated
        assert instance.get_run_by_id(by_target[running]).status == dg.DagsterRunStatus.CANCELED
        assert claims.claims(instance) == {}
        assert not any(alive(pid) for pid in bakes)
        wait_until(
            lambda: builders.status(E2E_BUILDER, record.name) == "canceled",
            f"the node to record {record.name} as cancelled",
            TERMINATED_BOUND_S,
        )
        started, finished = record_span(records_of_run(builders, by_target[running])[record.name])
        assert (finished - started).total_seconds() < float(CANCEL_HOLD_S)
        canceled_s = time.monotonic() - terminated
        # The dependents wait INPUT_WAIT_S for someone to rebuild the cancelled input, then
        # fail naming it; app-wheel's own input wait starts when lib has failed.
        dependents_s = wait_for_runs(instance, farm, len(E2E_TARGETS), 2 * TERMINATED_BOUND_S)
        ended = {t: instance.get_run_by_id(i) for t, i in by_target.items()}
        assert {t: r.status for t, r in ended.items()} == {
            running: dg.DagsterRunStatus.CANCELED,
            queued: dg.DagsterRunStatus.CANCELED,
            "lib": dg.DagsterRunStatus.FAILURE,
            "app-wheel": dg.DagsterRunStatus.FAILURE,
        }
        reason = run_log(instance, by_target["lib"])
        assert f"ended CANCELED and nothing rebuilt it within {INPUT_WAIT_S}s" in reason, reason
        assert "input lib@gfx942 is not published" in run_log(instance, by_target["app-wheel"])
        # The queued run and the dependents never started: no run worker, no bake.
        for target in (queued, "lib", "app-wheel"):
            assert not run_events(instance, by_target[target], dg.DagsterEventType.RUN_START)
            assert records_of_run(builders, by_target[target]) == {}
        assert_nothing_held(instance)
        ours = {name for run_id in by_target.values() for name in records_of_run(builders, run_id)}
    assert builders.overlaps(BUILD_PREFIX, ours) == []
    assert "Traceback" not in farm.log("daemon")
    record_property("terminated_run_ended_s", round(run_ended_s, 1))
    record_property("buildkit_record_canceled_s", round(canceled_s, 1))
    record_property("dependents_failed_after_s", round(dependents_s, 1))
