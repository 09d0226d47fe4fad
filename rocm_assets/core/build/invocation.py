"""One build = one `docker buildx bake` of one target for one arch on one builder.

Pure: no Dagster. The asset layer supplies a line sink (the run log) and gets back what the
materialization records. The command is an argv list, never a shell string, and the `--set`
overrides name the one target, never `*.`, so linked targets are never stamped or rebuilt.
"""

import contextlib
import json
import os
import queue
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rocm_assets.core.build import guard as bake_guard
from rocm_assets.core.common.buildx import find_buildx
from rocm_assets.core.common.constants import (
    ARCH_VAR,
    BUILD_NAME_ARG,
    BUILD_NAME_PREFIX,
    MAX_JOBS_ARG,
    NOARCH,
    PUBLISHED_INPUTS_VAR,
    RUN_ID_VAR,
    SCCACHE_LOG_VAR,
)
from rocm_assets.core.common.timefmt import duration

# The caller's settings that reach bake through the environment, shown in the copyable command;
# DOCKER_CONTEXT reaches a docker-driver node.
PASSTHROUGH_VARS = (SCCACHE_LOG_VAR, "CACHE_TAG_SUFFIX", "REGISTRY", "DOCKER_CONTEXT")
PASSTHROUGH_PREFIXES = ("SDE_",)
# Longer than the guard's own grace for bake, so the guard is never killed before bake is.
_TERMINATE_GRACE_S = bake_guard.GRACE_S + 10.0
_HEAD_LINES = 3
# How to get buildx where it is missing.
BUILDX_INSTALL_HINT = (
    "install Debian's docker-buildx package (0.29 from Debian testing names history records; "
    "Debian 13's 0.13 builds but has no `buildx history`), or Docker's docker-buildx-plugin"
)
# `buildx history` arrived in 0.20; history records take their name from BUILDKIT_BUILD_NAME
# since 0.27.
HISTORY_SINCE = (0, 20)
NAMED_HISTORY_SINCE = (0, 27)
# What a docker CLI without the buildx plugin prints for `docker buildx bake -f ...`: older ones
# say the command is unknown; 20.10 and newer read `buildx` as a plugin that is not there and
# then reject bake's first flag.
_NO_BUILDX = (
    "is not a docker command",
    "unknown shorthand flag: 'f' in -f",
)
_HISTORY_TIMEOUT_S = 30.0
_CONTEXT_TIMEOUT_S = 20.0
# A registry outage this short loses no build: a bake the registry failed is retried, backing
# off to one try every RETRY_MAX_S, for REGISTRY_RETRY_S after its first such failure, so some
# try starts within RETRY_MAX_S of the registry's return.
REGISTRY_OUTAGE_BOUND_S = 120.0
RETRY_FIRST_S = 5.0
RETRY_MAX_S = 30.0
REGISTRY_RETRY_S = REGISTRY_OUTAGE_BOUND_S + 2 * RETRY_MAX_S
# How bake's ERROR line says the registry could not be reached (Go's net errors, through the
# docker engine or BuildKit) or answered 5xx; a failed step's own output never reaches it.
_REGISTRY_TROUBLE = tuple(
    re.compile(p)
    for p in (
        r"\bdial tcp\b",
        r"connection refused",
        r"connection reset by peer",
        r"\bi/o timeout\b",
        r"\bno such host\b",
        r"\bno route to host\b",
        r"network is unreachable",
        r"TLS handshake timeout",
        r"\bbroken pipe\b",
        r"\bunexpected EOF\b",
        r"unexpected (HTTP )?status\b.*: 5\d\d\b",
    )
)
_STEP_FAILED = "did not complete successfully"


class BuildError(Exception):
    """A bake that could not start, failed, or left no usable metadata. `log_tail` holds its last lines."""

    def __init__(
        self, message: str, *, log_tail: tuple[str, ...] = (), history_ref: str | None = None
    ):
        super().__init__(message)
        self.log_tail = log_tail
        self.history_ref = history_ref


def builder_env(builder: str, env: Mapping[str, str], docker: str = "docker") -> dict[str, str]:
    """`env` set up to reach `builder`: through its docker context when it is one.

    A docker context is a buildx builder of the docker driver, and buildx builds on it only when
    it is the current context (`--builder NAME` alone is refused with `use docker --context=NAME
    buildx`), so DOCKER_CONTEXT names it. A builder made by `docker buildx create` is not a
    context and is reached by `--builder` alone.
    """
    out = dict(env)
    try:
        found = subprocess.run(
            [docker, "context", "inspect", "--format", "{{.Name}}", "--", builder],
            env=out,
            capture_output=True,
            text=True,
            timeout=_CONTEXT_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return out
    if found.returncode == 0 and found.stdout.strip() == builder:
        out["DOCKER_CONTEXT"] = builder
        out.pop("DOCKER_HOST", None)
    return out


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
    # The build's scratch directory, removed by the bake's guard if the worker dies mid-bake.
    scratch: Path | None = None

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
    scratch: Path | None = None,
) -> BakeInvocation:
    """The argv and env for baking `target` for `arch` on `builder` with inputs from the registry."""
    name = build_name(target, partition, run_id)
    env = builder_env(builder, base_env, docker)
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
        "--set", f"{target}.args.{BUILD_NAME_ARG}={name}",
        "--set", f"{target}.args.{MAX_JOBS_ARG}={max_jobs}",
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
        scratch=scratch,
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


