"""`make demo` (examples/demo.py) end to end, every build a real `docker buildx bake`.

Real: the demo's own docker-registry; one dockerd 26 per node of examples/farm/fleet.yaml, each
on a private socket, that the demo starts, with a docker context per builder; `dagster dev` with
the placement coordinator, which the demo starts; the two-arch backfill it launches through the
webserver's GraphQL API; every build, by the installed buildx (Debian's 0.29 plugin) on the engine
of the node it was placed on, its images FROM scratch plus Debian's static busybox, each holding
its node HOLD_S seconds; BuildKit's own history on each node (`docker buildx history ls`); the
demo's clean-up on SIGTERM, and what it keeps when its daemon is killed (`kill -9`).

Stand-in, in one test only: a `docker` CLI without the buildx plugin (a script the test writes),
since every docker CLI here finds Debian's plugin.
"""

import itertools
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import httpx
import pytest
from dagster._core.instance.ref import InstanceRef

from rocm_assets.cli.backfill import REQUEST_TAG
from rocm_assets.core.bake import load_graph
from rocm_assets.core.build.builds import Build, build_deps
from rocm_assets.core.build.invocation import BUILDX_INSTALL_HINT, HistoryRecord, history
from rocm_assets.core.common.buildx import find_buildx
from rocm_assets.core.common.constants import ROCM_BUILD_TAG, ROCM_NODE_TAG
from rocm_assets.core.nodes.fleet import load_fleet
from rocm_assets_tests.helpers import PROJECT_ROOT, alive, free_port
from rocm_assets_tests.servers.dockerd import BUSYBOX, Builders, Dockerd, remove_root
from rocm_assets_tests.servers.fakes import MANIFEST_ACCEPT

DEMO = PROJECT_ROOT / "examples" / "demo.py"
FARM = PROJECT_ROOT / "examples" / "farm"
NAME_PREFIX = "rocm-pytorch-build/"
_UP_TIMEOUT_S = 600.0
_BUILDS_TIMEOUT_S = 900.0
_STOP_TIMEOUT_S = 120.0
_TERMINAL = {dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED}


@pytest.fixture(scope="module")
def tools() -> None:
    """What the demo runs, from .ci/setup: a missing one fails here in one line."""
    sbin = f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin"
    for binary, package in (("docker", "docker-cli"), ("dockerd", "docker.io")):
        if shutil.which(binary, path=sbin) is None:
            pytest.fail(f"{binary} not found: .ci/setup installs {package}", pytrace=False)
    if not Path("/usr/bin/docker-registry").is_file():
        pytest.fail("docker-registry not found: .ci/setup installs it", pytrace=False)
    if find_buildx() is None:
        pytest.fail("no docker buildx plugin: .ci/setup installs docker-buildx", pytrace=False)
    if not BUSYBOX.is_file():
        pytest.fail(f"{BUSYBOX} is missing: .ci/setup installs busybox-static", pytrace=False)


def _environment(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DAGSTER_", "ROCM_"))}
    env.pop("HOLD_S", None)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(PROJECT_ROOT), env.get("PYTHONPATH")] if p)
    return {**env, **extra}


