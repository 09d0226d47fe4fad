"""Registry servers for tests: the real Debian `docker-registry` (CNCF distribution 2.8) on loopback,
open and with htpasswd auth, plus the Zot-like fake from `rocm_assets_tests.fakes_zot`.

A registry that cannot start fails the test with its stderr tail; it is never skipped.
"""

import gzip
import hashlib
import io
import json
import os
import secrets
import socket
import subprocess
import tarfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import bcrypt
import httpx
import pytest

from rocm_assets_tests.fakes_zot import FakeZot

DOCKER_REGISTRY = Path("/usr/bin/docker-registry")
START_TIMEOUT_S = 30.0
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"


@dataclass
class RegistryServer:
    """A running docker-registry; `push_image` populates it through the HTTP API."""

    url: str
    host: str
    root: Path
    process: subprocess.Popen[bytes]
    log_path: Path
    username: str | None = None
    password: str | None = field(default=None, repr=False)

    def new_repo(self, name: str) -> str:
        """A repository name no other test of the session uses (the server is shared)."""
        return f"{name}-{uuid.uuid4().hex[:8]}"

    def push_image(self, repo: str, tag: str, content: bytes = b"rocm-assets test layer") -> str:
        """Push a one-layer OCI image (config + gzipped tar layer + manifest); return its digest."""
        layer_tar = _tar_with(content)
        layer = gzip.compress(layer_tar, mtime=0)
        config = json.dumps(
            {
                "architecture": "amd64",
                "os": "linux",
                "config": {},
                "rootfs": {"type": "layers", "diff_ids": [_sha256(layer_tar)]},
            },
            sort_keys=True,
        ).encode()
        manifest = json.dumps(
            {
                "schemaVersion": 2,
                "mediaType": OCI_MANIFEST,
                "config": {
                    "mediaType": "application/vnd.oci.image.config.v1+json",
                    "digest": _sha256(config),
                    "size": len(config),
                },
                "layers": [
                    {
                        "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                        "digest": _sha256(layer),
                        "size": len(layer),
                    }
                ],
            },
            sort_keys=True,
        ).encode()
        auth = (self.username, self.password) if self.username and self.password else None
        with httpx.Client(base_url=self.url, auth=auth, trust_env=False, timeout=10.0) as http:
            for blob in (config, layer):
                started = http.post(f"/v2/{repo}/blobs/uploads/")
                started.raise_for_status()
                upload = httpx.URL(started.headers["Location"])
                done = http.put(
                    str(upload.copy_merge_params({"digest": _sha256(blob)})),
                    content=blob,
                    headers={"Content-Type": "application/octet-stream"},
                )
                done.raise_for_status()
            pushed = http.put(
                f"/v2/{repo}/manifests/{tag}",
                content=manifest,
                headers={"Content-Type": OCI_MANIFEST},
            )
            pushed.raise_for_status()
        digest = pushed.headers["Docker-Content-Digest"]
        assert digest == _sha256(manifest)
        return digest

    def stderr_tail(self, lines: int = 20) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:]) or "(no output)"

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)


def _sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _tar_with(content: bytes) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("content.txt")
        info.size = len(content)
        info.mtime = 0
        tar.addfile(info, io.BytesIO(content))
    return buffer.getvalue()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _write_config(root: Path, port: int, htpasswd: Path | None) -> Path:
    lines = [
        "version: 0.1",
        "log:",
        "  level: warn",
        "storage:",
        "  filesystem:",
        f"    rootdirectory: {root / 'data'}",
        "  delete:",
        "    enabled: true",
        "http:",
        f"  addr: 127.0.0.1:{port}",
    ]
    if htpasswd is not None:
        lines += ["auth:", "  htpasswd:", "    realm: rocm-test", f"    path: {htpasswd}"]
    config = root / "config.yml"
    config.write_text("\n".join(lines) + "\n")
    return config


def start_docker_registry(
    root: Path, username: str | None = None, password: str | None = None
) -> RegistryServer:
    """Start docker-registry on a free loopback port; pytest.fail with its stderr if it won't."""
    if not DOCKER_REGISTRY.exists():
        pytest.fail(f"{DOCKER_REGISTRY} is missing: apt-get install docker-registry")
    root.mkdir(parents=True, exist_ok=True)
    htpasswd = None
    if username is not None and password is not None:
        htpasswd = root / "htpasswd"
        # Cost 4 (Go's minimum): the registry checks the hash on every request.
        hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=4)).decode()
        htpasswd.write_text(f"{username}:{hashed}\n")
    server = None
    # The port is free when picked but another process may take it first: try a few.
    for _ in range(3):
        port = free_port()
        config = _write_config(root, port, htpasswd)
        log_path = root / f"registry-{port}.log"
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                [str(DOCKER_REGISTRY), "serve", str(config)],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        server = RegistryServer(
            url=f"http://127.0.0.1:{port}",
            host=f"127.0.0.1:{port}",
            root=root,
            process=process,
            log_path=log_path,
            username=username,
            password=password,
        )
        if _wait_ready(server):
            return server
        server.stop()
        if "address already in use" not in server.stderr_tail():
            break
    assert server is not None
    pytest.fail(
        f"docker-registry did not start on {server.host} "
        f"(exit {server.process.returncode}):\n{server.stderr_tail()}"
    )


def _wait_ready(server: RegistryServer) -> bool:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            return False
        try:
            response = httpx.get(f"{server.url}/v2/", trust_env=False, timeout=1.0)
        except httpx.TransportError:
            time.sleep(0.05)
            continue
        return response.status_code in (200, 401)
    return False


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
