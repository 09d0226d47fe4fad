"""pytest plugin: a real Docker engine for the session, and the `docker` shim put first on PATH.

`dockerd` is Debian's docker.io 20.10 engine with vfs storage, no iptables and no bridge, on its own
socket, data root, exec root and pidfile, so it shares nothing with a Docker the host may run. Its
built-in BuildKit pushes to the plain-HTTP test registry because dockerd treats 127.0.0.0/8 as an
insecure registry by default. An engine that cannot start fails the test with its log tail.

The shim (rocm_assets_tests/shim/docker) implements `docker buildx` on top of that engine; every
other subcommand goes to the real client. The fixtures hand back an environment for subprocesses;
a test that runs Dagster in-process sets it with monkeypatch.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

SHIM_DIR = Path(__file__).resolve().parent.parent / "shim"
E2E_DIR = Path(__file__).resolve().parent.parent / "fixtures" / "e2e"
E2E_BAKE_FILE = E2E_DIR / "bake.hcl"
PROJECT_ROOT = Path(__file__).resolve().parent.parent.parent
# The builder the shim knows unless a test sets ROCM_SHIM_BUILDERS itself.
SHIM_BUILDER = "rocm-e2e"

_START_TIMEOUT_S = 60.0
_STOP_TIMEOUT_S = 30.0
_LOG_TAIL_LINES = 30
# Docker 23+ clients hand `docker build` to the buildx plugin; older ones drive BuildKit themselves.
_FIRST_BUILDX_ONLY_MAJOR = 23


class DockerdError(Exception):
    """dockerd or a usable docker client is missing, or the engine did not come up."""


@dataclass(frozen=True)
class Dockerd:
    """A running engine: `host` is its DOCKER_HOST, `client` the real client that builds on it."""

    host: str
    client: str
    root: Path
    log_path: Path
    startup_s: float

    def env(self) -> dict[str, str]:
        """This process's environment pointed at this engine, with a client config of its own."""
        env = dict(os.environ)
        env.pop("DOCKER_CONTEXT", None)
        env["DOCKER_HOST"] = self.host
        # Keeps the host's ~/.docker (credentials, contexts) out of the tests.
        env["DOCKER_CONFIG"] = str(self.root / "client-config")
        return env


@dataclass(frozen=True)
class DockerShim:
    """The shim on PATH: `env` is a full environment for subprocesses (or monkeypatch)."""

    bin_dir: Path
    env: dict[str, str]
    state_dir: Path


@dataclass(frozen=True)
class RecordingShim:
    """The shim in recording mode: `bake` builds nothing and appends a JSON line to `record_file`."""

    bin_dir: Path
    env: dict[str, str]
    state_dir: Path
    record_file: Path

    def records(self) -> list[dict]:
        if not self.record_file.exists():
            return []
        return [json.loads(line) for line in self.record_file.read_text().splitlines()]


def _tail(path: Path) -> str:
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError as exc:
        return f"(no log: {exc.strerror})"
    return "\n".join(lines[-_LOG_TAIL_LINES:])


def _client_major(client: str) -> int | None:
    out = subprocess.run([client, "--version"], capture_output=True, text=True, check=False)
    match = re.search(r"version (\d+)\.", out.stdout)
    return int(match.group(1)) if match else None


def find_real_docker() -> str:
    """The first docker client on PATH (then /usr/bin) that can run BuildKit builds.

    /usr/local/bin may hold a newer client without the buildx plugin, whose `docker build` then
    refuses BuildKit; Debian's 20.10 client has BuildKit built in. Either talks to dockerd 20.10,
    since newer clients negotiate the API version down, so DOCKER_API_VERSION is not needed.
    """
    dirs = [d for d in os.environ.get("PATH", "").split(os.pathsep) if d]
    candidates: list[str] = []
    for directory in [*dirs, "/usr/bin"]:
        path = Path(directory) / "docker"
        if path.parent.resolve() == SHIM_DIR or not os.access(path, os.X_OK):
            continue
        if str(path.resolve()) not in {str(Path(c).resolve()) for c in candidates}:
            candidates.append(str(path))
    rejected: list[str] = []
    for client in candidates:
        major = _client_major(client)
        if major is not None and major < _FIRST_BUILDX_ONLY_MAJOR:
            return client
        buildx = subprocess.run([client, "buildx", "version"], capture_output=True, check=False)
        if buildx.returncode == 0:
            return client
        rejected.append(f"{client} (Docker {major}, no buildx plugin)")
    raise DockerdError(
        "no docker client here can run BuildKit builds: "
        + (", ".join(rejected) or "none on PATH")
        + "; install Debian's docker.io (apt-get install docker.io)"
    )


