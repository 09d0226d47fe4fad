"""A real OpenSSH sshd on loopback, one port per canned fleet node (a pytest plugin).

What is real: Debian's /usr/sbin/sshd, its key exchange and host keys (Ed25519, listed in the
fixture's known_hosts, and ECDSA, listed nowhere), public-key login as the
current user (root in CI), and the probe's POSIX sh script running under it.
What is canned, per node: /proc/meminfo, the two /proc/stat samples, `nproc` and `docker`
(`buildx inspect` for the node's builders; `run` echoes its arguments and exits as canned).
sshd's `Match LocalPort` blocks give each port its own `SetEnv PROC_ROOT=... PATH=...`, so the
probe reads `$PROC_ROOT/meminfo` and `$PROC_ROOT/stat` (real nodes leave PROC_ROOT unset and
read /proc) and finds that node's fake `nproc` and `docker` first on PATH.

`$PROC_ROOT/stat` is a FIFO fed by a thread that hands out the node's two samples in turn, one
reader at a time, so two reads of "the same file" see the CPU counters advance as on real /proc.
"""

import getpass
import os
import select
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import paramiko
import pytest

SSHD = Path("/usr/sbin/sshd")
SSH_KEYGEN = "ssh-keygen"
HOST = "127.0.0.1"
# Debian's sshd refuses to start without its privilege-separation directory; the service
# creates it at boot, so a bare CI container may not have it yet.
_PRIVSEP_DIR = Path("/run/sshd")
_START_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class CannedNode:
    """The figures one fake node reports; `stat` holds the two aggregate cpu lines in order."""

    name: str
    mem_available_kib: int
    nproc: int
    stat: tuple[str, str]
    builders: tuple[str, ...]
    # The fake `docker buildx inspect` never returns, to exercise the command timeout.
    docker_hangs: bool = False
    # What the fake `docker run` exits with, after echoing its arguments and a log line.
    docker_run_exit: int = 0


def _cpu_line(user: int, system: int, idle: int, iowait: int) -> str:
    return f"cpu  {user} 0 {system} {idle} {iowait} 0 0 0 0 0"


# big: 100 GiB free; Δtotal 3200, Δidle+iowait 2400 -> 0.75 x 32 = 24 idle cores; score 124.
# small: 8 GiB free; Δtotal 1600, Δidle+iowait 400 -> 0.25 x 16 = 4 idle cores; score 12.
CANNED_NODES: tuple[CannedNode, ...] = (
    CannedNode(
        name="big",
        mem_available_kib=100 * 1024 * 1024,
        nproc=32,
        stat=(_cpu_line(1000, 500, 8000, 100), _cpu_line(1700, 600, 10300, 200)),
        builders=("big-builder",),
    ),
    CannedNode(
        name="small",
        mem_available_kib=8 * 1024 * 1024,
        nproc=16,
        stat=(_cpu_line(5000, 1000, 2000, 0), _cpu_line(6000, 1200, 2400, 0)),
        builders=("small-builder",),
        docker_run_exit=1,
    ),
    CannedNode(
        name="stuck",
        mem_available_kib=64 * 1024 * 1024,
        nproc=8,
        stat=(_cpu_line(100, 100, 100, 0), _cpu_line(200, 200, 200, 0)),
        builders=("stuck-builder",),
        docker_hangs=True,
    ),
)


@dataclass(frozen=True)
class SshdServer:
    """The running sshd: one port per canned node, the client key and a matching known_hosts."""

    ports: dict[str, int]
    client_key: Path
    known_hosts: Path
    host_public_key: str
    # A second host key sshd also offers, listed nowhere: the probe must ask for the listed type.
    host_public_key_ecdsa: str
    log: Path
    user: str

    def ssh_address(self, node: str) -> str:
        """`user@127.0.0.1:port` for a canned node, as a fleet.yaml `ssh:` value."""
        return f"{self.user}@{HOST}:{self.ports[node]}"

    def connect_kwargs(self) -> dict[str, Any]:
        """paramiko connect arguments that log in with the fixture's key and nothing else."""
        return {"key_filename": str(self.client_key), "look_for_keys": False, "allow_agent": False}

    def log_tail(self, lines: int = 20) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


