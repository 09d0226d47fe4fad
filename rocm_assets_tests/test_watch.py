"""rocm-assets watch on a real Dagster instance (SQLite) with build runs in progress.

Real parts: `instance_for_test` storage; SSH probes against Debian's OpenSSH sshd (the
`sshd_server` fixture) and a closed loopback port; runs carry the coordinator's tags and are started through
the instance's event API (a RUN_START event sets a run's start time, as a run worker's does); the
`rocm-assets` CLI runs in a subprocess for `--once`, for Ctrl-C (SIGINT) and on a pseudo-terminal.
Frames rendered in-process take `now` as an argument, so elapsed and remaining times are exact.
"""

import fcntl
import os
import pty
import random
import select
import shutil
import signal
import socket
import sqlite3
import struct
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import dagster as dg
import pytest
from dagster._core.events import DagsterEvent, DagsterEventType
from dagster._core.remote_origin import (
    RegisteredCodeLocationOrigin,
    RemoteJobOrigin,
    RemoteRepositoryOrigin,
)
from dagster._core.test_utils import create_run_for_test, instance_for_test

from rocm_assets.cli.watch import NOT_PROBED, frame
from rocm_assets.core.build.invocation import build_name
from rocm_assets.core.common.constants import (
    FANOUT_PARENT,
    PLACEMENT_PLACED,
    PLACEMENT_WAITING,
    ROCM_BUILD_TAG,
    ROCM_EST_FINISH_TAG,
    ROCM_EST_START_TAG,
    ROCM_FANOUT_TAG,
    ROCM_NODE_TAG,
    ROCM_PLACEMENT_TAG,
    ROCM_WAITING_FOR_TAG,
)
from rocm_assets.core.common.timefmt import duration, to_iso
from rocm_assets.core.nodes.fleet import load_fleet
from rocm_assets.core.nodes.probes import probe_fleet
from rocm_assets_tests.helpers import PROJECT_ROOT, free_port, wait_until, write_fleet
from rocm_assets_tests.servers.sshd import SshdServer

FLEET = """
nodes:
  - {name: big, builder: big, cores: 32, mem_gb: 122, link_mbps: 1000}
  - {name: small, builder: small, cores: 16, mem_gb: 15, link_mbps: 40}
  - {name: mid, builder: mid, cores: 24, mem_gb: 64, link_mbps: 500}
  - {name: spare, builder: spare, cores: 8, mem_gb: 32, link_mbps: 40}
target_costs:
  reference: {cores: 32, mem_gb: 122}
"""
URL = "http://127.0.0.1:3000"
# Queued runs need an origin; the code location itself is not needed to read them back.
REPOSITORY = RemoteRepositoryOrigin(RegisteredCodeLocationOrigin("rocm_assets"), "__repository__")
# Long enough that no test frame is drawn twice before the test reads the first one.
_READ_TIMEOUT_S = 60.0


def cols(line: str) -> list[str]:
    """A node line's columns, without the reachability label (every FLEET node is unprobed)."""
    assert NOT_PROBED in line, line
    return line.replace(NOT_PROBED, "", 1).split()


@pytest.fixture
def fleet_file(tmp_path: Path) -> Path:
    path = tmp_path / "fleet.yaml"
    path.write_text(FLEET)
    return path


@pytest.fixture
def home(tmp_path: Path) -> Path:
    path = tmp_path / "dagster_home"
    path.mkdir()
    return path


@pytest.fixture
def instance(home: Path) -> Iterator[dg.DagsterInstance]:
    with instance_for_test(temp_dir=str(home)) as instance:
        yield instance


def add_build(
    instance: dg.DagsterInstance, build: str, tags: dict[str, str] | None = None
) -> dg.DagsterRun:
    target, _, arch = build.partition("@")
    all_tags = {ROCM_BUILD_TAG: build, **({"dagster/partition": arch} if arch else {})}
    return create_run_for_test(
        instance,
        job_name="__ASSET_JOB",
        status=dg.DagsterRunStatus.QUEUED,
        remote_job_origin=RemoteJobOrigin(REPOSITORY, "__ASSET_JOB"),
        asset_selection=frozenset({dg.AssetKey(target)}),
        tags={**all_tags, **(tags or {})},
    )


