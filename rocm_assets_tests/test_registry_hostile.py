"""The registry client against a registry that misbehaves: one regression test per failure class.

Real: sockets, HTTP/1.1 framing (httpcore/h11), TLS with a CA of the test's own, the client's
whole stack; the server is `HostileRegistry` (rocm_assets_tests/servers/hostile_registry.py),
which scripts every byte it sends. The bounds asserted on elapsed time are hang guards (the call
must end near its deadline, not run on), not performance figures.
"""

import json
import logging
import time
from collections.abc import Callable
from typing import Any

import pytest

from rocm_assets.core.registry.client import RegistryClient, RegistryError
from rocm_assets.instance.coordinator import _SUBMIT_REGISTRY_OPTIONS
from rocm_assets_tests.servers.hostile_registry import HostileRegistry, Scripted, Seen

PASSWORD = "pw-Hunter2/secret+value"
USER = "ci"
REPO = "rocm/pytorch"
DIGEST = "sha256:" + "ab" * 32
# How far past its deadline a call may end on a shared, loaded CI machine: a hang guard.
MARGIN_S = 2.0
V2_OK = Scripted(status=200, body=b"{}")


def client(url: str, **options: Any) -> RegistryClient:
    settings: dict[str, Any] = {
        "username": USER,
        "password": PASSWORD,
        "connect_timeout": 1.0,
        "read_timeout": 1.0,
        "deadline": 1.5,
        "retries": 1,
        "backoff": 0.01,
        "max_backoff": 0.2,
        **options,
    }
    return RegistryClient(url, **settings)


def failure(call: Callable[[], object]) -> tuple[RegistryError, float]:
    started = time.monotonic()
    with pytest.raises(RegistryError) as caught:
        call()
    return caught.value, time.monotonic() - started


def by_path(routes: dict[str, Scripted], default: Scripted = V2_OK) -> Callable[[Seen], Scripted]:
    return lambda seen: routes.get(seen.path.split("?")[0], default)


# --- time: one deadline per operation ------------------------------------------------------------


def test_a_server_dripping_its_headers_is_cut_off_at_the_deadline(
    hostile_registry: HostileRegistry,
) -> None:
    # One byte every 0.3 s: no read ever waits past read_timeout, so only a deadline stops it.
    hostile_registry.script([Scripted(status=200, body=b"{}", drip_s=0.3)])
    with client(hostile_registry.url) as registry:
        error, elapsed = failure(registry.check)
    assert str(error) == (
        f"registry {hostile_registry.url}: GET /v2/ did not finish within the 1.5 s deadline of "
        "this operation (connect to last byte, retries and pages included): the registry "
        "answers too slowly"
    )
    assert elapsed < 1.5 + MARGIN_S


def test_a_dripping_body_is_cut_off_too(hostile_registry: HostileRegistry) -> None:
    body = json.dumps({"tags": [f"t{i}" for i in range(100)]}).encode()
    hostile_registry.script([Scripted(status=200, body=body, drip_s=0.2, drip_after=120)])
    with client(hostile_registry.url) as registry:
        error, elapsed = failure(lambda: registry.tags(REPO))
    assert "did not finish within the 1.5 s deadline" in str(error)
    assert elapsed < 1.5 + MARGIN_S


def test_retries_stop_at_the_deadline(hostile_registry: HostileRegistry) -> None:
    # A 503 asking for a pause the deadline cannot hold is reported, not slept through.
    hostile_registry.script([Scripted(status=503, reason="Busy", headers=(("Retry-After", "1"),))])
    with client(hostile_registry.url, deadline=0.5, max_backoff=5.0, retries=5) as registry:
        error, elapsed = failure(registry.check)
    assert str(error) == (
        f"registry {hostile_registry.url}: 503 Busy for GET /v2/: server error after 1 attempt"
    )
    assert elapsed < 0.5 + MARGIN_S