class _StatFeed(threading.Thread):
    """Writes the node's cpu samples into its stat FIFO, one line per reader, in turn."""

    def __init__(self, fifo: Path, lines: tuple[str, ...]) -> None:
        super().__init__(name=f"stat-feed:{fifo.parent.parent.name}", daemon=True)
        self._fifo = fifo
        self._lines = lines
        self._stopping = threading.Event()

    def run(self) -> None:
        while not self._stopping.is_set():
            for line in self._lines:
                fd = os.open(self._fifo, os.O_WRONLY)  # blocks until a reader opens it
                try:
                    if self._stopping.is_set():
                        return
                    os.write(fd, f"{line}\n".encode())
                    self._wait_reader_gone(fd)
                except BrokenPipeError:
                    pass
                finally:
                    os.close(fd)

    def _wait_reader_gone(self, fd: int) -> None:
        # Reopening before this reader closes would hand it the next sample too; POLLERR on the
        # write end means the read end is closed.
        poller = select.poll()
        poller.register(fd, select.POLLERR)
        while not self._stopping.is_set() and not poller.poll(100):
            pass

    def stop(self) -> None:
        self._stopping.set()
        # Unblock a writer waiting in open() by briefly becoming its reader.
        fd = os.open(self._fifo, os.O_RDONLY | os.O_NONBLOCK)
        os.close(fd)
        self.join(timeout=5)


def _run(argv: list[str]) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.fail(f"{argv[0]} failed ({done.returncode}): {done.stderr.strip()}")


def _free_ports(count: int) -> list[int]:
    # Hold every socket until all are chosen so the ports are distinct.
    socks = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for sock in socks:
            sock.bind((HOST, 0))
        return [sock.getsockname()[1] for sock in socks]
    finally:
        for sock in socks:
            sock.close()