def _ready(client: str, host: str) -> bool:
    probe = subprocess.run(
        [client, "-H", host, "info", "--format", "{{.ServerVersion}}"],
        capture_output=True,
        check=False,
    )
    return probe.returncode == 0


def start_dockerd(root: Path, log_path: Path) -> tuple[subprocess.Popen, Dockerd]:
    """Start dockerd under `root` and wait until `docker info` answers, or raise DockerdError."""
    if os.geteuid() != 0:
        raise DockerdError("dockerd needs root; run the tests as root (as .ci/run does)")
    binary = shutil.which("dockerd") or shutil.which("dockerd", path="/usr/sbin:/sbin")
    if binary is None:
        raise DockerdError(
            "dockerd not found; install Debian's docker.io (apt-get install docker.io)"
        )
    client = find_real_docker()
    host = f"unix://{root}/docker.sock"
    # A unique containerd namespace keeps builds apart if dockerd attaches to a host containerd.
    namespace = f"rocm-test-{os.getpid()}"
    argv = [
        binary,
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
    started = time.monotonic()
    with log_path.open("wb") as log:
        # Its own session, so teardown can reach the containerd it spawns.
        proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
    deadline = started + _START_TIMEOUT_S
    while not _ready(client, host):
        if proc.poll() is not None:
            raise DockerdError(
                f"dockerd exited with status {proc.returncode} at start-up; log tail:\n"
                + _tail(log_path)
            )
        if time.monotonic() > deadline:
            stop_dockerd(proc)
            raise DockerdError(
                f"dockerd did not answer `docker info` within {_START_TIMEOUT_S:.0f}s; log tail:\n"
                + _tail(log_path)
            )
        time.sleep(0.1)
    engine = Dockerd(host, client, root, log_path, time.monotonic() - started)
    return proc, engine


def stop_dockerd(proc: subprocess.Popen) -> None:
    """SIGTERM (dockerd then stops its containerd), and SIGKILL the session if it hangs."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def remove_root(root: Path) -> None:
    """Delete an engine's root, first unmounting what dockerd left mounted there.

    dockerd bind-mounts its data root and unmounts it on a clean stop, but not when it dies at
    start-up or is killed, and rmtree then fails with EBUSY.
    """
    prefix = str(root.resolve())
    mounts = [
        line.split()[1].encode().decode("unicode_escape")
        for line in Path("/proc/self/mounts").read_text().splitlines()
    ]
    # Deepest first, so a mount inside another comes off before its parent.
    for mount in sorted((m for m in mounts if m.startswith(prefix + "/")), reverse=True):
        subprocess.run(["umount", mount], check=True, capture_output=True)
    shutil.rmtree(root)


@pytest.fixture(scope="session")
def dockerd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dockerd]:
    # Sockets live under root: keep it short, well inside the 108-byte socket path limit.
    root = Path(tempfile.mkdtemp(prefix="rocm-dockerd-"))
    log_path = tmp_path_factory.mktemp("dockerd") / "dockerd.log"
    try:
        proc, engine = start_dockerd(root, log_path)
    except DockerdError as exc:
        remove_root(root)
        pytest.fail(f"the test Docker engine could not start: {exc}", pytrace=False)
    try:
        yield engine
    finally:
        stop_dockerd(proc)
        remove_root(root)


def _shim_env(base: dict[str, str], state_dir: Path) -> dict[str, str]:
    env = dict(base)
    # The shim runs with this interpreter's python3 and imports the project from the checkout.
    env["PATH"] = os.pathsep.join([str(SHIM_DIR), str(Path(sys.executable).parent), env["PATH"]])
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in [str(PROJECT_ROOT), env.get("PYTHONPATH", "")] if p
    )
    env["ROCM_SHIM_STATE"] = str(state_dir)
    env["ROCM_SHIM_BUILDERS"] = SHIM_BUILDER
    return env


@pytest.fixture
def docker_shim(dockerd: Dockerd, tmp_path: Path) -> DockerShim:
    """The shim first on PATH, building for real on the session's dockerd."""
    state_dir = tmp_path / "shim-state"
    env = _shim_env(dockerd.env(), state_dir)
    env["ROCM_SHIM_REAL_DOCKER"] = dockerd.client
    return DockerShim(SHIM_DIR, env, state_dir)


@pytest.fixture
def docker_shim_record(tmp_path: Path) -> RecordingShim:
    """The shim first on PATH in recording mode: no engine, `bake` only records its command."""
    state_dir = tmp_path / "shim-state"
    record_file = tmp_path / "docker-calls.jsonl"
    env = _shim_env(dict(os.environ), state_dir)
    env["ROCM_SHIM_RECORD"] = str(record_file)
    env.pop("ROCM_SHIM_REAL_DOCKER", None)
    return RecordingShim(SHIM_DIR, env, state_dir, record_file)