def _processes_mentioning(text: str) -> list[int]:
    """Processes whose command line or environment names `text`: what the demo left running."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or not alive(int(proc.name)):
            continue
        try:
            seen = (proc / "cmdline").read_bytes() + (proc / "environ").read_bytes()
        except OSError:
            continue
        if text.encode() in seen:
            found.append(int(proc.name))
    return found


@pytest.fixture
def scratch() -> Iterator[Path]:
    # Short: the nodes' sockets live under it, within the 108-byte limit of a socket path.
    root = Path(tempfile.mkdtemp(prefix="rocm-demo-test-"))
    try:
        yield root
    finally:
        # What a killed dockerd left mounted comes off first.
        remove_root(root)


def _start_demo(scratch: Path, *args: str) -> tuple[subprocess.Popen[bytes], Path, Path, int]:
    """The demo as `make demo` runs it: (process, its stdout file, its state dir, its UI port)."""
    state, port, log = scratch / "farm", free_port(), scratch / "demo.out"
    argv = [sys.executable, str(DEMO), "--port", str(port), "--state-dir", str(state), *args]
    with log.open("wb") as out, (scratch / "demo.err").open("wb") as err:
        demo = subprocess.Popen(
            argv,
            cwd=PROJECT_ROOT,
            env=_environment({}),
            stdout=out,
            stderr=err,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    return demo, log, state, port


def _wait_for_line(proc: subprocess.Popen[bytes], log: Path, pattern: str) -> re.Match[str]:
    deadline = time.monotonic() + _UP_TIMEOUT_S
    while True:
        text = log.read_text(errors="replace")
        found = re.search(pattern, text, re.MULTILINE)
        if found:
            return found
        if proc.poll() is not None:
            err = (log.parent / "demo.err").read_text(errors="replace")
            pytest.fail(f"the demo exited with {proc.returncode}:\n{text}{err}", pytrace=False)
        if time.monotonic() > deadline:
            pytest.fail(f"no {pattern!r} from the demo in {_UP_TIMEOUT_S:.0f}s:\n{text}")
        time.sleep(1.0)


def _stop(demo: subprocess.Popen[bytes]) -> int:
    """SIGTERM, as a user's Ctrl-C; the exit status."""
    if demo.poll() is None:
        demo.send_signal(signal.SIGTERM)
    try:
        return demo.wait(timeout=_STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(demo.pid, signal.SIGKILL)
        raise


def _build_runs(instance: dg.DagsterInstance, request: str, expected: int) -> list[dg.RunRecord]:
    """The request's build runs, once `expected` of them exist and nothing of it is in flight."""
    deadline = time.monotonic() + _BUILDS_TIMEOUT_S
    while True:
        records = instance.get_run_records(dg.RunsFilter(tags={REQUEST_TAG: request}))
        builds = [r for r in records if r.dagster_run.tags.get(ROCM_BUILD_TAG)]
        if len(builds) >= expected and all(r.dagster_run.status in _TERMINAL for r in records):
            return builds
        if time.monotonic() > deadline:
            states = sorted(
                f"{r.dagster_run.tags.get(ROCM_BUILD_TAG)}={r.dagster_run.status.value}"
                for r in records
            )
            pytest.fail(f"request {request} unfinished after {_BUILDS_TIMEOUT_S:.0f}s: {states}")
        time.sleep(1.0)


def _registry_digest(url: str, ref: str) -> str | None:
    """The demo registry's digest for a pushed `host/repo:tag`."""
    repo, _, tag = ref.split("/", 1)[1].rpartition(":")
    head = httpx.head(
        f"{url}/v2/{repo}/manifests/{tag}",
        headers={"Accept": MANIFEST_ACCEPT},
        timeout=10.0,
        trust_env=False,
    )
    return head.headers.get("Docker-Content-Digest") if head.status_code == 200 else None


def _placed_at(instance: dg.DagsterInstance, run_id: str) -> float:
    """When the coordinator placed the run: its `placed <build> on <node>` event."""
    for event in instance.all_logs(run_id):
        if (event.message or "").startswith("placed "):
            return event.timestamp
    pytest.fail(f"run {run_id} has no placement event")


@pytest.mark.real
def test_the_demo_builds_the_example_farm_for_two_arches(tools: None, scratch: Path) -> None:
    demo, log, state, port = _start_demo(scratch)
    try:
        registry = _wait_for_line(demo, log, r"^registry     (http://\S+)$").group(1)
        backfill = _wait_for_line(
            demo, log, r"^  request (\w+): group default for (.*) \((\d+) builds, one run each, "
        )
        _wait_for_line(demo, log, r"^Ctrl-C stops it and removes ")
        # The demo put Debian's static busybox where the farm's Dockerfiles COPY it from.
        assert (FARM / "busybox").read_bytes() == BUSYBOX.read_bytes()
        graph = load_graph(FARM / "bake.hcl", {})
        assert backfill.group(2) == ", ".join(graph.arches) == "gfx942, gfx1100"
        expected = {
            f"{t}@{a}" if t in graph.per_arch else t
            for t in graph.groups["default"]
            for a in graph.arches
        }
        assert int(backfill.group(3)) == len(expected) == 9  # 4 per-arch targets x 2, 1 noarch

        fleet = load_fleet(FARM / "fleet.yaml")
        home = state / "dagster_home"
        with dg.DagsterInstance.from_ref(InstanceRef.from_dir(str(home))) as instance:
            runs = _build_runs(instance, backfill.group(1), len(expected))
            by_build = {r.dagster_run.tags[ROCM_BUILD_TAG]: r for r in runs}
            assert set(by_build) == expected and len(runs) == len(expected)
            # Every run of the demo succeeded: no input ever
            # failed, so no build was placed on a failed input or sat queued behind one.
            assert {
                r.dagster_run.run_id[:8]: r.dagster_run.status.value
                for r in instance.get_run_records()
                if r.dagster_run.status != dg.DagsterRunStatus.SUCCESS
            } == {}

            materialized: dict[str, dict[str, Any]] = {}
            materialized_at: dict[str, float] = {}
            for build, record in by_build.items():
                target, _, arch = build.partition("@")
                [found] = instance.fetch_materializations(
                    dg.AssetRecordsFilter(
                        asset_key=dg.AssetKey(target), asset_partitions=[arch] if arch else None
                    ),
                    limit=10,
                ).records
                assert found.run_id == record.dagster_run.run_id
                assert found.asset_materialization is not None
                metadata = {k: v.value for k, v in found.asset_materialization.metadata.items()}
                node = fleet.node(record.dagster_run.tags[ROCM_NODE_TAG])
                assert metadata["node"] == node.name and metadata["builder"] == node.builder
                # A real BuildKit ref of the docker driver: builder/node/ref.
                assert re.fullmatch(
                    rf"{node.builder}/{node.builder}/[a-z0-9]+", str(metadata["history_ref"])
                )
                # The digest recorded is the one the registry serves for every pushed tag.
                assert str(metadata["digest"]).startswith("sha256:")
                assert metadata["tags"] and all(
                    _registry_digest(registry, tag) == metadata["digest"]
                    for tag in metadata["tags"]
                ), (build, metadata["tags"])
                materialized[build], materialized_at[build] = metadata, found.timestamp

            # No build was placed before each of its inputs had published: its materialization,
            # recorded once its bake pushed, comes before the placement (a failed input freed
            # its builder before its run failed, and once passed for a published one).
            for build, record in by_build.items():
                placed = _placed_at(instance, record.dagster_run.run_id)
                for dep in build_deps(graph, Build.parse(build)):
                    assert materialized_at[str(dep)] <= placed, (build, str(dep))

        # Each node's own BuildKit history: the builds placed there, by name, as completed
        # records whose refs the materializations carry, and never two at once.
        env = _environment({"DOCKER_CONFIG": str(state / "docker-config")})
        for name in ("DOCKER_HOST", "DOCKER_CONTEXT"):
            env.pop(name, None)
        records: dict[str, list[HistoryRecord]] = {}
        for node in fleet.nodes:
            records[node.builder] = [
                r for r in history(node.builder, env) if r.name.startswith(NAME_PREFIX)
            ]
        for build, record in by_build.items():
            target, _, arch = build.partition("@")
            name = f"{NAME_PREFIX}{target}/{arch or 'noarch'}/{record.dagster_run.run_id}"
            builder = str(materialized[build]["builder"])
            named = [(b, r) for b, rs in records.items() for r in rs if r.name == name]
            assert [(b, r.ref, r.status) for b, r in named] == [
                (builder, materialized[build]["history_ref"], "Completed")
            ], build
        assert sum(map(len, records.values())) == len(expected)
        demo_builders = Builders(
            state / "docker-config",
            {
                node.builder: Dockerd(
                    f"unix://{state / 'nodes' / node.name / 'docker.sock'}",
                    state / "nodes" / node.name,
                    state / f"dockerd-{node.name}.log",
                    0.0,
                )
                for node in fleet.nodes
            },
            env,
        )
        demo_names = {r.name for rs in records.values() for r in rs}
        assert demo_builders.overlaps(NAME_PREFIX, demo_names) == []
        # And as the runs measured their bakes.
        for builder in records:
            spans = sorted(
                (float(m["started_at"]), float(m["finished_at"]), b)
                for b, m in materialized.items()
                if m["builder"] == builder
            )
            for (_, end, before), (start, _, after) in itertools.pairwise(spans):
                assert start >= end, f"{builder}: {after} started before {before} ended"
    finally:
        code = _stop(demo)
    out = log.read_text()
    assert code == 0, out + (scratch / "demo.err").read_text()
    assert out.rstrip().endswith("stopping the demo's dagster dev, dockerds and registry")
    assert not state.exists()
    assert _processes_mentioning(str(state)) == []
    with pytest.raises(httpx.TransportError):
        httpx.get(f"http://127.0.0.1:{port}/", timeout=5.0, trust_env=False)


@pytest.mark.real
def test_when_dagster_dev_dies_the_demo_keeps_its_state(tools: None, scratch: Path) -> None:
    demo, log, state, port = _start_demo(scratch, "--no-backfill")
    try:
        _wait_for_line(demo, log, r"^Ctrl-C stops it and removes ")
        mark = f"DOCKER_CONFIG={state / 'docker-config'}\0"
        [daemon] = [
            pid
            for pid in _processes_mentioning(mark)
            if b"dagster._daemon" in Path(f"/proc/{pid}/cmdline").read_bytes()
        ]
        # Its daemon killed, dagster dev stops its webserver and exits.
        os.kill(daemon, signal.SIGKILL)
        code = demo.wait(timeout=_STOP_TIMEOUT_S)
    finally:
        if demo.poll() is None:
            _stop(demo)
    assert code == 1
    kept = f"logs ({state}/*.log) and state kept in {state}"
    assert re.fullmatch(
        r"make demo: dagster-daemon died \(return code -9\), so dagster dev exited \(-?\d+\); "
        rf"the rest is stopped, {re.escape(kept)}\n",
        (scratch / "demo.err").read_text(),
    ), (scratch / "demo.err").read_text()
    # Kept: the logs (dagster dev's says what died), the runs' storage, the nodes' data.
    assert (
        "dagster-daemon process shut down unexpectedly with return code -9"
        in (state / "dagster-dev.log").read_text()
    )
    assert {p.name for p in state.glob("*.log")} >= {
        "registry.log",
        "dagster-dev.log",
        *(f"dockerd-{n.name}.log" for n in load_fleet(FARM / "fleet.yaml").nodes),
    }
    assert (state / "dagster_home" / "dagster.yaml").is_file()
    # Everything else it started is stopped.
    assert _processes_mentioning(str(state)) == []
    with pytest.raises(httpx.TransportError):
        httpx.get(f"http://127.0.0.1:{port}/", timeout=5.0, trust_env=False)


def test_without_buildx_the_demo_says_how_to_install_it(tools: None, scratch: Path) -> None:
    # Stand-in: a docker CLI without the plugin, first on PATH (every real one here finds it).
    bin_dir = scratch / "bin"
    bin_dir.mkdir()
    client = bin_dir / "docker"
    client.write_text(
        f"#!{sys.executable}\nimport sys\n"
        "sys.stderr.write(\"docker: 'buildx' is not a docker command.\\n\")\nsys.exit(1)\n"
    )
    client.chmod(0o755)
    state = scratch / "farm"
    out = subprocess.run(
        [sys.executable, str(DEMO), "--state-dir", str(state)],
        cwd=PROJECT_ROOT,
        env=_environment({"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 2
    assert out.stdout == ""
    assert out.stderr == (
        f"make demo: docker buildx is missing ({client} has no `buildx`): {BUILDX_INSTALL_HINT}\n"
    )
    assert not state.exists()
