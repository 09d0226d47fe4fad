"""pytest plugin: real Docker engines, and real buildx builders on them.

Real, all of it: Debian 13's dockerd 26 (vfs storage, no iptables, no bridge, on its own socket,
data root, exec root and pidfile, sharing nothing with a Docker the host may run), the docker CLI,
and Debian's buildx plugin (0.29 from Debian testing; `old_buildx` is Debian 13's 0.13, unpacked
beside it by .ci/setup). A builder is what a farm node is to buildx: a docker context named for
the builder, pointing at an engine (the docker driver), in a DOCKER_CONFIG of the test's own. The
engine's BuildKit pushes to the plain-HTTP test registry because dockerd treats 127.0.0.0/8 as an
insecure registry by default, and keeps up to 1,000 history records, so a test can judge from
the builders themselves that no two builds shared a node.

An engine that cannot start, a missing client or buildx fails the test with the reason (never a
skip): `.ci/setup` installs them.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import pytest

from rocm_assets.core.build.invocation import HistoryRecord, builder_env, history
from rocm_assets.core.common.buildx import PLUGIN_NAME, find_buildx

E2E_DIR = Path(__file__).resolve().parent.parent / "fixtures" / "e2e"
E2E_BAKE_FILE = E2E_DIR / "bake.hcl"
PROJECT_ROOT = Path(__file__).resolve().parent.parent.parent
# The builder (a docker context of the session's engine) the single-node tests build on.
E2E_BUILDER = "rocm-e2e"
# Debian 13's buildx, kept beside the plugin for the compatibility tests (.ci/setup puts it here).
OLD_BUILDX = Path(
    os.environ.get("ROCM_TEST_OLD_BUILDX", "/opt/rocm-assets/buildx-0.13/docker-buildx")
)
# A busybox that runs in a FROM-scratch image: RUN steps that take time, offline.
BUSYBOX = Path("/bin/busybox")

_START_TIMEOUT_S = 60.0
_STOP_TIMEOUT_S = 30.0
_LOG_TAIL_LINES = 30
_DAEMON_CONFIG = {"builder": {"history": {"maxEntries": 1000, "maxAge": "168h"}}}


class DockerdError(Exception):
    """dockerd, the docker client or buildx is missing, or the engine did not come up."""


@dataclass(frozen=True)
class Dockerd:
    """A running engine: `host` is its DOCKER_HOST."""

    host: str
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


def _tail(path: Path) -> str:
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError as exc:
        return f"(no log: {exc.strerror})"
    return "\n".join(lines[-_LOG_TAIL_LINES:])


def _ready(host: str) -> bool:
    probe = subprocess.run(
        ["docker", "-H", host, "info", "--format", "{{.ServerVersion}}"],
        capture_output=True,
        check=False,
    )
    return probe.returncode == 0


def dockerd_argv(root: Path, host: str, *extra: str) -> list[str]:
    """The engine's command line: its own everything under `root`."""
    binary = shutil.which("dockerd") or shutil.which("dockerd", path="/usr/sbin:/sbin")
    if binary is None:
        raise DockerdError("dockerd not found; .ci/setup installs Debian 13's docker.io")
    if shutil.which("docker") is None:
        raise DockerdError("the docker CLI is not on PATH; .ci/setup installs docker-cli")
    # A persistent root (the deploy test's) may be new on a fresh machine.
    root.mkdir(parents=True, exist_ok=True)
    config = root / "daemon.json"
    config.write_text(json.dumps(_DAEMON_CONFIG))
    # A unique containerd namespace keeps builds apart if dockerd attaches to a host containerd.
    namespace = f"rocm-test-{os.getpid()}-{root.name}"
    return [
        binary,
        "--config-file", str(config),
        "--storage-driver", "vfs",
        "--iptables=false",
        "--bridge=none",
        "--host", host,
        "--data-root", str(root / "data"),
        "--exec-root", str(root / "exec"),
        "--pidfile", str(root / "docker.pid"),
        "--containerd-namespace", namespace,
        "--containerd-plugins-namespace", f"{namespace}-plugins",
        *extra,
    ]  # fmt: skip


def start_dockerd(
    root: Path, log_path: Path, *, prefix: tuple[str, ...] = (), extra: tuple[str, ...] = ()
) -> tuple[subprocess.Popen, Dockerd]:
    """Start dockerd under `root` and wait until `docker info` answers, or raise DockerdError.

    `prefix` runs it inside something (e.g. `nsenter --net=...` for a node of its own).
    """
    if os.geteuid() != 0:
        raise DockerdError("dockerd needs root; run the tests as root (as .ci/run does)")
    host = f"unix://{root}/docker.sock"
    argv = [*prefix, *dockerd_argv(root, host, *extra)]
    started = time.monotonic()
    with log_path.open("wb") as log:
        # Its own session, so teardown can reach the containerd it spawns.
        proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
    deadline = started + _START_TIMEOUT_S
    while not _ready(host):
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
    return proc, Dockerd(host, root, log_path, time.monotonic() - started)


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


