"""Never two builds on one machine, whatever submits them: the real daemon under load.

Issue 11's stress test, on SQLite and on PostgreSQL: the real queued-run daemon (`dagster-daemon
run`, with the placement coordinator and run monitoring), two `dagster job launch` requests of the
e2e farm's default group (one per arch; each fans out into one run per build) and several
`dagster asset materialize` runs (in-process, no queue) started at the same moment, with more
builds than nodes. Each bake is held for a few seconds by the recording `docker` stand-in, which
records the builder it held and when. Asserted: no two bakes overlap on one builder, every run
ends SUCCESS, and each build of each request baked exactly once.

Real: the daemon, its code server and run workers, the Dagster CLIs, the instance's storage
(SQLite files or PostgreSQL 15), Debian's docker-registry (preflight reads it). Stand-in: the
`docker` shim in recording mode (no BuildKit: what is under test is placement, not building).
"""

import itertools
import json
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
import pytest
import yaml
from dagster._core.instance.ref import InstanceRef

from rocm_assets.core.bake import load_graph
from rocm_assets.core.constants import ROCM_BUILD_TAG, ROCM_FANOUT_OF_TAG, ROCM_FANOUT_TAG
from rocm_assets.core.registry import parse_image_ref
from rocm_assets_tests.helpers import PROJECT_ROOT, wait_until
from rocm_assets_tests.servers.dockerd import E2E_BAKE_FILE, SHIM_DIR
from rocm_assets_tests.servers.registry import RegistryServer

ARCHES = ("gfx942", "gfx1100")
BUILDERS = ("b1", "b2")
HOLD_S = 2.0
# In-process requests, each a run of its own, racing the job launches for the same machines.
IN_PROCESS = (("base", "gfx942"), ("tool-wheel", None), ("lib", "gfx1100"), ("app-wheel", "gfx942"))
GUARD_S = 900.0


@dataclass(frozen=True)
class Farm:
    env: dict[str, str]
    home: Path
    workspace: Path
    record_file: Path
    logs: Path


@contextmanager
def _instance(farm: Farm) -> Iterator[dg.DagsterInstance]:
    with dg.DagsterInstance.from_ref(InstanceRef.from_dir(str(farm.home))) as instance:
        yield instance


