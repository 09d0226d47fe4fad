"""Unit tests for rocm_assets.core.build: the bake command, its metadata, its failures, its output.

No engine runs here. The `docker` on PATH is either the project's shim in recording mode
(rocm_assets_tests/shim/docker: it records the argv and the build environment it was given as
JSON, writes the metadata keys real bake writes, keeps a history for `buildx history ls`, and acts
out failures on request), or a small stand-in script written by the test for what the shim cannot
act out: a docker without buildx, output paced by the test, and a child with a grandchild.
"""

import json
import os
import shlex
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from rocm_assets.core.build import (
    BakeInvocation,
    BuildError,
    bake_invocation,
    find_history_ref,
    metadata_summary,
    parse_metadata,
    run_bake,
)
from rocm_assets_tests.helpers import alive, wait_until
from rocm_assets_tests.servers.dockerd import E2E_BAKE_FILE, E2E_DIR, SHIM_BUILDER, RecordingShim

RUN_ID = "4f1c2d3e-run"
# Characters a shell would act on: each must reach bake as one literal value.
TRICKY = "a b;$(touch pwned)|&'\"`x` *"
# Guards against a hung child, not timings.
HANG_GUARD_S = 60.0
DIGEST = "sha256:" + "ab" * 32
REF = f"{SHIM_BUILDER}/{SHIM_BUILDER}0/abcdefghijklmnopqrstuvwxy"


def invocation(
    tmp_path: Path,
    base_env: dict[str, str],
    *,
    target: str = "base",
    partition: str | None = "gfx942",
    builder: str = SHIM_BUILDER,
) -> BakeInvocation:
    return bake_invocation(
        bake_file=E2E_BAKE_FILE,
        target=target,
        arch="gfx942",
        partition=partition,
        builder=builder,
        max_jobs=6,
        run_id=RUN_ID,
        metadata_file=tmp_path / "metadata.json",
        base_env=base_env,
    )


def collect() -> tuple[list[list[str]], Callable[[list[str]], None]]:
    batches: list[list[str]] = []
    return batches, lambda batch: batches.append(list(batch))


