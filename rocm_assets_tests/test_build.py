"""rocm_assets.core.build.invocation: the bake command, its metadata, its failures, its output;
and rocm_assets.core.build.output, where that output goes (driven with a test's own clock).

Real: Debian 13's dockerd 26 (a docker context of it is the builder, as a docker-driver farm node
is), the docker CLI with Debian's buildx 0.29 (and Debian 13's 0.13 where a test says so), Debian's
docker-registry, and BuildKit's own history (`docker buildx history ls`). The e2e farm's images are
FROM scratch plus Debian's static busybox, so every build runs a RUN step offline.

Stand-in, in two tests only: a `docker` CLI without the buildx plugin (a script written by the
test), since every docker CLI here finds Debian's plugin.
"""

import io
import json
import os
import shlex
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from rocm_assets.core.build.invocation import (
    BakeInvocation,
    BuildError,
    bake_invocation,
    builder_env,
    find_history_ref,
    metadata_summary,
    parse_metadata,
    run_bake,
)
from rocm_assets.core.build.output import BakeLog
from rocm_assets_tests.helpers import wait_until
from rocm_assets_tests.servers.dockerd import (
    E2E_BAKE_FILE,
    E2E_BUILDER,
    E2E_DIR,
    Builders,
    Dockerd,
    make_builders,
)
from rocm_assets_tests.servers.fakes import RegistryServer

RUN_ID = "4f1c2d3e-run"
# Characters a shell would act on: each must reach bake as one literal value.
TRICKY = "a b;$(touch pwned)|&'\"`x` *"
# Guards against a hung child, not timings.
HANG_GUARD_S = 120.0
DIGEST = "sha256:" + "ab" * 32
REF = f"{E2E_BUILDER}/{E2E_BUILDER}/abcdefghijklmnopqrstuvwxy"


def invocation(
    tmp_path: Path,
    base_env: dict[str, str],
    *,
    target: str = "base",
    partition: str | None = "gfx942",
    builder: str = E2E_BUILDER,
    bake_file: Path = E2E_BAKE_FILE,
    run_id: str = RUN_ID,
) -> BakeInvocation:
    return bake_invocation(
        bake_file=bake_file,
        target=target,
        arch="gfx942",
        partition=partition,
        builder=builder,
        max_jobs=6,
        run_id=run_id,
        metadata_file=tmp_path / "metadata.json",
        base_env=base_env,
    )


def collect() -> tuple[list[list[str]], Callable[[list[str]], None]]:
    batches: list[list[str]] = []
    return batches, lambda batch: batches.append(list(batch))


def unique(what: str) -> str:
    """A run id of the test's own: the session's engine keeps every test's history records."""
    return f"{what}-{uuid.uuid4().hex[:12]}"


def farm_env(builders: Builders, registry: RegistryServer, **extra: str) -> dict[str, str]:
    """The builders' environment with REGISTRY at a repository prefix of this test's own."""
    prefix = registry.new_repo("build")
    return {**builders.env, "REGISTRY": f"{registry.host}/{prefix}", **extra}


