"""`make demo` (examples/demo.py) end to end, with the test stand-in for `docker buildx`.

Real: the demo's own docker-registry; one dockerd per node of examples/farm/fleet.yaml, each on a
private socket, that the demo starts; `dagster dev` with the placement coordinator, which the demo
starts; the two-arch backfill it launches through the webserver's GraphQL API; every build's
`docker build` and `docker push` (Debian's docker client) on the engine of the node it was placed
on; and the demo's clean-up on SIGTERM. Stand-in: `docker buildx` is rocm_assets_tests/shim/docker,
which implements bake's contract over the real client and builds on the engine of the docker
context the demo created for the builder, as real buildx does with a context.
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

import dagster as dg
import httpx
import pytest
from dagster._core.instance.ref import InstanceRef

from rocm_assets.core.bake import load_graph
from rocm_assets.core.build import BUILDX_INSTALL_HINT
from rocm_assets.core.constants import ROCM_BUILD_TAG, ROCM_NODE_TAG
from rocm_assets.core.fleet import load_fleet
from rocm_assets_tests.helpers import PROJECT_ROOT, alive, free_port
from rocm_assets_tests.servers.dockerd import SHIM_DIR, find_real_docker

DEMO = PROJECT_ROOT / "examples" / "demo.py"
FARM = PROJECT_ROOT / "examples" / "farm"
_UP_TIMEOUT_S = 600.0
_BUILDS_TIMEOUT_S = 600.0
_STOP_TIMEOUT_S = 120.0
_TERMINAL = {dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED}


def _environment(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DAGSTER_", "ROCM_"))}
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
        shutil.rmtree(root, ignore_errors=True)


def _wait_for_line(proc: subprocess.Popen[bytes], log: Path, pattern: str) -> re.Match[str]:
    deadline = time.monotonic() + _UP_TIMEOUT_S
    while True:
        text = log.read_text(errors="replace")
        found = re.search(pattern, text, re.MULTILINE)
        if found:
            return found
        if proc.poll() is not None:
            pytest.fail(f"the demo exited with {proc.returncode}:\n{text}", pytrace=False)
        if time.monotonic() > deadline:
            pytest.fail(f"no {pattern!r} from the demo in {_UP_TIMEOUT_S:.0f}s:\n{text}")
        time.sleep(1.0)


def _build_runs(home: Path, backfill_id: str, expected: int) -> list[dg.RunRecord]:
    """The backfill's build runs, once `expected` of them exist and nothing of it is in flight."""
    deadline = time.monotonic() + _BUILDS_TIMEOUT_S
    with dg.DagsterInstance.from_ref(InstanceRef.from_dir(str(home))) as instance:
        while True:
            records = instance.get_run_records(dg.RunsFilter.for_backfill(backfill_id))
            builds = [r for r in records if r.dagster_run.tags.get(ROCM_BUILD_TAG)]
            if len(builds) >= expected and all(r.dagster_run.status in _TERMINAL for r in records):
                return builds
            if time.monotonic() > deadline:
                states = sorted(
                    f"{r.dagster_run.tags.get(ROCM_BUILD_TAG)}={r.dagster_run.status.value}"
                    for r in records
                )
                pytest.fail(
                    f"backfill {backfill_id} unfinished after {_BUILDS_TIMEOUT_S:.0f}s: {states}"
                )
            time.sleep(1.0)


