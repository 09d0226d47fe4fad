"""`rocm-assets backfill` against a real Dagster webserver: `dagster dev`, started by the tests.

Real parts: `dagster dev` (webserver, daemons, the code location over gRPC, run workers) with the
repo's dagster.yaml (PlacementRunCoordinator) and workspace.yaml, its SQLite instance, GraphQL over
HTTP from the `rocm-assets` CLI, and the real docker-registry the builds' preflight and push check
read. Every image a build reads is pushed there first, under a namespace of the test's own.
Stand-ins: the fleet's nodes have no ssh (never probed), and `docker` is the recording shim
(rocm_assets_tests/shim/docker): each `buildx bake` records its command and environment and
writes bake's metadata, so builds succeed without building.

The bake file is a copy of rocm-bake.hcl with one more arch in GPU_ARCHES and no other change:
that arch is a partition the webserver backfills. The tests at the end check the request the CLI
builds from the shipped bake file, without a server.
"""

import itertools
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import dagster as dg
import httpx
import pytest
import yaml
from dagster._core.instance.ref import InstanceRef

from rocm_assets.cli.backfill import asset_backfill_params, select, ui_url
from rocm_assets.core.bake import BakeGraph, load_graph
from rocm_assets.core.builds import Build, SelectionError, build_deps
from rocm_assets.core.constants import (
    FANOUT_PARENT,
    NOARCH,
    ROCM_BUILD_TAG,
    ROCM_FANOUT_OF_TAG,
    ROCM_FANOUT_TAG,
    ROCM_NODE_TAG,
)
from rocm_assets.core.registry import parse_image_ref
from rocm_assets_tests.helpers import PROJECT_ROOT, free_port, with_arch
from rocm_assets_tests.servers.dockerd import SHIM_DIR, RecordingShim
from rocm_assets_tests.servers.registry import RegistryServer

NEW_ARCH = "gfx1151"
ARCHES = ("gfx942", "gfx1100")
FLEET = """
nodes:
  - {name: n-big, builder: b-big, cores: 32, mem_gb: 122, link_mbps: 1000}
  - {name: n-mid, builder: b-mid, cores: 24, mem_gb: 64, link_mbps: 400}
  - {name: n-small, builder: b-small, cores: 16, mem_gb: 32, link_mbps: 100}
target_costs:
  reference: {cores: 32, mem_gb: 122}
"""
DAGSTER_DEV = (sys.executable, "-m", "dagster", "dev", "-w", "workspace.yaml", "-h", "127.0.0.1")
BUILDERS = {"n-big": "b-big", "n-mid": "b-mid", "n-small": "b-small"}
_START_TIMEOUT_S = 240.0
_RUNS_TIMEOUT_S = 900.0
_STOP_GRACE_S = 15.0
_TERMINAL = {
    dg.DagsterRunStatus.SUCCESS,
    dg.DagsterRunStatus.FAILURE,
    dg.DagsterRunStatus.CANCELED,
}


@dataclass(frozen=True)
class DagsterDev:
    url: str
    home: Path
    bake_file: Path
    env: dict[str, str]
    shim: RecordingShim
    process: subprocess.Popen[bytes]
    log_path: Path

    def instance(self) -> dg.DagsterInstance:
        return dg.DagsterInstance.from_ref(InstanceRef.from_dir(str(self.home)))

    def log_tail(self, lines: int = 40) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


def _push_inputs(registry: RegistryServer, graph: BakeGraph, arches: tuple[str, ...]) -> int:
    """Every tag the bake file names, for these arches: each build's inputs are then published."""
    refs = {ref for t in graph.asset_targets for a in arches for ref in graph.tags(t, a)}
    for ref in sorted(refs):
        image = parse_image_ref(ref)
        registry.push_image(image.repo, image.reference)
    return len(refs)


def _graphql(url: str, query: str) -> dict:
    response = httpx.post(f"{url}/graphql", json={"query": query}, timeout=10.0, trust_env=False)
    return response.json()["data"]


_LOCATION = """{ workspaceOrError { ... on Workspace { locationEntries { name loadStatus
  locationOrLoadError { __typename ... on PythonError { message } } } } } }"""