def bake_processes(name: str) -> list[int]:
    """Processes whose command line carries this build's history name: the bake, if alive."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(name.encode() in arg for arg in cmdline) and b"bake" in cmdline:
            found.append(int(proc.name))
    return found


# ##### ARGV AND ENV


def test_argv_bakes_one_target_with_overrides_on_that_target_only(tmp_path: Path) -> None:
    inv = invocation(tmp_path, {})
    assert inv.argv == (
        "docker", "buildx", "bake", "-f", str(E2E_BAKE_FILE), "--builder", E2E_BUILDER,
        "--push", "--metadata-file", str(tmp_path / "metadata.json"), "--progress=plain",
        "--set", f"base.args.BUILDKIT_BUILD_NAME=rocm-pytorch-build/base/gfx942/{RUN_ID}",
        "--set", "base.args.MAX_JOBS=6",
        "--", "base",
    )  # fmt: skip
    sets = [inv.argv[i + 1] for i, arg in enumerate(inv.argv) if arg == "--set"]
    assert all(s.startswith("base.") for s in sets)
    assert not any("*" in arg for arg in inv.argv)
    assert inv.name == f"rocm-pytorch-build/base/gfx942/{RUN_ID}"
    # Bake resolves relative contexts against its working directory: the bake file's.
    assert inv.cwd == E2E_DIR


def test_noarch_target_is_named_noarch_but_evaluated_with_the_arch(tmp_path: Path) -> None:
    inv = invocation(tmp_path, {}, target="tool-wheel", partition=None)
    assert inv.name == f"rocm-pytorch-build/tool-wheel/noarch/{RUN_ID}"
    assert f"tool-wheel.args.BUILDKIT_BUILD_NAME={inv.name}" in inv.argv
    assert inv.env["GPU_ARCH"] == "gfx942"


def test_env_forces_published_inputs_arch_and_run_id_and_passes_the_rest(tmp_path: Path) -> None:
    base = {
        "PATH": os.environ["PATH"],
        # The caller's own values for the farm's variables are overridden, never merged.
        "PUBLISHED_INPUTS": "0",
        "GPU_ARCH": "gfx1100",
        "RUN_ID": "dev",
        "SCCACHE_LOG": "debug sccache=trace",
        "CACHE_TAG_SUFFIX": TRICKY,
        "SDE_MIRROR": "http://mirror a/b?c=1&d=2",
        "SDE_EMPTY": "",
        "UNRELATED": "kept",
    }
    inv = invocation(tmp_path, base)
    assert dict(inv.env) == {
        **base,
        "PUBLISHED_INPUTS": "1",
        "GPU_ARCH": "gfx942",
        "RUN_ID": RUN_ID,
    }
    assert base["PUBLISHED_INPUTS"] == "0"


def test_command_is_copyable_and_shows_only_the_farms_settings(tmp_path: Path) -> None:
    base = {
        "PATH": os.environ["PATH"],
        "SCCACHE_LOG": "debug",
        "CACHE_TAG_SUFFIX": TRICKY,
        "SDE_MIRROR": "http://mirror a",
        "REGISTRY": "127.0.0.1:5000/x",
        "ROCM_REGISTRY_PASSWORD": "s3cret-value",
        "HOME": "/root",
    }
    inv = invocation(tmp_path, base)
    shown = {
        "CACHE_TAG_SUFFIX": TRICKY,
        "GPU_ARCH": "gfx942",
        "PUBLISHED_INPUTS": "1",
        "REGISTRY": "127.0.0.1:5000/x",
        "RUN_ID": RUN_ID,
        "SCCACHE_LOG": "debug",
        "SDE_MIRROR": "http://mirror a",
    }
    # Round trip: a shell splits the copied line back into exactly these words.
    assert shlex.split(inv.command()) == [f"{k}={v}" for k, v in shown.items()] + list(inv.argv)
    assert "s3cret-value" not in inv.command()
    assert "s3cret-value" not in repr(inv)


def test_a_docker_context_builder_is_reached_through_its_context(
    builders: Builders, tmp_path: Path
) -> None:
    # Real buildx refuses `--builder CTX` for a context that is not the current one.
    env = {**builders.env, "DOCKER_HOST": "unix:///nonexistent.sock"}
    reached = builder_env(E2E_BUILDER, env)
    assert reached["DOCKER_CONTEXT"] == E2E_BUILDER
    assert "DOCKER_HOST" not in reached
    # A builder made by `docker buildx create` is no context: `--builder` alone reaches it.
    assert "DOCKER_CONTEXT" not in builder_env("snoc-pool", builders.env)
    assert invocation(tmp_path, builders.env).env["DOCKER_CONTEXT"] == E2E_BUILDER
    assert "DOCKER_CONTEXT" not in invocation(tmp_path, builders.env, builder="snoc-pool").env


# ##### REAL BUILDS


def test_a_build_pushes_records_its_history_and_reports_it(
    builders: Builders, registry_server: RegistryServer, tmp_path: Path
) -> None:
    env = farm_env(builders, registry_server, SDE_MIRROR=TRICKY, PUBLISHED_INPUTS="0")
    run_id = unique("build")
    inv = invocation(tmp_path, env, run_id=run_id)
    batches, on_output = collect()
    result = run_bake(inv, on_output=on_output, flush_s=0.05)

    registry = env["REGISTRY"]
    assert result.tags == (f"{registry}/e2e/base:gfx942", f"{registry}/e2e/base:gfx942-{run_id}")
    for tag in result.tags:
        assert registry_server.digest(tag) == result.digest
    # The args reached the build: the image's labels carry them.
    labels = registry_server.image_config(result.tags[0])["config"]["Labels"]
    assert labels == {
        "org.rocm.e2e.arch": "gfx942",
        "org.rocm.e2e.run-id": run_id,
        "org.rocm.e2e.max-jobs": "6",
    }
    # The ref is the builder's (docker driver: builder/node/ref), and its history names the build.
    assert result.history_ref.startswith(f"{E2E_BUILDER}/{E2E_BUILDER}/")
    [record] = builders.history(E2E_BUILDER, inv.name)
    assert (record.ref, record.status) == (result.history_ref, "Completed")
    assert find_history_ref(inv) == (record.ref, "")
    lines = [line for batch in batches for line in batch]
    assert any("naming to" in line or "pushing" in line for line in lines)
    summary = metadata_summary(inv, result, "node-a")
    assert summary == {
        "history_ref": result.history_ref,
        "history_name": f"rocm-pytorch-build/base/gfx942/{run_id}",
        "digest": result.digest,
        "tags": list(result.tags),
        "node": "node-a",
        "builder": E2E_BUILDER,
        "max_jobs": 6,
        "run_id": run_id,
        "started_at": result.started_at,
        "finished_at": result.finished_at,
        "duration_s": round(result.finished_at - result.started_at, 3),
        "command": inv.command(),
    }


def test_values_reach_bake_literally(
    builders: Builders, registry_server: RegistryServer, tmp_path: Path
) -> None:
    bake_file = tmp_path / "bake.hcl"
    bake_file.write_text(
        'variable "GPU_ARCHES" {\n  default = ["gfx942"]\n}\n'
        'variable "GPU_ARCH" {\n  default = "gfx942"\n}\n'
        'variable "REGISTRY" {\n  default = "x"\n}\n'
        'variable "CACHE_TAG_SUFFIX" {\n  default = ""\n}\n'
        'variable "SDE_MIRROR" {\n  default = ""\n}\n'
        'target "lit" {\n  dockerfile = "lit.Dockerfile"\n  tags = ["${REGISTRY}/lit:1"]\n'
        "  args = { SUFFIX = CACHE_TAG_SUFFIX, MIRROR = SDE_MIRROR }\n}\n"
    )
    (tmp_path / "lit.Dockerfile").write_text(
        'FROM scratch\nARG SUFFIX\nARG MIRROR\nLABEL suffix="${SUFFIX}" mirror="${MIRROR}"\n'
    )
    env = farm_env(builders, registry_server, CACHE_TAG_SUFFIX=TRICKY, SDE_MIRROR=TRICKY)
    inv = invocation(tmp_path, env, target="lit", bake_file=bake_file)
    result = run_bake(inv, on_output=collect()[1])
    labels = registry_server.image_config(result.tags[0])["config"]["Labels"]
    assert labels == {"suffix": TRICKY, "mirror": TRICKY}
    assert not (tmp_path / "pwned").exists()


def test_noarch_build_is_named_noarch(
    builders: Builders, registry_server: RegistryServer, tmp_path: Path
) -> None:
    run_id = unique("noarch")
    env = farm_env(builders, registry_server)
    inv = invocation(tmp_path, env, target="tool-wheel", partition=None, run_id=run_id)
    result = run_bake(inv, on_output=collect()[1])
    [record] = builders.history(E2E_BUILDER, f"rocm-pytorch-build/tool-wheel/noarch/{run_id}")
    assert result.history_ref == record.ref


def test_unknown_builder(builders: Builders, tmp_path: Path) -> None:
    inv = invocation(tmp_path, builders.env, builder="nope")
    with pytest.raises(BuildError) as raised:
        run_bake(inv, on_output=collect()[1])
    assert str(raised.value) == (
        "builder 'nope' is unknown to docker buildx: create it "
        "(docker buildx create --name nope ...) or fix `builder:` in fleet.yaml"
    )
    assert raised.value.log_tail[-1] == 'ERROR: no builder "nope" found'


def test_failed_bake_carries_bakes_error_line_and_history_ref(
    builders: Builders, registry_server: RegistryServer, tmp_path: Path
) -> None:
    env = farm_env(builders, registry_server, FAIL="1")
    # The engine is the session's: a run id of its own keeps this record apart.
    inv = invocation(tmp_path, env, target="tool-wheel", partition=None, run_id=unique("fail"))
    # A file left by an earlier attempt must not pass for this build's.
    inv.metadata_file.write_text(json.dumps({"tool-wheel": {}}))
    with pytest.raises(BuildError) as raised:
        run_bake(inv, on_output=collect()[1], tail_lines=3)
    # The metadata file is not written on failure: the ref comes from the history, by name.
    [record] = builders.history(E2E_BUILDER, inv.name)
    assert record.status == "Error"
    ref = raised.value.history_ref
    assert ref == record.ref
    assert str(raised.value) == (
        f"bake of tool-wheel for gfx942 on builder {E2E_BUILDER} failed (exit 1): "
        'ERROR: failed to solve: process "/bin/busybox sh -c sleep \\"$HOLD_S\\" && test -z '
        '\\"$FAIL\\"" did not complete successfully: exit code: 1; '
        f"history ref {ref} (docker buildx history logs {ref.rsplit('/', 1)[1]})"
    )
    assert raised.value.log_tail[-1].startswith("ERROR: failed to solve: process ")
    assert not inv.metadata_file.exists()


def test_old_buildx_builds_and_says_it_has_no_history(
    dockerd: Dockerd,
    registry_server: RegistryServer,
    old_buildx: Path,
    e2e_context: Path,
    tmp_path: Path,
) -> None:
    # Debian 13's buildx 0.13: it builds through the context and writes the ref in the metadata,
    # but has no `buildx history`, so a failed build's ref cannot be looked up.
    old = make_builders(tmp_path / "old-config", {E2E_BUILDER: dockerd}, buildx=old_buildx)
    env = farm_env(old, registry_server)
    result = run_bake(invocation(tmp_path, env), on_output=collect()[1])
    assert result.history_ref.startswith(f"{E2E_BUILDER}/{E2E_BUILDER}/")
    assert registry_server.digest(result.tags[0]) == result.digest

    failing = invocation(tmp_path, {**env, "FAIL": "1"}, target="tool-wheel", partition=None)
    with pytest.raises(BuildError) as raised:
        run_bake(failing, on_output=collect()[1])
    assert raised.value.history_ref is None
    assert str(raised.value).endswith(
        "; no history ref: buildx 0.13.1 has no `buildx history` (0.20 and later list a "
        "builder's records)"
    )


# ##### METADATA


def _entry(**overrides: object) -> dict[str, object]:
    entry: dict[str, object] = {
        "buildx.build.ref": REF,
        "containerimage.digest": DIGEST,
        "image.name": "r/e2e/base:gfx942,r/e2e/base:gfx942-x",
    }
    entry.update(overrides)
    return {k: v for k, v in entry.items() if v is not None}


def test_metadata_gives_ref_digest_and_pushed_names(tmp_path: Path) -> None:
    path = tmp_path / "metadata.json"
    path.write_text(json.dumps({"base": _entry(), "buildx.build.warnings": []}))
    assert parse_metadata(path, "base") == (
        REF,
        DIGEST,
        ("r/e2e/base:gfx942", "r/e2e/base:gfx942-x"),
    )
    path.write_text(json.dumps({"base": _entry(**{"image.name": None})}))
    assert parse_metadata(path, "base") == (REF, DIGEST, ())


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, r"bake exited 0 but wrote no metadata file .*metadata\.json: is `docker buildx`"),
        ("{not json", r"bake metadata file .*metadata\.json is not JSON: "),
        ('["base"]', r"bake metadata file .*metadata\.json has no entry for target 'base'"),
        (json.dumps({"lib": _entry()}), r"has no entry for target 'base'"),
        (
            json.dumps({"base": _entry(**{"buildx.build.ref": None})}),
            r"bake metadata for 'base' has no buildx\.build\.ref \(needs a builder with history\)",
        ),
        (
            json.dumps({"base": _entry(**{"buildx.build.ref": ""})}),
            r"bake metadata for 'base' has no buildx\.build\.ref",
        ),
        (
            json.dumps({"base": _entry(**{"containerimage.digest": None})}),
            r"bake metadata for 'base' has no containerimage\.digest: was it pushed\?",
        ),
        (
            json.dumps({"base": _entry(**{"containerimage.digest": "abc"})}),
            r"has no containerimage\.digest",
        ),
    ],
    ids=[
        "missing",
        "malformed",
        "not-a-map",
        "no-entry",
        "no-ref",
        "empty-ref",
        "no-digest",
        "bad-digest",
    ],
)
def test_bad_metadata_is_one_clear_error(tmp_path: Path, content: str | None, message: str) -> None:
    path = tmp_path / "metadata.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(BuildError, match=message) as raised:
        parse_metadata(path, "base")
    assert "\n" not in str(raised.value)


# ##### NO DOCKER, NO BUILDX


def test_docker_not_on_path(tmp_path: Path) -> None:
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    inv = invocation(tmp_path, {"PATH": str(empty)})
    with pytest.raises(
        BuildError,
        match=r"^'docker' is not on PATH: install the Docker CLI with the buildx plugin$",
    ):
        run_bake(inv, on_output=collect()[1])


BUILDX_MISSING = (
    "the docker buildx plugin is missing (docker has no `buildx`): install Debian's "
    "docker-buildx package (0.29 from Debian testing names history records; Debian 13's 0.13 "
    "builds but has no `buildx history`), or Docker's docker-buildx-plugin"
)


@pytest.mark.parametrize(
    "said",
    [
        # Older Docker CLIs, for a plugin they do not have.
        ["docker: 'buildx' is not a docker command.", "See 'docker --help'"],
        # 20.10 and newer read `buildx` as a missing plugin, then reject bake's first flag.
        ["unknown shorthand flag: 'f' in -f", "See 'docker --help'."],
    ],
    ids=["not-a-command", "unknown-flag"],
)
def test_buildx_missing(tmp_path: Path, said: list[str]) -> None:
    # Stand-in: a docker CLI without the plugin (every docker CLI here finds Debian's).
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "docker"
    script.write_text(
        f"#!{sys.executable}\nimport sys\nsys.stderr.write({chr(10).join(said) + chr(10)!r})\n"
        "sys.exit(1 if sys.argv[1:2] == ['buildx'] else 0)\n"
    )
    script.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    with pytest.raises(BuildError) as raised:
        run_bake(invocation(tmp_path, env), on_output=collect()[1])
    assert str(raised.value).startswith(BUILDX_MISSING)
    assert list(raised.value.log_tail) == said
    assert raised.value.history_ref is None


# ##### STREAMING AND CANCELLATION


def test_output_streams_while_bake_runs(
    builders: Builders, registry_server: RegistryServer, tmp_path: Path
) -> None:
    inv = invocation(tmp_path, farm_env(builders, registry_server, HOLD_S="3"))
    # Bake writes its metadata file when it ends: a batch seen before then was streamed.
    before_end: list[bool] = []

    def on_output(batch: list[str]) -> None:
        before_end.append(not inv.metadata_file.exists())

    result = run_bake(inv, on_output=on_output, flush_s=0.05)
    assert len(before_end) > 1
    assert before_end[0] is True
    assert result.digest.startswith("sha256:")


def test_bake_log_keeps_every_line_raw_and_only_a_digest_as_events() -> None:
    clock = [0.0]
    raw = io.StringIO()
    events: list[str] = []
    log = BakeLog(raw, events.append, progress_s=60.0, tail_lines=3, clock=lambda: clock[0])
    log(["#1 [internal] load build definition", "#1 DONE 0.0s", "#2 [1/2] RUN make"])
    # 1,000 batches over 1,000 s; plain progress repeats a step's header when steps interleave.
    for k in range(1000):
        clock[0] += 1.0
        log([f"#2 {k}.0 cc unit{k}.c", "#2 [1/2] RUN make"])
    log.close()
    assert raw.getvalue().count("\n") == 2003
    assert raw.getvalue().splitlines()[-2:] == ["#2 999.0 cc unit999.c", "#2 [1/2] RUN make"]
    # Each step once, a progress line a minute (16 in 1,000 s), one summary.
    assert events[:2] == ["step #1 [internal] load build definition", "step #2 [1/2] RUN make"]
    progress = events[2:-1]
    assert len(progress) == 16
    assert progress[0] == ("bake output: 123 lines in 1m00s so far; last: #2 [1/2] RUN make")
    assert events[-1] == (
        "bake output: 2,003 lines in 16m40s, all of them in this step's compute log (stdout); "
        "the last 3:\n#2 [1/2] RUN make\n#2 999.0 cc unit999.c\n#2 [1/2] RUN make"
    )


def test_bake_log_of_a_short_bake_is_all_in_its_summary() -> None:
    events: list[str] = []
    log = BakeLog(io.StringIO(), events.append, clock=lambda: 0.0)
    log(["#1 [internal] load build definition", "#1 DONE 0.0s"])
    log.close()
    assert events == [
        "step #1 [internal] load build definition",
        "bake output, all 2 lines in 0s:\n#1 [internal] load build definition\n#1 DONE 0.0s",
    ]


class StopBuild(Exception):
    pass


@pytest.mark.parametrize("interrupt", [StopBuild, KeyboardInterrupt])
def test_an_exception_in_the_caller_cancels_the_build_on_its_node(
    builders: Builders,
    registry_server: RegistryServer,
    tmp_path: Path,
    interrupt: type[BaseException],
) -> None:
    run_id = unique(f"cancel-{interrupt.__name__}")
    inv = invocation(tmp_path, farm_env(builders, registry_server, HOLD_S="60"), run_id=run_id)

    def on_output(batch: list[str]) -> None:
        # A cancelled Dagster run raises in the step's thread, as this does.
        if any("sleep" in line for line in batch):
            assert bake_processes(inv.name)
            raise interrupt()

    with pytest.raises(interrupt):
        run_bake(inv, on_output=on_output, flush_s=0.05)
    # run_bake reaped bake's whole process group before re-raising.
    assert bake_processes(inv.name) == []
    # And bake cancelled the build on the builder: BuildKit's record ends cancelled.
    wait_until(
        lambda: builders.status(E2E_BUILDER, inv.name) == "canceled",
        f"the builder to record {inv.name} as cancelled",
        timeout_s=HANG_GUARD_S,
    )


def test_a_stop_reason_stops_the_bake_and_fails_the_build_with_it(
    builders: Builders, registry_server: RegistryServer, tmp_path: Path
) -> None:
    # What the link watch of a node says once the node stops answering its probes.
    reason = "node node-a unreachable for 46 s (ssh timeout after 5 s)"
    run_id = unique("stopped")
    inv = invocation(tmp_path, farm_env(builders, registry_server, HOLD_S="60"), run_id=run_id)
    started: list[bool] = []

    def stop_when() -> str | None:
        return reason if started else None

    def on_output(batch: list[str]) -> None:
        if any("sleep" in line for line in batch):
            started.append(True)

    with pytest.raises(BuildError) as raised:
        run_bake(inv, on_output=on_output, flush_s=0.05, stop_when=stop_when)
    assert str(raised.value) == f"{reason}: bake was stopped"
    assert any("sleep" in line for line in raised.value.log_tail)
    assert bake_processes(inv.name) == []
    wait_until(
        lambda: builders.status(E2E_BUILDER, inv.name) == "canceled",
        f"the builder to record {inv.name} as cancelled",
        timeout_s=HANG_GUARD_S,
    )


# A run worker in miniature: it bakes through run_bake until it is killed.
_WORKER = """
import json, os, sys
from pathlib import Path
from rocm_assets.core.build.invocation import bake_invocation, run_bake
spec = json.loads(sys.argv[1])
inv = bake_invocation(
    bake_file=Path(spec["bake_file"]), target="base", arch="gfx942", partition="gfx942",
    builder=spec["builder"], max_jobs=2, run_id=spec["run_id"],
    metadata_file=Path(spec["scratch"]) / "metadata.json", base_env=os.environ,
    scratch=Path(spec["scratch"]),
)
run_bake(inv, on_output=lambda lines: None)
"""


def test_a_killed_worker_takes_its_bake_and_scratch_files_with_it(
    builders: Builders, registry_server: RegistryServer, tmp_path: Path
) -> None:
    run_id = unique("killed")
    scratch = tmp_path / "rocm-bake-scratch"
    scratch.mkdir()
    spec = {
        "bake_file": str(E2E_BAKE_FILE),
        "builder": E2E_BUILDER,
        "run_id": run_id,
        "scratch": str(scratch),
    }
    env = farm_env(builders, registry_server, HOLD_S="120")
    worker = subprocess.Popen([sys.executable, "-c", _WORKER, json.dumps(spec)], env=env)
    name = f"rocm-pytorch-build/base/gfx942/{run_id}"
    try:
        wait_until(
            lambda: any(r.status == "Running" for r in builders.history(E2E_BUILDER, name)),
            "the build to start on the builder",
            timeout_s=HANG_GUARD_S,
        )
        worker.kill()  # SIGKILL: the worker can clean up nothing itself
        worker.wait()
        # The guard cancels the build on the builder and removes the scratch directory.
        states: list[str | None] = []

        def ended() -> bool:
            states.append(builders.status(E2E_BUILDER, name))
            return states[-1] not in (None, "running")

        wait_until(ended, "the killed worker's build to end on the builder", timeout_s=HANG_GUARD_S)
        assert states[-1] == "canceled", builders.inspect(
            E2E_BUILDER, builders.history(E2E_BUILDER, name)[0].ref
        )
        wait_until(lambda: bake_processes(name) == [], "the bake to end", timeout_s=HANG_GUARD_S)
        assert not scratch.exists()
    finally:
        for pid in bake_processes(name):
            os.kill(pid, signal.SIGKILL)
