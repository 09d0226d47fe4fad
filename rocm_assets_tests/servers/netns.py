"""pytest plugin: a build node that is a separate host, reached over SSH as a farm reaches one.

Real, all of it. The node is a network namespace of its own, joined to the host by a veth pair
(a /30 under 10.77.0.0/16: its first address on the host's end, its second on the node's). It
runs:
- its own OpenSSH sshd on the node's address (its own Ed25519 host key; one authorized client
  key whose `environment=` points the node's docker CLI at the node's dockerd and at a docker
  config of the node's own, allowed by `PermitUserEnvironment`). That config knows the builder
  by the farm's name, as README asks of a node, so the probe's `docker buildx inspect` answers;
- its own dockerd (vfs, no iptables, no bridge, private data and exec roots and socket), with
  `--insecure-registry` for a registry on the host's side of the link (`registry_host`).
Both start with `nsenter --net=...`, not `ip netns exec`, which remounts /sys and kills dockerd.

The node is a buildx builder (docker driver) through a docker context `host=ssh://root@NODE` in
a DOCKER_CONFIG of the test's own. The docker CLI runs plain `ssh` from PATH for such a context
and offers no way to pass it options (docker/cli connhelper calls GetConnectionHelper with no ssh
flags), so `env` puts a one-line `ssh` first on PATH that runs the real ssh with `-F` and the
node's ssh_config: the generated client key only, the node's known_hosts only, and
StrictHostKeyChecking yes. /root/.ssh and /etc/ssh/ssh_config are never read or written.

Addresses: each node takes the first free /30 from a start derived from the pid, chosen and
claimed under a lock file, so xdist workers (and two sessions) never share one. Teardown stops
everything the node started, whatever the test did: dockerd, sshd, any process left in the
namespace, dockerd's mounts, the veth pair and the namespace. A node that cannot start fails
the test with a one-line reason and the log tail; it is never skipped.
"""

import ipaddress
import os
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from rocm_assets.core.common.buildx import PLUGIN_NAME, find_buildx
from rocm_assets.core.nodes.fleet import Node
from rocm_assets_tests.helpers import locked
from rocm_assets_tests.servers.dockerd import DockerdError, remove_root, start_dockerd, stop_dockerd
from rocm_assets_tests.servers.fakes import DOCKER_REGISTRY

NETWORK = ipaddress.IPv4Network("10.77.0.0/16")
# One /30 per node: network, host side, node, broadcast.
_SLOT_PREFIX = 30
_SLOTS = 2 ** (_SLOT_PREFIX - NETWORK.prefixlen)
# Held while a node picks and claims its addresses, so two workers cannot pick the same /30.
_LOCK_FILE = Path("/run/rocm-assets-test-netns.lock")
_NETNS_DIR = Path("/var/run/netns")
SSHD = Path("/usr/sbin/sshd")
SSH_PORT = 22
# Nodes are logged in to as root, as the farm's are (the tests run as root).
NODE_USER = "root"
# On the host's veth address, which no other node shares: a fixed port cannot clash.
REGISTRY_PORT = 5000
_PRIVSEP_DIR = Path("/run/sshd")
_START_TIMEOUT_S = 30.0
_STOP_TIMEOUT_S = 10.0
_CMD_TIMEOUT_S = 30.0
_LOG_TAIL_LINES = 20


class NodeStartError(Exception):
    """The node could not be set up; the message is one line, `tail` the log that explains it."""

    def __init__(self, message: str, tail: str = "") -> None:
        super().__init__(message)
        self.tail = tail


