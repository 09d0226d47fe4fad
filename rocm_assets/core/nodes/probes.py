"""What the nodes say about themselves: SSH probes, a background probe cache, commands on nodes.

Probes never raise for a node's failure: an unreachable, slow or misconfigured node comes back as
a `NodeProbe` with `ok=False` and a one-line reason, so the caller excludes it for that decision
and carries on (the seed's balancer did the same with SSH). `run_on_node` (the GPU tests) uses
the same bounded, host-key-checked connection, but raises `NodeCommandError` when it cannot
reach the node: its caller decides whether another node will do.
"""

import logging
import os
import shlex
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rocm_assets.core.common.constants import SSH_KNOWN_HOSTS_ENV
from rocm_assets.core.common.text import bounded, one_line, shown
from rocm_assets.core.nodes.fleet import Fleet, Node
from rocm_assets.core.nodes.known_hosts import HostKeyRejected, KnownHostsFiles

if TYPE_CHECKING:
    import paramiko
    from fabric import Connection

logger = logging.getLogger(__name__)
# paramiko logs a node's failure (a banner that never came) from its own thread, with a
# traceback; the probe's reason says it in one line. Unless the process configures logging (the
# daemon does), Python's last-resort handler would print it over `rocm-assets watch`'s frames.
logging.getLogger("paramiko").addHandler(logging.NullHandler())

_GIB_PER_KIB = 1024**2
_SYSTEM_KNOWN_HOSTS = Path("/etc/ssh/ssh_known_hosts")
_USER_KNOWN_HOSTS = "~/.ssh/known_hosts"
# Parsed once per file version for every probe and command of this process.
_KNOWN_HOSTS = KnownHostsFiles()
_MAX_PROBES = 32


class ProbeError(ValueError):
    """Probe output that cannot be read; becomes the node's one-line exclusion reason."""


@dataclass(frozen=True, slots=True)
class NodeProbe:
    """One node's state at `probed_at` (epoch s). Figures are 0 when the node could not be read."""

    node: str
    ok: bool
    reason: str | None
    mem_available_gb: float
    cores: int
    idle_cores: float
    builder_ok: bool
    probed_at: float
    # False: the node has no ssh address and its fleet figures stand in (all cores idle).
    probed: bool = True

    @property
    def score(self) -> float:
        """Free GB plus idle cores, weighted equally on purpose: RAM is what bounds a big node."""
        return self.mem_available_gb + self.idle_cores


@dataclass(frozen=True, slots=True)
class CpuSample:
    """The aggregate `cpu` line of /proc/stat: idle (idle + iowait) and total jiffies."""

    idle: int
    total: int


def parse_meminfo_available(text: str) -> float:
    """MemAvailable from /proc/meminfo text, in GiB (the kernel reports kB, i.e. KiB)."""
    for line in text.splitlines():
        fields = line.split()
        if fields and fields[0] == "MemAvailable:":
            if len(fields) < 2 or not fields[1].isdigit():
                raise ProbeError(f"unreadable MemAvailable line {line.strip()!r}")
            return int(fields[1]) / _GIB_PER_KIB
    raise ProbeError("no MemAvailable in /proc/meminfo")


def parse_cpu_sample(line: str) -> CpuSample:
    """The aggregate `cpu` line of /proc/stat.

    Fields: user nice system idle iowait irq softirq steal [guest guest_nice]. guest and
    guest_nice are already counted in user and nice, so the total stops at steal.
    """
    fields = line.split()
    if len(fields) < 5 or fields[0] != "cpu" or not all(f.isdigit() for f in fields[1:]):
        raise ProbeError(f"unreadable /proc/stat cpu line {shown(line.strip())}")
    ticks = [int(f) for f in fields[1:9]]
    return CpuSample(idle=ticks[3] + ticks[4], total=sum(ticks))


def idle_cores(first: CpuSample, second: CpuSample, cores: int) -> float:
    """Idle cores over the interval: (Δidle / Δtotal) x cores."""
    elapsed = second.total - first.total
    idle = second.idle - first.idle
    if elapsed <= 0:
        raise ProbeError(f"/proc/stat samples do not advance (Δtotal={elapsed})")
    if not 0 <= idle <= elapsed:
        raise ProbeError(f"/proc/stat samples are inconsistent (Δtotal={elapsed}, Δidle={idle})")
    return idle / elapsed * cores


