"""`rocm-assets backfill` against a real Dagster webserver: `dagster dev`, started by the tests.

Real parts: `dagster dev` (webserver, daemons, the code location over gRPC, run workers) with the
repo's dagster.yaml (PlacementRunCoordinator) and workspace.yaml, its SQLite instance, GraphQL over
HTTP from the `rocm-assets` CLI, and every build: Debian's `docker buildx bake` (buildx 0.29) on
three Debian dockerd 26 engines, one per fleet node, each reached through the docker context that
is that node's builder, pushing to the real docker-registry, which the builds' preflight and push
check read. Each build names its inputs by their registry tags, under a prefix of this module's
own: an engine that did not build an input itself pulls it from the registry. What a test says
about a build it reads from the build's own artifacts: BuildKit's history on the node's engine
(record name, state, times, build args, named contexts), the registry's digests and the pushed
images' labels.

Stand-ins: none for a build. The fleet's nodes have no ssh, so they are never probed (MAX_JOBS
comes from their figures).

The bake file is the e2e farm (rocm_assets_tests/fixtures/e2e: FROM scratch plus Debian's
static busybox; every build holds its node HOLD_S seconds) with one more arch in GPU_ARCHES, a
partition the webserver backfills, and one target in no group, built only by its own job (as
pytorch-run in rocm-bake.hcl). The tests at the end check the request the CLI builds from the
shipped bake file, without a server.
"""

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

from rocm_assets.cli.backfill import (
    REQUEST_TAG,
    asset_backfill_params,
    request_url,
    run_params,
    select,
    ui_url,
)
from rocm_assets.core.bake import load_graph
from rocm_assets.core.build.builds import Build, SelectionError, build_deps
from rocm_assets.core.build.invocation import HistoryRecord
from rocm_assets.core.common.constants import (
    FANOUT_PARENT,
    NOARCH,
    ROCM_BUILD_TAG,
    ROCM_FANOUT_OF_TAG,
    ROCM_FANOUT_TAG,
    ROCM_NODE_TAG,
)
from rocm_assets_tests.helpers import PROJECT_ROOT, free_port
from rocm_assets_tests.servers.dockerd import (
    Builders,
    EnginePool,
    copy_e2e,
    make_builders,
    record_span,
)
from rocm_assets_tests.servers.registry import RegistryServer

