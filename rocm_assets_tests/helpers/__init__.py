"""Helpers the test modules share, so that no test module imports another.

`helpers.placement` holds the placement stand-ins, `helpers.seed` the seed's graph as the tests
know it, `helpers.registry_tick` the observation tick as its benchmark and test drive it; the
rest is here.
"""

import fcntl
import re
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

PROJECT_ROOT = Path(__file__).resolve().parent.parent.parent
SHIPPED_BAKE_FILE = PROJECT_ROOT / "rocm-bake.hcl"
SHIPPED_FLEET = PROJECT_ROOT / "fleet.yaml"
# How long a test waits for something that should take a second or two before it fails.
HANG_GUARD_S = 60.0


def free_port() -> int:
    """A loopback port nothing listens on (a server may take it; a client finds it refused)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def write_fleet(
    path: Path,
    nodes: Sequence[Mapping[str, Any]],
    costs: Mapping[str, Any] | None = None,
    **node_defaults: Any,
) -> Path:
    """A fleet.yaml at `path`: each node's missing fields from `node_defaults` (builder = name)."""
    doc = {
        "nodes": [{"builder": n["name"], **node_defaults, **n} for n in nodes],
        "target_costs": {"reference": {"cores": 32, "mem_gb": 122}, **(costs or {})},
    }
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def rocm_assets_cli(
    *args: str,
    env: Mapping[str, str] | None = None,
    cwd: Path = PROJECT_ROOT,
    timeout_s: float = 600.0,
) -> subprocess.CompletedProcess[str]:
    """`rocm-assets ARGS` in a fresh interpreter, as a user runs it; output captured as text."""
    return subprocess.run(
        [sys.executable, "-m", "rocm_assets.cli", *args],
        cwd=cwd,
        env=None if env is None else dict(env),
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout_s,
    )


def with_target(dest: Path, block: str, source: Path = SHIPPED_BAKE_FILE) -> Path:
    """A copy of the bake file `source` at `dest` with `block` (a target) appended."""
    dest.write_text(source.read_text() + block)
    return dest


def with_arch(source: Path, dest: Path, arch: str) -> Path:
    """A copy of the bake file `source` at `dest` with `arch` added to its one-line GPU_ARCHES."""
    text = source.read_text()
    new, count = re.subn(
        r"^(GPU_ARCHES = \[.*)\]$", rf'\1, "{arch}"]', text, count=1, flags=re.MULTILINE
    )
    assert count == 1, f"no one-line GPU_ARCHES list in {source}"
    dest.write_text(new)
    return dest


def wait_until(
    condition: Callable[[], bool], what: str, timeout_s: float = HANG_GUARD_S, poll_s: float = 0.02
) -> None:
    """Poll `condition` until it holds; fail naming `what` once `timeout_s` has passed."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{what} did not happen within {timeout_s:g} s"
        time.sleep(poll_s)


def alive(pid: int) -> bool:
    """Running or stopped; a zombie has ended (nothing here reaps an orphaned grandchild)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold an exclusive flock on `path` (made if missing): one test session at a time."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