def probe_script(builder: str, sample_s: float) -> str:
    """The POSIX sh script one probe sends: cores, MemAvailable, two cpu samples, the builder.

    PROC_ROOT is unset on real nodes, so /proc is read; a test sshd sets it to canned files.
    """
    inspect = shlex.join(["docker", "buildx", "inspect", builder])
    return "\n".join(
        [
            'p="${PROC_ROOT:-/proc}"',
            'echo "nproc $(nproc)"',
            'grep "^MemAvailable:" "$p/meminfo"',
            'IFS= read -r s < "$p/stat"; echo "stat0 $s"',
            f"sleep {sample_s:g}",
            'IFS= read -r s < "$p/stat"; echo "stat1 $s"',
            f'{inspect} >/dev/null 2>&1; echo "builder $?"',
        ]
    )


def parse_probe_output(node: Node, stdout: str, *, probed_at: float) -> NodeProbe:
    """Turn the output of `probe_script` into a probe; ProbeError if a figure is missing."""
    values: dict[str, str] = {}
    meminfo: list[str] = []
    for line in stdout.splitlines():
        key, _, rest = line.partition(" ")
        if key == "MemAvailable:":
            meminfo.append(line)
        elif key in ("nproc", "stat0", "stat1", "builder"):
            values[key] = rest.strip()
    for key in ("nproc", "stat0", "stat1", "builder"):
        if key not in values:
            raise ProbeError(f"probe output has no {key!r} line")
    if not values["nproc"].isdigit() or int(values["nproc"]) <= 0:
        raise ProbeError(f"nproc printed {shown(values['nproc'])}")
    cores = int(values["nproc"])
    mem = parse_meminfo_available("\n".join(meminfo))
    idle = idle_cores(parse_cpu_sample(values["stat0"]), parse_cpu_sample(values["stat1"]), cores)
    builder_ok = values["builder"] == "0"
    reason = (
        None
        if builder_ok
        else f"builder {node.builder!r} did not answer (docker exit {values['builder']})"
    )
    return NodeProbe(
        node=node.name,
        ok=builder_ok,
        reason=reason,
        mem_available_gb=mem,
        cores=cores,
        idle_cores=idle,
        builder_ok=builder_ok,
        probed_at=probed_at,
    )


def unprobed(node: Node, *, probed_at: float) -> NodeProbe:
    """A stand-in probe from the fleet figures for a node without an ssh address."""
    return NodeProbe(
        node=node.name,
        ok=True,
        reason=None,
        mem_available_gb=node.mem_gb,
        cores=node.cores,
        idle_cores=float(node.cores),
        # Not checked: without ssh there is no way to ask; the build itself will tell.
        builder_ok=True,
        probed_at=probed_at,
        probed=False,
    )


def known_hosts_files(explicit: str | Path | None = None) -> list[Path]:
    """System, user, then `explicit` (else $ROCM_SSH_KNOWN_HOSTS) known_hosts files."""
    files = [_SYSTEM_KNOWN_HOSTS, Path(os.path.expanduser(_USER_KNOWN_HOSTS))]
    extra = explicit if explicit is not None else os.environ.get(SSH_KNOWN_HOSTS_ENV)
    if extra:
        files.append(Path(extra))
    return files


def probe_node(
    node: Node,
    *,
    timeout_s: float = 5.0,
    sample_s: float = 0.5,
    connect_kwargs: Mapping[str, Any] | None = None,
    known_hosts: str | Path | None = None,
) -> NodeProbe:
    """Probe one node over SSH in one command round-trip. Never raises for the node's failure.

    TCP connect, SSH banner, authentication and channel open are each bounded by `timeout_s`;
    the remote command by `timeout_s + sample_s`. Host keys must be in known_hosts
    (`known_hosts_files`): an unknown key is rejected, never added.

    Args:
        node: the node; one without `ssh` gets `unprobed` figures.
        timeout_s: bound for each connection phase and, plus `sample_s`, for the command.
        sample_s: interval between the two /proc/stat samples.
        connect_kwargs: extra paramiko `connect` arguments (e.g. `key_filename`).
        known_hosts: an extra known_hosts file; default $ROCM_SSH_KNOWN_HOSTS.
    """
    probed_at = time.time()
    if node.ssh is None:
        return unprobed(node, probed_at=probed_at)
    try:
        return _probe_over_ssh(
            node,
            timeout_s=timeout_s,
            sample_s=sample_s,
            connect_kwargs=connect_kwargs or {},
            known_hosts=known_hosts_files(known_hosts),
            probed_at=probed_at,
        )
    except Exception as exc:
        # Last resort so one node's surprise never reaches the coordinator or the daemon.
        logger.warning("probe of %s failed unexpectedly", node.name, exc_info=True)
        return _failed(node, f"probe failed: {type(exc).__name__}: {one_line(str(exc))}", probed_at)


