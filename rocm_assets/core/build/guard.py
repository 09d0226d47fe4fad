"""The bake's guard: a bake dies with the run worker that started it, and its scratch files too.

    python -m rocm_assets.core.build.guard --parent PID [--scratch DIR] -- docker buildx bake ...

A run worker killed with SIGKILL cannot stop what it started, and a `docker buildx bake` left
behind kept building on a node the farm had already given to the next build: two builds on one
machine. The guard asks the kernel for SIGTERM when its parent dies (PR_SET_PDEATHSIG), starts
bake in a process group of its own, and on SIGTERM or SIGINT (the worker's death, or the worker
cancelling) stops that group: SIGTERM first, which the docker CLI passes to buildx and buildx
turns into a cancel on the builder, then SIGKILL after a grace. It then removes the build's
scratch directory, which the dead worker cannot, and exits 128 + the signal; so too when bake
ends on its own but the worker is gone (its output pipe closed under it). Otherwise it exits
with bake's own status and leaves the scratch directory (the metadata file is in it) to the
worker. Only the standard library: it starts in a few milliseconds.
"""

import argparse
import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
GRACE_S = 20.0


# The first SIGTERM or SIGINT: checked between waits, so a signal that lands while bake is
# being started still stops it.
_stopped: list[int] = []
_POLL_S = 0.2


def _note(signum: int, _frame: FrameType | None) -> None:
    _stopped.append(signum)


def _sigterm_on_parent_death() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")


def _die_with_parent(parent: int) -> bool:
    """Ask for SIGTERM when the parent dies, and to adopt bake's orphans; False if the parent
    has died already."""
    _sigterm_on_parent_death()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")
    # The parent may have died before the request took effect: then nobody waits for us.
    return os.getppid() == parent


def _children() -> list[int]:
    """This process's children: with it a subreaper, every descendant bake left behind ends up
    here (the docker CLI starts buildx in a process group of its own and may exit first)."""
    me, found = os.getpid(), []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                stat = Path(f"/proc/{entry}/stat").read_text()
                # Fields after the command name, which may hold spaces: state, ppid, ...
                if int(stat.rsplit(")", 1)[1].split()[1]) == me:
                    found.append(int(entry))
    return found


def _reap() -> bool:
    """Reap what has exited; True while some child is still alive."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return False
        if pid == 0:
            return True


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM bake, then SIGKILL whatever of it is left after the grace, buildx included."""
    deadline = time.monotonic() + GRACE_S
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    while _reap() and time.monotonic() < deadline:
        time.sleep(_POLL_S)
    # Again and again: a child killed leaves its own children (buildx, its ssh) to the guard, and
    # they would wait on a dead link as long as it stays down.
    while _reap():
        for pid in _children():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(_POLL_S)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bake_guard")
    parser.add_argument("--parent", type=int, required=True)
    parser.add_argument("--scratch")
    parser.add_argument("command", nargs="+")
    args = parser.parse_args(argv)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _note)
    try:
        if not _die_with_parent(args.parent):
            _stopped.append(signal.SIGTERM)
        # Bake gets the same request of the guard (which has no threads, so preexec_fn is safe):
        # should the guard itself be killed, bake is still stopped.
        proc = (
            None
            if _stopped
            else subprocess.Popen(
                args.command,
                start_new_session=True,
                preexec_fn=_sigterm_on_parent_death,  # noqa: PLW1509
            )
        )
    except OSError as exc:
        sys.stderr.write(f"bake_guard: cannot start {args.command[0]}: {exc.strerror or exc}\n")
        return 127
    while proc is not None and not _stopped:
        try:
            rc = proc.wait(timeout=_POLL_S)
        except subprocess.TimeoutExpired:
            continue
        # A worker that died may take bake down with it first (its output pipe closes), so a
        # bake that ended is cleaned up after too unless the worker is there to read it.
        if not _stopped and os.getppid() == args.parent:
            return 128 - rc if rc < 0 else rc
        break
    if proc is not None:
        _stop(proc)
    if args.scratch:
        shutil.rmtree(args.scratch, ignore_errors=True)
    return 128 + (_stopped[0] if _stopped else signal.SIGTERM)


if __name__ == "__main__":
    sys.exit(main())