def test_the_submission_options_get_a_deadline_of_their_own() -> None:
    # The webserver's submission preflight has a deadline of its own, well under connect + read.
    with RegistryClient("http://127.0.0.1:5000", **_SUBMIT_REGISTRY_OPTIONS) as registry:
        assert registry.deadline == 3.0 < 2.0 + 5.0
    with RegistryClient("http://127.0.0.1:5000") as registry:
        assert registry.deadline == 5.0 + 30.0


# --- pages, bodies, redirects: capped, loops named ------------------------------------------------


def test_a_link_header_that_always_advances_ends_at_the_page_cap(
    hostile_registry: HostileRegistry,
) -> None:
    page = Scripted(
        status=200,
        body=b'{"tags": ["t{n}"]}',
        headers=(("Link", f'</v2/{REPO}/tags/list?n=1&last=t{{n}}>; rel="next"'),),
    )
    hostile_registry.script([page])
    with client(hostile_registry.url, max_pages=5, deadline=30) as registry:
        error, _ = failure(lambda: registry.tags(REPO))
        assert registry.requests == 5
    assert str(error) == (
        f"registry {hostile_registry.url}: stopped listing the tags of {REPO} after 5 pages, "
        "the page cap: the server's Link header kept advancing"
    )


def test_a_link_to_another_server_is_not_followed(hostile_registry: HostileRegistry) -> None:
    hostile_registry.script(
        [
            Scripted(
                status=200,
                body=b'{"tags": ["a"]}',
                headers=(("Link", '<http://127.0.0.2:9/v2/x/tags/list?last=a>; rel="next"'),),
            )
        ]
    )
    with client(hostile_registry.url) as registry:
        error, _ = failure(lambda: registry.tags(REPO))
    assert str(error) == (
        f"registry {hostile_registry.url}: GET /v2/{REPO}/tags/list: the Link header points to "
        "another server (127.0.0.2); not followed"
    )


def test_a_redirect_loop_is_named_as_one(hostile_registry: HostileRegistry) -> None:
    hostile_registry.respond = by_path(
        {
            "/v2/": Scripted(status=302, reason="Found", headers=(("Location", "/a"),)),
            "/a": Scripted(status=307, reason="Moved", headers=(("Location", "/b"),)),
            "/b": Scripted(status=301, reason="Moved", headers=(("Location", "/a"),)),
        }
    )
    with client(hostile_registry.url) as registry:
        error, _ = failure(registry.check)
        assert registry.requests == 3
    url = hostile_registry.url
    assert str(error) == (
        f"registry {url}: redirect loop for GET /v2/: {url}/v2/ -> {url}/a -> {url}/b -> {url}/a"
    )


def test_a_redirect_chain_past_the_cap_is_refused(hostile_registry: HostileRegistry) -> None:
    hostile_registry.script([Scripted(status=302, headers=(("Location", "/hop{n}"),))])
    with client(hostile_registry.url, max_redirects=3) as registry:
        error, _ = failure(registry.check)
        assert registry.requests == 4
    assert str(error) == (
        f"registry {hostile_registry.url}: more than 3 redirects for GET /v2/ "
        f"(the last to {hostile_registry.url}/hop4)"
    )


def test_a_redirect_is_followed_without_credentials_to_another_origin(
    hostile_registry: HostileRegistry,
) -> None:
    with HostileRegistry() as other:
        other.script([V2_OK])
        hostile_registry.respond = by_path(
            {"/v2/": Scripted(status=307, headers=(("Location", f"{other.url}/v2/"),))}
        )
        with client(hostile_registry.url) as registry:
            registry.check()
        assert "Authorization" in hostile_registry.seen[0].headers
        assert [s.path for s in other.seen] == ["/v2/"]
        assert "Authorization" not in other.seen[0].headers


