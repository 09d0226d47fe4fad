"""Test doubles for the registry: a Zot-like fake and Debian's docker-registry, on loopback.

- `FakeZot`: a small Zot-like registry on a real socket, for what Debian's docker-registry lacks.
  It mimics Zot (project-zot/zot `pkg/api/routes.go`, `pkg/extensions/search`): sorted tags with
  `n`/`last` paging, a relative `Link` with an unencoded `last`, 404 with an empty body for an
  unknown `last`, NAME_UNKNOWN vs MANIFEST_UNKNOWN, GraphQL `ImageList` with `PushTimestamp`, the
  lowercase unquoted `basic realm=` challenge and a Docker token realm (`/token`) for bearer auth.
  `fail` switches a failure mode on for every request (or the first `fail_times`).
- `start_docker_registry`: the real Debian `docker-registry` (CNCF distribution 2.8), started on a
  free loopback port; `RegistryServer.push_image` populates it through the HTTP API.

`rocm_assets_tests.servers.registry` wraps them as pytest fixtures; the registry tick's benchmark
uses them directly.
"""

import base64
import gzip
import hashlib
import io
import json
import re
import secrets
import subprocess
import sys
import tarfile
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Literal, Self, cast
from urllib.parse import parse_qs, urlsplit

import httpx

from rocm_assets_tests.helpers import free_port

DOCKER_REGISTRY = Path("/usr/bin/docker-registry")
START_TIMEOUT_S = 30.0


class LocalRegistryError(RuntimeError):
    """A local registry could not start; the message names the binary, port and its output."""


Auth = Literal["basic", "bearer"] | None
Failure = Literal["401", "403", "404", "429", "500", "slow", "malformed"] | None

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
_REPO_PATH = re.compile(r"^/v2/(?P<name>.+)/(?:tags/(?P<tags>list)|manifests/(?P<ref>[^/]+))$")
_IMAGE_LIST = re.compile(r'ImageList\(\s*repo:\s*"(?P<repo>[^"]*)"')
_GO_ZERO_TIME = "0001-01-01T00:00:00Z"


class FakeZot:
    """Start with `with FakeZot() as zot:`; `zot.url` is `http://127.0.0.1:<port>`."""

    def __init__(self) -> None:
        self.repos: dict[str, dict[str, tuple[str | None, float | None]]] = {}
        self.search = True
        self.auth: Auth = None
        self.username = "zot-user"
        self.password = secrets.token_urlsafe(16)
        self.fail: Failure = None
        # Fail only this many requests, then behave (None: fail every request).
        self.fail_times: int | None = None
        self.retry_after = "0"
        self.slow_seconds = 5.0
        # Called with the repository after each tags/list page is sent (to change tags mid-listing).
        self.on_tags_page: Callable[[str], None] | None = None
        # (method, request target, Authorization scheme or None) of every request, in order.
        self.log: list[tuple[str, str, str | None]] = []
        self.tokens: set[str] = set()
        self.tokens_issued = 0
        self._lock = threading.Lock()
        self._release = threading.Event()
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.daemon_threads = True
        self._server.fake = self
        # A short poll interval: shutdown() waits for it, once per test.
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        host, port = self._server.server_address[:2]
        self.host = f"{host}:{port}"
        self.url = f"http://{self.host}"

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._release.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    def put(self, repo: str, tag: str, pushed_at: float | None = None, content: str = "") -> str:
        """Tag an image in `repo`; the digest derives from repo, tag and `content`."""
        digest = "sha256:" + hashlib.sha256(f"{repo}:{tag}:{content}".encode()).hexdigest()
        self.repos.setdefault(repo, {})[tag] = (digest, pushed_at)
        return digest

    def put_dangling(self, repo: str, tag: str) -> None:
        """A tag that tags/list names but whose manifest is gone."""
        self.repos.setdefault(repo, {})[tag] = (None, None)

    def expire_tokens(self) -> None:
        self.tokens.clear()

    def requests_to(self, prefix: str) -> int:
        return sum(1 for _, path, _ in self.log if path.startswith(prefix))

    def take_failure(self) -> Failure:
        with self._lock:
            if self.fail is None:
                return None
            if self.fail_times is not None:
                if self.fail_times <= 0:
                    return None
                self.fail_times -= 1
            return self.fail

    def wait_slow(self) -> None:
        # An event, not sleep: closing the fake releases a handler stuck in "slow".
        self._release.wait(self.slow_seconds)

    def issue_token(self) -> str:
        with self._lock:
            self.tokens_issued += 1
            token = f"tok{self.tokens_issued}-{secrets.token_hex(8)}"
            self.tokens.add(token)
            return token