def stand_in(tmp_path: Path, body: str, **extra: str) -> dict[str, str]:
    """An env whose PATH starts with a `docker` that runs `body` (Python) for every command."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "docker"
    script.write_text(f"#!{sys.executable}\n{body}")
    script.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", **extra}


# ##### ARGV AND ENV


def test_argv_bakes_one_target_with_overrides_on_that_target_only(tmp_path: Path) -> None:
    inv = invocation(tmp_path, {})
    assert inv.argv == (
        "docker", "buildx", "bake", "-f", str(E2E_BAKE_FILE), "--builder", SHIM_BUILDER,
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
        "PATH": "/usr/bin",
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
        "PATH": "/usr/bin",
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


# ##### THROUGH THE RECORDING SHIM


def test_bake_receives_argv_and_env_literally(
    docker_shim_record: RecordingShim, tmp_path: Path
) -> None:
    base = {
        **docker_shim_record.env,
        "REGISTRY": "127.0.0.1:5999/literal",
        "SCCACHE_LOG": "debug sccache=trace",
        "CACHE_TAG_SUFFIX": TRICKY,
        "SDE_MIRROR": TRICKY,
        "SDE_EMPTY": "",
        "PUBLISHED_INPUTS": "0",
    }
    inv = invocation(tmp_path, base)
    batches, on_output = collect()
    result = run_bake(inv, on_output=on_output, flush_s=0.05)

    [record] = docker_shim_record.records()
    assert record["argv"] == list(inv.argv[1:])
    assert record["env"] == {
        "PUBLISHED_INPUTS": "1",
        "GPU_ARCH": "gfx942",
        "RUN_ID": RUN_ID,
        "SCCACHE_LOG": "debug sccache=trace",
        "CACHE_TAG_SUFFIX": TRICKY,
        "SDE_MIRROR": TRICKY,
        "SDE_EMPTY": "",
    }
    assert record["cwd"] == str(E2E_DIR)
    assert not (E2E_DIR / "pwned").exists()
    assert not (tmp_path / "pwned").exists()

    written = record["metadata"]["base"]
    assert result.history_ref == written["buildx.build.ref"]
    assert result.digest == written["containerimage.digest"]
    assert result.tags == (
        "127.0.0.1:5999/literal/e2e/base:gfx942",
        f"127.0.0.1:5999/literal/e2e/base:gfx942-{RUN_ID}",
    )
    assert [line for batch in batches for line in batch] == [
        "#1 [internal] recorded bake of base (no build)",
        "#1 DONE 0.0s",
    ]
    summary = metadata_summary(inv, result, "node-a")
    assert summary == {
        "history_ref": written["buildx.build.ref"],
        "history_name": f"rocm-pytorch-build/base/gfx942/{RUN_ID}",
        "digest": written["containerimage.digest"],
        "tags": list(result.tags),
        "node": "node-a",
        "builder": SHIM_BUILDER,
        "max_jobs": 6,
        "run_id": RUN_ID,
        "started_at": result.started_at,
        "finished_at": result.finished_at,
        "duration_s": round(result.finished_at - result.started_at, 3),
        "command": inv.command(),
    }
    assert result.started_at <= result.finished_at
    # The history name finds the record, as `docker buildx history ls` would for anyone.
    assert find_history_ref(inv) == written["buildx.build.ref"]


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


# ##### FAILURE PATHS


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
    "the docker buildx plugin is missing (docker has no `buildx`): install the "
    "docker-buildx-plugin package from Docker's apt repository "
    "(https://docs.docker.com/engine/install/debian/), or the docker-buildx binary from "
    "https://github.com/docker/buildx/releases as ~/.docker/cli-plugins/docker-buildx (chmod +x); "
    "buildx >= 0.27 for history names"
)


def test_buildx_missing(tmp_path: Path) -> None:
    # What older Docker CLIs print for a plugin they do not have.
    env = stand_in(
        tmp_path,
        "import sys\n"
        "sys.stderr.write(\"docker: 'buildx' is not a docker command.\\n"
        "See 'docker --help'\\n\")\n"
        "sys.exit(1)\n",
    )
    inv = invocation(tmp_path, env)
    with pytest.raises(BuildError) as raised:
        run_bake(inv, on_output=collect()[1])
    assert str(raised.value) == BUILDX_MISSING
    assert raised.value.log_tail == (
        "docker: 'buildx' is not a docker command.",
        "See 'docker --help'",
    )
    assert raised.value.history_ref is None


def test_buildx_missing_from_debians_docker_client(tmp_path: Path) -> None:
    # Real: Debian's docker.io client, which has no buildx plugin (no Debian package ships one),
    # and so rejects bake's `-f` as an unknown shorthand flag.
    real = Path("/usr/bin/docker")
    assert subprocess.run([real, "buildx", "version"], capture_output=True, check=False).returncode
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "docker").symlink_to(real)
    config = tmp_path / "docker-config"  # no user plugins either
    config.mkdir()
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}/usr/bin:/bin",
        "DOCKER_CONFIG": str(config),
    }
    with pytest.raises(BuildError) as raised:
        run_bake(invocation(tmp_path, env), on_output=collect()[1])
    # The reason is docker's first line; the usage text after it fills the tail.
    assert str(raised.value) == BUILDX_MISSING
    assert "unknown shorthand flag: 'f' in -f" not in raised.value.log_tail


def test_unknown_builder(docker_shim_record: RecordingShim, tmp_path: Path) -> None:
    inv = invocation(tmp_path, docker_shim_record.env, builder="nope")
    with pytest.raises(BuildError) as raised:
        run_bake(inv, on_output=collect()[1])
    assert str(raised.value) == (
        "builder 'nope' is unknown to docker buildx: create it "
        "(docker buildx create --name nope ...) or fix `builder:` in fleet.yaml"
    )
    assert raised.value.log_tail == ('ERROR: no builder "nope" found',)
    assert docker_shim_record.records() == []


@pytest.mark.parametrize(
    ("mode", "message"),
    [
        ("no-metadata", r"^bake exited 0 but wrote no metadata file .*/metadata\.json: "),
        ("bad-metadata", r"^bake metadata file .*/metadata\.json is not JSON: "),
    ],
)
def test_zero_exit_without_usable_metadata(
    docker_shim_record: RecordingShim, tmp_path: Path, mode: str, message: str
) -> None:
    env = {**docker_shim_record.env, "ROCM_SHIM_RECORD_MODE": mode}
    inv = invocation(tmp_path, env)
    # A file left by an earlier attempt must not pass for this build's.
    inv.metadata_file.write_text(json.dumps({"base": _entry()}))
    with pytest.raises(BuildError, match=message):
        run_bake(inv, on_output=collect()[1])


def test_failed_bake_reports_its_last_lines_and_history_ref(
    docker_shim_record: RecordingShim, tmp_path: Path
) -> None:
    env = {**docker_shim_record.env, "ROCM_SHIM_RECORD_MODE": "fail"}
    inv = invocation(tmp_path, env)
    with pytest.raises(BuildError) as raised:
        run_bake(inv, on_output=collect()[1], tail_lines=2)
    # The metadata file is not written on failure: the ref comes from the history, by name.
    listed = [
        json.loads(line)
        for line in (docker_shim_record.state_dir / "history.jsonl").read_text().splitlines()
    ]
    [ref] = {r["ref"] for r in listed if r["name"] == inv.name and r["status"] == "Error"}
    build_id = ref.rsplit("/", 1)[1]
    assert str(raised.value) == (
        f"bake of base for gfx942 on builder {SHIM_BUILDER} failed (exit 1); "
        f"history ref {ref} (docker buildx history logs {build_id})"
    )
    assert raised.value.history_ref == ref
    assert raised.value.log_tail == (
        "#1 ERROR: recorded failure",
        "ERROR: target base: failed to solve: recorded failure",
    )
    assert not inv.metadata_file.exists()


# ##### STREAMING AND CANCELLATION

# Prints, then blocks until the test's callback has seen the first line, then finishes.
_PACED = """\
import json, os, pathlib, sys, time
args = sys.argv[1:]
if args[:2] != ["buildx", "bake"]:
    sys.exit(1)