@pytest.mark.parametrize(
    ("reply", "cause"),
    [
        # Declared past the cap: refused before a byte of the body is read.
        (
            Scripted(status=200, body=b"{}", content_length=10**12),
            "the reply to GET /v2/rocm/pytorch/tags/list is larger than 1 MiB, the cap",
        ),
        # No length at all, a body past the cap: read up to the cap, then stopped.
        (
            Scripted(status=200, body=b"x" * (2 << 20), content_length=-1),
            "the reply to GET /v2/rocm/pytorch/tags/list is larger than 1 MiB, the cap; "
            "stopped reading",
        ),
        # Compressed although identity was asked for: never inflated.
        (
            Scripted(status=200, body=b"\x1f\x8b", headers=(("Content-Encoding", "gzip"),)),
            "the reply to GET /v2/rocm/pytorch/tags/list is 'gzip'-encoded; identity was asked for",
        ),
        # Nested past what json can descend.
        (
            Scripted(status=200, body=b"[" * 100_000),
            "malformed JSON in the reply to GET /v2/rocm/pytorch/tags/list: maximum recursion "
            "depth exceeded while decoding a JSON array from a unicode string",
        ),
        (
            Scripted(status=200, body=json.dumps({"tags": ["ok", "x" * 5000]}).encode()),
            f"unexpected reply to GET /v2/rocm/pytorch/tags/list: '{'x' * 56}... is not a tag",
        ),
    ],
    ids=["declared-too-big", "streamed-too-big", "gzip", "deep-json", "huge-tag"],
)
def test_bodies_are_capped_and_checked(
    hostile_registry: HostileRegistry, reply: Scripted, cause: str
) -> None:
    hostile_registry.script([reply])
    with client(hostile_registry.url, max_body_bytes=1 << 20) as registry:
        error, _ = failure(lambda: registry.tags(REPO))
    assert str(error) == f"registry {hostile_registry.url}: {cause}"


def test_a_truncated_reply_is_one_line(hostile_registry: HostileRegistry) -> None:
    # 500 bytes announced, 12 sent, then the connection closed.
    reply = Scripted(status=200, body=b'{"tags": []}', content_length=500, truncate_at=10_000)
    hostile_registry.script([reply])
    with client(hostile_registry.url) as registry:
        error, _ = failure(lambda: registry.tags(REPO))
        assert registry.requests == 2
    assert str(error).startswith(
        f"registry {hostile_registry.url}: GET /v2/{REPO}/tags/list failed after 2 attempts: "
        "peer closed connection without sending complete message body"
    )


def test_garbage_headers_are_not_advice(hostile_registry: HostileRegistry) -> None:
    # Unicode digits, a date past the calendar, a malformed digest: each one line or ignored.
    hostile_registry.respond = by_path(
        {f"/v2/{REPO}/manifests/t": Scripted(headers=(("Docker-Content-Digest", "sha256:zz"),))},
        default=Scripted(status=429, reason="Slow", headers=(("Retry-After", "²"),)),
    )
    with client(hostile_registry.url, retries=0) as registry:
        error, _ = failure(registry.check)
        assert str(error) == (
            f"registry {hostile_registry.url}: 429 Slow for GET /v2/: rate limited after 1 attempt"
        )
        error, _ = failure(lambda: registry.digest(REPO, "t"))
        assert str(error) == (
            f"registry {hostile_registry.url}: HEAD /v2/{REPO}/manifests/t: 'sha256:zz' is not "
            "a digest"
        )


