"""The Makefile's seed-compatible targets: the exact command each runs, and build-all for real.

Real parts: GNU make on the repo's Makefile, the installed `rocm-assets` CLI, the shipped
rocm-bake.hcl and fleet.yaml for the dry runs, and for `make build-all` a real bake: Debian's
`docker buildx bake` (buildx 0.29) of the e2e farm's default group (rocm_assets_tests/fixtures/e2e:
FROM scratch plus Debian's static busybox) on a fleet node's builder, a docker context of a
Debian dockerd 26 (the docker driver). What it built is read back from the engine itself:
BuildKit's history (`docker buildx history ls` and `inspect`: state, Dockerfile, build args,
named contexts, times) and the images in the engine's store; Debian's docker-registry shows
that nothing was pushed. `make gpu-test` queues runs in a real (SQLite) Dagster instance.

Stand-ins: none.
"""

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Mapping
from pathlib import Path

import pytest

from rocm_assets.core.build.invocation import HistoryRecord, builder_env
from rocm_assets_tests.helpers import PROJECT_ROOT, free_port, write_fleet
from rocm_assets_tests.servers.dockerd import E2E_BAKE_FILE, E2E_BUILDER, Builders, record_span
from rocm_assets_tests.servers.registry import RegistryServer

# Where the running interpreter's console scripts are: the Makefile's $(BIN) for these tests.
BIN = Path(sys.executable).parent
URL = "http://127.0.0.1:3999"
# Settings the caller may have exported that would change what the targets do (the e2e farm's
# from RUN_ID on).
_CALLER_SETTINGS = (
    *("ARCH", "GPU_ARCH", "BUILDER", "GROUP", "PUBLISHED_INPUTS", "MAKEFLAGS"),
    *("RUN_ID", "MAX_JOBS", "HOLD_S", "FAIL", "REGISTRY"),
)
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
    assert f'{BIN}/python -m pytest -n 2 --dist loadfile -m "not slow"' in test


def test_the_slow_tests_have_a_target_of_their_own_and_ci_runs_both() -> None:
    slow = make("test-slow", dry_run=True).stdout
    assert f"{BIN}/python -m pytest -n 2 --dist loadfile -m slow" in slow
    ci = (PROJECT_ROOT / ".ci" / "run").read_text().splitlines()
    assert ci.index("make test") < ci.index("make test-slow")


def test_demo_is_one_command_after_set_up() -> None:
    demo = make("demo", dry_run=True).stdout.splitlines()
    assert demo == ["bash .ci/setup", f"{BIN}/python examples/demo.py"]


@pytest.fixture
def farm_env(builders: Builders, registry_server: RegistryServer, tmp_path: Path) -> dict[str, str]:
    """build-all's environment: a fleet whose one node has the test's builder, the e2e farm as
    the bake file, and a registry prefix of the test's own (which build-all must not push to)."""
    fleet = write_fleet(
        tmp_path / "fleet.yaml",
        [{"name": "e2e-node", "builder": E2E_BUILDER}],
        cores=8,
        mem_gb=16,
        link_mbps=100,
    )
    return {
        **clean_env(builders.env),
        "ROCM_FLEET_FILE": str(fleet),
        "ROCM_BAKE_FILE": str(E2E_BAKE_FILE),
        "REGISTRY": f"{registry_server.host}/{registry_server.new_repo('make')}",
    }


def refs(builders: Builders) -> set[str]:
    return {r.ref for r in builders.history(E2E_BUILDER)}


def built_since(builders: Builders, before: set[str]) -> list[tuple[HistoryRecord, dict]]:
    """The builds the node made since `before`, oldest first, each with BuildKit's full record."""
    new = [r for r in builders.history(E2E_BUILDER) if r.ref not in before]
    new.sort(key=lambda r: record_span(r)[0])
    return [(r, builders.inspect(E2E_BUILDER, r.ref)) for r in new]


def args_of(inspected: Mapping) -> dict[str, str]:
    """A record's build args (an empty value has no Value)."""
    return {a["Name"]: a.get("Value", "") for a in inspected.get("BuildArgs") or []}


def by_dockerfile(built: list[tuple[HistoryRecord, dict]]) -> dict[str, tuple[HistoryRecord, dict]]:
    found = {inspected["Dockerfile"]: (record, inspected) for record, inspected in built}
    assert len(found) == len(built), "a target was built twice"
    return found


def local_labels(env: Mapping[str, str], tag: str) -> dict[str, str] | None:
    """The labels of `tag` in the node's engine's image store, or None if it has no such image."""
    out = subprocess.run(
        ["docker", "image", "inspect", "--format", "{{json .Config.Labels}}", "--", tag],
        env=builder_env(E2E_BUILDER, env),
        capture_output=True,
        text=True,
        check=False,
    )
    return json.loads(out.stdout) if out.returncode == 0 else None


def build_all_line(arch: str) -> str:
    """What build-all prints before its bake: the node's context, the arch, the one bake."""
    return (
        f"rocm-assets build-all: DOCKER_CONTEXT={E2E_BUILDER} GPU_ARCH={arch} docker buildx bake "
        f"-f {E2E_BAKE_FILE} --builder {E2E_BUILDER} -- default"
    )


