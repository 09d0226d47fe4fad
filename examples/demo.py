#!/usr/bin/env python3
"""`make demo`: the example farm (examples/farm) on this machine, in the Dagster UI, in minutes.

As root, it starts and wires together, all on loopback and under one state directory:

- a registry: Debian's docker-registry on 127.0.0.1:<free port>;
- one BuildKit node per node of examples/farm/fleet.yaml: a dockerd on its own socket, data root
  and exec root (vfs, no iptables, no bridge), so nothing of a Docker the host runs is touched,
  and a docker context of the node's builder name, which `docker buildx` uses as the node's
  builder (buildx's docker driver); the contexts live in a docker config of the demo's own;
- `dagster dev` (webserver and daemon, with the placement coordinator) with a DAGSTER_HOME of its
  own, the example bake file and fleet, ROCM_REGISTRY_URL and REGISTRY at the registry;

then launches every build of the bake file's default group for every arch in it (two) at once
(`rocm-assets backfill`: one run per build, each placed when its inputs are pushed), says where
to look, and waits. Every build is a real `docker buildx bake` on its node's engine. The farm's
images copy in Debian's static busybox, which the demo puts beside the bake file
(examples/farm/busybox, git-ignored): the farm the UI shows is the repository's own, so an edit
to it reaches the running demo. Each build holds its node HOLD_S seconds (the bake file's
variable, 3 by default; `HOLD_S=20 make demo` to watch the placement slowly).

Ctrl-C or SIGTERM stops everything it started and removes the state directory: the user chose to
stop, and it holds three engines' copies of every layer. If a part of it dies instead (dagster
dev exits because its daemon was killed, a dockerd or the registry exits) or cannot start, the
rest is stopped and the state directory is kept, logs included, and one line says what died and
where they are.

    python examples/demo.py [--port 3000] [--no-backfill] [--state-dir DIR]

It needs `docker buildx` (the docker CLI plugin); without it, it says so in one line and exits 2.
"""

import argparse
import contextlib
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
import yaml

from rocm_assets.core.bake import BakeError, load_graph
from rocm_assets.core.build.invocation import BUILDX_INSTALL_HINT
from rocm_assets.core.nodes.fleet import Fleet, FleetError, load_fleet

ROOT = Path(__file__).resolve().parent.parent
FARM = ROOT / "examples" / "farm"
BAKE_FILE = FARM / "bake.hcl"
FLEET_FILE = FARM / "fleet.yaml"
GROUP = "default"
REGISTRY_BIN = Path("/usr/bin/docker-registry")
# Debian's busybox-static: the farm's FROM-scratch images RUN it, so it must need no loader.
BUSYBOX = Path("/bin/busybox")
_START_TIMEOUT_S = 60.0
_UI_TIMEOUT_S = 300.0
_STOP_GRACE_S = 20.0
# A unix socket path must fit in 108 bytes.
_MAX_SOCKET_PATH = 100
# Settings of the caller's that would point the demo's farm somewhere else.
_CALLER_SETTINGS = (
    "DOCKER_HOST",
    "DOCKER_CONTEXT",
    "PUBLISHED_INPUTS",
    "GPU_ARCH",
    "ROCM_REGISTRY_USERNAME",
    "ROCM_REGISTRY_PASSWORD",
    "ROCM_REGISTRY_CA",
    "ROCM_ALERT_WEBHOOK",
)


class DemoError(Exception):
    """Something the demo cannot do: one line saying what and how to fix it."""


class Died(Exception):
    """A service the demo started exited while the demo ran: one line saying which and how."""