class _Server(ThreadingHTTPServer):
    # The handlers read the fake's state through their server.
    fake: FakeZot

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that timed out on a "slow" reply has hung up: expected, not worth a traceback.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    server_version = "zot-fake"

    @property
    def fake(self) -> FakeZot:
        return cast(_Server, self.server).fake

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        # Quiet: the fake's own request log is `fake.log`.
        return

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_HEAD(self) -> None:
        self._dispatch("HEAD")

    def do_POST(self) -> None:
        self._dispatch("POST")

    # ---------------------------------------------------------------- plumbing

    def _send(
        self,
        status: int,
        body: bytes = b"",
        headers: Mapping[str, str] | None = None,
        content_type: str = "application/json",
    ) -> None:
        self.send_response(status)
        self.send_header("Docker-Distribution-API-Version", "registry/2.0")
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _send_json(
        self, status: int, data: object, headers: Mapping[str, str] | None = None
    ) -> None:
        self._send(status, json.dumps(data).encode(), headers)

    def _error(
        self,
        status: int,
        code: str,
        message: str,
        detail: object = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        errors = [{"code": code, "message": message, "detail": detail}]
        self._send_json(status, {"errors": errors}, headers)

    def _dispatch(self, method: str) -> None:
        split = urlsplit(self.path)
        authorization = self.headers.get("Authorization")
        scheme = authorization.split(" ", 1)[0] if authorization else None
        # The raw target: a path, or an absolute URL when the client came through us as a proxy.
        self.fake.log.append((method, self.path, scheme))
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        failure = self.fake.take_failure()
        if failure == "slow":
            self.fake.wait_slow()
        elif failure == "403":
            # What a corporate proxy answers for a host it will not forward to.
            self._send(403, b"<html>Access Denied by proxy</html>", content_type="text/html")
            return
        elif failure == "404":
            self._send(404, b"not found", content_type="text/plain")
            return
        elif failure == "429":
            self._error(
                429, "TOOMANYREQUESTS", "slow down", headers={"Retry-After": self.fake.retry_after}
            )
            return
        elif failure == "500":
            self._error(500, "UNKNOWN", "internal error")
            return
        if split.path == "/token":
            self._token(parse_qs(split.query))
            return
        if failure == "401":
            self._unauthorized(split.path)
            return
        if not self._authorized(authorization, split.path):
            return
        if split.path == "/v2/":
            self._send_json(200, {})
        elif split.path == "/v2/_zot/ext/search" and method == "POST":
            self._graphql(body, malformed=failure == "malformed")
        else:
            match = _REPO_PATH.match(split.path)
            if match is None or (match["tags"] and method != "GET"):
                self._send(404, b"404 page not found", content_type="text/plain")
            elif match["tags"]:
                self._tags(match["name"], parse_qs(split.query), malformed=failure == "malformed")
            else:
                self._manifest(match["name"], match["ref"])

    def _challenge(self, path: str) -> str:
        if self.fake.auth == "bearer":
            realm = f"{self.fake.url}/token"
            match = _REPO_PATH.match(path)
            if match is None:
                return f"bearer realm={realm},service=zot-fake"
            return (
                f'Bearer realm="{realm}",service="zot-fake",scope="repository:{match["name"]}:pull"'
            )
        # Zot's quirk: lowercase scheme, unquoted realm.
        return "basic realm=zot"

    def _authorized(self, authorization: str | None, path: str) -> bool:
        fake = self.fake
        if fake.auth is None:
            return True
        if fake.auth == "basic":
            ok = authorization == _basic(fake.username, fake.password)
        else:
            ok = (authorization or "").removeprefix("Bearer ") in fake.tokens
        if not ok:
            self._unauthorized(path)
        return ok

    def _unauthorized(self, path: str) -> None:
        headers = {"WWW-Authenticate": self._challenge(path)}
        self._error(401, "UNAUTHORIZED", "authentication required", headers=headers)

    # ---------------------------------------------------------------- endpoints

    def _token(self, query: dict[str, list[str]]) -> None:
        fake = self.fake
        if self.headers.get("Authorization") != _basic(fake.username, fake.password):
            self._send_json(401, {"details": "invalid credentials"})
            return
        if query.get("service") != ["zot-fake"]:
            self._send_json(400, {"details": "unknown service"})
            return
        self._send_json(200, {"token": fake.issue_token(), "expires_in": 300})

    def _tags(self, name: str, query: dict[str, list[str]], *, malformed: bool) -> None:
        if malformed:
            self._send(200, b'{"name": "' + name.encode() + b'", "tags": [')
            return
        if name not in self.fake.repos:
            self._error(
                404, "NAME_UNKNOWN", "repository name not known to registry", {"name": name}
            )
            return
        tags = sorted(self.fake.repos[name])
        if "last" in query:
            last = query["last"][0]
            if last not in tags:
                self._send(404)
                return
            tags = tags[tags.index(last) + 1 :]
        headers = {}
        if "n" in query:
            count = int(query["n"][0])
            if count < len(tags):
                # Zot's Link: relative, `last` not URL-encoded.
                link = f"/v2/{name}/tags/list?n={count}&last={tags[count - 1]}"
                headers["Link"] = f'<{link}>; rel="next"'
            tags = tags[:count]
        self._send_json(200, {"name": name, "tags": tags}, headers)
        if self.fake.on_tags_page is not None:
            self.fake.on_tags_page(name)

    def _manifest(self, name: str, ref: str) -> None:
        images = self.fake.repos.get(name)
        if images is None:
            self._error(
                404, "NAME_UNKNOWN", "repository name not known to registry", {"name": name}
            )
            return
        digest = images.get(ref, (None, None))[0]
        if digest is None and ref.startswith("sha256:"):
            digest = ref if any(ref == known for known, _ in images.values()) else None
        if digest is None:
            self._error(404, "MANIFEST_UNKNOWN", "manifest unknown", {"reference": ref})
            return
        body = json.dumps(
            {"schemaVersion": 2, "mediaType": OCI_MANIFEST, "digest": digest}
        ).encode()
        self._send(200, body, {"Docker-Content-Digest": digest}, content_type=OCI_MANIFEST)

    def _graphql(self, body: bytes, *, malformed: bool) -> None:
        if not self.fake.search:
            self._send(404, b"404 page not found", content_type="text/plain")
            return
        if malformed:
            self._send(200, b'{"data": {"ImageList": ')
            return
        match = _IMAGE_LIST.search(json.loads(body).get("query", ""))
        if match is None:
            self._send_json(200, {"errors": [{"message": "unsupported query", "path": []}]})
            return
        repo = match["repo"]
        results = [
            {
                "RepoName": repo,
                "Tag": tag,
                "Digest": digest,
                "PushTimestamp": _rfc3339(pushed_at),
            }
            for tag, (digest, pushed_at) in sorted(self.fake.repos.get(repo, {}).items())
            if digest is not None
        ]
        page = {"TotalCount": len(results), "ItemCount": len(results)}
        self._send_json(200, {"data": {"ImageList": {"Page": page, "Results": results}}})


def _basic(username: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode()


def _rfc3339(stamp: float | None) -> str:
    if stamp is None:
        return _GO_ZERO_TIME
    # Go's RFC3339Nano, as Zot's JSON carries it.
    moment = datetime.fromtimestamp(stamp, UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%f") + "000Z"


# --- the real docker-registry ----------------------------------------------------------------------

# What a client must accept for docker-registry to serve OCI and Docker manifests alike.
MANIFEST_ACCEPT = ", ".join(
    [
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.oci.image.index.v1+json",
        "application/vnd.docker.distribution.manifest.v2+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
    ]
)


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

    def _http(self) -> httpx.Client:
        auth = (self.username, self.password) if self.username and self.password else None
        return httpx.Client(base_url=self.url, auth=auth, trust_env=False, timeout=10.0)

    def digest(self, ref: str) -> str | None:
        """The registry's digest for a pushed `host/repo:tag` (or `repo:tag`), None if absent."""
        repo, _, tag = ref.removeprefix(f"{self.host}/").rpartition(":")
        with self._http() as http:
            head = http.head(f"/v2/{repo}/manifests/{tag}", headers={"Accept": MANIFEST_ACCEPT})
        if head.status_code == 404:
            return None
        head.raise_for_status()
        return head.headers["Docker-Content-Digest"]

    def image_config(self, ref: str) -> dict:
        """The image config (labels under config.Labels) of a pushed single-platform image."""
        repo, _, tag = ref.removeprefix(f"{self.host}/").rpartition(":")
        with self._http() as http:
            manifest = http.get(f"/v2/{repo}/manifests/{tag}", headers={"Accept": MANIFEST_ACCEPT})
            manifest.raise_for_status()
            blob = http.get(f"/v2/{repo}/blobs/{manifest.json()['config']['digest']}")
            blob.raise_for_status()
        return blob.json()

    def requests_served(self) -> int:
        """Requests the server has answered so far: the lines of its access log (on by default,
        in Combined Log Format, written before a small reply leaves the server)."""
        with self.log_path.open("rb") as log:
            return sum(1 for line in log if line.startswith(b"127.0.0.1 - "))

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

    def restart(self) -> None:
        """Serve again after `stop`, on the same port with the same storage: an outage ends."""
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [str(DOCKER_REGISTRY), "serve", str(self.root / "config.yml")],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        if not _wait_ready(self):
            last = self.stderr_tail().splitlines()[-1]
            raise LocalRegistryError(
                f"{DOCKER_REGISTRY} did not start again on {self.host}: {last}"
            )


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
    root: Path,
    htpasswd: Path | None = None,
    username: str | None = None,
    password: str | None = None,
) -> RegistryServer:
    """Start docker-registry on a free loopback port, storing under `root`; LocalRegistryError
    with the last line of its output if it won't. `htpasswd` (bcrypt) turns basic auth on, and
    `username`/`password` are what `push_image` then sends."""
    if not DOCKER_REGISTRY.exists():
        raise LocalRegistryError(f"{DOCKER_REGISTRY} is missing: apt-get install docker-registry")
    root.mkdir(parents=True, exist_ok=True)
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
    last = server.stderr_tail().splitlines()[-1]
    raise LocalRegistryError(
        f"{DOCKER_REGISTRY} did not start on {server.host} "
        f"(exit {server.process.returncode}): {last}"
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