NEW_ARCH = "gfx1151"
ARCHES = ("gfx942", "gfx1100")
BUILDERS = {"n-big": "b-big", "n-mid": "b-mid", "n-small": "b-small"}
FLEET = """
nodes:
  - {name: n-big, builder: b-big, cores: 32, mem_gb: 122, link_mbps: 1000}
  - {name: n-mid, builder: b-mid, cores: 24, mem_gb: 64, link_mbps: 400}
  - {name: n-small, builder: b-small, cores: 16, mem_gb: 32, link_mbps: 100}
target_costs:
  reference: {cores: 32, mem_gb: 122}
"""
# A target in no group: only its own job builds it.
OWN_JOB_TARGET = "base-run"
OWN_JOB_HCL = f"""
target "{OWN_JOB_TARGET}" {{
  inherits = ["base"]
  tags     = ["${{REGISTRY}}/e2e/{OWN_JOB_TARGET}:${{GPU_ARCH}}"]
}}
"""
# Each build holds its node this long: two builds sharing a node would overlap.
HOLD_S = "2"
BUILD_PREFIX = "rocm-pytorch-build/"
DAGSTER_DEV = (sys.executable, "-m", "dagster", "dev", "-w", "workspace.yaml", "-h", "127.0.0.1")
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
    builders: Builders
    registry: RegistryServer
    process: subprocess.Popen[bytes]
    log_path: Path

    def instance(self) -> dg.DagsterInstance:
        return dg.DagsterInstance.from_ref(InstanceRef.from_dir(str(self.home)))

    def log_tail(self, lines: int = 40) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


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
    tmp_path_factory: pytest.TempPathFactory,
    registry_server: RegistryServer,
    engines: EnginePool,
) -> Iterator[DagsterDev]:
    root = tmp_path_factory.mktemp("dagster-dev")
    home = root / "home"
    home.mkdir()
    config = yaml.safe_load((PROJECT_ROOT / "dagster.yaml").read_text())
    config["run_coordinator"]["config"].update(probe_nodes=False, dequeue_interval_seconds=1)
    (home / "dagster.yaml").write_text(yaml.safe_dump(config))
    fleet = root / "fleet.yaml"
    fleet.write_text(FLEET)
    bake_file = copy_e2e(root / "farm", arches=(*ARCHES, NEW_ARCH), extra=OWN_JOB_HCL)
    # A machine per node: an engine each, so each node's history holds its builds only.
    builders = make_builders(
        root / "docker-config",
        {builder: engines.get(i) for i, builder in enumerate(BUILDERS.values())},
    )
    env = {
        k: v
        for k, v in builders.env.items()
        if not k.startswith(("ROCM_", "DAGSTER_"))
        and k not in ("PUBLISHED_INPUTS", "GPU_ARCH", "RUN_ID")
    }
    env.update(
        PATH=os.pathsep.join([str(Path(sys.executable).parent), env["PATH"]]),
        PYTHONPATH=os.pathsep.join(p for p in [str(PROJECT_ROOT), env.get("PYTHONPATH")] if p),
        REGISTRY=f"{registry_server.host}/{registry_server.new_repo('rocm-backfill')}",
        HOLD_S=HOLD_S,
        DAGSTER_HOME=str(home),
        ROCM_FLEET_FILE=str(fleet),
        ROCM_BAKE_FILE=str(bake_file),
        ROCM_REGISTRY_URL=registry_server.url,
        # The backfill's builds only: the rebuild automation would request the same partitions.
        ROCM_AUTOMATION="off",
    )
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
    dev = DagsterDev(
        f"http://127.0.0.1:{port}",
        home,
        bake_file,
        env,
        builders,
        registry_server,
        process,
        log_path,
    )
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
    return wait_for_runs(dev, dg.RunsFilter.for_backfill(backfill_id), expected)


def wait_for_request(dev: DagsterDev, request: str, expected: set[str]) -> dict[str, dg.RunRecord]:
    """The build runs of a request launched at once (its tag), as `wait_for_builds`."""
    return wait_for_runs(dev, dg.RunsFilter(tags={REQUEST_TAG: request}), expected)


def wait_for_runs(
    dev: DagsterDev, runs: dg.RunsFilter, expected: set[str]
) -> dict[str, dg.RunRecord]:
    deadline = time.monotonic() + _RUNS_TIMEOUT_S
    with dev.instance() as instance:
        while True:
            records = instance.get_run_records(runs)
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
                    f"{runs}: after {_RUNS_TIMEOUT_S:.0f}s missing "
                    f"{sorted(expected - seen)}; runs {states}\n{dev.log_tail()}",
                    pytrace=False,
                )
            time.sleep(1.0)


def build_name(build: Build, run_id: str) -> str:
    return f"{BUILD_PREFIX}{build.target}/{build.arch or NOARCH}/{run_id}"


def builder_of(record: dg.RunRecord) -> str:
    """The builder of the node the run was placed on."""
    return BUILDERS[record.dagster_run.tags[ROCM_NODE_TAG]]


def baked(dev: DagsterDev, record: dg.RunRecord) -> HistoryRecord:
    """The one build a build run made, as its node's BuildKit history records it: named for the
    run, completed, on the engine of the node the run was placed on."""
    run = record.dagster_run
    name = build_name(Build.parse(run.tags[ROCM_BUILD_TAG]), run.run_id)
    builder = builder_of(record)
    [found] = dev.builders.history(builder, name)
    assert found.status == "Completed", (builder, name, found)
    return found


def build_args(dev: DagsterDev, builder: str, found: HistoryRecord) -> dict[str, str]:
    """The build args BuildKit recorded (an empty value has no Value)."""
    inspected = dev.builders.inspect(builder, found.ref)
    return {a["Name"]: a.get("Value", "") for a in inspected.get("BuildArgs") or []}