class HistoryUnavailable(Exception):
    """The builder's BuildKit history cannot be listed; the message says why, in one line."""


@dataclass(frozen=True)
class HistoryRecord:
    """One build in a builder's BuildKit history (`docker buildx history ls --format json`)."""

    ref: str
    name: str
    status: str
    created_at: str
    completed_at: str | None


def history(
    builder: str,
    env: Mapping[str, str],
    *,
    docker: str = "docker",
    timeout_s: float = _HISTORY_TIMEOUT_S,
) -> list[HistoryRecord]:
    """The builder's history records, newest first; HistoryUnavailable if buildx cannot list them."""
    found = find_buildx(env)
    if found is not None and found.version < HISTORY_SINCE:
        raise HistoryUnavailable(
            f"buildx {found.version_text} has no `buildx history` "
            f"({'.'.join(map(str, HISTORY_SINCE))} and later list a builder's records)"
        )
    argv = [docker, "buildx", "history", "ls", "--builder", builder, "--format", "json"]
    try:
        out = subprocess.run(
            argv,
            env=builder_env(builder, env, docker),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise HistoryUnavailable(f"{shlex.join(argv[:4])} did not answer: {exc}") from None
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["no output"])[-1]
        raise HistoryUnavailable(f"{shlex.join(argv[:4])} --builder {builder} failed: {last}")
    records = []
    for line in out.stdout.splitlines():
        with contextlib.suppress(ValueError):
            item = json.loads(line)
            if isinstance(item, dict) and item.get("ref"):
                records.append(
                    HistoryRecord(
                        str(item["ref"]),
                        str(item.get("name") or ""),
                        str(item.get("status") or ""),
                        str(item.get("created_at") or ""),
                        item.get("completed_at") or None,
                    )
                )
    return records


def find_history_ref(inv: BakeInvocation) -> tuple[str | None, str]:
    """The history ref of a failed build, matched by its name (no metadata file is written for
    it), or None and why it is not known."""
    try:
        records = history(inv.builder, inv.env, docker=inv.argv[0])
    except HistoryUnavailable as exc:
        return None, str(exc)
    for record in records:
        if record.name == inv.name:
            return record.ref, ""
    return None, (
        f"no history record named {inv.name} on {inv.builder} (buildx before "
        f"{'.'.join(map(str, NAMED_HISTORY_SINCE))} does not name records by BUILDKIT_BUILD_NAME)"
    )


def bake_error_line(output: tuple[str, ...]) -> str | None:
    """Bake's own reason: its last `ERROR:` line, which names the step or the file that failed."""
    for line in reversed(output):
        text = line.strip()
        if text.startswith("ERROR:"):
            return text[:500]
    return None


def _diagnose(inv: BakeInvocation, rc: int, output: tuple[str, ...]) -> tuple[str, bool]:
    """The reason a bake failed, from its first and last lines of output, and whether it got as
    far as a build the builder's history would hold."""
    text = "\n".join(output)
    if any(sign in text for sign in _NO_BUILDX) or ("unknown command" in text and "buildx" in text):
        return (
            f"the docker buildx plugin is missing ({inv.argv[0]} has no `buildx`): "
            f"{BUILDX_INSTALL_HINT}"
        ), False
    if f'no builder "{inv.builder}" found' in text:
        return (
            f"builder {inv.builder!r} is unknown to docker buildx: create it (docker buildx "
            f"create --name {inv.builder} ...) or fix `builder:` in fleet.yaml"
        ), False
    if rc < 0 or rc in (130, 143):
        return f"bake was stopped (exit {rc})", True
    reason = bake_error_line(output)
    failed = f"bake of {inv.target} for {inv.arch} on builder {inv.builder} failed (exit {rc})"
    return (f"{failed}: {reason}" if reason else failed), True


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


def registry_trouble(output: tuple[str, ...]) -> str | None:
    """Bake's `ERROR:` line when it says the registry could not be reached or answered 5xx (a
    push, or an input's pull): what a registry outage gives. None for any other failure."""
    line = bake_error_line(output)
    if line is None or _STEP_FAILED in line:
        return None
    return line if any(p.search(line) for p in _REGISTRY_TROUBLE) else None