def _probe_over_ssh(
    node: Node,
    *,
    timeout_s: float,
    sample_s: float,
    connect_kwargs: Mapping[str, Any],
    known_hosts: Sequence[Path],
    probed_at: float,
) -> NodeProbe:
    from invoke.exceptions import CommandTimedOut

    command = shlex.join(["sh", "-c", probe_script(node.builder, sample_s)])
    timed_out = f"probe command timed out after {timeout_s + sample_s:g} s"
    started = time.monotonic()
    try:
        with _connection(
            node, timeout_s=timeout_s, connect_kwargs=connect_kwargs, known_hosts=known_hosts
        ) as conn:
            result = conn.run(
                command, hide=True, warn=True, in_stream=False, timeout=timeout_s + sample_s
            )
    except CommandTimedOut:
        return _failed(node, timed_out, probed_at)
    except Exception as exc:
        # paramiko and invoke raise more than SSHException and OSError (EOFError, their
        # own thread errors, ValueError for a bad port): every one is this node's reason.
        return _failed(node, _ssh_failure(node, exc, timeout_s), probed_at)
    # Under load invoke can see the channel its timer closed before it sees the timer:
    # the command then "exits" -1 (no exit status) instead of raising CommandTimedOut.
    if result.exited == -1 and time.monotonic() - started >= timeout_s + sample_s:
        return _failed(node, timed_out, probed_at)
    if result.exited != 0:
        detail = bounded(result.stderr) or "no stderr"
        return _failed(node, f"probe script exited {result.exited}: {detail}", probed_at)
    try:
        return parse_probe_output(node, result.stdout, probed_at=probed_at)
    except ProbeError as exc:
        return _failed(node, f"unreadable probe output: {exc}", probed_at)


@contextmanager
def _connection(
    node: Node,
    *,
    timeout_s: float,
    connect_kwargs: Mapping[str, Any],
    known_hosts: Sequence[Path],
) -> "Iterator[Connection]":
    """A fabric connection to `node` with every phase bounded and host keys checked; closed after.

    fabric connects lazily, so connection errors surface from the first `run`: map them with
    `_ssh_failure`.
    """
    bounded_kwargs = {
        **connect_kwargs,
        "timeout": timeout_s,
        "banner_timeout": timeout_s,
        "auth_timeout": timeout_s,
        "channel_timeout": timeout_s,
    }
    from fabric import Connection  # paramiko and fabric load only when a node is reached

    conn = Connection(node.ssh, connect_kwargs=bounded_kwargs)
    # fabric truncates connect_timeout to an int and refuses it alongside connect_kwargs["timeout"];
    # the float bound above is the one that applies.
    conn.connect_timeout = None
    try:
        _KNOWN_HOSTS.trust(conn, known_hosts, node.ssh or conn.host)
        yield conn
    finally:
        try:
            conn.close()
        except Exception:
            # Closing a half-open session can fail too; the reason that matters is the first.
            logger.debug("closing the ssh connection to %s failed", node.name, exc_info=True)


def _ssh_failure(node: Node, exc: Exception, timeout_s: float) -> str:
    """The one-line reason for anything that went wrong reaching `node` or running on it."""
    import paramiko

    # Order matters: the paramiko errors subclass SSHException, the socket ones OSError.
    if isinstance(exc, HostKeyRejected):
        return str(exc)
    if isinstance(exc, paramiko.BadHostKeyException):
        return f"host key of {node.ssh} does not match known_hosts"
    if isinstance(exc, paramiko.AuthenticationException):
        return f"ssh authentication to {node.ssh} failed"
    if isinstance(exc, paramiko.SSHException):
        return _ssh_reason(node, exc, timeout_s)
    if isinstance(exc, TimeoutError):
        return f"ssh timeout after {timeout_s:g} s"
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
        # paramiko wraps every address's connect error, a timeout (a cut link) included.
        errors = list(exc.errors.values())
        if errors and all(isinstance(e, TimeoutError) for e in errors):
            return f"ssh timeout after {timeout_s:g} s"
        if not all(isinstance(e, ConnectionRefusedError) for e in errors):
            first = errors[0] if errors else exc
            return f"ssh connect to {node.ssh} failed: {bounded(first.strerror or str(first))}"
        return f"ssh connection to {node.ssh} refused"
    if isinstance(exc, OSError):
        return f"ssh connect to {node.ssh} failed: {bounded(exc.strerror or str(exc))}"
    if isinstance(exc, EOFError):
        return f"ssh connection to {node.ssh} closed by the other end"
    return f"ssh to {node.ssh} failed: {type(exc).__name__}: {bounded(str(exc))}"