def say(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _tail(path: Path, lines: int = 5) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "(no log)"
    return " | ".join(text[-lines:]) or "(empty log)"


@dataclass
class Service:
    """A process the demo started in its own session, so stopping it reaches its children."""

    name: str
    process: subprocess.Popen[bytes]
    log: Path

    def stop(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if self.process.poll() is not None:
                return
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=_STOP_GRACE_S)


class Demo:
    """Everything the demo started, stopped in reverse order by `close`."""

    def __init__(self, state: Path, docker: str, port: int):
        self.state = state
        self.docker = docker
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.services: list[Service] = []
        self.env = {k: v for k, v in os.environ.items() if k not in _CALLER_SETTINGS}
        self.env["DOCKER_CONFIG"] = str(state / "docker-config")
        # The registry and the UI are on loopback: a proxy from the environment must not answer.
        for name in ("NO_PROXY", "no_proxy"):
            self.env[name] = ",".join(filter(None, [self.env.get(name), "127.0.0.1", "localhost"]))

    def start(self, name: str, argv: Sequence[str], cwd: Path | None = None) -> Service:
        log = self.state / f"{name}.log"
        with log.open("wb") as out:
            process = subprocess.Popen(
                list(argv),
                cwd=cwd,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        service = Service(name, process, log)
        self.services.append(service)
        return service

    def run(self, *argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            list(argv), env=self.env, capture_output=True, text=True, check=False, timeout=120
        )

    def close(self, *, keep: bool) -> None:
        """Stop everything; remove the state directory unless `keep` (something went wrong)."""
        for service in reversed(self.services):
            service.stop()
        self._stop_strays()
        if not keep:
            _remove(self.state)

    def watch(self) -> None:
        """Return never: raise Died once a service exits (nothing the demo starts ends by itself)."""
        while True:
            for service in self.services:
                if service.process.poll() is not None:
                    raise Died(_what_died(service))
            time.sleep(1.0)

    def _stop_strays(self) -> None:
        """Stop what outlived its service's group: a run worker or bake in a session of its own.

        Every process the demo started inherits its DOCKER_CONFIG, so that marks it as ours.
        """
        mark = f"DOCKER_CONFIG={self.env['DOCKER_CONFIG']}\0".encode()
        for sig in (signal.SIGTERM, signal.SIGKILL):
            strays = _processes_with(mark)
            if not strays:
                return
            for pid in strays:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)
            deadline = time.monotonic() + _STOP_GRACE_S
            while _processes_with(mark) and time.monotonic() < deadline:
                time.sleep(0.2)


def _processes_with(mark: bytes) -> list[int]:
    """Live (not zombie) processes whose environment contains `mark`."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if mark not in (proc / "environ").read_bytes():
                continue
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            found.append(int(proc.name))
    return found


def _remove(state: Path) -> None:
    """Delete the state directory, first unmounting what a killed dockerd left mounted there."""
    if not state.exists():
        return
    prefix = str(state.resolve()) + "/"
    mounts = [
        line.split()[1].encode().decode("unicode_escape")
        for line in Path("/proc/self/mounts").read_text().splitlines()
    ]
    for mount in sorted((m for m in mounts if m.startswith(prefix)), reverse=True):
        subprocess.run(["umount", mount], capture_output=True, check=False)
    shutil.rmtree(state, ignore_errors=True)


def _what_died(service: Service) -> str:
    """Which service died and how; for dagster dev, which of its own processes ended it."""
    code = service.process.returncode
    if service.name == "dagster-dev":
        # dagster dev stops the rest when its webserver or daemon exits, and logs which.
        found = re.findall(
            r"(dagster-\w+) process shut down unexpectedly with return code (-?\d+)",
            service.log.read_text(errors="replace") if service.log.exists() else "",
        )
        if found:
            process, returned = found[-1]
            return f"{process} died (return code {returned}), so dagster dev exited ({code})"
        return f"dagster dev exited with status {code}"
    return f"{service.name} exited with status {code}"


def _wait(what: str, ready: Callable[[], bool], service: Service, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        if service.process.poll() is not None:
            raise DemoError(
                f"{what} exited with status {service.process.returncode}: {_tail(service.log)}"
            )
        if time.monotonic() > deadline:
            raise DemoError(f"{what} not ready after {timeout_s:.0f}s: {_tail(service.log)}")
        time.sleep(0.2)


# ---- the pieces ---------------------------------------------------------------------------------


def _static(path: Path) -> bool:
    """A 64-bit little-endian ELF with no program interpreter (PT_INTERP): it runs FROM scratch."""
    try:
        with path.open("rb") as binary:
            head = binary.read(65536)
        if head[:6] != b"\x7fELF\x02\x01":
            return False
        (offset,) = struct.unpack_from("<Q", head, 0x20)
        size, count = struct.unpack_from("<HH", head, 0x36)
        return all(struct.unpack_from("<I", head, offset + i * size)[0] != 3 for i in range(count))
    except (OSError, struct.error):
        return False


def check_prerequisites(docker: str, port: int) -> None:
    if os.geteuid() != 0:
        raise DemoError("run it as root: it starts dockerd (as `make test` does)")
    for binary, package in (("dockerd", "docker.io"), (str(REGISTRY_BIN), "docker-registry")):
        if not shutil.which(binary, path=f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin"):
            raise DemoError(f"{binary} not found: apt-get install {package} (or `make setup`)")
    if not _static(BUSYBOX):
        raise DemoError(
            f"no static {BUSYBOX} (the farm's FROM-scratch images run it): "
            "apt-get install busybox-static (or `make setup`)"
        )
    version = subprocess.run(
        [docker, "buildx", "version"], capture_output=True, text=True, check=False
    )
    if version.returncode != 0:
        raise DemoError(
            f"docker buildx is missing ({docker} has no `buildx`): {BUILDX_INSTALL_HINT}"
        )
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            raise DemoError(f"port {port} is in use: pass --port <a free one>") from None


def place_busybox() -> None:
    """Debian's static busybox beside the bake file, where the farm's Dockerfiles COPY it from.

    Atomically: a demo (or test) running at the same time may be building from it.
    """
    fd, tmp = tempfile.mkstemp(dir=FARM, prefix=".busybox-")
    os.close(fd)
    try:
        shutil.copy2(BUSYBOX, tmp)
        os.replace(tmp, FARM / "busybox")
    finally:
        Path(tmp).unlink(missing_ok=True)


def start_registry(demo: Demo) -> str:
    port = free_port()
    root = demo.state / "registry"
    root.mkdir()
    config = root / "config.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "version": 0.1,
                "log": {"level": "warn"},
                "storage": {"filesystem": {"rootdirectory": str(root / "data")}},
                "http": {"addr": f"127.0.0.1:{port}"},
            }
        )
    )
    service = demo.start("registry", [str(REGISTRY_BIN), "serve", str(config)])
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        try:
            return httpx.get(f"{url}/v2/", timeout=1.0, trust_env=False).status_code == 200
        except httpx.TransportError:
            return False

    _wait("docker-registry", ready, service, _START_TIMEOUT_S)
    return url


def start_nodes(demo: Demo, fleet: Fleet) -> dict[str, str]:
    """A dockerd per node, and a docker context per builder on it; builder -> DOCKER_HOST."""
    dockerd = shutil.which("dockerd", path=f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin")
    assert dockerd is not None  # check_prerequisites found it
    hosts: dict[str, str] = {}
    started: list[tuple[str, Service]] = []
    for node in fleet.nodes:
        root = demo.state / "nodes" / node.name
        root.mkdir(parents=True)
        host = f"unix://{root}/docker.sock"
        if len(host) > _MAX_SOCKET_PATH:
            raise DemoError(f"{host} is too long for a socket: pass a shorter --state-dir")
        namespace = f"rocm-demo-{node.name}-{os.getpid()}"
        argv = [
            dockerd,
            "--storage-driver", "vfs",
            "--iptables=false",
            "--bridge=none",
            "--host", host,
            "--data-root", str(root / "data"),
            "--exec-root", str(root / "exec"),
            "--pidfile", str(root / "docker.pid"),
            "--containerd-namespace", namespace,
            "--containerd-plugins-namespace", f"{namespace}-plugins",
        ]  # fmt: skip
        started.append((node.name, demo.start(f"dockerd-{node.name}", argv)))
        hosts[node.builder] = host
    for (name, service), (builder, host) in zip(started, hosts.items(), strict=True):
        _wait(
            f"dockerd for {name}",
            lambda host=host: demo.run(demo.docker, "-H", host, "info").returncode == 0,
            service,
            _START_TIMEOUT_S,
        )
        created = demo.run(demo.docker, "context", "create", builder, "--docker", f"host={host}")
        if created.returncode != 0:
            raise DemoError(f"docker context create {builder}: {created.stderr.strip()}")
    return hosts


def docker_config(demo: Demo) -> None:
    """The demo's own docker config (its contexts), still seeing the user's CLI plugins."""
    config = Path(demo.env["DOCKER_CONFIG"])
    config.mkdir()
    user = Path(os.environ.get("DOCKER_CONFIG") or Path.home() / ".docker") / "cli-plugins"
    if user.is_dir():
        (config / "cli-plugins").symlink_to(user)


def start_dagster(demo: Demo, registry_url: str) -> Service:
    home = demo.state / "dagster_home"
    home.mkdir()
    shutil.copy(ROOT / "dagster.yaml", home / "dagster.yaml")
    demo.env.update(
        DAGSTER_HOME=str(home),
        ROCM_BAKE_FILE=str(BAKE_FILE),
        ROCM_FLEET_FILE=str(FLEET_FILE),
        ROCM_REGISTRY_URL=registry_url,
        REGISTRY=registry_url.removeprefix("http://"),
        PATH=os.pathsep.join([str(Path(sys.executable).parent), demo.env["PATH"]]),
        # The demo's builds are its backfill's: the rebuild automation, which would request the
        # same missing partitions, starts stopped (its toggle is under Automation in the UI).
        ROCM_AUTOMATION="off",
    )
    argv = [sys.executable, "-m", "dagster", "dev", "-w", "workspace.yaml"]
    service = demo.start("dagster-dev", [*argv, "-h", "127.0.0.1", "-p", str(demo.port)], ROOT)

    def ready() -> bool:
        query = "{ workspaceOrError { ... on Workspace { locationEntries { loadStatus } } } }"
        try:
            reply = httpx.post(
                f"{demo.url}/graphql", json={"query": query}, timeout=5.0, trust_env=False
            )
            entries = reply.json()["data"]["workspaceOrError"]["locationEntries"]
        except (httpx.TransportError, ValueError, KeyError, TypeError):
            return False
        return bool(entries) and all(e["loadStatus"] == "LOADED" for e in entries)

    _wait("dagster dev", ready, service, _UI_TIMEOUT_S)
    return service


def launch_backfill(demo: Demo, arches: Sequence[str]) -> None:
    argv = ["rocm-assets", "backfill", "--url", demo.url, "--group", GROUP, "--arch", *arches]
    say(f"$ {' '.join(argv)}")
    out = demo.run(sys.executable, "-m", "rocm_assets.cli", *argv[1:])
    if out.returncode != 0:
        raise DemoError(out.stderr.strip() or f"rocm-assets backfill exited {out.returncode}")
    for line in out.stdout.splitlines():
        say(f"  {line}")


# ---- the whole ----------------------------------------------------------------------------------


@contextlib.contextmanager
def _stop_on_sigterm() -> Iterator[None]:
    """SIGTERM ends the demo as Ctrl-C does: through the `finally` that stops everything."""

    def stop(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run(args: argparse.Namespace) -> int:
    docker = shutil.which("docker")
    if docker is None:
        raise DemoError(
            f"no docker client on PATH: apt-get install docker.io; {BUILDX_INSTALL_HINT}"
        )
    check_prerequisites(docker, args.port)
    graph = load_graph(BAKE_FILE, {})
    fleet = load_fleet(FLEET_FILE)
    if args.state_dir:
        state = Path(args.state_dir).resolve()
        try:
            state.mkdir(parents=True)
        except FileExistsError:
            raise DemoError(
                f"--state-dir {state} exists: name a new one (Ctrl-C removes it)"
            ) from None
    else:
        state = Path(tempfile.mkdtemp(prefix="rocm-demo-"))
    demo = Demo(state, docker, args.port)
    kept = f"logs ({state}/*.log) and state kept in {state}"
    stopped_by_user = False
    with _stop_on_sigterm():
        try:
            place_busybox()
            docker_config(demo)
            registry = start_registry(demo)
            say(f"registry     {registry}")
            for builder, host in start_nodes(demo, fleet).items():
                say(f"node         {builder}: {host} (docker context and buildx builder {builder})")
            say(f"dagster dev  starting on {demo.url} (log: {state / 'dagster-dev.log'})")
            start_dagster(demo, registry)
            if not args.no_backfill:
                launch_backfill(demo, graph.arches)
            shown = f"{sys.executable} -m rocm_assets.cli"
            say(
                "\n".join(
                    [
                        f"The example farm is up: {demo.url}",
                        "  Runs:    one run per build, each placed on a node (tag rocm/node),",
                        "           never two at once on one node; the coordinator's event says why",
                        "  Assets:  each materialization's history_ref, digest, node and command",
                        "  Automation: registry_observation_sensor observes every pushed tag",
                        f"  Terminal: DAGSTER_HOME={demo.env['DAGSTER_HOME']} "
                        f"ROCM_FLEET_FILE={FLEET_FILE} {shown} watch",
                        f"  More:    {shown} backfill --url {demo.url} --bake-file {BAKE_FILE} "
                        f"--targets torch --arch {graph.arches[0]}",
                        f"If a part of it dies, the rest is stopped and {state} is kept.",
                        f"Ctrl-C stops it and removes {state}.",
                    ]
                )
            )
            demo.watch()
        except KeyboardInterrupt:
            stopped_by_user = True
            say("stopping the demo's dagster dev, dockerds and registry")
            return 0
        except Died as exc:
            raise Died(f"{exc}; the rest is stopped, {kept}") from None
        except DemoError as exc:
            raise DemoError(f"{exc}; {kept}") from None
        finally:
            # Kept unless the user stopped it: what went wrong is in the logs and dagster_home.
            demo.close(keep=not stopped_by_user)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="examples/demo.py", description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=3000, help="the Dagster UI's port (3000)")
    parser.add_argument("--no-backfill", action="store_true", help="start the farm, launch nothing")
    parser.add_argument(
        "--state-dir", help="where everything lives while it runs (default: a new /tmp dir)"
    )
    args = parser.parse_args(argv)
    try:
        return run(args)
    except Died as exc:
        sys.stderr.write(f"make demo: {exc}\n")
        return 1
    except (DemoError, BakeError, FleetError) as exc:
        sys.stderr.write(f"make demo: {exc}\n")
        return 2


if __name__ == "__main__":
    sys.exit(main())