def start(instance: dg.DagsterInstance, run: dg.DagsterRun, est_s: float | None) -> float:
    """Start `run` now; tag its estimate as the coordinator does; its recorded start time."""
    instance.report_dagster_event(
        DagsterEvent(DagsterEventType.RUN_START.value, job_name=run.job_name, message="started"),
        run_id=run.run_id,
    )
    record = instance.get_run_record_by_id(run.run_id)
    assert record is not None and record.start_time is not None
    if est_s is not None:
        instance.add_run_tags(
            run.run_id,
            {
                ROCM_EST_START_TAG: to_iso(record.start_time),
                ROCM_EST_FINISH_TAG: to_iso(record.start_time + est_s),
            },
        )
    return record.start_time


def placed(node: str) -> dict[str, str]:
    return {ROCM_NODE_TAG: node, ROCM_PLACEMENT_TAG: PLACEMENT_PLACED}


def waiting(reason: str) -> dict[str, str]:
    return {ROCM_PLACEMENT_TAG: PLACEMENT_WAITING, ROCM_WAITING_FOR_TAG: reason}


@pytest.fixture
def farm(instance: dg.DagsterInstance) -> dict[str, dg.DagsterRun]:
    """pytorch on big (2 h estimate), triton-wheel on small (overdue), vllm placed on mid, a queue."""
    runs = {
        "pytorch": add_build(instance, "pytorch@gfx942", placed("big")),
        "triton": add_build(instance, "triton-wheel", placed("small")),
        "vllm": add_build(instance, "vllm@gfx1100", placed("mid")),
        "lmcache": add_build(instance, "lmcache-wheel@gfx942", waiting("waits for lmcache@gfx942")),
        "aiter": add_build(
            instance, "aiter-wheel@gfx942", waiting("no free node (planned on big at +5400s)")
        ),
        # A request split into one run per build: it takes no node and is no build.
        "parent": create_run_for_test(
            instance,
            job_name="serving",
            status=dg.DagsterRunStatus.QUEUED,
            remote_job_origin=RemoteJobOrigin(REPOSITORY, "serving"),
            tags={ROCM_FANOUT_TAG: FANOUT_PARENT, "dagster/partition": "gfx942"},
        ),
    }
    instance.add_run_tags(
        runs["vllm"].run_id,
        {ROCM_EST_START_TAG: to_iso(time.time()), ROCM_EST_FINISH_TAG: to_iso(time.time() + 1800)},
    )
    return runs


def test_a_frame_shows_each_node_and_the_queue(
    instance: dg.DagsterInstance, farm: dict[str, dg.DagsterRun], fleet_file: Path
) -> None:
    began = start(instance, farm["pytorch"], est_s=7200)
    triton_began = start(instance, farm["triton"], est_s=600)
    start(instance, farm["parent"], est_s=None)
    now = began + 1800
    lines = frame(instance, load_fleet(fleet_file), now, URL)

    header, *rest = lines
    assert "nodes busy 3/4" in header
    assert "queued 2" in header
    assert "other runs 1" in header
    assert f"{URL}/runs" in header
    node_lines = {line.split()[0]: line for line in rest[:4]}
    assert list(node_lines) == ["big", "small", "mid", "spare"]

    pytorch = farm["pytorch"].run_id
    big = cols(node_lines["big"])
    assert big[:5] == ["big", "pytorch", "gfx942", pytorch[:8], "30m00s"]
    assert "~1h30m left" in node_lines["big"]
    assert "[#####...............]  25%" in node_lines["big"]
    assert node_lines["big"].endswith(build_name("pytorch", "gfx942", pytorch))
    assert node_lines["big"].endswith(f"rocm-pytorch-build/pytorch/gfx942/{pytorch}")

    triton = farm["triton"].run_id
    assert cols(node_lines["small"])[:4] == ["small", "triton-wheel", "noarch", triton[:8]]
    assert cols(node_lines["small"])[4:7] == [
        duration(now - triton_began),
        duration(now - triton_began - 600),
        "over",
    ]
    assert "[####################] 100%" in node_lines["small"]
    assert node_lines["small"].endswith(f"rocm-pytorch-build/triton-wheel/noarch/{triton}")

    # Placed and not yet started by the daemon.
    assert cols(node_lines["mid"])[:5] == [
        "mid",
        "vllm",
        "gfx1100",
        farm["vllm"].run_id[:8],
        "starting",
    ]
    # No ssh address: nobody probes it, and the line says its figures are the fleet file's.
    assert node_lines["spare"] == f"  spare  {NOT_PROBED}  idle"

    queue = rest[4:]
    assert queue[0] == "queue (2 waiting):"
    lmcache, aiter_wheel = queue[1:]
    assert lmcache.split()[:2] == ["lmcache-wheel@gfx942", farm["lmcache"].run_id[:8]]
    assert "waits for lmcache@gfx942" in lmcache
    assert lmcache.endswith(build_name("lmcache-wheel", "gfx942", farm["lmcache"].run_id))
    assert "no free node (planned on big at +5400s)" in aiter_wheel
    assert len(queue) == 3


