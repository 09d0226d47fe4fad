"""One build = one `docker buildx bake` of one target for one arch on one builder.

Pure: no Dagster. The asset layer supplies a line sink (the run log) and gets back what the
materialization records. The command is an argv list, never a shell string, and the `--set`
overrides name the one target, never `*.`, so linked targets are never stamped or rebuilt.
"""

import contextlib
import json
import os
import queue
import shlex
import shutil
import signal
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rocm_assets.core.constants import (
    ARCH_VAR,
    BUILD_NAME_PREFIX,
    NOARCH,
    PUBLISHED_INPUTS_VAR,
    RUN_ID_VAR,
)

# The caller's settings that reach bake through the environment, shown in the copyable command.
PASSTHROUGH_VARS = ("SCCACHE_LOG", "CACHE_TAG_SUFFIX", "REGISTRY")
PASSTHROUGH_PREFIXES = ("SDE_",)
_TERMINATE_GRACE_S = 10.0
_HEAD_LINES = 3
# How to get buildx where it is missing: no Debian package ships it.
BUILDX_INSTALL_HINT = (
    "install the docker-buildx-plugin package from Docker's apt repository "
    "(https://docs.docker.com/engine/install/debian/), or the docker-buildx binary from "
    "https://github.com/docker/buildx/releases as ~/.docker/cli-plugins/docker-buildx (chmod +x)"
)
# What a docker CLI without the buildx plugin prints for `docker buildx bake -f ...`: older ones
# say the command is unknown; 20.10 and newer read `buildx` as a plugin that is not there and
# then reject bake's first flag.
_NO_BUILDX = (
    "is not a docker command",
    "unknown shorthand flag: 'f' in -f",
)
_HISTORY_TIMEOUT_S = 30.0


class BuildError(Exception):
    """A bake that could not start, failed, or left no usable metadata. `log_tail` holds its last lines."""

    def __init__(
        self, message: str, *, log_tail: tuple[str, ...] = (), history_ref: str | None = None
    ):
        super().__init__(message)
        self.log_tail = log_tail
        self.history_ref = history_ref


def build_name(target: str, arch: str | None, run_id: str) -> str:
    """The BuildKit history name: `docker buildx history ls` finds a build by it."""
    return f"{BUILD_NAME_PREFIX}/{target}/{arch or NOARCH}/{run_id}"


@dataclass(frozen=True)
class BakeInvocation:
    """Everything needed to run, show and later find one bake."""

    target: str
    arch: str
    partition: str | None  # None for noarch targets (built against `arch`)
    builder: str
    max_jobs: int
    run_id: str
    name: str
    metadata_file: Path
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(repr=False)
    cwd: Path = Path()

    def command(self) -> str:
        """A copyable command line: the farm's env settings, then the argv, shell-quoted."""
        shown = {
            k: v
            for k, v in self.env.items()
            if k in (PUBLISHED_INPUTS_VAR, ARCH_VAR, RUN_ID_VAR, *PASSTHROUGH_VARS)
            or k.startswith(PASSTHROUGH_PREFIXES)
        }
        prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(shown.items()))
        return f"{prefix} {shlex.join(self.argv)}".strip()


def bake_invocation(
    *,
    bake_file: Path,
    target: str,
    arch: str,
    partition: str | None,
    builder: str,
    max_jobs: int,
    run_id: str,
    metadata_file: Path,
    base_env: Mapping[str, str],
    docker: str = "docker",
    progress: str = "plain",
) -> BakeInvocation:
    """The argv and env for baking `target` for `arch` on `builder` with inputs from the registry."""
    name = build_name(target, partition, run_id)
    env = dict(base_env)
    # Inputs always come from the registry: a target: context would make bake rebuild upstream.
    env[PUBLISHED_INPUTS_VAR] = "1"
    env[ARCH_VAR] = arch
    env[RUN_ID_VAR] = run_id
    argv = (
        docker, "buildx", "bake",
        "-f", str(bake_file),
        "--builder", builder,
        "--push",
        "--metadata-file", str(metadata_file),
        f"--progress={progress}",
        "--set", f"{target}.args.BUILDKIT_BUILD_NAME={name}",
        "--set", f"{target}.args.MAX_JOBS={max_jobs}",
        # Options end here: no target name can be read as a flag.
        "--", target,
    )  # fmt: skip
    return BakeInvocation(
        target,
        arch,
        partition,
        builder,
        max_jobs,
        run_id,
        name,
        metadata_file,
        argv,
        env,
        # Bake resolves relative `context` paths against its working directory, not the file's.
        cwd=bake_file.parent,
    )


@dataclass(frozen=True)
class BuildResult:
    """What one successful bake produced, as recorded on the materialization."""

    history_ref: str
    digest: str
    tags: tuple[str, ...]
    started_at: float
    finished_at: float

    @property
    def duration_s(self) -> float:
        return self.finished_at - self.started_at


