# A script copied into the image, not a module of a package.
# ruff: noqa: INP001
"""Entrypoint of the rocm-assets image: secrets from files, registry auth, then exec the command.

- `NAME_FILE` (a docker secret's path) fills NAME when NAME is unset or empty, for the registry
  credentials and the PostgreSQL password.
- With ROCM_REGISTRY_USERNAME and ROCM_REGISTRY_PASSWORD set, the registry's auth goes into
  $DOCKER_CONFIG/config.json (mode 0600), for the registry host in REGISTRY (bake's) and the one in
  ROCM_REGISTRY_URL. `docker buildx bake --push` sends credentials from there to the BuildKit node;
  `docker login` would need a local Docker engine, which a run worker does not have.
- ROCM_REGISTRY_USERNAME without a password (or the reverse) is said in one line, and nothing is
  written: the container still starts, and what needs the registry says why it was refused.
- A Dagster process (webserver, daemon, code server, run worker) needs the instance's PostgreSQL:
  until DAGSTER_POSTGRES_HOST accepts the farm's login, it waits, and says so in one line (again
  every ROCM_POSTGRES_WAIT_REPORT_S seconds, 60), instead of dying on its first query. A login the
  server refuses (password, role, database) is a setting, not a wait.
- The webserver and the daemon start and stop run workers through the Docker socket mounted at
  /var/run/docker.sock: one the container may not open (DOCKER_GID is not the socket's group) is a
  setting, said before the daemon fails every run it dequeues with a traceback.
- Then it becomes the command. A problem is one line on stderr and no value is printed; then exit 2,
  or with ROCM_ENTRYPOINT_ON_ERROR=hold (compose's long-running services) wait until stopped, so a
  restart policy does not turn one bad setting into a crash loop.
"""

import base64
import json
import os
import signal
import socket
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

FILE_VARS = ("ROCM_REGISTRY_USERNAME", "ROCM_REGISTRY_PASSWORD", "DAGSTER_POSTGRES_PASSWORD")
# The commands that load the Dagster instance, so need its PostgreSQL before anything else.
DAGSTER_COMMANDS = ("dagster", "dagster-daemon", "dagster-webserver")
# What PostgreSQL says when the login itself is wrong: waiting would not change it.
_LOGIN_REFUSED = ("password authentication failed", "does not exist", "no pg_hba.conf entry")
_CONNECT_TIMEOUT_S = 5
# The processes that reach the Docker engine (DockerRunLauncher launches and terminates runs).
DOCKER_COMMANDS = ("dagster-daemon", "dagster-webserver")
DOCKER_SOCKET = "/var/run/docker.sock"
_RETRY_S = 2.0


class EntrypointError(Exception):
    """A setting the container cannot start with; the message names it."""


def secrets_from_files(env: dict[str, str]) -> None:
    for name in FILE_VARS:
        path = env.get(f"{name}_FILE")
        if path and not env.get(name):
            try:
                env[name] = Path(path).read_text(encoding="utf-8").rstrip("\r\n")
            except OSError as exc:
                raise EntrypointError(
                    f"{name}_FILE={path}: cannot read it: {exc.strerror or exc}"
                ) from None


def registry_hosts(env: dict[str, str]) -> list[str]:
    """host[:port] of bake's REGISTRY and of ROCM_REGISTRY_URL, without duplicates."""
    hosts: list[str] = []
    bake_registry = env.get("REGISTRY", "").split("/", 1)[0]
    url = env.get("ROCM_REGISTRY_URL", "")
    url_host = urlsplit(url if "://" in url else f"https://{url}").netloc if url else ""
    for host in (bake_registry, url_host):
        if host and host not in hosts:
            hosts.append(host)
    return hosts


def say(line: str) -> None:
    sys.stderr.write(f"rocm-assets entrypoint: {line}\n")
    sys.stderr.flush()


def write_registry_auth(env: dict[str, str]) -> None:
    username, password = env.get("ROCM_REGISTRY_USERNAME"), env.get("ROCM_REGISTRY_PASSWORD")
    if bool(username) != bool(password):
        have, lack = (
            ("ROCM_REGISTRY_USERNAME", "ROCM_REGISTRY_PASSWORD")
            if username
            else ("ROCM_REGISTRY_PASSWORD", "ROCM_REGISTRY_USERNAME")
        )
        hosts = ", ".join(registry_hosts(env)) or "the registry"
        say(
            f"{have} is set but {lack} is empty: no registry auth written, so {hosts} will "
            f"refuse pushes and reads that need one; set {lack} (or {lack}_FILE)"
        )
        return
    if not username or not password:
        return
    hosts = registry_hosts(env)
    if not hosts:
        raise EntrypointError(
            "ROCM_REGISTRY_USERNAME/PASSWORD are set but neither REGISTRY nor ROCM_REGISTRY_URL "
            "names the registry they are for"
        )
    config_dir = Path(env.get("DOCKER_CONFIG") or Path.home() / ".docker")
    config_file = config_dir / "config.json"
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        config = {}
    except (OSError, ValueError) as exc:
        raise EntrypointError(f"{config_file}: cannot read it as JSON: {exc}") from None
    token = base64.b64encode(f"{username}:{password}".encode()).decode("ascii")
    auths = config.setdefault("auths", {})
    for host in hosts:
        auths[host] = {"auth": token}
    try:
        config_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        staged = config_file.with_name(f".config.json.{os.getpid()}")
        fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump(config, out, indent=2)
        staged.replace(config_file)
    except OSError as exc:
        raise EntrypointError(
            f"{config_file}: cannot write the registry auth: {exc.strerror or exc}"
        ) from None