def _ssh_reason(node: Node, exc: "paramiko.SSHException", timeout_s: float) -> str:
    text = bounded(str(exc))
    # paramiko bounds the handshake with the connect timeout and, when that runs out first,
    # returns quietly; authentication then fails with "No existing session".
    if any(sign in text.lower() for sign in ("banner", "timeout", "no existing session")):
        return f"ssh timeout after {timeout_s:g} s ({text[:80]})"
    return f"ssh error: {text}"


def _failed(node: Node, reason: str, probed_at: float) -> NodeProbe:
    return NodeProbe(
        node=node.name,
        ok=False,
        reason=one_line(reason),
        mem_available_gb=0.0,
        cores=0,
        idle_cores=0.0,
        builder_ok=False,
        probed_at=probed_at,
    )


def probe_fleet(
    fleet: Fleet,
    *,
    timeout_s: float = 5.0,
    sample_s: float = 0.5,
    connect_kwargs: Mapping[str, Any] | None = None,
    known_hosts: str | Path | None = None,
) -> list[NodeProbe]:
    """Probe every node in parallel threads, in fleet order; a failed node is `ok=False`.

    The threads are daemons, at most 32 at once: a process that is ending (`watch` on Ctrl-C)
    never waits for a probe of an unreachable node, as it would for concurrent.futures' workers,
    which are joined at exit.
    """
    results: list[NodeProbe | None] = [None] * len(fleet.nodes)
    slots = threading.Semaphore(_MAX_PROBES)

    def probe(index: int, node: Node) -> None:
        with slots:
            results[index] = probe_node(
                node,
                timeout_s=timeout_s,
                sample_s=sample_s,
                connect_kwargs=connect_kwargs,
                known_hosts=known_hosts,
            )

    threads = [
        threading.Thread(target=probe, args=(i, n), name=f"rocm-probe-{n.name}", daemon=True)
        for i, n in enumerate(fleet.nodes)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return [
        r if r is not None else _failed(n, "probe failed", time.time())
        for n, r in zip(fleet.nodes, results, strict=True)
    ]


def best_node(probes: Iterable[NodeProbe]) -> NodeProbe | None:
    """The usable node with the highest score, or None if every node is excluded."""
    usable = [p for p in probes if p.ok]
    return max(usable, key=lambda p: p.score, default=None)


class ProbeCache:
    """Probes the fleet in a background thread; readers take results younger than a bound."""

    def __init__(self, interval_s: float, max_age_s: float):
        self.interval_s = interval_s
        self.max_age_s = max_age_s
        self._lock = threading.Lock()
        self._probes: dict[str, NodeProbe] = {}
        self._fleet: Fleet | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def watch(self, fleet: Fleet) -> None:
        with self._lock:
            self._fleet = fleet
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="rocm-probes", daemon=True)
                self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                fleet = self._fleet
            if fleet is not None:
                try:
                    self.probe_now(fleet)
                except Exception:
                    logger.exception("fleet probe failed; keeping the last results")
            self._stop.wait(self.interval_s)

    def probe_now(self, fleet: Fleet) -> None:
        """Probe `fleet` in the caller's thread, for a decision that cannot wait for the loop."""
        results = probe_fleet(fleet)
        with self._lock:
            self._probes = {p.node: p for p in results}

    def fresh(self, now: float) -> dict[str, NodeProbe]:
        with self._lock:
            return {n: p for n, p in self._probes.items() if now - p.probed_at <= self.max_age_s}

    def stop(self) -> None:
        self._stop.set()


# --- commands on a node -----------------------------------------------------------------------


class NodeCommandError(RuntimeError):
    """A command could not be run on a node (no ssh address, ssh failure); one line naming it."""