@pytest.mark.real
def test_the_demo_builds_the_example_farm_for_two_arches(scratch: Path) -> None:
    state, port = scratch / "farm", free_port()
    env = _environment(
        {
            "ROCM_SHIM_REAL_DOCKER": find_real_docker(),
            "ROCM_SHIM_STATE": str(scratch / "shim-state"),
        }
    )
    log = scratch / "demo.out"
    argv = [sys.executable, str(DEMO), "--docker", str(SHIM_DIR / "docker"), "--port", str(port)]
    with log.open("wb") as out:
        demo = subprocess.Popen(
            [*argv, "--state-dir", str(state)],
            cwd=PROJECT_ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    try:
        backfill = _wait_for_line(
            demo, log, r"^  backfill (\w+): group default for (.*) \((\d+) builds\)$"
        )
        _wait_for_line(demo, log, r"^Ctrl-C stops it and removes ")
        graph = load_graph(FARM / "bake.hcl", {})
        assert backfill.group(2) == ", ".join(graph.arches) == "gfx942, gfx1100"
        expected = {
            f"{t}@{a}" if t in graph.per_arch else t
            for t in graph.groups["default"]
            for a in graph.arches
        }
        assert int(backfill.group(3)) == len(expected) == 9  # 4 per-arch targets x 2, 1 noarch

        runs = _build_runs(state / "dagster_home", backfill.group(1), len(expected))
        by_build = {r.dagster_run.tags[ROCM_BUILD_TAG]: r for r in runs}
        assert set(by_build) == expected and len(runs) == len(expected)
        assert {b: r.dagster_run.status for b, r in by_build.items()} == dict.fromkeys(
            expected, dg.DagsterRunStatus.SUCCESS
        )

        # No two builds on one node at once.
        spans: dict[str, list[tuple[float, float, str]]] = {}
        for build, record in by_build.items():
            assert record.start_time is not None and record.end_time is not None
            node = record.dagster_run.tags[ROCM_NODE_TAG]
            spans.setdefault(node, []).append((record.start_time, record.end_time, build))
        for node, node_spans in spans.items():
            for (_, end, before), (start, _, after) in itertools.pairwise(sorted(node_spans)):
                assert start >= end, f"{node}: {after} started before {before} ended"

        # Each build ran on the engine of the node it was placed on, and was recorded there.
        fleet = load_fleet(FARM / "fleet.yaml")
        client = env["ROCM_SHIM_REAL_DOCKER"]
        with dg.DagsterInstance.from_ref(
            InstanceRef.from_dir(str(state / "dagster_home"))
        ) as instance:
            for build, record in by_build.items():
                node = fleet.node(record.dagster_run.tags[ROCM_NODE_TAG])
                socket = f"unix://{state / 'nodes' / node.name / 'docker.sock'}"
                images = subprocess.run(
                    [client, "-H", socket, "images", "--format", "{{.Repository}}:{{.Tag}}"],
                    capture_output=True, text=True, check=True,
                ).stdout.split()  # fmt: skip
                target, _, arch = build.partition("@")
                materialization = (
                    instance.fetch_materializations(
                        dg.AssetRecordsFilter(
                            asset_key=dg.AssetKey(target), asset_partitions=[arch] if arch else None
                        ),
                        limit=1,
                    )
                    .records[0]
                    .asset_materialization
                )
                assert materialization is not None
                metadata = {k: v.value for k, v in materialization.metadata.items()}
                assert metadata["node"] == node.name and metadata["builder"] == node.builder
                assert str(metadata["history_ref"]).startswith(f"{node.builder}/")
                assert str(metadata["digest"]).startswith("sha256:")
                assert set(metadata["tags"]) <= set(images), (build, node.name, images)
    finally:
        if demo.poll() is None:
            demo.send_signal(signal.SIGTERM)
        try:
            code = demo.wait(timeout=_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(demo.pid, signal.SIGKILL)
            raise
    assert code == 0, log.read_text()
    assert (
        log.read_text().rstrip().endswith("stopping the demo's dagster dev, dockerds and registry")
    )
    assert not state.exists()
    assert _processes_mentioning(str(state)) == []
    with pytest.raises(httpx.TransportError):
        httpx.get(f"http://127.0.0.1:{port}/", timeout=5.0, trust_env=False)


def test_without_buildx_the_demo_says_how_to_install_it(scratch: Path) -> None:
    # Real: Debian's docker client, which has no buildx plugin, with no user plugins either.
    client = "/usr/bin/docker"
    assert subprocess.run(
        [client, "buildx", "version"], capture_output=True, check=False
    ).returncode
    config = scratch / "docker-config"
    config.mkdir()
    state = scratch / "farm"
    out = subprocess.run(
        [sys.executable, str(DEMO), "--docker", client, "--state-dir", str(state)],
        cwd=PROJECT_ROOT,
        env=_environment({"DOCKER_CONFIG": str(config)}),
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