pathlib.Path(os.environ["PID_FILE"]).write_text(str(os.getpid()))
print("first", flush=True)
go = pathlib.Path(os.environ["GO_FILE"])
deadline = time.monotonic() + float(os.environ["GUARD_S"])
while not go.exists():
    if time.monotonic() > deadline:
        print("never released", flush=True)
        sys.exit(3)
    time.sleep(0.01)
print("second", flush=True)
meta = {"base": {"buildx.build.ref": os.environ["REF"], "containerimage.digest": os.environ["DIGEST"]}}
pathlib.Path(args[args.index("--metadata-file") + 1]).write_text(json.dumps(meta))
"""


def test_output_streams_while_bake_runs(tmp_path: Path) -> None:
    go, pid_file = tmp_path / "go", tmp_path / "pid"
    env = stand_in(
        tmp_path,
        _PACED,
        GO_FILE=str(go),
        PID_FILE=str(pid_file),
        GUARD_S=str(HANG_GUARD_S),
        REF=REF,
        DIGEST=DIGEST,
    )
    batches: list[list[str]] = []
    running_at_batch: list[bool] = []

    def on_output(batch: list[str]) -> None:
        batches.append(list(batch))
        running_at_batch.append(alive(int(pid_file.read_text())))
        go.touch()

    result = run_bake(invocation(tmp_path, env), on_output=on_output, flush_s=0.05)
    # The stand-in prints "second" only after the callback got "first": had the output been
    # held until bake ended, it would have printed "never released" and failed.
    assert batches == [["first"], ["second"]]
    assert running_at_batch[0] is True
    assert (result.history_ref, result.digest) == (REF, DIGEST)


# A bake that starts a grandchild in its process group, reports both pids, and never ends.
_FAMILY = """\
import os, pathlib, subprocess, sys, time
if sys.argv[1:3] != ["buildx", "bake"]:
    sys.exit(1)
grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
tmp = pathlib.Path(os.environ["PIDS_FILE"] + ".tmp")
tmp.write_text(f"{os.getpid()} {grandchild.pid}")
tmp.replace(os.environ["PIDS_FILE"])
print("building", flush=True)
time.sleep(600)
"""


class StopBuild(Exception):
    pass


@pytest.mark.parametrize("interrupt", [StopBuild, KeyboardInterrupt])
def test_an_exception_in_the_caller_kills_the_whole_process_group(
    tmp_path: Path, interrupt: type[BaseException]
) -> None:
    pids_file = tmp_path / "pids"
    env = stand_in(tmp_path, _FAMILY, PIDS_FILE=str(pids_file))
    pids: list[int] = []

    def on_output(batch: list[str]) -> None:
        assert batch == ["building"]
        pids.extend(int(p) for p in pids_file.read_text().split())
        assert all(alive(pid) for pid in pids)
        # A cancelled Dagster run raises in the step's thread, as this does.
        raise interrupt()

    try:
        with pytest.raises(interrupt):
            run_bake(invocation(tmp_path, env), on_output=on_output, flush_s=0.05)
        child, grandchild = pids
        # run_bake reaped bake itself before re-raising.
        assert not alive(child)
        # The grandchild got the same signal; its end is asynchronous to run_bake's return.
        wait_until(lambda: not alive(grandchild), f"the end of grandchild {grandchild}")
    finally:
        # A failed check must not leave the stand-in's processes behind.
        for pid in pids:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