def test_build_all_refuses_the_pool(farm_env: dict[str, str], builders: Builders) -> None:
    before = refs(builders)
    out = make("build-all", "BUILDER=snoc-pool", env=farm_env)
    assert out.returncode != 0
    errors = [line for line in out.stderr.splitlines() if line.startswith("rocm-assets:")]
    assert len(errors) == 1
    assert "refuses the pool 'snoc-pool'" in errors[0]
    assert POOL_REASON in errors[0]
    # A name that is no single node's builder is refused the same way.
    out = make("build-all", "BUILDER=every-node", env=farm_env)
    assert out.returncode != 0
    assert "'every-node' is none in" in out.stderr
    assert POOL_REASON in out.stderr
    # The node built nothing.
    assert refs(builders) == before


def test_build_all_bakes_the_group_once_on_one_builder(
    farm_env: dict[str, str], builders: Builders, registry_server: RegistryServer
) -> None:
    # Env-only settings reach bake from the caller's environment unchanged.
    settings = {"RUN_ID": f"make-{uuid.uuid4().hex[:8]}", "MAX_JOBS": "3", "HOLD_S": "1"}
    before = refs(builders)
    out = make("build-all", f"BUILDER={E2E_BUILDER}", "ARCH=gfx1100", env={**farm_env, **settings})
    assert out.returncode == 0, out.stderr
    assert out.stderr.count("rocm-assets build-all: ") == 1
    assert f"{build_all_line('gfx1100')}\n" in out.stderr

    # One bake built every member of the group on the node, each stage on the one before it as
    # that bake produced it (named contexts linked in-process, not registry references).
    built = by_dockerfile(built_since(builders, before))
    assert set(built) == {"base.Dockerfile", "tool.Dockerfile", "lib.Dockerfile", "app.Dockerfile"}
    assert all(record.status == "Completed" for record, _ in built.values())
    linked = {
        dockerfile: {c["Name"]: c["Value"] for c in inspected.get("NamedContexts") or []}
        for dockerfile, (_, inspected) in built.items()
    }
    assert linked == {
        "base.Dockerfile": {},
        "tool.Dockerfile": {},
        "lib.Dockerfile": {"base-img": "input:0-base", "tool-wheel": "input:0-tool-wheel"},
        "app.Dockerfile": {"lib-img": "input:0-lib"},
    }
    base_args = args_of(built["base.Dockerfile"][1])
    assert {k: base_args[k] for k in ("GPU_ARCH", *settings)} == {"GPU_ARCH": "gfx1100", **settings}
    assert args_of(built["lib.Dockerfile"][1])["BASE_IMAGE"] == "base-img"

    # The result is in the node's image store, and nothing was pushed.
    app = f"{farm_env['REGISTRY']}/e2e/app-wheel:gfx1100"
    assert local_labels(farm_env, app) == {
        "org.rocm.e2e.arch": "gfx1100",
        "org.rocm.e2e.run-id": settings["RUN_ID"],
        "org.rocm.e2e.max-jobs": "3",
    }
    assert registry_server.digest(app) is None


def test_build_all_bakes_each_arch_in_turn(farm_env: dict[str, str], builders: Builders) -> None:
    # ARCH lists arches; build-all bakes once per arch, none dropped (issue 15).
    before = refs(builders)
    out = make("build-all", f"BUILDER={E2E_BUILDER}", "ARCH=gfx942 gfx1100", env=farm_env)
    assert out.returncode == 0, out.stderr
    lines = [line for line in out.stderr.splitlines() if line.startswith("rocm-assets build-all:")]
    assert lines == [build_all_line("gfx942"), build_all_line("gfx1100")]
    built = built_since(builders, before)
    assert len(built) == 8
    first, second = built[:4], built[4:]
    # The second bake started on the node only after every build of the first had ended.
    assert max(record_span(r)[1] for r, _ in first) <= min(record_span(r)[0] for r, _ in second)
    assert args_of(by_dockerfile(first)["base.Dockerfile"][1])["GPU_ARCH"] == "gfx942"
    assert args_of(by_dockerfile(second)["base.Dockerfile"][1])["GPU_ARCH"] == "gfx1100"
    for arch in ("gfx942", "gfx1100"):
        labels = local_labels(farm_env, f"{farm_env['REGISTRY']}/e2e/app-wheel:{arch}")
        assert labels is not None and labels["org.rocm.e2e.arch"] == arch


def test_build_all_refuses_published_inputs(farm_env: dict[str, str], builders: Builders) -> None:
    before = refs(builders)
    out = make("build-all", f"BUILDER={E2E_BUILDER}", env={**farm_env, "PUBLISHED_INPUTS": "1"})
    assert out.returncode != 0
    assert "PUBLISHED_INPUTS='1'" in out.stderr
    assert refs(builders) == before


def test_build_all_exits_with_bakes_status(farm_env: dict[str, str], builders: Builders) -> None:
    before = refs(builders)
    # FAIL makes tool-wheel's RUN step exit 1.
    out = make("build-all", f"BUILDER={E2E_BUILDER}", env={**farm_env, "FAIL": "1"})
    assert out.returncode != 0
    # Bake's own reason reached the terminal (for a group, it names the requested target the
    # failure stopped), and its status is make's recipe's.
    [error] = [line for line in out.stderr.splitlines() if line.startswith("ERROR: ")]
    assert error.startswith("ERROR: target ")
    assert error.endswith(
        ': failed to solve: process "/bin/busybox sh -c sleep \\"$HOLD_S\\" && test -z '
        '\\"$FAIL\\"" did not complete successfully: exit code: 1'
    )
    assert "build-all] Error 1" in out.stderr
    tool, _ = by_dockerfile(built_since(builders, before))["tool.Dockerfile"]
    assert tool.status == "Error"


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
