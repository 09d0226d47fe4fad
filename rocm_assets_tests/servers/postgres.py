"""A real PostgreSQL 15 server on loopback for the session (a pytest plugin).

What is real: Debian's PostgreSQL 15 binaries (initdb, postgres), a fresh cluster in a temporary
data dir, TCP on a free 127.0.0.1 port and a unix socket in the same temp dir. Trust auth for the
`postgres` role: the server listens on loopback only and lives for one test session.

PostgreSQL refuses to run as root, so under root (CI) initdb and the server run as the
`postgres` OS user (subprocess's `user=`, no shell), in a temp dir that user owns. A server that
cannot start fails the test with a one-line reason; it is never skipped.
"""

import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg2
import pytest

from rocm_assets_tests.servers.fakes import free_port

PG_BIN = Path("/usr/lib/postgresql/15/bin")
HOST = "127.0.0.1"
SUPERUSER = "postgres"
# The OS user the server runs as when the tests run as root.
OS_USER = "postgres"
_START_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class PostgresServer:
    """The running server: its port, socket dir and log, and URLs for its databases."""

    port: int
    socket_dir: Path
    log: Path

    def url(self, database: str = "postgres") -> str:
        """A SQLAlchemy URL, as dagster-postgres's `postgres_url` takes it."""
        # SQLAlchemy 2.1 maps a bare `postgresql://` to psycopg 3, which dagster-postgres does not
        # install; name its driver, psycopg2, explicitly.
        return f"postgresql+psycopg2://{SUPERUSER}@{HOST}:{self.port}/{database}"

    def dsn(self, database: str = "postgres") -> str:
        """A libpq connection string, as psycopg2.connect takes it."""
        return f"host={HOST} port={self.port} user={SUPERUSER} dbname={database}"

    def last_log_line(self) -> str:
        lines = self.log.read_text(errors="replace").strip().splitlines()
        return lines[-1] if lines else "(empty log)"


def _run_as() -> dict[str, object]:
    """Popen arguments that drop root to the postgres OS user; none when not root."""
    if os.geteuid() != 0:
        return {}
    try:
        pwd.getpwnam(OS_USER)
    except KeyError:
        pytest.fail(f"running as root and there is no {OS_USER!r} OS user: install postgresql")
    return {"user": OS_USER, "group": OS_USER, "extra_groups": []}


def _make_root() -> Path:
    # Not tmp_path_factory: pytest's base temp dir is 0700 root, which postgres could not enter.
    root = Path(tempfile.mkdtemp(prefix="rocm-pg-"))
    if os.geteuid() == 0:
        shutil.chown(root, OS_USER, OS_USER)
    return root


def _initdb(root: Path, run_as: dict[str, object]) -> Path:
    data = root / "data"
    done = subprocess.run(
        [
            str(PG_BIN / "initdb"),
            "--pgdata",
            str(data),
            "--username",
            SUPERUSER,
            "--auth",
            "trust",
            "--encoding",
            "UTF8",
            "--locale",
            "C",
            # A throwaway cluster: skipping fsync makes initdb several times faster.
            "--no-sync",
        ],
        capture_output=True,
        text=True,
        check=False,
        cwd=root,
        **run_as,  # type: ignore[arg-type]
    )
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines()
        pytest.fail(f"initdb failed ({done.returncode}): {lines[-1] if lines else 'no output'}")
    return data


def _wait_ready(process: subprocess.Popen[bytes], server: PostgresServer) -> None:
    deadline = time.monotonic() + _START_TIMEOUT_S
    while True:
        if process.poll() is not None:
            pytest.fail(f"postgres exited {process.returncode} at start: {server.last_log_line()}")
        try:
            psycopg2.connect(server.dsn(), connect_timeout=2).close()
            return
        except psycopg2.OperationalError as exc:
            if time.monotonic() > deadline:
                reason = str(exc).strip().splitlines()[0]
                pytest.fail(f"postgres not ready after {_START_TIMEOUT_S} s: {reason}")
            time.sleep(0.1)


def _stop(process: subprocess.Popen[bytes]) -> None:
    # SIGINT is PostgreSQL's "fast" shutdown: abort sessions, checkpoint, exit.
    process.send_signal(signal.SIGINT)
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """Start the real PostgreSQL 15 for the session; fail (never skip) with the reason."""
    for tool in ("initdb", "postgres"):
        if not (PG_BIN / tool).is_file():
            pytest.fail(f"{PG_BIN / tool} not found: install postgresql (15)")
    run_as = _run_as()
    root = _make_root()
    try:
        data = _initdb(root, run_as)
        server = PostgresServer(port=free_port(), socket_dir=root, log=root / "postgres.log")
        with server.log.open("wb") as log_file:
            process = subprocess.Popen(
                [
                    str(PG_BIN / "postgres"),
                    "-D",
                    str(data),
                    "-p",
                    str(server.port),
                    "-k",
                    str(root),
                    "-c",
                    f"listen_addresses={HOST}",
                    # Durability is pointless for a session-long test server.
                    "-c",
                    "fsync=off",
                    "-c",
                    "synchronous_commit=off",
                    "-c",
                    "full_page_writes=off",
                ],
                stdout=log_file,
                stderr=subprocess.STDOUT,
                cwd=root,
                **run_as,  # type: ignore[arg-type]
            )
        try:
            _wait_ready(process, server)
            yield server
        finally:
            _stop(process)
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres_url(postgres_server: PostgresServer) -> str:
    """URL of the session server's default `postgres` database."""
    return postgres_server.url()


@pytest.fixture
def postgres_db(postgres_server: PostgresServer) -> Iterator[str]:
    """URL of a new empty database for one test, dropped afterwards."""
    name = f"test_{uuid.uuid4().hex[:12]}"
    admin = psycopg2.connect(postgres_server.dsn())
    # CREATE/DROP DATABASE cannot run inside a transaction block.
    admin.autocommit = True
    try:
        with admin.cursor() as cursor:
            cursor.execute(f'CREATE DATABASE "{name}"')
        yield postgres_server.url(name)
        with admin.cursor() as cursor:
            # FORCE: a test's instance or worker processes may still hold connections.
            cursor.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
    finally:
        admin.close()