def test_an_unforeseen_exception_is_a_registry_error_with_its_cause(
    hostile_registry: HostileRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    hostile_registry.script([Scripted(status=200, body=b'{"tags": ["a"]}')])

    def broken(*args: object, **kwargs: object) -> None:
        raise KeyError("surprise")

    with client(hostile_registry.url) as registry:
        monkeypatch.setattr(registry, "_next_page", broken)
        hostile_registry.script(
            [Scripted(body=b'{"tags": ["a"]}', headers=(("Link", '</x>; rel="next"'),))]
        )
        error, _ = failure(lambda: registry.tags(REPO))
    assert str(error) == (
        f"registry {hostile_registry.url}: listing the tags of {REPO} failed unexpectedly: "
        "KeyError: 'surprise'"
    )
    assert isinstance(error.__cause__, KeyError)


# --- TLS ------------------------------------------------------------------------------------------


def test_an_untrusted_certificate_is_a_tls_failure_not_retried(
    hostile_registry_tls: HostileRegistry,
) -> None:
    hostile_registry_tls.script([V2_OK])
    with client(hostile_registry_tls.url, retries=2) as registry:
        error, _ = failure(registry.check)
        assert registry.requests == 1
    host = f"127.0.0.1:{hostile_registry_tls.port}"
    assert str(error) == (
        f"registry {hostile_registry_tls.url}: TLS failure with {host} for GET /v2/: the "
        "server's certificate is not trusted (unable to get local issuer certificate); set "
        "ROCM_REGISTRY_CA to the CA that signed it, or fix the host in the URL"
    )
    assert "running" not in str(error)
    # The fix the message names works: with its CA the same server is fine.
    with client(hostile_registry_tls.url, ca_bundle=str(hostile_registry_tls.ca_file)) as registry:
        registry.check()


def test_a_certificate_for_another_name_says_so(hostile_registry_tls: HostileRegistry) -> None:
    url = f"https://localhost:{hostile_registry_tls.port}"
    hostile_registry_tls.script([V2_OK])
    with client(url, ca_bundle=str(hostile_registry_tls.ca_file)) as registry:
        error, _ = failure(registry.check)
    assert str(error) == (
        f"registry {url}: TLS failure with localhost:{hostile_registry_tls.port} for GET /v2/: "
        "the server's certificate is not trusted (Hostname mismatch, certificate is not valid "
        "for 'localhost'.); set ROCM_REGISTRY_CA to the CA that signed it, or fix the host in "
        "the URL"
    )


def test_plain_http_on_an_https_url_is_named(hostile_registry: HostileRegistry) -> None:
    url = hostile_registry.url.replace("http://", "https://")
    with client(url) as registry:
        error, _ = failure(registry.check)
    assert str(error).startswith(
        f"registry {url}: TLS failure with 127.0.0.1:{hostile_registry.port} for GET /v2/: "
        "the TLS handshake failed ("
    )


# --- credentials: never shown, even echoed back ---------------------------------------------------


ECHOES = {
    "body": Scripted(status=500, reason="Oops {password}", body=b"{password} {auth}"),
    "graphql": Scripted(body=b'{"errors": [{"message": "bad password {password}"}]}'),
    "json": Scripted(body=b'{"tags": [1, "{password}"'),
    "tag": Scripted(body=b'{"tags": ["{password}"]}'),
    "link": Scripted(body=b'{"tags": ["a"]}', headers=(("Link", '<{password}>; rel="next"'),)),
    "location": Scripted(status=302, headers=(("Location", "/v2/?p={password}"),)),
    "realm": Scripted(
        status=401,
        headers=(("WWW-Authenticate", 'Bearer realm="http://127.0.0.1:{port}/t?{password}"'),),
    ),
    "token": Scripted(status=401, headers=(("WWW-Authenticate", 'Bearer realm="{auth}"'),)),
    # A body past its Content-Length is read as the start of the next reply on that connection:
    # h11 quotes the whole status line, reason phrase and all, in the error the client retries.
    "status-line": Scripted(status=500, reason="Nope {password}", body=b"{}", content_length=0),
}


@pytest.mark.parametrize("echo", list(ECHOES))
def test_a_password_echoed_by_the_server_is_never_shown(
    hostile_registry: HostileRegistry, echo: str, caplog: pytest.LogCaptureFixture
) -> None:
    hostile_registry.script([ECHOES[echo]])
    warnings: list[str] = []
    with (
        caplog.at_level(logging.INFO),
        client(hostile_registry.url, warn=warnings.append) as registry,
    ):
        texts = []
        for call in (lambda: registry.tags(REPO), lambda: registry.repo_images(REPO)):
            try:
                texts.append(repr(call()))
            except RegistryError as error:
                cause: BaseException | None = error
                while cause is not None:
                    texts += [str(cause), repr(cause)]
                    cause = cause.__cause__ or cause.__context__
        texts += [repr(registry), *warnings, *(r.getMessage() for r in caplog.records)]
        assert any("registry" in t for t in texts)
        assert not [t for t in texts if PASSWORD in t or "Hunter2" in t], echo
    # The echo really happened: the server had the password to send back.
    assert any("Authorization" in seen.headers for seen in hostile_registry.seen)