def _tail(path: Path, lines: int = _LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        return f"(no log {path}: {exc.strerror})"
    return "\n".join(text.splitlines()[-lines:]) or f"(log {path} is empty)"


def _run(argv: Sequence[str], *, env: Mapping[str, str] | None = None) -> str:
    """Run a set-up command; NodeStartError with its stderr if it fails."""
    try:
        done = subprocess.run(
            list(argv),
            env=None if env is None else dict(env),
            capture_output=True,
            text=True,
            timeout=_CMD_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NodeStartError(f"{shlex.join(argv[:4])} could not run: {exc}") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no stderr"])[-1]
        raise NodeStartError(f"{shlex.join(argv)} failed ({done.returncode}): {last}")
    return done.stdout


def _quiet(argv: Sequence[str]) -> None:
    # Teardown: something already gone is not an error.
    subprocess.run(list(argv), capture_output=True, timeout=_CMD_TIMEOUT_S, check=False)


@dataclass(frozen=True)
class Slot:
    """A node's /30 and the names that go with it."""

    index: int

    @property
    def network(self) -> ipaddress.IPv4Network:
        size = 2 ** (32 - _SLOT_PREFIX)
        return ipaddress.IPv4Network(
            (int(NETWORK.network_address) + self.index * size, _SLOT_PREFIX)
        )

    @property
    def host_addr(self) -> str:
        return str(self.network.network_address + 1)

    @property
    def node_addr(self) -> str:
        return str(self.network.network_address + 2)

    @property
    def host_if(self) -> str:
        return f"rn{self.index}h"  # IFNAMSIZ: 15 characters at most

    @property
    def node_if(self) -> str:
        return f"rn{self.index}n"


def _used_networks() -> tuple[list[ipaddress.IPv4Network], set[str]]:
    """Every IPv4 network on the host's interfaces, and every interface name."""
    networks = []
    for line in _run(["ip", "-o", "-4", "addr", "show"]).splitlines():
        fields = line.split()
        if "inet" in fields:
            networks.append(ipaddress.IPv4Interface(fields[fields.index("inet") + 1]).network)
    names = set()
    for line in _run(["ip", "-o", "link", "show"]).splitlines():
        # "7: rn12h@if6: <...>": the name, without the peer suffix.
        names.add(line.split(":", 2)[1].strip().split("@")[0])
    return networks, names


def _free_slot(start: int) -> Slot:
    """The first /30 from `start` that no interface of the host overlaps (the host side of every
    other node's veth is on the host, so its /30 is seen here)."""
    networks, names = _used_networks()
    for step in range(_SLOTS):
        slot = Slot((start + step) % _SLOTS)
        if slot.host_if in names or slot.node_if in names:
            continue
        if not any(slot.network.overlaps(n) for n in networks):
            return slot
    raise NodeStartError(f"no free /{_SLOT_PREFIX} left in {NETWORK}")


@dataclass
class RemoteNode:
    """A running node. `builder` is its docker context (ssh) in `config_dir`; `env` reaches it.

    `env` is this process's environment with DOCKER_CONFIG set to the test's own, DOCKER_HOST
    and DOCKER_CONTEXT unset (the code under test picks the context, as a farm's would), and the
    ssh wrapper first on PATH.
    """

    name: str
    slot: Slot
    netns: str
    root: Path
    builder: str
    config_dir: Path
    client_key: Path
    known_hosts: Path
    ssh_config: Path
    sshd_log: Path
    dockerd_log: Path
    # The node's dockerd as the node sees it; the host reaches the same socket directly.
    docker_host: str
    engine_root: Path
    env: dict[str, str] = field(repr=False)
    startup_s: float = 0.0

    @property
    def node_addr(self) -> str:
        return self.slot.node_addr

    @property
    def host_addr(self) -> str:
        return self.slot.host_addr

    @property
    def registry_host(self) -> str:
        """`ADDR:PORT` of the registry the node's dockerd trusts over plain HTTP (host side)."""
        return f"{self.host_addr}:{REGISTRY_PORT}"

    @property
    def ssh_address(self) -> str:
        """`root@NODE`, as a fleet.yaml `ssh:` value."""
        return f"{NODE_USER}@{self.node_addr}"

    @property
    def netns_path(self) -> Path:
        return _NETNS_DIR / self.netns

    def fleet_node(self, *, cores: int = 1, mem_gb: float = 1.0, link_mbps: float = 1000.0) -> Node:
        """This node as a fleet entry (nominal figures; a probe reports the real ones)."""
        return Node(
            name=self.name,
            builder=self.builder,
            ssh=self.ssh_address,
            cores=cores,
            mem_gb=mem_gb,
            link_mbps=link_mbps,
        )

    def connect_kwargs(self) -> dict[str, Any]:
        """paramiko connect arguments that log in with the node's key and nothing else."""
        return {"key_filename": str(self.client_key), "look_for_keys": False, "allow_agent": False}

    def dockerd_pid(self) -> int:
        return int((self.engine_root / "docker.pid").read_text().strip())

    def runs_in_node(self, pid: int) -> bool:
        """Whether process `pid` lives in the node's network namespace (is "on the node")."""
        return os.stat(f"/proc/{pid}/ns/net").st_ino == self.netns_path.stat().st_ino

    def node_docker(self, *args: str, timeout_s: float = _CMD_TIMEOUT_S) -> str:
        """`docker ARGS` on the node's engine through its socket, not SSH: what the node holds."""
        env = dict(self.env)
        env["DOCKER_HOST"] = self.docker_host
        env.pop("DOCKER_CONTEXT", None)
        done = subprocess.run(
            ["docker", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
        if done.returncode != 0:
            raise AssertionError(f"docker {shlex.join(args)} on {self.name}: {done.stderr.strip()}")
        return done.stdout

    def set_link(self, up: bool) -> None:
        """Bring the node's end of the link down or up: a cable pulled, from the node's side.

        The address stays configured, so packets to the node are silently dropped while it is
        down (nothing answers, nothing resets), as on a real cut.
        """
        _run(
            [
                "ip",
                "-n",
                self.netns,
                "link",
                "set",
                "dev",
                self.slot.node_if,
                "up" if up else "down",
            ]
        )

    def link_down(self) -> None:
        self.set_link(False)

    def link_up(self) -> None:
        self.set_link(True)

    def link_is_up(self) -> bool:
        out = _run(["ip", "-n", self.netns, "-o", "link", "show", "dev", self.slot.node_if])
        flags = out.split("<", 1)[1].split(">", 1)[0].split(",") if "<" in out else []
        return "UP" in flags

    @contextmanager
    def link_cut(self) -> Iterator[None]:
        """The link down for the body of the `with`, and up again however it ends."""
        self.link_down()
        try:
            yield
        finally:
            self.link_up()

    def log_tail(self) -> str:
        return f"sshd:\n{_tail(self.sshd_log)}\ndockerd:\n{_tail(self.dockerd_log)}"


def _keygen(path: Path) -> str:
    _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", path.name, "-f", str(path)])
    return " ".join(path.with_suffix(".pub").read_text().split()[:2])


def _sshd_config(root: Path, slot: Slot) -> str:
    lines = [
        f"ListenAddress {slot.node_addr}:{SSH_PORT}",
        f"HostKey {root / 'host_key'}",
        f"PidFile {root / 'sshd.pid'}",
        f"AuthorizedKeysFile {root / 'authorized_keys'}",
        # The key's environment= options: which engine and which client config the node's
        # docker CLI uses (`docker system dial-stdio`, the probe's `docker buildx inspect`).
        "PermitUserEnvironment DOCKER_HOST,DOCKER_CONFIG",
        # The tmp dir is not owned and moded the way sshd insists on for real homes.
        "StrictModes no",
        # PAM's session modules (pam_loginuid) fail in containers; key login needs none of them.
        "UsePAM no",
        "PermitRootLogin prohibit-password",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "LogLevel VERBOSE",
        # buildx opens an ssh session per API connection, several at once.
        "MaxStartups 100:30:200",
    ]
    return "\n".join(lines) + "\n"


def _ssh_client_config(key: Path, known_hosts: Path) -> str:
    # The only config the wrapped ssh reads (-F skips ~/.ssh/config and /etc/ssh/ssh_config).
    lines = [
        "Host *",
        f"    IdentityFile {key}",
        "    IdentitiesOnly yes",
        "    IdentityAgent none",
        f"    UserKnownHostsFile {known_hosts}",
        "    GlobalKnownHostsFile /dev/null",
        "    StrictHostKeyChecking yes",
        "    UpdateHostKeys no",
        "    BatchMode yes",
        "    LogLevel ERROR",
    ]
    return "\n".join(lines) + "\n"


def _ssh_wrapper(ssh: str, config: Path) -> str:
    return (
        "#!/bin/sh\n"
        "# The docker CLI runs `ssh` from PATH and cannot pass it options for a context.\n"
        f'exec {shlex.quote(ssh)} -F {shlex.quote(str(config))} "$@"\n'
    )


def _wait_tcp(addr: str, port: int, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + _START_TIMEOUT_S
    while True:
        if proc.poll() is not None:
            raise NodeStartError(f"sshd exited {proc.returncode} at start-up", _tail(log))
        try:
            with socket.create_connection((addr, port), timeout=0.5):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise NodeStartError(
                    f"sshd not reachable on {addr}:{port} after {_START_TIMEOUT_S:.0f} s",
                    _tail(log),
                ) from None
            time.sleep(0.05)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _kill_netns_pids(netns: str) -> None:
    """SIGKILL what is still running in the namespace: only this node's processes live there
    (sshd sessions and their `docker system dial-stdio`, containerd)."""
    done = subprocess.run(
        ["ip", "netns", "pids", netns],
        capture_output=True,
        text=True,
        timeout=_CMD_TIMEOUT_S,
        check=False,
    )
    for pid in (int(p) for p in done.stdout.split() if p.isdigit()):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _client_env(config_dir: Path, wrapper_dir: Path, node_addr: str) -> dict[str, str]:
    env = dict(os.environ)
    for name in ("DOCKER_HOST", "DOCKER_CONTEXT", "DOCKER_TLS_VERIFY", "DOCKER_CERT_PATH"):
        env.pop(name, None)
    env["DOCKER_CONFIG"] = str(config_dir)
    env["PATH"] = f"{wrapper_dir}{os.pathsep}{env.get('PATH', os.defpath)}"
    # A proxy from the environment must not answer for the node.
    for name in ("NO_PROXY", "no_proxy"):
        env[name] = ",".join(filter(None, [env.get(name, ""), str(NETWORK), node_addr]))
    return env


def start_node(name: str, builder: str, stack: ExitStack, logs: Path) -> RemoteNode:
    """Set up one node, registering every undo step on `stack` as it goes (so a node that fails
    half-way is still cleaned up); NodeStartError if any part will not start."""
    started = time.monotonic()
    for tool in ("ip", "nsenter", "ssh", "ssh-keygen", "docker"):
        if shutil.which(tool) is None:
            raise NodeStartError(f"{tool} is not on PATH: .ci/setup installs it")
    if not SSHD.is_file():
        raise NodeStartError(f"{SSHD} is missing: .ci/setup installs openssh-server")
    if not DOCKER_REGISTRY.is_file():
        raise NodeStartError(f"{DOCKER_REGISTRY} is missing: .ci/setup installs docker-registry")
    if os.geteuid() != 0:
        raise NodeStartError("a node of its own needs root (network namespaces, dockerd)")
    try:
        # Debian's sshd refuses to start without it; a bare CI container may not have it yet.
        _PRIVSEP_DIR.mkdir(mode=0o755, exist_ok=True)
    except OSError as exc:
        raise NodeStartError(f"sshd needs {_PRIVSEP_DIR}: {exc.strerror}") from None

    # Sockets live under root: a short path keeps them inside the 108-byte limit.
    root = Path(tempfile.mkdtemp(prefix=f"rocm-{name}-"))
    stack.callback(shutil.rmtree, root, ignore_errors=True)

    with locked(_LOCK_FILE):
        slot = _free_slot(os.getpid() % _SLOTS)
        netns = f"rocm-{os.getpid()}-{slot.index}"
        _run(["ip", "netns", "add", netns])
        stack.callback(_quiet, ["ip", "netns", "delete", netns])
        _run(
            ["ip", "link", "add", slot.host_if, "type", "veth",
             "peer", "name", slot.node_if, "netns", netns]
        )  # fmt: skip
        # Deleting one end deletes the pair.
        stack.callback(_quiet, ["ip", "link", "delete", slot.host_if])
        _run(["ip", "addr", "add", f"{slot.host_addr}/{_SLOT_PREFIX}", "dev", slot.host_if])
    _run(["ip", "link", "set", "dev", slot.host_if, "up"])
    _run(
        ["ip", "-n", netns, "addr", "add", f"{slot.node_addr}/{_SLOT_PREFIX}", "dev", slot.node_if]
    )
    _run(["ip", "-n", netns, "link", "set", "dev", slot.node_if, "up"])
    _run(["ip", "-n", netns, "link", "set", "dev", "lo", "up"])
    enter = ("nsenter", f"--net={_NETNS_DIR / netns}")
    # A proxy from the environment must not carry the node's pushes to the host's address.
    no_proxy = ",".join(filter(None, [os.environ.get("NO_PROXY", ""), str(NETWORK)]))
    no_proxy_lower = ",".join(filter(None, [os.environ.get("no_proxy", ""), str(NETWORK)]))

    # The node's dockerd.
    engine_root = root / "engine"
    engine_root.mkdir()
    dockerd_log = logs / f"{name}-dockerd.log"
    try:
        proc, engine = start_dockerd(
            engine_root,
            dockerd_log,
            prefix=(*enter, "env", f"NO_PROXY={no_proxy}", f"no_proxy={no_proxy_lower}"),
            extra=("--insecure-registry", f"{slot.host_addr}:{REGISTRY_PORT}"),
        )
    except DockerdError as exc:
        remove_root(engine_root)
        raise NodeStartError(
            f"the node's dockerd did not start: {str(exc).splitlines()[0]}", _tail(dockerd_log)
        ) from None
    # Undone in reverse: dockerd stops, then whatever is left in the namespace (sshd sessions,
    # their dial-stdio, a containerd dockerd left behind) is killed, then its mounts come off.
    stack.callback(remove_root, engine_root)
    stack.callback(_kill_netns_pids, netns)
    stack.callback(stop_dockerd, proc)

    # The node's own docker client config: the node's root shares the host's /root/.docker here.
    node_config = root / "node-docker"
    node_config.mkdir()
    node_env = dict(os.environ, DOCKER_CONFIG=str(node_config))
    node_env.pop("DOCKER_HOST", None)
    node_env.pop("DOCKER_CONTEXT", None)
    # The node knows its builder by the farm's name, so a probe's `docker buildx inspect`
    # of it answers on the node.
    _run(["docker", "context", "create", builder, "--docker", f"host={engine.host}"], env=node_env)

    # The node's sshd.
    ssh_dir = root / "ssh"
    ssh_dir.mkdir(mode=0o700)
    host_key = _keygen(ssh_dir / "host_key")
    client_key_pub = _keygen(ssh_dir / "client_key")
    (ssh_dir / "authorized_keys").write_text(
        f'environment="DOCKER_HOST={engine.host}",'
        f'environment="DOCKER_CONFIG={node_config}" {client_key_pub}\n'
    )
    sshd_config = ssh_dir / "sshd_config"
    sshd_config.write_text(_sshd_config(ssh_dir, slot))
    checked = subprocess.run(
        [str(SSHD), "-t", "-f", str(sshd_config)],
        capture_output=True,
        text=True,
        timeout=_CMD_TIMEOUT_S,
        check=False,
    )
    if checked.returncode != 0:
        raise NodeStartError(f"sshd rejects the node's config: {checked.stderr.strip()}")
    sshd_log = logs / f"{name}-sshd.log"
    with sshd_log.open("wb") as log:
        sshd = subprocess.Popen(
            [*enter, str(SSHD), "-D", "-e", "-f", str(sshd_config)],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    stack.callback(_stop, sshd)
    _wait_tcp(slot.node_addr, SSH_PORT, sshd, sshd_log)

    # The client side: known_hosts, ssh config, the ssh wrapper, the docker context.
    known_hosts = ssh_dir / "known_hosts"
    known_hosts.write_text(f"{slot.node_addr} {host_key}\n")
    ssh_config = ssh_dir / "ssh_config"
    ssh_config.write_text(_ssh_client_config(ssh_dir / "client_key", known_hosts))
    real_ssh = shutil.which("ssh")
    assert real_ssh is not None  # checked above
    wrapper_dir = root / "bin"
    wrapper_dir.mkdir()
    wrapper = wrapper_dir / "ssh"
    wrapper.write_text(_ssh_wrapper(str(Path(real_ssh).resolve()), ssh_config))
    wrapper.chmod(0o755)

    config_dir = root / "client-docker"
    config_dir.mkdir()
    env = _client_env(config_dir, wrapper_dir, slot.node_addr)
    found = find_buildx(env)
    if found is None:
        raise NodeStartError("no docker buildx plugin is installed: .ci/setup installs it")
    (config_dir / "cli-plugins").mkdir()
    (config_dir / "cli-plugins" / PLUGIN_NAME).symlink_to(found.path)
    _run(
        [
            "docker",
            "context",
            "create",
            builder,
            "--docker",
            f"host=ssh://{NODE_USER}@{slot.node_addr}",
        ],
        env=env,
    )

    node = RemoteNode(
        name=name,
        slot=slot,
        netns=netns,
        root=root,
        builder=builder,
        config_dir=config_dir,
        client_key=ssh_dir / "client_key",
        known_hosts=known_hosts,
        ssh_config=ssh_config,
        sshd_log=sshd_log,
        dockerd_log=dockerd_log,
        docker_host=engine.host,
        engine_root=engine_root,
        env=env,
    )
    _check_reaches_node(node)
    node.startup_s = time.monotonic() - started
    return node


def _check_reaches_node(node: RemoteNode) -> None:
    """The context reaches the node's engine over SSH: same engine ID as through its socket."""
    argv = ["docker", "--context", node.builder, "info", "--format", "{{.ID}}"]
    done = subprocess.run(
        argv, env=node.env, capture_output=True, text=True, timeout=_CMD_TIMEOUT_S, check=False
    )
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no stderr"])[-1]
        raise NodeStartError(
            f"docker context {node.builder} ({node.ssh_address}) does not answer over ssh: {last}",
            _tail(node.sshd_log),
        )
    direct = node.node_docker("info", "--format", "{{.ID}}").strip()
    if done.stdout.strip() != direct:
        raise NodeStartError(
            f"context {node.builder} reached engine {done.stdout.strip()!r}, not the node's "
            f"{direct!r}"
        )


class NodePool:
    """The session's nodes, started when first asked for: node i is always the same one."""

    def __init__(self, logs: Path) -> None:
        self._logs = logs
        self._stack = ExitStack()
        self._nodes: list[RemoteNode] = []

    def get(self, index: int) -> RemoteNode:
        while len(self._nodes) <= index:
            name = f"node{len(self._nodes) + 1}"
            # A node's own stack: one that fails half-way is undone at once, not at session end.
            with ExitStack() as stack:
                try:
                    node = start_node(name, f"rocm-{name}", stack, self._logs)
                except NodeStartError as exc:
                    reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                    pytest.fail(
                        f"remote build node {name} could not start: {reason}\n{exc.tail}",
                        pytrace=False,
                    )
                self._stack.push(stack.pop_all())
            self._nodes.append(node)
        return self._nodes[index]

    def close(self) -> None:
        self._stack.close()


@pytest.fixture(scope="session")
def remote_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodePool]:
    """Nodes that are separate hosts, started on first use and torn down at session end."""
    pool = NodePool(tmp_path_factory.mktemp("netns"))
    try:
        yield pool
    finally:
        pool.close()


@pytest.fixture
def remote_node(remote_nodes: NodePool) -> Iterator[RemoteNode]:
    """The session's first node; its link is up again after each test (a fault test may cut it)."""
    node = remote_nodes.get(0)
    if not node.link_is_up():
        node.link_up()
    yield node
    if not node.link_is_up():
        node.link_up()


# --- a registry on the host's side of a node's link ---------------------------------------------


@dataclass
class HostRegistry:
    """docker-registry listening on a node's host-side address, where the node pushes."""

    host: str
    root: Path
    process: subprocess.Popen[bytes]
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://{self.host}"

    def log_tail(self) -> str:
        return _tail(self.log_path)

    def stop(self) -> None:
        _stop(self.process)


def start_registry_on(host: str, root: Path) -> HostRegistry:
    """Start docker-registry on `host` (ADDR:PORT), storing under `root`; NodeStartError if not."""
    root.mkdir(parents=True, exist_ok=True)
    config = root / "config.yml"
    config.write_text(
        "\n".join(
            [
                "version: 0.1",
                "log:",
                "  level: info",
                "storage:",
                "  filesystem:",
                f"    rootdirectory: {root / 'data'}",
                "http:",
                f"  addr: {host}",
            ]
        )
        + "\n"
    )
    log_path = root / "registry.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [str(DOCKER_REGISTRY), "serve", str(config)],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    registry = HostRegistry(host, root, process, log_path)
    deadline = time.monotonic() + _START_TIMEOUT_S
    while True:
        if process.poll() is not None:
            raise NodeStartError(
                f"docker-registry on {host} exited {process.returncode}", _tail(log_path)
            )
        try:
            if httpx.get(f"{registry.url}/v2/", trust_env=False, timeout=1.0).status_code == 200:
                return registry
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            registry.stop()
            raise NodeStartError(f"docker-registry on {host} did not answer /v2/", _tail(log_path))
        time.sleep(0.05)


@pytest.fixture(scope="session")
def remote_registry(
    remote_nodes: NodePool, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[HostRegistry]:
    """docker-registry on the first node's host-side address (its `registry_host`)."""
    node = remote_nodes.get(0)
    try:
        registry = start_registry_on(node.registry_host, tmp_path_factory.mktemp("node-registry"))
    except NodeStartError as exc:
        pytest.fail(f"the node's registry could not start: {exc}\n{exc.tail}", pytrace=False)
    try:
        yield registry
    finally:
        registry.stop()