def retry_delay(attempt: int) -> float:
    """The pause before try `attempt` + 1 at something the registry failed: 5, 10, 20, 30 s."""
    return min(RETRY_FIRST_S * 2 ** (attempt - 1), RETRY_MAX_S)


def run_bake(
    inv: BakeInvocation,
    *,
    on_output: Callable[[list[str]], None],
    on_retry: Callable[[str], None] | None = None,
    flush_s: float = 1.0,
    tail_lines: int = 40,
    retry_s: float = REGISTRY_RETRY_S,
    stop_when: Callable[[], str | None] | None = None,
) -> BuildResult:
    """Run the bake, streaming its output in batches as it arrives; raise BuildError on failure.

    Batches (at most `flush_s` apart, at most 200 lines) keep a 100k-line PyTorch log from
    costing `on_output` 100k calls; what reaches the run's events is the sink's choice
    (`output.BakeLog`). Any exception in this thread (a cancelled run raises one) terminates
    bake's process group before re-raising, so no orphan build keeps the node busy.

    A bake that failed because the registry could not be reached or answered 5xx is run again,
    after 5, 10, 20, then 30 s, until `retry_s` has passed since the first such failure: with
    BuildKit's cache the steps already built are not built again, only what is left is pushed.
    So a registry outage shorter than REGISTRY_OUTAGE_BOUND_S loses no build. Each retry is
    said in one line to `on_retry` (default: the output sink).

    `stop_when` is asked every `flush_s`: a reason (the node stopped answering its probes)
    stops bake and fails the build with it.
    """
    docker = inv.argv[0]
    if shutil.which(docker, path=inv.env.get("PATH")) is None:
        raise BuildError(
            f"{docker!r} is not on PATH: install the Docker CLI with the buildx plugin"
        )
    say = on_retry or (lambda line: on_output([line]))
    first_failure: float | None = None
    attempt = 1
    # A retried build took all its attempts: the build's own times say when it began.
    started = time.time()
    while True:
        rc, head, tail = _bake_once(inv, on_output, flush_s, tail_lines, stop_when)
        finished = time.time()
        if rc == 0:
            ref, digest, names = parse_metadata(inv.metadata_file, inv.target)
            return BuildResult(ref, digest, names, started, finished)
        output = (*head, *tail)
        trouble = registry_trouble(output)
        if trouble is not None and _diagnose(inv, rc, output)[1]:
            first_failure = first_failure or finished
            delay = retry_delay(attempt)
            if finished + delay - first_failure <= retry_s:
                say(
                    f"the registry failed bake of {inv.target} ({trouble}); attempt "
                    f"{attempt + 1} in {delay:.0f}s, retried for {duration(retry_s)} after the "
                    "first failure"
                )
                time.sleep(delay)
                attempt += 1
                continue
        raise _failure(inv, rc, output, tail, attempt, first_failure, finished)


def _failure(
    inv: BakeInvocation,
    rc: int,
    output: tuple[str, ...],
    tail: tuple[str, ...],
    attempts: int,
    first_failure: float | None,
    finished: float,
) -> BuildError:
    reason, built = _diagnose(inv, rc, output)
    if not built:
        return BuildError(reason, log_tail=tail)
    if first_failure is not None:
        reason += (
            f"; {attempts} attempts over {duration(finished - first_failure)} "
            "after the registry first failed it"
        )
    ref, why = find_history_ref(inv)
    where = (
        f"; history ref {ref} (docker buildx history logs {ref.rsplit('/', 1)[-1]})"
        if ref
        else f"; no history ref: {why}"
    )
    return BuildError(f"{reason}{where}", log_tail=tail, history_ref=ref)


def _bake_once(
    inv: BakeInvocation,
    on_output: Callable[[list[str]], None],
    flush_s: float,
    tail_lines: int,
    stop_when: Callable[[], str | None] | None,
) -> tuple[int, tuple[str, ...], tuple[str, ...]]:
    """One bake, its output streamed: (exit status, its first lines, its last lines)."""
    inv.metadata_file.unlink(missing_ok=True)
    guard = [sys.executable, "-m", bake_guard.__name__, "--parent", str(os.getpid())]
    if inv.scratch is not None:
        guard += ["--scratch", str(inv.scratch)]
    try:
        proc = subprocess.Popen(
            [*guard, "--", *inv.argv],
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
            reason = None if done or stop_when is None else stop_when()
            if reason:
                raise BuildError(f"{reason}: bake was stopped", log_tail=tuple(tail))
        rc = proc.wait()
    except BaseException:
        _terminate(proc)
        raise
    return rc, tuple(head), tuple(tail)


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