def test_two_builds_on_one_node_are_both_shown(
    instance: dg.DagsterInstance, fleet_file: Path
) -> None:
    first = add_build(instance, "pytorch@gfx942", placed("big"))
    second = add_build(instance, "pytorch@gfx950", placed("big"))
    began = start(instance, first, est_s=None)
    start(instance, second, est_s=None)
    lines = frame(instance, load_fleet(fleet_file), began + 5, URL)
    on_big = [line for line in lines if line.split()[0] == "big"]
    assert [cols(line)[3] for line in on_big] == [first.run_id[:8], second.run_id[:8]]
    # No estimate: the time left and the bar say so rather than guess.
    assert all("[????????????????????]    ?" in line for line in on_big)
    assert "queue (0 waiting)" in lines


def _cli_env(home: Path, fleet_file: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        DAGSTER_HOME=str(home),
        ROCM_FLEET_FILE=str(fleet_file),
        PYTHONPATH=os.pathsep.join(p for p in [str(PROJECT_ROOT), env.get("PYTHONPATH")] if p),
    )
    return env


def _watch_argv(*extra: str) -> list[str]:
    return [sys.executable, "-m", "rocm_assets.cli", "watch", "--url", URL, *extra]


def test_once_prints_one_frame(
    instance: dg.DagsterInstance,
    farm: dict[str, dg.DagsterRun],
    home: Path,
    fleet_file: Path,
) -> None:
    start(instance, farm["pytorch"], est_s=7200)
    out = subprocess.run(
        _watch_argv("--once"),
        env=_cli_env(home, fleet_file),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert out.stderr == ""
    lines = out.stdout.splitlines()
    assert lines[0].startswith("rocm-assets watch")
    assert "\x1b" not in out.stdout
    pytorch = farm["pytorch"].run_id
    assert any(
        line.startswith("  big")
        and cols(line)[:4] == ["big", "pytorch", "gfx942", pytorch[:8]]
        and line.endswith(f"rocm-pytorch-build/pytorch/gfx942/{pytorch}")
        for line in lines
    )
    assert "queue (2 waiting):" in lines
    assert lines[-1].endswith(build_name("aiter-wheel", "gfx942", farm["aiter"].run_id))


def test_ctrl_c_ends_watch_cleanly(
    instance: dg.DagsterInstance, farm: dict[str, dg.DagsterRun], home: Path, fleet_file: Path
) -> None:
    proc = subprocess.Popen(
        _watch_argv("--interval", "0.2"),
        env=_cli_env(home, fleet_file),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        # Two headers: watch is past start-up and in its loop.
        seen: list[str] = []
        while sum(line.startswith("rocm-assets watch") for line in seen) < 2:
            line = proc.stdout.readline()
            assert line, f"watch ended early: {proc.stderr.read() if proc.stderr else ''}"
            seen.append(line)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=_READ_TIMEOUT_S)
        out = "".join(seen) + out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0
    assert err == ""
    # Frames on a pipe are plain lines, one blank line apart.
    assert "\x1b" not in out
    assert "\n\nrocm-assets watch" in out


def _read_until(fd: int, wanted: bytes, count: int) -> bytes:
    data = b""
    deadline = time.monotonic() + _READ_TIMEOUT_S
    while data.count(wanted) < count:
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"no {count} x {wanted!r} from watch on a tty; got {data[-500:]!r}"
        ready, _, _ = select.select([fd], [], [], remaining)
        if ready:
            data += os.read(fd, 65536)
    return data


def _drain(fd: int, proc: subprocess.Popen[bytes]) -> None:
    """Read the terminal until watch exits, so a full pty buffer never blocks its last frame."""
    deadline = time.monotonic() + _READ_TIMEOUT_S
    while proc.poll() is None and time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.1)
        if ready:
            try:
                os.read(fd, 65536)
            except OSError:  # EIO: the child closed its end
                return


