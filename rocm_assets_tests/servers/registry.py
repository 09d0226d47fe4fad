"""Registry servers for tests: the real Debian `docker-registry` (CNCF distribution 2.8) on loopback,
open and with htpasswd auth, plus the Zot-like fake; both are started by `rocm_assets_tests.servers.fakes`.

A registry that cannot start fails the test with the reason (its last line of output); it is
never skipped.
"""

import os
import secrets
from collections.abc import Iterator
from pathlib import Path

import bcrypt
import pytest

from rocm_assets_tests.servers import fakes as benchsupport

# Re-exported: the test modules import them from here.
from rocm_assets_tests.servers.fakes import (
    OCI_MANIFEST as OCI_MANIFEST,
    FakeZot,
    LocalRegistryError,
    RegistryServer as RegistryServer,
)


def start_docker_registry(
    root: Path, username: str | None = None, password: str | None = None
) -> RegistryServer:
    """Start docker-registry on a free loopback port; pytest.fail with the reason if it won't."""
    htpasswd = None
    if username is not None and password is not None:
        root.mkdir(parents=True, exist_ok=True)
        htpasswd = root / "htpasswd"
        # Cost 4 (Go's minimum): the registry checks the hash on every request.
        hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=4)).decode()
        htpasswd.write_text(f"{username}:{hashed}\n")
    try:
        return benchsupport.start_docker_registry(root, htpasswd, username, password)
    except LocalRegistryError as exc:
        pytest.fail(str(exc))


@pytest.fixture(scope="session")
def _loopback_no_proxy() -> Iterator[None]:
    # A proxy from the environment must not answer for the loopback test servers.
    with pytest.MonkeyPatch.context() as patch:
        for name in ("NO_PROXY", "no_proxy"):
            current = os.environ.get(name, "")
            patch.setenv(name, ",".join(filter(None, [current, "127.0.0.1", "localhost"])))
        yield


@pytest.fixture(scope="session")
def registry_server(
    tmp_path_factory: pytest.TempPathFactory, _loopback_no_proxy: None
) -> Iterator[RegistryServer]:
    """The real docker-registry, open (no auth)."""
    server = start_docker_registry(tmp_path_factory.mktemp("registry-open"))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def registry_server_auth(
    tmp_path_factory: pytest.TempPathFactory, _loopback_no_proxy: None
) -> Iterator[RegistryServer]:
    """The real docker-registry behind htpasswd (bcrypt) basic auth; see .username/.password."""
    server = start_docker_registry(
        tmp_path_factory.mktemp("registry-auth"),
        username="rocm-ci",
        password=secrets.token_urlsafe(16),
    )
    yield server
    server.stop()


@pytest.fixture
def zot_fake(_loopback_no_proxy: None) -> Iterator[FakeZot]:
    """A fresh Zot-like fake per test: switch its `auth`, `search` and `fail` modes freely."""
    with FakeZot() as fake:
        yield fake