def _wait_for_location(dev: DagsterDev) -> None:
    """Until GraphQL answers and the code location is loaded; fail loudly with the log if not."""
    deadline = time.monotonic() + _START_TIMEOUT_S
    last = "no answer yet"
    while time.monotonic() < deadline:
        if dev.process.poll() is not None:
            pytest.fail(
                f"dagster dev exited with {dev.process.returncode}:\n{dev.log_tail()}",
                pytrace=False,
            )
        try:
            entries = _graphql(dev.url, _LOCATION)["workspaceOrError"]["locationEntries"]
        except (httpx.TransportError, ValueError, KeyError, TypeError) as exc:
            last = f"{type(exc).__name__}: {exc}"
        else:
            loaded = [e for e in entries if e["loadStatus"] == "LOADED"]
            errors = [
                e["locationOrLoadError"]["message"]
                for e in loaded
                if e["locationOrLoadError"]["__typename"] == "PythonError"
            ]
            if errors:
                pytest.fail(f"the code location failed to load: {errors[0]}", pytrace=False)
            if loaded:
                return
            last = f"locations {[e['loadStatus'] for e in entries]}"
        time.sleep(0.5)
    pytest.fail(
        f"dagster dev at {dev.url} not ready in {_START_TIMEOUT_S:.0f}s ({last}):\n{dev.log_tail()}",
        pytrace=False,
    )


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM the whole group (dagster dev ignores it when not in a terminal), then SIGKILL."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=_STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            continue
        if sig == signal.SIGKILL:
            return
    process.wait()


@pytest.fixture(scope="module")
def dagster_dev(
    tmp_path_factory: pytest.TempPathFactory, registry_server: RegistryServer
) -> Iterator[DagsterDev]:
    root = tmp_path_factory.mktemp("dagster-dev")
    home = root / "home"
    home.mkdir()
    config = yaml.safe_load((PROJECT_ROOT / "dagster.yaml").read_text())
    config["run_coordinator"]["config"].update(probe_nodes=False, dequeue_interval_seconds=1)
    (home / "dagster.yaml").write_text(yaml.safe_dump(config))
    fleet = root / "fleet.yaml"
    fleet.write_text(FLEET)
    bake_file = with_arch(PROJECT_ROOT / "rocm-bake.hcl", root / "rocm-bake.hcl", NEW_ARCH)
    namespace = registry_server.new_repo("rocm-backfill")
    bake_env = {"REGISTRY": registry_server.host, "NAMESPACE": namespace}
    _push_inputs(registry_server, load_graph(bake_file, bake_env), (*ARCHES, NEW_ARCH))

    record_file = root / "docker-calls.jsonl"
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("ROCM_", "DAGSTER_")) and k not in ("PUBLISHED_INPUTS", "GPU_ARCH")
    }
    env.update(bake_env)
    env.update(
        # The recording `docker` first on PATH for the webserver, the daemon and run workers.
        PATH=os.pathsep.join([str(SHIM_DIR), str(Path(sys.executable).parent), env["PATH"]]),
        PYTHONPATH=os.pathsep.join(p for p in [str(PROJECT_ROOT), env.get("PYTHONPATH")] if p),
        ROCM_SHIM_STATE=str(root / "shim-state"),
        ROCM_SHIM_BUILDERS=",".join(BUILDERS.values()),
        ROCM_SHIM_RECORD=str(record_file),
        DAGSTER_HOME=str(home),
        ROCM_FLEET_FILE=str(fleet),
        ROCM_BAKE_FILE=str(bake_file),
        ROCM_REGISTRY_URL=registry_server.url,
    )
    shim = RecordingShim(SHIM_DIR, env, root / "shim-state", record_file)
    port = free_port()
    log_path = root / "dagster-dev.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [*DAGSTER_DEV, "-p", str(port)],
            cwd=PROJECT_ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            # Its own group: teardown reaches the webserver, daemon, code server and run workers.
            start_new_session=True,
        )
    dev = DagsterDev(f"http://127.0.0.1:{port}", home, bake_file, env, shim, process, log_path)
    try:
        _wait_for_location(dev)
        yield dev
    finally:
        _stop(process)