def parse_metadata(path: Path, target: str) -> tuple[str, str, tuple[str, ...]]:
    """(history ref, image digest, pushed names) from bake's --metadata-file."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BuildError(
            f"bake exited 0 but wrote no metadata file {path}: is `docker buildx` the real bake (buildx >= 0.13)?"
        ) from None
    except (OSError, ValueError) as exc:
        raise BuildError(f"bake metadata file {path} is not JSON: {exc}") from None
    entry = data.get(target) if isinstance(data, dict) else None
    if not isinstance(entry, dict):
        raise BuildError(f"bake metadata file {path} has no entry for target {target!r}")
    ref, digest = entry.get("buildx.build.ref"), entry.get("containerimage.digest")
    if not isinstance(ref, str) or not ref:
        raise BuildError(
            f"bake metadata for {target!r} has no buildx.build.ref (needs a builder with history)"
        )
    if not isinstance(digest, str) or not digest.startswith("sha256:"):
        raise BuildError(
            f"bake metadata for {target!r} has no containerimage.digest: was it pushed?"
        )
    names = entry.get("image.name", "")
    return ref, digest, tuple(n for n in str(names).split(",") if n)


def find_history_ref(inv: BakeInvocation, *, timeout_s: float = _HISTORY_TIMEOUT_S) -> str | None:
    """The history ref of a failed build, matched by its name (the metadata file is not written)."""
    argv = [inv.argv[0], "buildx", "history", "ls", "--builder", inv.builder, "--format", "json"]
    try:
        out = subprocess.run(
            argv, env=dict(inv.env), capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in out.stdout.splitlines():
        with contextlib.suppress(ValueError):
            record = json.loads(line)
            if isinstance(record, dict) and record.get("name") == inv.name:
                return str(record.get("ref") or "") or None  # newest first
    return None


def _diagnose(inv: BakeInvocation, rc: int, output: tuple[str, ...]) -> str:
    """The reason a bake failed, from its first and last lines of output."""
    text = "\n".join(output)
    if any(sign in text for sign in _NO_BUILDX) or ("unknown command" in text and "buildx" in text):
        return (
            f"the docker buildx plugin is missing ({inv.argv[0]} has no `buildx`): "
            f"{BUILDX_INSTALL_HINT}; buildx >= 0.27 for history names"
        )
    if f'no builder "{inv.builder}" found' in text:
        return f"builder {inv.builder!r} is unknown to docker buildx: create it (docker buildx create --name {inv.builder} ...) or fix `builder:` in fleet.yaml"
    if rc < 0 or rc in (130, 143):
        return f"bake was stopped (exit {rc})"
    return f"bake of {inv.target} for {inv.arch} on builder {inv.builder} failed (exit {rc})"


def _terminate(proc: subprocess.Popen[str]) -> None:
    """End bake and everything it started: it runs in its own process group."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=_TERMINATE_GRACE_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def run_bake(
    inv: BakeInvocation,
    *,
    on_output: Callable[[list[str]], None],
    flush_s: float = 1.0,
    tail_lines: int = 40,
) -> BuildResult:
    """Run the bake, streaming its output in batches as it arrives; raise BuildError on failure.

    Batching keeps a 100k-line PyTorch log from becoming 100k run-log events. Any exception in
    this thread (a cancelled run raises one) terminates bake's process group before re-raising,
    so no orphan build keeps the node busy.
    """
    docker = inv.argv[0]
    if shutil.which(docker, path=inv.env.get("PATH")) is None:
        raise BuildError(
            f"{docker!r} is not on PATH: install the Docker CLI with the buildx plugin"
        )
    inv.metadata_file.unlink(missing_ok=True)
    started = time.time()
    try:
        proc = subprocess.Popen(
            list(inv.argv),
            env=dict(inv.env),
            cwd=inv.cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            errors="replace",
            bufsize=1,
            start_new_session=True,
        )
    except OSError as exc:
        raise BuildError(
            f"cannot start {shlex.join(inv.argv[:3])}: {exc.strerror or exc}"
        ) from None
    lines: queue.Queue[str | None] = queue.Queue()
    tail: deque[str] = deque(maxlen=tail_lines)
    # A CLI usage error (a docker without buildx) prints its reason first, then 80 lines of usage.
    head: list[str] = []

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line.rstrip("\n"))
        lines.put(None)

    reader = threading.Thread(target=pump, name=f"bake-{inv.target}", daemon=True)
    reader.start()
    batch: list[str] = []
    last_flush = time.monotonic()
    try:
        done = False
        while not done:
            try:
                line = lines.get(timeout=flush_s)
            except queue.Empty:
                line = ""
            if line is None:
                done = True
            elif line:
                batch.append(line)
                tail.append(line)
                if len(head) < _HEAD_LINES:
                    head.append(line)
            if batch and (done or time.monotonic() - last_flush >= flush_s or len(batch) >= 200):
                on_output(batch)
                batch, last_flush = [], time.monotonic()
        rc = proc.wait()
    except BaseException:
        _terminate(proc)
        raise
    finished = time.time()
    if rc != 0:
        ref = find_history_ref(inv)
        reason = _diagnose(inv, rc, (*head, *tail))
        where = (
            f"; history ref {ref} (docker buildx history logs {ref.rsplit('/', 1)[-1]})"
            if ref
            else ""
        )
        raise BuildError(f"{reason}{where}", log_tail=tuple(tail), history_ref=ref)
    ref, digest, names = parse_metadata(inv.metadata_file, inv.target)
    return BuildResult(ref, digest, names, started, finished)


def metadata_summary(inv: BakeInvocation, result: BuildResult, node: str) -> dict[str, Any]:
    """Plain values for the materialization's metadata (the Dagster layer wraps them)."""
    return {
        "history_ref": result.history_ref,
        "history_name": inv.name,
        "digest": result.digest,
        "tags": list(result.tags),
        "node": node,
        "builder": inv.builder,
        "max_jobs": inv.max_jobs,
        "run_id": inv.run_id,
        "started_at": result.started_at,
        "finished_at": result.finished_at,
        "duration_s": round(result.duration_s, 3),
        "command": inv.command(),
    }