def materialized(dev: DagsterDev, run_id: str) -> dict:
    """The run's one materialization's metadata, and its data version as `data_version`."""
    with dev.instance() as instance:
        [entry] = instance.all_logs(run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION)
    materialization = entry.asset_materialization
    assert materialization is not None
    return {
        **{k: v.value for k, v in materialization.metadata.items()},
        "data_version": materialization.tags["dagster/data_version"],
    }


def assert_one_build_per_node_at_a_time(dev: DagsterDev) -> int:
    """No two builds ran at once on one node, across everything this server ran: each engine's
    own history shows it. Returns how many builds the server's runs made."""
    with dev.instance() as instance:
        runs = [r.dagster_run for r in instance.get_run_records()]
    names = {
        build_name(Build.parse(run.tags[ROCM_BUILD_TAG]), run.run_id)
        for run in runs
        if run.tags.get(ROCM_BUILD_TAG) and run.tags.get(ROCM_NODE_TAG)
    }
    assert dev.builders.overlaps(BUILD_PREFIX, names) == []
    recorded = {r.name for b in BUILDERS.values() for r in dev.builders.history(b, BUILD_PREFIX)}
    return len(names & recorded)


def test_the_first_visit_opens_on_the_farm_without_the_community_modal(
    dagster_dev: DagsterDev,
) -> None:
    # The UI's CommunityNux asks `shouldShowNux` on every page served on 127.0.0.1 or localhost
    # and opens "Join the community" over it until dismissed; the shipped dagster.yaml says no.
    assert _graphql(dagster_dev.url, "{ shouldShowNux }") == {"shouldShowNux": False}
    page = httpx.get(f"{dagster_dev.url}/", timeout=10.0, trust_env=False, follow_redirects=True)
    assert page.status_code == 200
    # Dagster's default would show it: the setting is what keeps it away.
    with dg.instance_for_test() as default:
        assert default.nux_enabled