def backfill_cli(dev: DagsterDev, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**dev.env, "ROCM_BAKE_FILE": str(dev.bake_file)}
    return subprocess.run(
        [sys.executable, "-m", "rocm_assets.cli", "backfill", "--url", dev.url, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def wait_for_builds(
    dev: DagsterDev, backfill_id: str, expected: set[str]
) -> dict[str, dg.RunRecord]:
    """The backfill's build runs, once each expected build has one and nothing is in flight."""
    deadline = time.monotonic() + _RUNS_TIMEOUT_S
    with dev.instance() as instance:
        while True:
            records = instance.get_run_records(dg.RunsFilter.for_backfill(backfill_id))
            builds = [r for r in records if r.dagster_run.tags.get(ROCM_BUILD_TAG)]
            seen = {r.dagster_run.tags[ROCM_BUILD_TAG] for r in builds}
            done = all(r.dagster_run.status in _TERMINAL for r in records)
            if seen >= expected and done:
                counts = Counter(r.dagster_run.tags[ROCM_BUILD_TAG] for r in builds)
                assert {b: n for b, n in counts.items() if n != 1} == {}, "a build ran twice"
                return {r.dagster_run.tags[ROCM_BUILD_TAG]: r for r in builds}
            if time.monotonic() > deadline:
                states = sorted(
                    f"{r.dagster_run.tags.get(ROCM_BUILD_TAG, r.dagster_run.run_id[:8])}="
                    f"{r.dagster_run.status.value}"
                    for r in records
                )
                pytest.fail(
                    f"backfill {backfill_id}: after {_RUNS_TIMEOUT_S:.0f}s missing "
                    f"{sorted(expected - seen)}; runs {states}\n{dev.log_tail()}",
                    pytrace=False,
                )
            time.sleep(1.0)


def assert_one_build_per_node_at_a_time(dev: DagsterDev) -> int:
    """No two build runs overlapped on one node, across everything this server ran."""
    with dev.instance() as instance:
        records = [
            r
            for r in instance.get_run_records(dg.RunsFilter(statuses=list(_TERMINAL)))
            if r.dagster_run.tags.get(ROCM_NODE_TAG)
        ]
    by_node: dict[str, list[tuple[float, float, str]]] = {}
    for r in records:
        assert r.start_time is not None and r.end_time is not None
        node = r.dagster_run.tags[ROCM_NODE_TAG]
        by_node.setdefault(node, []).append((r.start_time, r.end_time, r.dagster_run.run_id))
    for node, spans in by_node.items():
        spans.sort()
        for (_, end, before), (start, _, after) in itertools.pairwise(spans):
            assert start >= end, f"{node}: run {after} started before run {before} ended"
    return len(records)


def records_by_run(shim: RecordingShim) -> dict[str, dict]:
    """The stand-in's bakes, keyed by RUN_ID: the Dagster run that baked."""
    out: dict[str, dict] = {}
    for record in shim.records():
        run_id = record["env"]["RUN_ID"]
        assert run_id not in out, f"run {run_id} baked twice"
        out[run_id] = record
    return out


@pytest.mark.real
def test_a_group_backfill_is_one_placed_run_per_build(dagster_dev: DagsterDev) -> None:
    # Issue 5's "done when": a default-group request for two arches on a live instance.
    out = backfill_cli(dagster_dev, "--group", "default", "--arch", *ARCHES)
    assert out.returncode == 0, out.stderr
    first, link = out.stdout.splitlines()
    match = re.fullmatch(r"backfill (\w+): group default for gfx942, gfx1100 \(26 builds\)", first)
    assert match, first
    backfill_id = match.group(1)
    assert link == ui_url(dagster_dev.url, backfill_id)
    assert httpx.get(link, timeout=10.0, trust_env=False).status_code == 200

    graph = load_graph(dagster_dev.bake_file)
    members = [t for t in graph.asset_targets if t in graph.groups["default"]]
    expected = {f"{t}@{a}" if t in graph.per_arch else t for t in members for a in ARCHES}
    assert len(expected) == 26  # 12 per-arch targets x 2 arches, 2 noarch targets once
    with dagster_dev.instance() as instance:
        backfill = instance.get_backfill(backfill_id)
        assert backfill is not None and backfill.asset_backfill_data is not None
        target = backfill.asset_backfill_data.target_subset
        assert {
            k.to_user_string(): sorted(s.get_partition_keys())
            for k, s in target.partitions_subsets_by_asset_key.items()
        } == {t: sorted(ARCHES) for t in members if t in graph.per_arch}
        assert {k.to_user_string() for k in target.non_partitioned_asset_keys} == {
            t for t in members if t not in graph.per_arch
        }

    runs = wait_for_builds(dagster_dev, backfill_id, expected)
    assert set(runs) == expected
    assert all(r.dagster_run.status == dg.DagsterRunStatus.SUCCESS for r in runs.values()), {
        b: r.dagster_run.status.value for b, r in runs.items()
    }
    # The backfill's requests were split by the coordinator: their runs built nothing.
    with dagster_dev.instance() as instance:
        parents = {
            r.dagster_run.run_id
            for r in instance.get_run_records(dg.RunsFilter.for_backfill(backfill_id))
            if r.dagster_run.tags.get(ROCM_FANOUT_TAG) == FANOUT_PARENT
        }
    assert parents
    # A request the daemon made for one build alone (a noarch target) needed no split.
    children = [r for r in runs.values() if ROCM_FANOUT_OF_TAG in r.dagster_run.tags]
    assert children and {r.dagster_run.tags[ROCM_FANOUT_OF_TAG] for r in children} <= parents
    for record in runs.values():
        assert record.dagster_run.tags.get("dagster/backfill") == backfill_id

    # Each build started only once every input it has in this backfill had finished.
    for build, record in runs.items():
        for dep in build_deps(graph, Build.parse(build)):
            if str(dep) in runs:
                assert record.start_time >= runs[str(dep)].end_time, f"{build} before {dep}"
    assert assert_one_build_per_node_at_a_time(dagster_dev) >= 26

    # One bake per build, on its node's builder, with inputs from the registry.
    bakes = records_by_run(dagster_dev.shim)
    for build, record in runs.items():
        run = record.dagster_run
        bake = bakes[run.run_id]
        target, arch = Build.parse(build).target, Build.parse(build).arch
        argv = bake["argv"]
        assert argv[argv.index("--builder") + 1] == BUILDERS[run.tags[ROCM_NODE_TAG]]
        assert argv[-1] == target
        assert (
            f"{target}.args.BUILDKIT_BUILD_NAME=rocm-pytorch-build/{target}/{arch or NOARCH}/{run.run_id}"
            in argv
        )
        assert bake["env"]["PUBLISHED_INPUTS"] == "1"
        assert bake["env"]["GPU_ARCH"] == (arch or graph.arches[0])


@pytest.mark.real
def test_a_new_arch_in_the_bake_file_is_a_partition(dagster_dev: DagsterDev) -> None:
    # A noarch target and a per-arch one: the noarch target is built once, unpartitioned.
    out = backfill_cli(
        dagster_dev, "--targets", "triton-wheel", "torchvision-wheel", "--arch", NEW_ARCH, "--json"
    )
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["arches"] == [NEW_ARCH]
    assert data["builds"] == 2
    runs = wait_for_builds(
        dagster_dev, data["backfill_id"], {"triton-wheel", f"torchvision-wheel@{NEW_ARCH}"}
    )
    assert set(runs) == {"triton-wheel", f"torchvision-wheel@{NEW_ARCH}"}
    assert all(r.dagster_run.status == dg.DagsterRunStatus.SUCCESS for r in runs.values())
    assert "dagster/partition" not in runs["triton-wheel"].dagster_run.tags
    new = runs[f"torchvision-wheel@{NEW_ARCH}"].dagster_run
    assert new.tags["dagster/partition"] == NEW_ARCH
    bake = records_by_run(dagster_dev.shim)[new.run_id]
    assert bake["env"]["GPU_ARCH"] == NEW_ARCH
    assert_one_build_per_node_at_a_time(dagster_dev)


@pytest.mark.real
def test_an_arch_outside_the_bake_file_is_refused_before_the_webserver(
    dagster_dev: DagsterDev,
) -> None:
    out = backfill_cli(
        dagster_dev,
        "--bake-file",
        str(PROJECT_ROOT / "rocm-bake.hcl"),
        "--targets",
        "pytorch",
        "--arch",
        NEW_ARCH,
    )
    assert out.returncode == 2
    assert out.stdout == ""
    assert out.stderr == (
        f"rocm-assets: error: unknown arch '{NEW_ARCH}': rocm-bake.hcl builds gfx942, gfx950, "
        "gfx1100, gfx1201, gfx1250 (add it to GPU_ARCHES there to make it a partition)\n"
    )


@pytest.mark.real
def test_an_arch_the_webserver_has_not_loaded_says_reload(
    dagster_dev: DagsterDev, tmp_path: Path
) -> None:
    newer = with_arch(dagster_dev.bake_file, tmp_path / "rocm-bake.hcl", "gfx1152")
    out = backfill_cli(
        dagster_dev, "--bake-file", str(newer), "--targets", "pytorch", "--arch", "gfx1152"
    )
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1
    assert "has no partition 'gfx1152' for pytorch" in out.stderr
    assert "reload the code location" in out.stderr


@pytest.mark.real
def test_a_job_backfill_runs_the_job_per_arch(dagster_dev: DagsterDev) -> None:
    out = backfill_cli(dagster_dev, "--job", "pytorch_run_job", "--arch", "gfx942", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert (data["job"], data["runs"]) == ("pytorch_run_job", 1)
    runs = wait_for_builds(dagster_dev, data["backfill_id"], {"pytorch-run@gfx942"})
    run = runs["pytorch-run@gfx942"].dagster_run
    assert run.job_name == "pytorch_run_job"
    assert run.status == dg.DagsterRunStatus.SUCCESS
    assert records_by_run(dagster_dev.shim)[run.run_id]["argv"][-1] == "pytorch-run"


@pytest.mark.real
def test_unknown_job_and_unreachable_webserver_are_one_line(dagster_dev: DagsterDev) -> None:
    out = backfill_cli(dagster_dev, "--job", "no_such_job", "--arch", "gfx942")
    assert out.returncode == 2
    assert out.stderr.startswith(
        f"rocm-assets: error: the webserver at {dagster_dev.url} has no job 'no_such_job' (jobs: "
    )
    assert "pytorch_run_job" in out.stderr
    assert out.stderr.count("\n") == 1
    closed = f"http://127.0.0.1:{free_port()}"
    down = backfill_cli(replace(dagster_dev, url=closed), "--group", "serving", "--arch", "gfx942")
    assert down.returncode == 2
    assert down.stderr.count("\n") == 1
    assert f"cannot reach the Dagster webserver at {closed}" in down.stderr


# ##### The request, without a server


def test_a_mixed_selection_names_every_target_with_its_partitions() -> None:
    graph = load_graph(PROJECT_ROOT / "rocm-bake.hcl")
    selection = select(graph, group="wheels", targets=None, arches=["gfx942", "gfx1100", "gfx942"])
    assert selection.arches == ("gfx942", "gfx1100")
    assert selection.build_count == 7 * 2 + 1
    params = asset_backfill_params(selection, "t")
    by_asset = {
        tuple(e["assetKey"]["path"]): e.get("partitions") for e in params["partitionsByAssets"]
    }
    ranges = {
        "ranges": [{"start": "gfx942", "end": "gfx942"}, {"start": "gfx1100", "end": "gfx1100"}]
    }
    # Every member: assetSelection + partitionNames would drop lmcache-wheel and vllm-wheel.
    assert by_asset == {
        (t,): (None if t == "triton-wheel" else ranges) for t in graph.groups["wheels"]
    }
    assert "assetSelection" not in params and "partitionNames" not in params


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"group": "all", "targets": None, "arches": ["gfx942"]},
            "no group 'all' in rocm-bake.hcl",
        ),
        ({"group": None, "targets": ["vllm", "torch"], "arches": ["gfx942"]}, "no target 'torch'"),
        (
            {"group": None, "targets": ["pytorch-test"], "arches": ["gfx942"]},
            "'pytorch-test' is a test target, not an asset: it runs as the check on pytorch",
        ),
        ({"group": "serving", "targets": None, "arches": ["gfx9"]}, "unknown arch 'gfx9'"),
    ],
)
def test_requests_the_bake_file_cannot_build_are_refused(kwargs: dict, message: str) -> None:
    graph = load_graph(PROJECT_ROOT / "rocm-bake.hcl")
    with pytest.raises(SelectionError, match=re.escape(message)):
        select(graph, **kwargs)