def test_on_a_terminal_it_redraws_in_place(
    instance: dg.DagsterInstance, farm: dict[str, dg.DagsterRun], home: Path, fleet_file: Path
) -> None:
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        _watch_argv("--interval", "0.2"),
        env=_cli_env(home, fleet_file),
        stdout=follower,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )
    os.close(follower)
    try:
        screen = _read_until(leader, b"\x1b[H\x1b[J", 2)
        proc.send_signal(signal.SIGINT)
        _drain(leader, proc)
        _, err = proc.communicate(timeout=_READ_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(leader)
    assert proc.returncode == 0
    assert err == b""
    frames = screen.split(b"\x1b[H\x1b[J")[1:]
    assert frames[0].startswith(b"rocm-assets watch")
    assert b"lmcache-wheel@gfx942" in frames[0]


def test_without_dagster_home_it_says_so(fleet_file: Path, tmp_path: Path) -> None:
    env = _cli_env(Path(), fleet_file)
    env.pop("DAGSTER_HOME")
    # Run where there is no ./.dagster_home either, the instance it would read instead.
    out = subprocess.run(
        _watch_argv("--once"),
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=tmp_path,
    )
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1
    assert "DAGSTER_HOME is not set" in out.stderr


# ##### Reachability: real probes over the test sshd, a closed port, and a node with no ssh


def _probed_fleet(tmp_path: Path, sshd: SshdServer, dead_port: int) -> Path:
    return write_fleet(
        tmp_path / "probed.yaml",
        [
            {"name": "big", "builder": "big-builder", "ssh": sshd.ssh_address("big")},
            {"name": "dead", "ssh": f"root@127.0.0.1:{dead_port}"},
            {"name": "cloud"},
            {"name": "late", "ssh": "root@late.invalid"},
        ],
        cores=8,
        mem_gb=16.0,
        link_mbps=100.0,
    )


@pytest.mark.real
def test_unreachable_and_unprobed_nodes_say_so(
    instance: dg.DagsterInstance, sshd_server: SshdServer, tmp_path: Path
) -> None:
    dead_port = free_port()
    fleet = load_fleet(_probed_fleet(tmp_path, sshd_server, dead_port))
    reachable = [n for n in fleet.nodes if n.name in ("big", "dead", "cloud")]
    probes = probe_fleet(
        fleet.model_copy(update={"nodes": tuple(reachable)}),
        connect_kwargs=sshd_server.connect_kwargs(),
        known_hosts=sshd_server.known_hosts,
    )
    run = add_build(instance, "pytorch@gfx942", placed("dead"))
    began = start(instance, run, est_s=None)
    # `late` has no probe result yet: the frame does not wait for one.
    lines = frame(instance, fleet, began + 60, URL, {p.node: p for p in probes})
    header, *rest = lines
    assert "nodes busy 1/4  unreachable 1  queued 0" in header
    reason = f"ssh connection to root@127.0.0.1:{dead_port} refused"
    width = len(NOT_PROBED)
    assert rest[0] == f"  big    {'reachable':<{width}}  idle"
    assert rest[1].startswith(
        f"  dead   {'UNREACHABLE':<{width}}  pytorch  gfx942  {run.run_id[:8]}"
    )
    assert rest[2] == f"  {'':<5}  {'':<{width}}  ({reason})"
    assert rest[3] == f"  cloud  {NOT_PROBED}  idle"
    assert rest[4] == f"  late   {'probing':<{width}}  idle"


@pytest.mark.real
def test_once_probes_before_its_frame(
    instance: dg.DagsterInstance, sshd_server: SshdServer, home: Path, tmp_path: Path
) -> None:
    dead_port = free_port()
    fleet_file = write_fleet(
        tmp_path / "fleet.yaml",
        [
            {"name": "big", "builder": "big-builder", "ssh": sshd_server.ssh_address("big")},
            {"name": "dead", "ssh": f"root@127.0.0.1:{dead_port}"},
            {"name": "cloud"},
        ],
        cores=8,
        mem_gb=16.0,
        link_mbps=100.0,
    )
    # paramiko takes the default key from ~/.ssh; the host keys come from ROCM_SSH_KNOWN_HOSTS.
    user = tmp_path / "user"
    (user / ".ssh").mkdir(parents=True)
    shutil.copy(sshd_server.client_key, user / ".ssh" / "id_ed25519")
    os.chmod(user / ".ssh" / "id_ed25519", 0o600)
    env = {
        **_cli_env(home, fleet_file),
        "HOME": str(user),
        "ROCM_SSH_KNOWN_HOSTS": str(sshd_server.known_hosts),
    }
    out = subprocess.run(
        _watch_argv("--once"), env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert out.returncode == 0, out.stderr
    width = len(NOT_PROBED)
    assert out.stdout.splitlines()[1:4] == [
        f"  big    {'reachable':<{width}}  idle",
        f"  dead   {'UNREACHABLE':<{width}}  idle  (ssh connection to root@127.0.0.1:{dead_port} refused)",
        f"  cloud  {NOT_PROBED}  idle",
    ]
    assert "unreachable 1" in out.stdout.splitlines()[0]


# ##### Ctrl-C at any point of the loop: real watch processes, a real sshd, a real SQLite lock


class SilentNode:
    """A TCP port that accepts SSH connections and never says a word: a probe of it waits out
    its banner timeout (5 s), so watch's probe thread is mid-probe while it is interrupted."""

    def __init__(self) -> None:
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = self._server.getsockname()[1]
        self._held: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, name="silent-node", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            with self._lock:
                self._held.append(conn)

    def connections(self) -> int:
        """Connections accepted and still open at the other end."""
        with self._lock:
            return sum(1 for c in self._held if not _closed_by_peer(c))

    def close(self) -> None:
        self._server.close()
        with self._lock:
            for conn in self._held:
                conn.close()


def _closed_by_peer(conn: socket.socket) -> bool:
    ready, _, _ = select.select([conn], [], [], 0)
    return bool(ready) and conn.recv(1, socket.MSG_PEEK) == b""


@pytest.fixture
def silent_node() -> Iterator[SilentNode]:
    node = SilentNode()
    yield node
    node.close()


class Watch:
    """One `rocm-assets watch` in a session of its own, its stdout read by the test."""

    def __init__(self, env: dict[str, str], *args: str) -> None:
        self.proc = subprocess.Popen(
            _watch_argv(*args),
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        assert self.proc.stdout is not None
        self.out = self.proc.stdout.fileno()
        self.seen = b""

    def read_for(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            ready, _, _ = select.select([self.out], [], [], left)
            if ready:
                chunk = os.read(self.out, 1 << 16)
                assert chunk, (
                    f"watch ended early: {self.proc.stderr.read() if self.proc.stderr else ''}"
                )
                self.seen += chunk

    def frames(self) -> int:
        """Frames printed whole (plain frames end in a blank line)."""
        return self.seen.count(b"\n\nrocm-assets watch") + (1 if self.seen.endswith(b"\n\n") else 0)

    def read_frames(self, count: int) -> None:
        deadline = time.monotonic() + _READ_TIMEOUT_S
        while self.frames() < count:
            assert time.monotonic() < deadline, (
                f"no {count} frames from watch: {self.seen[-300:]!r}"
            )
            self.read_for(0.05)

    def interrupt(self) -> tuple[int, float, bytes]:
        """SIGINT, then its exit status, how long after the signal it ended, and its stderr."""
        sent = time.monotonic()
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=_READ_TIMEOUT_S)
        finally:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        ended = time.monotonic() - sent
        assert self.proc.stderr is not None
        return self.proc.returncode, ended, self.proc.stderr.read()

    def left_behind(self) -> bool:
        """Whether any process of its session (a child it started) outlived it."""
        try:
            os.killpg(self.proc.pid, 0)
        except ProcessLookupError:
            return False
        return True


def _unread(fd: int) -> int:
    return struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0]


def _pipe_stalled(fd: int) -> bool:
    """The pipe holds a frame's worth and no more comes for 0.5 s (frames are due every 0.2 s):
    watch is blocked writing to it. A full pipe holds a little under its capacity."""
    before = _unread(fd)
    time.sleep(0.5)
    return _unread(fd) == before >= fcntl.fcntl(fd, fcntl.F_GETPIPE_SZ) // 2


@contextmanager
def runs_locked(home: Path) -> Iterator[None]:
    """The run storage locked as a writer holds it: every read of it waits (SQLite's busy
    timeout, 5 s) until released."""
    db = sqlite3.connect(home / "history" / "runs.db", timeout=0, isolation_level=None)
    try:
        db.execute("PRAGMA locking_mode=EXCLUSIVE")
        db.execute("BEGIN EXCLUSIVE")
        db.execute("INSERT INTO kvs (key, value) VALUES ('rocm-test/lock', '1')")
        yield
    finally:
        db.execute("ROLLBACK")
        db.close()


_PHASES = ("sleeping", "reading the instance", "drawing to a stalled pipe", "probing (--once)")
_PER_PHASE = 5


@pytest.mark.real
def test_ctrl_c_ends_watch_within_2_s_at_any_point_of_its_loop(
    instance: dg.DagsterInstance,
    sshd_server: SshdServer,
    silent_node: SilentNode,
    home: Path,
    tmp_path: Path,
) -> None:
    """20 interrupts, 5 in each phase, each made to happen: a frame read blocked by a writer's
    lock, a frame write blocked on a full pipe, the --once probe waiting on a silent node, and
    the pause between frames; the probe thread mid-probe of the silent node every time."""
    # A long queue: a frame is ~40 KB, so two fill the pipe when nobody reads it.
    for k in range(200):
        add_build(instance, f"pytorch@gfx{k}", waiting(f"waits for an input, reason {k} " * 4))
    fleet_file = write_fleet(
        tmp_path / "fleet.yaml",
        [
            {"name": "big", "builder": "big-builder", "ssh": sshd_server.ssh_address("big")},
            {"name": "silent", "ssh": f"root@127.0.0.1:{silent_node.port}"},
            {"name": "cloud"},
        ],
        cores=8,
        mem_gb=16.0,
        link_mbps=100.0,
    )
    user = tmp_path / "user"
    (user / ".ssh").mkdir(parents=True)
    shutil.copy(sshd_server.client_key, user / ".ssh" / "id_ed25519")
    os.chmod(user / ".ssh" / "id_ed25519", 0o600)
    env = {
        **_cli_env(home, fleet_file),
        "HOME": str(user),
        "ROCM_SSH_KNOWN_HOSTS": str(sshd_server.known_hosts),
    }
    rng = random.Random(42)
    results: list[tuple[str, int, float, bytes, bool]] = []
    for phase in _PHASES:
        for _ in range(_PER_PHASE):
            probing_before = silent_node.connections()
            if phase == "probing (--once)":
                watch = Watch(env, "--once")
                wait_until(
                    lambda before=probing_before: silent_node.connections() > before,
                    "the --once probe to reach the silent node",
                    timeout_s=_READ_TIMEOUT_S,
                    poll_s=0.02,
                )
                time.sleep(rng.uniform(0.0, 2.0))
                assert watch.seen == b""  # still probing: no frame yet
                results.append((phase, *watch.interrupt(), watch.left_behind()))
                continue
            interval = "3" if phase == "sleeping" else "0.2"
            watch = Watch(env, "--interval", interval)
            watch.read_frames(1)
            if phase == "sleeping":
                time.sleep(rng.uniform(0.2, 2.5))
                assert watch.frames() == 1
                verdict = watch.interrupt()
            elif phase == "reading the instance":
                with runs_locked(home):
                    # The next frame's read starts within an interval and then waits on the lock.
                    watch.read_for(0.4)
                    frames = watch.frames()
                    watch.read_for(rng.uniform(0.3, 1.5))
                    assert watch.frames() == frames, "a frame was read through the lock"
                    verdict = watch.interrupt()
            else:
                deadline = time.monotonic() + _READ_TIMEOUT_S
                while not _pipe_stalled(watch.out):
                    assert time.monotonic() < deadline, "watch never filled its stdout pipe"
                    time.sleep(0.05)
                time.sleep(rng.uniform(0.1, 1.0))
                verdict = watch.interrupt()
            # The probe thread was in its probe of the silent node when the signal came.
            assert silent_node.connections() > probing_before or phase == "sleeping", phase
            results.append((phase, *verdict, watch.left_behind()))
    bad = [r for r in results if r[1] != 0 or r[2] >= 2.0 or r[3] != b"" or r[4]]
    assert not bad, bad
    assert len(results) == len(_PHASES) * _PER_PHASE