def test_a_group_request_launches_every_build_at_once(dagster_dev: DagsterDev) -> None:
    # The default: no backfill daemon between a build and its inputs (issue 36).
    out = backfill_cli(dagster_dev, "--group", "default", "--arch", *ARCHES, "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    graph = load_graph(dagster_dev.bake_file, dagster_dev.env)
    members = [t for t in graph.asset_targets if t in graph.groups["default"]]
    expected = {f"{t}@{a}" if t in graph.per_arch else t for t in members for a in ARCHES}
    assert (data["builds"], len(data["runs"])) == (7, 7) and set(data["runs"]) == expected
    assert data["url"] == request_url(dagster_dev.url, data["request_id"])
    # Every run exists when the command returns, one build each, none split from another.
    with dagster_dev.instance() as instance:
        launched = instance.get_run_records(dg.RunsFilter(tags={REQUEST_TAG: data["request_id"]}))
        assert {r.dagster_run.run_id for r in launched} == set(data["runs"].values())
        for record in launched:
            tags = record.dagster_run.tags
            assert ROCM_FANOUT_TAG not in tags and ROCM_FANOUT_OF_TAG not in tags
    runs = wait_for_request(dagster_dev, data["request_id"], expected)
    assert all(r.dagster_run.status == dg.DagsterRunStatus.SUCCESS for r in runs.values()), {
        b: r.dagster_run.status.value for b, r in runs.items()
    }
    builds = {build: baked(dagster_dev, record) for build, record in runs.items()}
    for build, record in runs.items():
        assert data["runs"][build] == record.dagster_run.run_id
        parsed = Build.parse(build)
        assert record.dagster_run.tags.get("dagster/partition") == parsed.arch
        # Queued at once, yet started on its node only after every input's bake had ended.
        started, _ = record_span(builds[build])
        for dep in build_deps(graph, parsed):
            _, ended = record_span(builds[str(dep)])
            assert ended <= started, f"{build} before {dep}"
    assert assert_one_build_per_node_at_a_time(dagster_dev) >= 7


def test_a_group_asset_backfill_is_one_placed_run_per_build(dagster_dev: DagsterDev) -> None:
    # Issue 5's "done when": a default-group request for two arches on a live instance.
    out = backfill_cli(dagster_dev, "--group", "default", "--arch", *ARCHES, "--asset-backfill")
    assert out.returncode == 0, out.stderr
    first, link = out.stdout.splitlines()
    match = re.fullmatch(r"backfill (\w+): group default for gfx942, gfx1100 \(7 builds\)", first)
    assert match, first
    backfill_id = match.group(1)
    assert link == ui_url(dagster_dev.url, backfill_id)
    assert httpx.get(link, timeout=10.0, trust_env=False).status_code == 200

    graph = load_graph(dagster_dev.bake_file, dagster_dev.env)
    members = [t for t in graph.asset_targets if t in graph.groups["default"]]
    expected = {f"{t}@{a}" if t in graph.per_arch else t for t in members for a in ARCHES}
    assert len(expected) == 7  # 3 per-arch targets x 2 arches, 1 noarch target once
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

    # One bake per build, on its node's engine, named for its run, from inputs in the registry.
    builds = {build: baked(dagster_dev, record) for build, record in runs.items()}
    for build, record in runs.items():
        run = record.dagster_run
        builder = builder_of(record)
        found = builds[build]
        inspected = dagster_dev.builders.inspect(builder, found.ref)
        assert not inspected.get("NamedContexts"), f"{build} linked a target instead of pulling"
        metadata = materialized(dagster_dev, run.run_id)
        assert (metadata["history_ref"], metadata["builder"]) == (found.ref, builder)
        assert found.ref.startswith(f"{builder}/{builder}/")
        # What was pushed is what Dagster recorded: the registry's digest is the data version.
        for tag in metadata["tags"]:
            assert dagster_dev.registry.digest(tag) == metadata["data_version"], tag
        parsed = Build.parse(build)
        # A per-arch build is for its partition; a noarch one is evaluated with the first arch.
        assert f"GPU_ARCH={parsed.arch or graph.arches[0]} " in metadata["command"]
        if parsed.arch:
            labels = dagster_dev.registry.image_config(metadata["tags"][0])["config"]["Labels"]
            assert labels["org.rocm.e2e.arch"] == parsed.arch
    # lib pulled its inputs from the registry, by the tags their builds pushed.
    lib = f"lib@{ARCHES[0]}"
    args = build_args(dagster_dev, builder_of(runs[lib]), builds[lib])
    assert args["BASE_IMAGE"] == graph.tags("base", ARCHES[0])[0]
    assert args["TOOL_IMAGE"] == graph.tags("tool-wheel", ARCHES[0])[0]

    # Each build started on its node only once every input it has in this backfill had ended,
    # as the nodes' own clocks (one host's) recorded them.
    for build, found in builds.items():
        started, _ = record_span(found)
        for dep in build_deps(graph, Build.parse(build)):
            if str(dep) in builds:
                _, ended = record_span(builds[str(dep)])
                assert ended <= started, f"{build} before {dep}"
    # The three nodes shared the work, and never two builds at once on one of them.
    assert len({r.dagster_run.tags[ROCM_NODE_TAG] for r in runs.values()}) > 1
    assert assert_one_build_per_node_at_a_time(dagster_dev) >= 7


def test_a_new_arch_in_the_bake_file_is_a_partition(dagster_dev: DagsterDev) -> None:
    # A noarch target and a per-arch one: the noarch target is built once, unpartitioned.
    out = backfill_cli(dagster_dev, "--targets", "tool-wheel", "base", "--arch", NEW_ARCH, "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["arches"] == [NEW_ARCH]
    assert data["builds"] == 2
    runs = wait_for_request(dagster_dev, data["request_id"], {"tool-wheel", f"base@{NEW_ARCH}"})
    assert set(runs) == {"tool-wheel", f"base@{NEW_ARCH}"}
    assert all(r.dagster_run.status == dg.DagsterRunStatus.SUCCESS for r in runs.values())
    assert "dagster/partition" not in runs["tool-wheel"].dagster_run.tags
    new = runs[f"base@{NEW_ARCH}"]
    assert new.dagster_run.tags["dagster/partition"] == NEW_ARCH
    # The build was for the new arch: bake got it, and the pushed image says so.
    found = baked(dagster_dev, new)
    assert build_args(dagster_dev, builder_of(new), found)["GPU_ARCH"] == NEW_ARCH
    [tag, _] = materialized(dagster_dev, new.dagster_run.run_id)["tags"]
    assert tag.endswith(f"/e2e/base:{NEW_ARCH}")
    labels = dagster_dev.registry.image_config(tag)["config"]["Labels"]
    assert labels["org.rocm.e2e.arch"] == NEW_ARCH
    assert_one_build_per_node_at_a_time(dagster_dev)


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


def test_an_arch_the_webserver_has_not_loaded_says_reload(
    dagster_dev: DagsterDev, tmp_path: Path
) -> None:
    newer = copy_e2e(tmp_path, arches=(*ARCHES, NEW_ARCH, "gfx1152"), extra=OWN_JOB_HCL)
    out = backfill_cli(
        dagster_dev, "--bake-file", str(newer), "--targets", "base", "--arch", "gfx1152"
    )
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1
    assert "has no partition 'gfx1152' for base" in out.stderr
    assert "reload the code location" in out.stderr


def test_a_job_backfill_runs_the_job_per_arch(dagster_dev: DagsterDev) -> None:
    job = f"{OWN_JOB_TARGET.replace('-', '_')}_job"
    out = backfill_cli(dagster_dev, "--job", job, "--arch", "gfx942", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert (data["job"], data["runs"]) == (job, 1)
    runs = wait_for_builds(dagster_dev, data["backfill_id"], {f"{OWN_JOB_TARGET}@gfx942"})
    record = runs[f"{OWN_JOB_TARGET}@gfx942"]
    run = record.dagster_run
    assert run.job_name == job
    assert run.status == dg.DagsterRunStatus.SUCCESS
    # The job's run baked its target on its node, and pushed it.
    found = baked(dagster_dev, record)
    assert materialized(dagster_dev, run.run_id)["history_ref"] == found.ref
    assert_one_build_per_node_at_a_time(dagster_dev)


def test_unknown_job_and_unreachable_webserver_are_one_line(dagster_dev: DagsterDev) -> None:
    out = backfill_cli(dagster_dev, "--job", "no_such_job", "--arch", "gfx942")
    assert out.returncode == 2
    assert out.stderr.startswith(
        f"rocm-assets: error: the webserver at {dagster_dev.url} has no job 'no_such_job' (jobs: "
    )
    assert f"{OWN_JOB_TARGET.replace('-', '_')}_job" in out.stderr
    assert out.stderr.count("\n") == 1
    closed = f"http://127.0.0.1:{free_port()}"
    down = backfill_cli(replace(dagster_dev, url=closed), "--group", "default", "--arch", "gfx942")
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


def test_a_request_at_once_is_one_run_per_build_of_the_ui_materialize_kind() -> None:
    graph = load_graph(PROJECT_ROOT / "rocm-bake.hcl")
    per_arch = run_params("loc", "repo", Build("vllm", "gfx950"), "r1")
    assert per_arch == {
        "selector": {
            "repositoryLocationName": "loc",
            "repositoryName": "repo",
            "jobName": "__ASSET_JOB",
            "assetSelection": [{"path": ["vllm"]}],
        },
        "mode": "default",
        "runConfigData": {},
        "executionMetadata": {
            "tags": [
                {"key": REQUEST_TAG, "value": "r1"},
                {"key": "dagster/partition", "value": "gfx950"},
            ]
        },
    }
    # A noarch target's run has no partition.
    noarch = run_params("loc", "repo", Build("triton-wheel"), "r1")
    assert noarch["executionMetadata"]["tags"] == [{"key": REQUEST_TAG, "value": "r1"}]
    assert "triton-wheel" not in graph.per_arch
    assert request_url("http://h:3000/", "r1") == (
        "http://h:3000/runs?q%5B%5D=tag%3Arocm-assets%2Frequest%3Dr1"
    )


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
