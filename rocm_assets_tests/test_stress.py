"""Never two builds on one machine, whatever submits them: the real daemon under load.

Issue 11's stress test, on SQLite and on PostgreSQL: the real queued-run daemon (`dagster-daemon
run`, with the placement coordinator and run monitoring), two `dagster job launch` requests of the
e2e farm's default group (one per arch; each fans out into one run per build) and several
`dagster asset materialize` runs (in-process, no queue) started at the same moment, with more
builds than nodes: two builders, each a docker context of its own engine (two machines). Each
build is a real bake that holds its node HOLD_S seconds (a busybox sleep). Asserted from the
builders' own BuildKit history: no two bakes overlapped on one builder, and each build of each
request baked exactly once, on the builder its run held; and every run ended SUCCESS.

Real, all of it: the daemon, its code server and run workers, the Dagster CLIs, the instance's
storage (SQLite files or PostgreSQL 15), Debian's docker-registry (preflight reads it, bake pushes
to it), two dockerd 26 engines and Debian's buildx 0.29 (`docker buildx bake`, `docker buildx
history ls`). The in-process runs' inputs are built for real before the race (preflight checks
them before such a run waits in line).
"""

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
import pytest
import yaml
from dagster._core.instance.ref import InstanceRef

from rocm_assets.core.build.invocation import builder_env
from rocm_assets.core.common.constants import (
    ROCM_BUILD_TAG,
    ROCM_BUILDER_TAG,
    ROCM_FANOUT_OF_TAG,
    ROCM_FANOUT_TAG,
)
from rocm_assets_tests.helpers import PROJECT_ROOT, wait_until
from rocm_assets_tests.servers.dockerd import (
    E2E_BAKE_FILE,
    E2E_DIR,
    Builders,
    EnginePool,
    make_builders,
)
from rocm_assets_tests.servers.registry import RegistryServer

ARCHES = ("gfx942", "gfx1100")
BUILDERS = ("b1", "b2")
HOLD_S = 2
NAME_PREFIX = "rocm-pytorch-build/"
# In-process requests, each a run of its own, racing the job launches for the same machines.
IN_PROCESS = (("base", "gfx942"), ("tool-wheel", None), ("lib", "gfx1100"), ("app-wheel", "gfx942"))
GUARD_S = 900.0
# What the in-process runs read from the registry: built for real before the race.
SEEDED = ("base", "tool-wheel", "lib")


@dataclass(frozen=True)
class Farm:
    env: dict[str, str]
    home: Path
    workspace: Path
    builders: Builders
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


def _seed(env: dict[str, str]) -> None:
    """Build and push SEEDED for every arch, for real, in one bake per arch on b1."""
    for arch in ARCHES:
        argv = ["docker", "buildx", "bake", "-f", str(E2E_BAKE_FILE), "--builder", BUILDERS[0]]
        seeded = subprocess.run(
            [*argv, "--push", "--progress=quiet", "--", *SEEDED],
            cwd=E2E_DIR,
            env={**builder_env(BUILDERS[0], env), "GPU_ARCH": arch, "HOLD_S": "0"},
            capture_output=True,
            text=True,
            check=False,
            timeout=300,
        )
        assert seeded.returncode == 0, seeded.stderr


def _make_farm(
    root: Path, registry: RegistryServer, storage: dict | None, builders: Builders
) -> Farm:
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
        for k, v in builders.env.items()
        if not k.startswith(("ROCM_", "DAGSTER_")) and k not in ("PUBLISHED_INPUTS", "GPU_ARCH")
    }
    env.update(
        PATH=os.pathsep.join([str(Path(sys.executable).parent), env["PATH"]]),
        PYTHONPATH=os.pathsep.join(p for p in [str(PROJECT_ROOT), env.get("PYTHONPATH")] if p),
        DAGSTER_HOME=str(home),
        ROCM_BAKE_FILE=str(E2E_BAKE_FILE),
        ROCM_FLEET_FILE=str(fleet),
        ROCM_REGISTRY_URL=registry.url,
        REGISTRY=registry_var,
        HOLD_S=str(HOLD_S),
        # Only the race's own requests: the rebuild automation would add the missing partitions.
        ROCM_AUTOMATION="off",
    )
    _seed(env)
    logs = root / "logs"
    logs.mkdir()
    return Farm(env, home, workspace, builders, logs)


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
    request: pytest.FixtureRequest,
    tmp_path: Path,
    registry_server: RegistryServer,
    engines: EnginePool,
    e2e_context: Path,
) -> Iterator[Farm]:
    storage = None
    if request.param == "postgres":
        storage = {"postgres": {"postgres_url": request.getfixturevalue("postgres_db")}}
    # Two engines: the two builders are two machines.
    builders = make_builders(
        tmp_path / "docker-config", {b: engines.get(i) for i, b in enumerate(BUILDERS)}
    )
    farm = _make_farm(tmp_path, registry_server, storage, builders)
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
@pytest.mark.slow
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

    # Each build run baked exactly once, on the builder it held, and BuildKit completed it.
    build_runs = [r for r in runs if r.tags.get(ROCM_FANOUT_TAG) != "parent"]
    assert len(build_runs) == 4 * len(ARCHES) + len(IN_PROCESS)
    names: dict[str, str] = {}
    for run in build_runs:
        target, _, arch = run.tags[ROCM_BUILD_TAG].partition("@")
        names[f"{NAME_PREFIX}{target}/{arch or 'noarch'}/{run.run_id}"] = run.tags[ROCM_BUILDER_TAG]
    baked = [
        (record.name, builder, record.status)
        for builder in BUILDERS
        for record in farm.builders.history(builder, NAME_PREFIX)
        if record.name in names
    ]
    assert sorted(baked) == sorted((name, b, "Completed") for name, b in names.items())
    # No two bakes overlapped on one builder, by the builders' own clocks.
    assert farm.builders.overlaps(NAME_PREFIX, names) == []