def _write_home(home: Path, storage: dict | None) -> None:
    config: dict = {
        "run_coordinator": {
            "module": "rocm_assets.instance.coordinator",
            "class": "PlacementRunCoordinator",
            "config": {
                "max_concurrent_runs": 25,
                "dequeue_interval_seconds": 1,
                "probe_nodes": False,
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
        config["storage"] = storage
    home.mkdir()
    (home / "dagster.yaml").write_text(yaml.safe_dump(config))


def _make_farm(root: Path, registry: RegistryServer, storage: dict | None) -> Farm:
    home = root / "home"
    _write_home(home, storage)
    fleet = root / "fleet.yaml"
    nodes = [
        {"name": f"n-{b}", "builder": b, "cores": 8, "mem_gb": 16, "link_mbps": 1000}
        for b in BUILDERS
    ]
    fleet.write_text(
        yaml.safe_dump({"nodes": nodes, "target_costs": {"reference": {"cores": 8, "mem_gb": 16}}})
    )
    registry_var = f"{registry.host}/{registry.new_repo('stress')}"
    graph = load_graph(E2E_BAKE_FILE, {"REGISTRY": registry_var})
    # Every input published up front: preflight passes, and what is under test is placement.
    for ref in sorted({r for t in graph.asset_targets for a in ARCHES for r in graph.tags(t, a)}):
        image = parse_image_ref(ref)
        registry.push_image(image.repo, image.reference)
    workspace = root / "workspace.yaml"
    workspace.write_text(
        yaml.safe_dump(
            {
                "load_from": [
                    {
                        "python_module": {
                            "module_name": "rocm_assets.definitions",
                            "location_name": "rocm_assets",
                            "working_directory": str(PROJECT_ROOT),
                        }
                    }
                ]
            }
        )
    )
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("ROCM_", "DAGSTER_")) and k not in ("PUBLISHED_INPUTS", "GPU_ARCH")
    }
    env.update(
        PATH=os.pathsep.join([str(SHIM_DIR), str(Path(sys.executable).parent), env["PATH"]]),
        PYTHONPATH=os.pathsep.join(p for p in [str(PROJECT_ROOT), env.get("PYTHONPATH")] if p),
        DAGSTER_HOME=str(home),
        ROCM_BAKE_FILE=str(E2E_BAKE_FILE),
        ROCM_FLEET_FILE=str(fleet),
        ROCM_REGISTRY_URL=registry.url,
        REGISTRY=registry_var,
        ROCM_SHIM_STATE=str(root / "shim-state"),
        ROCM_SHIM_BUILDERS=",".join(BUILDERS),
        ROCM_SHIM_RECORD=str(root / "bakes.jsonl"),
        ROCM_SHIM_HOLD_S=str(HOLD_S),
    )
    logs = root / "logs"
    logs.mkdir()
    return Farm(env, home, workspace, root / "bakes.jsonl", logs)


def _start(farm: Farm, name: str, *argv: str) -> subprocess.Popen[bytes]:
    with (farm.logs / f"{name}.log").open("wb") as log:
        return subprocess.Popen(
            [sys.executable, "-m", *argv],
            cwd=PROJECT_ROOT,
            env=farm.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            # Its own group: stopping it reaches its code server and run workers.
            start_new_session=True,
        )


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is not None:
        return
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def _logs(farm: Farm) -> str:
    return "\n".join(
        f"--- {p.name}\n" + "\n".join(p.read_text(errors="replace").splitlines()[-15:])
        for p in sorted(farm.logs.glob("*.log"))
    )


@pytest.fixture(params=["sqlite", "postgres"])
def farm(
    request: pytest.FixtureRequest, tmp_path: Path, registry_server: RegistryServer
) -> Iterator[Farm]:
    storage = None
    if request.param == "postgres":
        storage = {"postgres": {"postgres_url": request.getfixturevalue("postgres_db")}}
    farm = _make_farm(tmp_path, registry_server, storage)
    # Create the storage before anything else opens it: SQLite's first migration is not safe
    # against processes initialising the same new files at once.
    with _instance(farm):
        pass
    daemon = _start(farm, "daemon", "dagster._daemon", "run", "-w", str(farm.workspace))
    try:
        with _instance(farm) as instance:
            wait_until(
                lambda: (
                    daemon.poll() is None
                    and "QUEUED_RUN_COORDINATOR" in instance.get_daemon_heartbeats()
                ),
                "the daemon's first heartbeat",
                timeout_s=180,
                poll_s=0.5,
            )
        yield farm
    finally:
        _stop(daemon)


@pytest.mark.real
def test_no_two_builds_ever_share_a_machine(farm: Farm) -> None:
    submitters = [
        _start(
            farm,
            f"launch-{arch}",
            "dagster",
            "job",
            "launch",
            "-w",
            str(farm.workspace),
            "-j",
            "default",
            "--tags",
            json.dumps({"dagster/partition": arch}),
        )
        for arch in ARCHES
    ]
    for target, arch in IN_PROCESS:
        partition = ["--partition", arch] if arch else []
        submitters.append(
            _start(
                farm,
                f"materialize-{target}-{arch}",
                "dagster",
                "asset",
                "materialize",
                "-m",
                "rocm_assets.definitions",
                "--select",
                target,
                *partition,
            )
        )
    try:
        with _instance(farm) as instance:

            def settled() -> bool:
                runs = instance.get_runs()
                children = [r for r in runs if r.tags.get(ROCM_FANOUT_OF_TAG)]
                return (
                    all(p.poll() is not None for p in submitters)
                    and len(children) == 4 * len(ARCHES)
                    and all(r.is_finished for r in runs)
                )

            wait_until(settled, f"every run ended\n{_logs(farm)}", timeout_s=GUARD_S, poll_s=1.0)
            runs = instance.get_runs()
    finally:
        for process in submitters:
            _stop(process)
    failed = {r.run_id[:8]: r.status.value for r in runs if r.status != dg.DagsterRunStatus.SUCCESS}
    assert failed == {}, _logs(farm)
    assert [p.returncode for p in submitters] == [0] * len(submitters), _logs(farm)

    bakes = [json.loads(line) for line in farm.record_file.read_text().splitlines()]
    # No two bakes overlap on one builder.
    by_builder: dict[str, list[tuple[float, float, str]]] = {}
    for bake in bakes:
        by_builder.setdefault(bake["builder"], []).append(
            (bake["started"], bake["ended"], bake["env"]["RUN_ID"])
        )
    assert set(by_builder) <= set(BUILDERS)
    for builder, spans in by_builder.items():
        spans.sort()
        for (_, end, first), (start, _, second) in itertools.pairwise(spans):
            assert start >= end, f"{builder}: {first[:8]} and {second[:8]} overlapped"
    # Each build of each request baked exactly once: one bake per build run, of its build.
    per_run = Counter(bake["env"]["RUN_ID"] for bake in bakes)
    build_runs = [r for r in runs if r.tags.get(ROCM_FANOUT_TAG) != "parent"]
    assert {r.run_id: per_run[r.run_id] for r in build_runs} == {r.run_id: 1 for r in build_runs}
    assert len(build_runs) == 4 * len(ARCHES) + len(IN_PROCESS)
    assert all(r.tags.get(ROCM_BUILD_TAG) for r in build_runs)