class EnginePool:
    """The session's engines, started when first asked for: engine i is always the same one."""

    def __init__(self, logs: Path):
        self._logs = logs
        self._started: list[tuple[subprocess.Popen, Dockerd]] = []

    def get(self, index: int) -> Dockerd:
        while len(self._started) <= index:
            # Sockets live under root: keep it short, inside the 108-byte socket path limit.
            root = Path(tempfile.mkdtemp(prefix="rocm-dockerd-"))
            try:
                self._started.append(
                    start_dockerd(root, self._logs / f"dockerd-{len(self._started)}.log")
                )
            except DockerdError as exc:
                remove_root(root)
                pytest.fail(f"a test Docker engine could not start: {exc}", pytrace=False)
        return self._started[index][1]

    def stop(self) -> None:
        for proc, engine in self._started:
            stop_dockerd(proc)
            remove_root(engine.root)


def _overlap(a: HistoryRecord, b: HistoryRecord) -> bool:
    now = datetime.now().astimezone()
    a0, a1 = _time(a.created_at), _time(a.completed_at) if a.completed_at else now
    b0, b1 = _time(b.created_at), _time(b.completed_at) if b.completed_at else now
    return a0 < b1 and b0 < a1


def record_span(record: HistoryRecord) -> tuple[datetime, datetime]:
    """When a record's build started and ended (now, while it still runs)."""
    ended = _time(record.completed_at) if record.completed_at else datetime.now().astimezone()
    return _time(record.created_at), ended


def _time(text: str) -> datetime:
    # BuildKit writes RFC 3339 with nanoseconds; Python reads microseconds.
    head, dot, rest = text.replace("Z", "+00:00").partition(".")
    if dot:
        # The fraction's digits only: the zone after them has digits too.
        digits = rest[: len(rest) - len(rest.lstrip("0123456789"))]
        zone = rest[len(digits) :]
        head = f"{head}.{digits[:6]}{zone}"
    return datetime.fromisoformat(head)


@dataclass
class Builders:
    """Builder names, each a docker context (docker driver) of an engine, in a config dir of the
    test's own. `env` reaches them: DOCKER_CONFIG set, DOCKER_HOST and DOCKER_CONTEXT not, so the
    code under test picks the context as a real farm's would."""

    config_dir: Path
    engines: dict[str, Dockerd]
    env: dict[str, str] = field(default_factory=dict)

    def history(self, builder: str, prefix: str = "") -> list[HistoryRecord]:
        """The builder's BuildKit history (real `docker buildx history ls`), names under prefix."""
        return [r for r in history(builder, self.env) if r.name.startswith(prefix)]

    def status(self, builder: str, name: str) -> str | None:
        """The final state BuildKit gives the newest record of that name (`history inspect`:
        completed, failed, canceled), or None while there is none."""
        records = self.history(builder, name)
        if not records:
            return None
        return str(self.inspect(builder, records[0].ref).get("Status") or "").lower() or None

    def inspect(self, builder: str, ref: str) -> dict:
        """One record as BuildKit keeps it (real `docker buildx history inspect --format json`):
        Name, Status, Dockerfile, BuildArgs and NamedContexts (lists of {Name, Value}), ...
        `ref` is a full builder/node/ref or its last part."""
        out = subprocess.run(
            ["docker", "buildx", "history", "inspect", "--builder", builder, ref.rsplit("/", 1)[-1],
             "--format", "json"],
            env=builder_env(builder, self.env),
            capture_output=True,
            text=True,
            check=True,
        )  # fmt: skip
        return json.loads(out.stdout)

    def overlaps(self, prefix: str, names: Collection[str]) -> list[tuple[str, str, str]]:
        """(engine, record, record) for every two records under `prefix` and among `names` that
        ran at once on one engine; builders sharing an engine are one machine.

        `names` is the caller's own builds: the session's engines keep every earlier test's
        records, and some tests run two builders on one engine on purpose."""
        found = []
        seen: set[str] = set()
        for builder, engine in self.engines.items():
            if engine.host in seen:
                continue
            seen.add(engine.host)
            records = [r for r in self.history(builder, prefix) if r.name in names]
            for i, a in enumerate(records):
                found.extend((builder, a.name, b.name) for b in records[i + 1 :] if _overlap(a, b))
        return found


def make_builders(
    config_dir: Path, engines: Mapping[str, Dockerd], *, buildx: Path | None = None
) -> Builders:
    """A docker context per builder name; `buildx` replaces the CLI plugin for these builders."""
    config_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    for name in ("DOCKER_HOST", "DOCKER_CONTEXT"):
        env.pop(name, None)
    env["DOCKER_CONFIG"] = str(config_dir)
    plugin = buildx
    if plugin is None:
        found = find_buildx(env)
        if found is None:
            pytest.fail("no docker buildx plugin is installed: .ci/setup installs docker-buildx")
        plugin = found.path
    plugins = config_dir / "cli-plugins"
    plugins.mkdir(exist_ok=True)
    (plugins / PLUGIN_NAME).unlink(missing_ok=True)
    (plugins / PLUGIN_NAME).symlink_to(plugin)
    for name, engine in engines.items():
        subprocess.run(
            ["docker", "context", "create", name, "--docker", f"host={engine.host}"],
            env=env,
            check=True,
            capture_output=True,
        )
    return Builders(config_dir, dict(engines), env)