@dataclass(frozen=True, slots=True)
class CommandResult:
    """How a command on a node ended. `exit_code` is None when it ran out of time."""

    node: str
    command: str
    exit_code: int | None
    # The last lines of stdout and stderr, interleaved as they arrived.
    tail: tuple[str, ...]
    duration_s: float

    @property
    def timed_out(self) -> bool:
        return self.exit_code is None


class OutputTail:
    """The last `lines` lines written through its streams, in the order they arrived.

    invoke reads stdout and stderr in two threads; each gets its own stream (`stream()`), so a
    line half-written on one is never joined to the other's.
    """

    def __init__(self, lines: int) -> None:
        self._lines: deque[str] = deque(maxlen=lines)
        self._lock = threading.Lock()
        self._streams: list[_TailStream] = []

    def stream(self) -> "_TailStream":
        stream = _TailStream(self)
        self._streams.append(stream)
        return stream

    def add(self, lines: Sequence[str]) -> None:
        with self._lock:
            self._lines.extend(lines)

    def lines(self) -> tuple[str, ...]:
        """The kept lines, then any unterminated last line of each stream."""
        with self._lock:
            kept = (*self._lines, *(s.partial for s in self._streams if s.partial))
            return kept[-self._lines.maxlen :] if self._lines.maxlen else ()


class _TailStream:
    """A write-only text stream feeding an `OutputTail`."""

    def __init__(self, tail: OutputTail) -> None:
        self._tail = tail
        self.partial = ""

    def write(self, text: str) -> int:
        *done, self.partial = (self.partial + text).split("\n")
        self._tail.add(done)
        return len(text)

    def flush(self) -> None:
        """Nothing is buffered but the unterminated last line, which `OutputTail.lines` shows."""


def run_on_node(
    node: Node,
    argv: Sequence[str],
    *,
    timeout_s: float,
    connect_timeout_s: float = 10.0,
    tail_lines: int = 50,
    connect_kwargs: Mapping[str, Any] | None = None,
    known_hosts: str | Path | None = None,
) -> CommandResult:
    """Run `argv` on `node` over SSH, with the same host-key checking and bounds as a probe.

    The remote command line is `shlex.join(argv)`, so no argument is re-split by the remote shell.

    Args:
        node: the node; it must have an `ssh` address.
        argv: the command and its arguments.
        timeout_s: bound on the command; when it runs out the result has `exit_code=None`. The
            remote process may outlive the channel, so the caller cleans up what it started.
        connect_timeout_s: bound on each connection phase (TCP, banner, authentication, channel).
        tail_lines: how many of the last output lines the result keeps.
        connect_kwargs: extra paramiko `connect` arguments (e.g. `key_filename`).
        known_hosts: an extra known_hosts file; default $ROCM_SSH_KNOWN_HOSTS.

    Raises:
        NodeCommandError: the node has no ssh address, or the connection failed.
    """
    from invoke.exceptions import CommandTimedOut

    command = shlex.join(argv)
    if node.ssh is None:
        raise NodeCommandError(f"node {node.name} has no ssh address in the fleet file")
    tail = OutputTail(tail_lines)
    started = time.monotonic()
    try:
        with _connection(
            node,
            timeout_s=connect_timeout_s,
            connect_kwargs=connect_kwargs or {},
            known_hosts=known_hosts_files(known_hosts),
        ) as conn:
            # One tail for both streams keeps their interleaving (as it arrived); hide=False is
            # what sends output to out_stream/err_stream (nothing reaches this process's stdout).
            result = conn.run(
                command,
                hide=False,
                warn=True,
                in_stream=False,
                out_stream=tail.stream(),
                err_stream=tail.stream(),
                timeout=timeout_s,
            )
    except CommandTimedOut:
        return CommandResult(node.name, command, None, tail.lines(), time.monotonic() - started)
    except Exception as exc:
        # The boundary: no paramiko, invoke or socket error reaches the caller raw.
        raise NodeCommandError(
            f"{node.name}: {_ssh_failure(node, exc, connect_timeout_s)}"
        ) from exc
    elapsed = time.monotonic() - started
    # The race _probe_over_ssh describes: a timed-out command may come back as exit -1.
    exited = None if result.exited == -1 and elapsed >= timeout_s else result.exited
    return CommandResult(node.name, command, exited, tail.lines(), elapsed)