def _postgres_login_error(env: dict[str, str]) -> str | None:
    """None once the farm's login to its PostgreSQL succeeds, else why not (one line)."""
    import psycopg2

    try:
        connection = psycopg2.connect(
            host=env["DAGSTER_POSTGRES_HOST"],
            port=int(env.get("DAGSTER_POSTGRES_PORT") or 5432),
            user=env.get("DAGSTER_POSTGRES_USER", ""),
            password=env.get("DAGSTER_POSTGRES_PASSWORD", ""),
            dbname=env.get("DAGSTER_POSTGRES_DB", ""),
            connect_timeout=_CONNECT_TIMEOUT_S,
        )
    except psycopg2.Error as exc:
        return " ".join(str(exc).split()) or type(exc).__name__
    connection.close()
    return None


def wait_for_postgres(env: dict[str, str], argv: list[str]) -> None:
    """Block until the instance's PostgreSQL takes the farm's login, saying so while it does not."""
    if not env.get("DAGSTER_POSTGRES_HOST") or os.path.basename(argv[0]) not in DAGSTER_COMMANDS:
        return
    where = f"{env['DAGSTER_POSTGRES_HOST']}:{env.get('DAGSTER_POSTGRES_PORT') or 5432}"
    report_s = float(env.get("ROCM_POSTGRES_WAIT_REPORT_S") or 60)
    started = time.monotonic()
    said_at: float | None = None
    while (error := _postgres_login_error(env)) is not None:
        if any(marker in error for marker in _LOGIN_REFUSED):
            raise EntrypointError(f"PostgreSQL at {where} refused the farm's login: {error}")
        now = time.monotonic()
        if said_at is None:
            say(f"waiting for PostgreSQL at {where}: {error}")
            said_at = now
        elif now - said_at >= report_s:
            say(f"still waiting for PostgreSQL at {where} after {now - started:.0f} s: {error}")
            said_at = now
        time.sleep(_RETRY_S)
    if said_at is not None:
        say(f"PostgreSQL at {where} is up after {time.monotonic() - started:.0f} s")


def check_docker_socket(env: dict[str, str], argv: list[str]) -> None:
    """The mounted Docker socket, if this command uses it, must open for this user."""
    host = env.get("DOCKER_HOST") or f"unix://{DOCKER_SOCKET}"
    if os.path.basename(argv[0]) not in DOCKER_COMMANDS or not host.startswith("unix://"):
        return
    path = host.removeprefix("unix://")
    if not os.path.exists(path):
        return
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(_CONNECT_TIMEOUT_S)
        try:
            sock.connect(path)
        except PermissionError:
            raise EntrypointError(
                f"{path}: permission denied for uid {os.getuid()} with groups "
                f"{sorted(os.getgroups())}: set DOCKER_GID to the socket's group on the host "
                "(stat -c %g /var/run/docker.sock)"
            ) from None
        except OSError:
            # Down or restarting: the launcher says so itself when it next needs it.
            return


def hold() -> None:
    """Wait, doing nothing, until the container is stopped (SIGTERM, forwarded by tini)."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(2))
    while True:
        signal.pause()


def main(argv: list[str]) -> None:
    if not argv:
        raise EntrypointError("no command to run")
    env = dict(os.environ)
    secrets_from_files(env)
    write_registry_auth(env)
    check_docker_socket(env, argv)
    wait_for_postgres(env, argv)
    try:
        os.execvpe(argv[0], argv, env)
    except OSError as exc:
        raise EntrypointError(f"cannot run {argv[0]!r}: {exc.strerror or exc}") from None


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except EntrypointError as exc:
        if os.environ.get("ROCM_ENTRYPOINT_ON_ERROR") == "hold":
            say(f"{exc} (holding until stopped: fix it, then `docker compose up -d`)")
            hold()
        say(str(exc))
        sys.exit(2)