@pytest.fixture(scope="session")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EnginePool]:
    pool = EnginePool(tmp_path_factory.mktemp("dockerd"))
    try:
        yield pool
    finally:
        pool.stop()


@pytest.fixture(scope="session")
def dockerd(engines: EnginePool) -> Dockerd:
    """The session's first engine."""
    return engines.get(0)


def place_busybox(context_dir: Path) -> None:
    """Debian's static busybox as `busybox` in a build context (atomically: workers race)."""
    if not BUSYBOX.is_file():
        pytest.fail(f"{BUSYBOX} is missing: .ci/setup installs busybox-static", pytrace=False)
    target = context_dir / "busybox"
    if target.exists():
        return
    fd, tmp = tempfile.mkstemp(dir=context_dir, prefix=".busybox-")
    os.close(fd)
    shutil.copy2(BUSYBOX, tmp)
    os.replace(tmp, target)


def copy_e2e(dest: Path, *, arches: Sequence[str] | None = None, extra: str = "") -> Path:
    """The e2e farm copied into `dest` (busybox included), its GPU_ARCHES replaced by `arches` and
    `extra` (more targets, variables) appended; returns the copy's bake file."""
    dest.mkdir(parents=True, exist_ok=True)
    for source in E2E_DIR.iterdir():
        if source.is_file() and source.name != "busybox" and not source.name.startswith("."):
            shutil.copy2(source, dest / source.name)
    place_busybox(dest)
    bake_file = dest / E2E_BAKE_FILE.name
    text = bake_file.read_text()
    if arches is not None:
        listed = ", ".join(json.dumps(a) for a in arches)
        text, count = re.subn(
            r'(variable "GPU_ARCHES" \{\s*default = )\[[^\]]*\]', rf"\g<1>[{listed}]", text
        )
        assert count == 1, f"no GPU_ARCHES variable in {E2E_BAKE_FILE}"
    bake_file.write_text(text + extra)
    return bake_file


def bake_push(
    builder: str, bake_file: Path, env: Mapping[str, str], *targets: str, timeout_s: float = 600.0
) -> None:
    """`targets` baked with their inputs linked in one invocation and pushed, outside Dagster (as
    `make build-all` plus a push would): the inputs a later build finds in the registry."""
    done = subprocess.run(
        ["docker", "buildx", "bake", "-f", str(bake_file), "--builder", builder, "--push",
         "--progress=plain", "--", *targets],
        env=builder_env(builder, env), cwd=bake_file.parent, capture_output=True, text=True,
        timeout=timeout_s, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:]


# A build by hand that holds its builder `seconds`: offline, from scratch, with busybox.
_HAND_DOCKERFILE = """FROM scratch
COPY busybox /bin/busybox
RUN --network=none ["/bin/busybox", "sleep", "{seconds}"]
"""


def hand_build(
    builders: Builders, builder: str, seconds: int, context: Path, name: str | None = None
) -> subprocess.Popen[bytes]:
    """`docker buildx build` started by hand on `builder`, as a sibling project or a person
    would, named by BUILDKIT_BUILD_NAME when `name` is given (else buildx derives its name from
    the Dockerfile's path). `context` gets busybox and the Dockerfile."""
    context.mkdir(parents=True, exist_ok=True)
    place_busybox(context)
    dockerfile = context / f"Dockerfile.hold{seconds}"
    dockerfile.write_text(_HAND_DOCKERFILE.format(seconds=seconds))
    named = ["--build-arg", f"BUILDKIT_BUILD_NAME={name}"] if name else []
    return subprocess.Popen(
        ["docker", "buildx", "build", "--builder", builder, "--no-cache", "--progress=plain",
         *named, "-f", str(dockerfile), str(context)],
        env=builder_env(builder, builders.env), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip


@pytest.fixture(scope="session")
def e2e_context() -> Path:
    """The e2e farm's directory, ready to build: its roots copy busybox from it."""
    place_busybox(E2E_DIR)
    return E2E_DIR


@pytest.fixture
def builders(dockerd: Dockerd, e2e_context: Path, tmp_path: Path) -> Builders:
    """One builder, E2E_BUILDER, on the session's engine, with the installed buildx."""
    return make_builders(tmp_path / "docker-config", {E2E_BUILDER: dockerd})


@pytest.fixture(scope="session")
def old_buildx() -> Path:
    """Debian 13's buildx 0.13, for the compatibility tests."""
    if not os.access(OLD_BUILDX, os.X_OK):
        pytest.fail(
            f"buildx 0.13 is not at {OLD_BUILDX}: .ci/setup unpacks Debian 13's docker-buildx there",
            pytrace=False,
        )
    return OLD_BUILDX