def _write_exec(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(0o755)


def _fake_docker(node: CannedNode) -> str:
    if node.docker_hangs:
        return "#!/bin/sh\nexec sleep 30\n"
    known = "|".join(node.builders)
    return (
        "#!/bin/sh\n"
        "# `docker run` echoes one argument per line, logs to stderr and exits as canned;\n"
        "# `docker buildx inspect <builder>` answers for this node's builders only.\n"
        'if [ "$1" = run ]; then\n'
        '    shift; for a in "$@"; do echo "arg: $a"; done\n'
        f'    echo "{node.name}: test log, exit {node.docker_run_exit}" >&2\n'
        f"    exit {node.docker_run_exit}\n"
        "fi\n"
        '[ "$1" = buildx ] && [ "$2" = inspect ] || exit 2\n'
        f'case "$3" in {known}) exit 0 ;; esac\n'
        "exit 1\n"
    )


def _prepare_node(root: Path, node: CannedNode) -> tuple[Path, Path, _StatFeed]:
    proc = root / node.name / "proc"
    bin_dir = root / node.name / "bin"
    proc.mkdir(parents=True)
    bin_dir.mkdir()
    (proc / "meminfo").write_text(
        f"MemTotal:       {node.mem_available_kib * 2} kB\n"
        f"MemFree:        {node.mem_available_kib // 2} kB\n"
        f"MemAvailable:   {node.mem_available_kib} kB\n"
    )
    fifo = proc / "stat"
    os.mkfifo(fifo)
    _write_exec(bin_dir / "nproc", f"#!/bin/sh\necho {node.nproc}\n")
    _write_exec(bin_dir / "docker", _fake_docker(node))
    return proc, bin_dir, _StatFeed(fifo, node.stat)


def _sshd_config(root: Path, ports: dict[str, int], envs: dict[str, dict[str, str]]) -> str:
    lines = [f"ListenAddress {HOST}:{port}" for port in ports.values()]
    lines += [
        f"HostKey {root / 'host_key'}",
        f"HostKey {root / 'host_key_ecdsa'}",
        f"PidFile {root / 'sshd.pid'}",
        f"AuthorizedKeysFile {root / 'authorized_keys'}",
        # The tmp dir is not owned and moded the way sshd insists on for real homes.
        "StrictModes no",
        # PAM's session modules (pam_loginuid) fail in containers; key login needs none of them.
        "UsePAM no",
        "PermitRootLogin prohibit-password",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "LogLevel VERBOSE",
        # The default 10:30:100 randomly resets connections while ten are unauthenticated,
        # which a loaded box reaches with the refused-host-key tests' connections.
        "MaxStartups 200",
    ]
    for name, port in ports.items():
        pairs = " ".join(f"{key}={value}" for key, value in envs[name].items())
        lines += [f"Match LocalPort {port}", f"    SetEnv {pairs}"]
    return "\n".join(lines) + "\n"


def _wait_listening(process: subprocess.Popen[bytes], ports: list[int], log: Path) -> None:
    deadline = time.monotonic() + _START_TIMEOUT_S
    pending = list(ports)
    while pending:
        if process.poll() is not None:
            pytest.fail(f"sshd exited {process.returncode} at start:\n{log.read_text()}")
        try:
            with socket.create_connection((HOST, pending[0]), timeout=0.5):
                pending.pop(0)
        except OSError:
            if time.monotonic() > deadline:
                pytest.fail(f"sshd not listening on {pending} after {_START_TIMEOUT_S} s")
            time.sleep(0.05)


def _check_login(server: SshdServer, node: str, proc_root: Path) -> None:
    # One real login per port proves the key, the known_hosts entry and SetEnv all work.
    client = paramiko.SSHClient()
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    client.load_host_keys(str(server.known_hosts))
    try:
        client.connect(
            HOST,
            port=server.ports[node],
            username=server.user,
            timeout=5,
            **server.connect_kwargs(),
        )
        _, stdout, _ = client.exec_command('printf %s "$PROC_ROOT"', timeout=5)
        seen = stdout.read().decode()
    except (paramiko.SSHException, OSError) as exc:
        pytest.fail(f"cannot log in to the test sshd ({node}): {exc}\n{server.log_tail()}")
    finally:
        client.close()
    if seen != str(proc_root):
        pytest.fail(f"sshd SetEnv not applied on {node}: PROC_ROOT={seen!r}\n{server.log_tail()}")


@pytest.fixture(scope="session")
def sshd_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshdServer]:
    """Start the real sshd for the session; fail (never skip) with the reason if it cannot."""
    if not SSHD.is_file():
        pytest.fail(f"{SSHD} not found: install openssh-server")
    if shutil.which(SSH_KEYGEN) is None:
        pytest.fail("ssh-keygen not found: install openssh-client")
    if not _PRIVSEP_DIR.is_dir():
        try:
            _PRIVSEP_DIR.mkdir(mode=0o755)
        except OSError as exc:
            pytest.fail(f"sshd needs {_PRIVSEP_DIR} and it cannot be created: {exc}")

    root = tmp_path_factory.mktemp("sshd")
    _run([SSH_KEYGEN, "-q", "-t", "ed25519", "-N", "", "-f", str(root / "host_key")])
    _run([SSH_KEYGEN, "-q", "-t", "ecdsa", "-N", "", "-f", str(root / "host_key_ecdsa")])
    _run([SSH_KEYGEN, "-q", "-t", "ed25519", "-N", "", "-f", str(root / "client_key")])
    shutil.copy(root / "client_key.pub", root / "authorized_keys")
    host_public_key = " ".join((root / "host_key.pub").read_text().split()[:2])
    host_public_key_ecdsa = " ".join((root / "host_key_ecdsa.pub").read_text().split()[:2])

    ports = dict(zip((n.name for n in CANNED_NODES), _free_ports(len(CANNED_NODES)), strict=True))
    known_hosts = root / "known_hosts"
    known_hosts.write_text("".join(f"[{HOST}]:{p} {host_public_key}\n" for p in ports.values()))

    envs: dict[str, dict[str, str]] = {}
    proc_roots: dict[str, Path] = {}
    feeds: list[_StatFeed] = []
    for node in CANNED_NODES:
        proc, bin_dir, feed = _prepare_node(root, node)
        proc_roots[node.name] = proc
        envs[node.name] = {"PROC_ROOT": str(proc), "PATH": f"{bin_dir}:/usr/bin:/bin"}
        feeds.append(feed)

    config = root / "sshd_config"
    config.write_text(_sshd_config(root, ports, envs))
    checked = subprocess.run(
        [str(SSHD), "-t", "-f", str(config)], capture_output=True, text=True, check=False
    )
    if checked.returncode != 0:
        pytest.fail(f"sshd rejects its test config: {checked.stderr.strip()}")

    log = root / "sshd.log"
    server = SshdServer(
        ports=ports,
        client_key=root / "client_key",
        known_hosts=known_hosts,
        host_public_key=host_public_key,
        host_public_key_ecdsa=host_public_key_ecdsa,
        log=log,
        user=getpass.getuser(),
    )
    with log.open("wb") as log_file:
        process = subprocess.Popen(
            [str(SSHD), "-D", "-e", "-f", str(config)], stdout=log_file, stderr=subprocess.STDOUT
        )
    try:
        _wait_listening(process, list(ports.values()), log)
        for feed in feeds:
            feed.start()
        for node in CANNED_NODES:
            # Logging in reads no stat sample, so the feeds stay in step.
            _check_login(server, node.name, proc_roots[node.name])
        yield server
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        for feed in feeds:
            if feed.is_alive():
                feed.stop()
