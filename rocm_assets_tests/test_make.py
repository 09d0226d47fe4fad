"""The Makefile's seed-compatible targets: the exact command each runs, and build-all for real.

Real parts: GNU make on the repo's Makefile, the installed `rocm-assets` CLI, the shipped
rocm-bake.hcl and fleet.yaml. `docker` is the recording stand-in (rocm_assets_tests/shim/docker):
its `buildx bake` records argv, working directory and bake's environment settings, builds nothing.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rocm_assets_tests.helpers import PROJECT_ROOT, free_port
from rocm_assets_tests.servers.dockerd import RecordingShim

# Where the running interpreter's console scripts are: the Makefile's $(BIN) for these tests.
BIN = Path(sys.executable).parent
URL = "http://127.0.0.1:3999"
# Settings the caller may have exported that would change what the targets do.
_CALLER_SETTINGS = ("ARCH", "GPU_ARCH", "BUILDER", "GROUP", "PUBLISHED_INPUTS", "MAKEFLAGS")
POOL_REASON = (
    "every target would be its own bake invocation, so stage 2 would silently build against "
    "whatever is in the registry rather than what stage 1 produced"
)


def clean_env(base: dict[str, str] | None = None) -> dict[str, str]:
    return {k: v for k, v in (base or os.environ).items() if k not in _CALLER_SETTINGS}


def make(
    *args: str, env: dict[str, str] | None = None, dry_run: bool = False
) -> subprocess.CompletedProcess[str]:
    base = clean_env() if env is None else env
    argv = ["make", "--no-print-directory", "-C", str(PROJECT_ROOT), f"BIN={BIN}"]
    argv += ["-n"] if dry_run else []
    return subprocess.run(
        [*argv, *args], env=base, capture_output=True, text=True, timeout=300, check=False
    )


@pytest.mark.parametrize(
    ("target", "command"),
    [
        ("push-all", f"backfill --url {URL} --group default --arch gfx942 gfx1100"),
        ("push-wheels", f"backfill --url {URL} --group wheels --arch gfx942 gfx1100"),
        ("push-pytorch", f"backfill --url {URL} --targets pytorch --arch gfx942 gfx1100"),
        ("push-runtime", f"backfill --url {URL} --job pytorch_run_job --arch gfx942 gfx1100"),
        ("watch", f"watch --url {URL}"),
    ],
)
def test_each_target_is_one_rocm_assets_call(target: str, command: str) -> None:
    out = make(target, "ARCH=gfx942 gfx1100", f"DAGSTER_URL={URL}", dry_run=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [f"{BIN}/rocm-assets", *command.split()]


def test_build_all_and_watch_options() -> None:
    out = make("build-all", "BUILDER=snoc-think", dry_run=True)
    assert out.stdout.split() == [
        f"{BIN}/rocm-assets",
        *"build-all --builder snoc-think --group default".split(),
    ]
    out = make("build-all", "BUILDER=snoc-lab", "GROUP=wheels", "ARCH=gfx950", dry_run=True)
    assert out.stdout.split() == [
        f"{BIN}/rocm-assets",
        *"build-all --builder snoc-lab --group wheels --arch gfx950".split(),
    ]
    out = make("watch", "ONCE=1", dry_run=True)
    assert out.stdout.split()[-1] == "--once"


def test_arch_defaults_to_gpu_arch_and_is_required() -> None:
    out = make("push-all", dry_run=True, env={**clean_env(), "GPU_ARCH": "gfx950"})
    assert out.stdout.split()[-2:] == ["--arch", "gfx950"]
    out = make("push-all", dry_run=True)
    assert out.returncode != 0
    assert "make push-all: set ARCH=<arch ...> (or GPU_ARCH)" in out.stderr


def test_build_all_needs_a_builder() -> None:
    out = make("build-all", dry_run=True)
    assert out.returncode != 0
    assert "make build-all: set BUILDER=<one node's builder in fleet.yaml>" in out.stderr


def test_readme_targets_are_intact() -> None:
    dev = make("dev", dry_run=True).stdout
    assert f"{BIN}/python -m dagster dev -w workspace.yaml -h 127.0.0.1 -p 3000" in dev
    test = make("test", dry_run=True).stdout
    assert f"{BIN}/python -m pytest" in test


def test_demo_is_one_command_after_set_up() -> None:
    demo = make("demo", dry_run=True).stdout.splitlines()
    assert demo == ["bash .ci/setup", f"{BIN}/python examples/demo.py"]


@pytest.fixture
def shim_env(docker_shim_record: RecordingShim) -> dict[str, str]:
    env = clean_env(docker_shim_record.env)
    # The shipped fleet's builders; the stand-in answers `no builder` for any other.
    env["ROCM_SHIM_BUILDERS"] = "snoc-think,snoc-gaming,snoc-lab,snoc-nuc,snoc-cloud"
    env.pop("ROCM_FLEET_FILE", None)
    env.pop("ROCM_BAKE_FILE", None)
    return env


def test_build_all_refuses_the_pool(
    shim_env: dict[str, str], docker_shim_record: RecordingShim
) -> None:
    out = make("build-all", "BUILDER=snoc-pool", env=shim_env)
    assert out.returncode != 0
    errors = [line for line in out.stderr.splitlines() if line.startswith("rocm-assets:")]
    assert len(errors) == 1
    assert "refuses the pool 'snoc-pool'" in errors[0]
    assert POOL_REASON in errors[0]
    # A name that is no single node's builder is refused the same way.
    out = make("build-all", "BUILDER=every-node", env=shim_env)
    assert out.returncode != 0
    assert "'every-node' is none in" in out.stderr
    assert POOL_REASON in out.stderr
    assert docker_shim_record.records() == []


def test_build_all_bakes_the_group_once_on_one_builder(
    shim_env: dict[str, str], docker_shim_record: RecordingShim
) -> None:
    # Env-only settings reach bake from the caller's environment unchanged.
    settings = {
        "SCCACHE_LOG": "debug",
        "RUN_ID": "make-test",
        "CACHE_TAG_SUFFIX": "-exp1",
        "SDE_PYTHON_VERSION": "3.12",
    }
    out = make("build-all", "BUILDER=snoc-think", "ARCH=gfx1100", env={**shim_env, **settings})
    assert out.returncode == 0, out.stderr
    records = docker_shim_record.records()
    assert len(records) == 1
    (record,) = records
    bake_file = str(PROJECT_ROOT / "rocm-bake.hcl")
    assert record["argv"] == [
        "buildx",
        "bake",
        "-f",
        bake_file,
        "--builder",
        "snoc-think",
        "--",
        "default",
    ]
    assert record["cwd"] == str(PROJECT_ROOT)
    assert "PUBLISHED_INPUTS" not in record["env"]
    assert record["env"] == {**settings, "GPU_ARCH": "gfx1100"}
    # One bake stamped every member of the group, each with its history name.
    assert set(record["metadata"]) >= {"rocm-runtime", "pytorch", "vllm-wheel", "lmcache-wheel"}
    assert "pytorch-run" not in record["metadata"]
    assert f"GPU_ARCH=gfx1100 docker buildx bake -f {bake_file}" in out.stderr


def test_build_all_bakes_each_arch_in_turn(
    shim_env: dict[str, str], docker_shim_record: RecordingShim
) -> None:
    # ARCH lists arches; build-all bakes once per arch, none dropped (issue 15).
    out = make("build-all", "BUILDER=snoc-think", "ARCH=gfx942 gfx1100", env=shim_env)
    assert out.returncode == 0, out.stderr
    assert [r["env"]["GPU_ARCH"] for r in docker_shim_record.records()] == ["gfx942", "gfx1100"]


def test_build_all_refuses_published_inputs(
    shim_env: dict[str, str], docker_shim_record: RecordingShim
) -> None:
    out = make("build-all", "BUILDER=snoc-think", env={**shim_env, "PUBLISHED_INPUTS": "1"})
    assert out.returncode != 0
    assert "PUBLISHED_INPUTS='1'" in out.stderr
    assert docker_shim_record.records() == []


def test_build_all_exits_with_bakes_status(
    shim_env: dict[str, str], docker_shim_record: RecordingShim
) -> None:
    out = make("build-all", "BUILDER=snoc-nuc", env={**shim_env, "ROCM_SHIM_RECORD_MODE": "fail"})
    assert out.returncode != 0
    assert "failed to solve: recorded failure" in out.stderr
    assert len(docker_shim_record.records()) == 1


def test_push_all_reaches_the_webserver_or_says_why() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    out = make("push-all", "ARCH=gfx942", f"DAGSTER_URL={url}")
    assert out.returncode != 0
    errors = [line for line in out.stderr.splitlines() if line.startswith("rocm-assets:")]
    assert len(errors) == 1
    assert errors[0].startswith(f"rocm-assets: error: cannot reach the Dagster webserver at {url}")
    assert "(start it with `make dev`, or pass --url)" in errors[0]


def test_gpu_test_queues_one_check_run_per_arch(tmp_path: Path) -> None:
    """`make gpu-test` through the real `dagster job launch` into a real (SQLite) instance."""
    import dagster as dg

    home = tmp_path / "home"
    home.mkdir()
    env = clean_env({**os.environ, "DAGSTER_HOME": str(home)})
    out = make("gpu-test", "ARCH=gfx942 gfx1100", env=env)
    assert out.returncode == 0, out.stderr
    from dagster._core.instance.ref import InstanceRef

    with dg.DagsterInstance.from_ref(InstanceRef.from_dir(str(home))) as instance:
        runs = instance.get_runs(dg.RunsFilter(job_name="pytorch_test_job"))
        assert sorted(r.tags["dagster/partition"] for r in runs) == ["gfx1100", "gfx942"]
        assert all(r.status == dg.DagsterRunStatus.QUEUED for r in runs)
        assert all(not r.asset_selection for r in runs)  # a check run builds nothing
