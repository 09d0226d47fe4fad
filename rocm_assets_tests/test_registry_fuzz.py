"""Property-based tests of the registry client against a server that answers at random.

Real: the loopback `HostileRegistry` (rocm_assets_tests/servers/hostile_registry.py) sends each
scripted reply byte for byte over a real socket, and the client runs whole (its transport,
httpcore, h11). Hypothesis draws the replies: any status, `Link`, `Location`, `WWW-Authenticate`,
`Retry-After`, digest and encoding headers, lying or missing `Content-Length`, bodies from valid
JSON to nested or oversized garbage, replies dripped slowly or cut off, and replies that echo the
client's password back at it. Every call must end in its result type or one RegistryError line,
by its deadline plus a margin (a hang guard on a shared machine, not a speed figure), and the
password must appear in no message, cause, warning, repr or log record at INFO or above (DEBUG is
httpcore's wire trace, which prints what the server sent).
"""

import json
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings, strategies as st

from rocm_assets.core.registry.client import ImageInfo, RegistryClient, RegistryError
from rocm_assets_tests.servers.hostile_registry import HostileRegistry, Scripted

PASSWORD = "pw-Fuzz7/secret+Value"
REPO = "rocm/pytorch"
DEADLINE_S = 1.0
MARGIN_S = 1.5
DIGEST = "sha256:" + "cd" * 32

STATUSES = st.sampled_from([200] * 6 + [204, 301, 302, 303, 307, 308, 401, 403, 404, 429, 500]) | (
    st.integers(100, 599)
)
HEADER_VALUES: dict[str, list[str]] = {
    "Link": [
        f'</v2/{REPO}/tags/list?n=2&last=t{{n}}>; rel="next"',
        f'</v2/{REPO}/tags/list?n=2&last=a>; rel="next"',
        '<http://127.0.0.1:1/elsewhere>; rel="next"',
        '<{password}>; rel="next"',
        "<>; rel=next",
        "garbage;;;<<",
    ],
    "Location": [
        "/v2/",
        "/loop{n}",
        "/a",
        "http://127.0.0.1:{port}/v2/",
        "https://127.0.0.1:{port}/v2/",
        "http://127.0.0.1:1/",
        "/?p={password}",
        "ftp://x/",
        "http://[::1",
        "",
    ],
    "WWW-Authenticate": [
        'Bearer realm="http://127.0.0.1:{port}/token",service="s",scope="repository:x:pull"',
        'Bearer realm="{auth}"',
        'Bearer realm="http://127.0.0.1:{port}/t?{password}"',
        'Bearer realm="ftp://x"',
        "basic realm=zot",
        "Bearer",
    ],
    "Retry-After": ["0", "1", "120", "²", "Fri, 31 Dec 9999 23:59:59 GMT", "99999999999999999999"],
    "Docker-Content-Digest": [DIGEST, "sha256:zz", "x" * 300, "{password}"],
    "Content-Encoding": ["gzip", "br", "identity"],
    "Transfer-Encoding": ["chunked"],
    "Content-Type": ["application/json", "text/html"],
}
BODIES = st.sampled_from(
    [
        b"",
        b"{}",
        b'{"tags": ["a", "b"]}',
        b'{"tags": ["t{n}"]}',
        b'{"tags": null}',
        b'{"tags": [1, 2]}',
        b'{"token": "tok-{n}"}',
        b'{"access_token": ""}',
        b'{"errors": [{"message": "no {password}"}]}',
        b'{"errors": "x"}',
        b'{"data": {"ImageList": {"Page": {"TotalCount": 99}, "Results": [{"Tag": "t{n}", '
        b'"Digest": "' + DIGEST.encode() + b'"}]}}}',
        b'{"data": {"ImageList": {"Results": [{"Tag": 1}]}}}',
        b'{"data": []}',
        b"{password} {auth}",
        b"[" * 5000,
        b"x" * 5000,
        b"\x1f\x8b\x08\x00",
    ]
) | st.binary(max_size=200)
# What an honest registry answers, so that results are reached as well as errors.
HONEST = st.sampled_from(
    [
        Scripted(body=b"{}"),
        Scripted(body=b'{"tags": ["a", "b"]}'),
        Scripted(headers=(("Docker-Content-Digest", DIGEST),)),
        Scripted(status=404, reason="Not Found"),
        Scripted(
            body=b'{"data": {"ImageList": {"Page": {"TotalCount": 1}, "Results": '
            b'[{"RepoName": "rocm/pytorch", "Tag": "gfx942", "Digest": "'
            + DIGEST.encode()
            + b'"}]}}}'
        ),
    ]
)
RANDOM = st.builds(
    Scripted,
    status=STATUSES,
    reason=st.sampled_from(["OK", "", "Nope {password}", "x" * 300]),
    headers=st.lists(
        st.sampled_from(sorted(HEADER_VALUES)).flatmap(
            lambda name: st.tuples(st.just(name), st.sampled_from(HEADER_VALUES[name]))
        ),
        max_size=3,
    ).map(tuple),
    body=BODIES,
    content_length=st.none() | st.just(-1) | st.integers(0, 10_000),
    drip_s=st.sampled_from([0.0] * 8 + [0.02, 0.1, 0.4]),
    drip_after=st.integers(0, 200),
    truncate_at=st.none() | st.integers(0, 300),
)
CALLS: dict[str, tuple[Callable[[RegistryClient], Any], type | tuple[type, ...]]] = {
    "check": (lambda c: c.check(), type(None)),
    "tags": (lambda c: c.tags(REPO), list),
    "digest": (lambda c: c.digest(REPO, "gfx942"), (str, type(None))),
    "repo_images": (lambda c: c.repo_images(REPO), dict),
}


@pytest.fixture(scope="module")
def server(_loopback_no_proxy: None) -> Iterator[HostileRegistry]:
    with HostileRegistry() as registry:
        yield registry


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _texts(error: BaseException) -> list[str]:
    texts = []
    current: BaseException | None = error
    while current is not None:
        texts += [str(current), repr(current)]
        current = current.__cause__ or current.__context__
    return texts


@settings(
    max_examples=250,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    replies=st.lists(HONEST | RANDOM, min_size=1, max_size=5), call=st.sampled_from(sorted(CALLS))
)
def test_every_call_ends_in_a_result_or_one_line_by_its_deadline(
    server: HostileRegistry, replies: list[Scripted], call: str
) -> None:
    server.reset()
    server.script(replies)
    run, expected = CALLS[call]
    warnings: list[str] = []
    records = _Records()
    root = logging.getLogger()
    level = root.level
    root.addHandler(records)
    root.setLevel(logging.INFO)
    registry = RegistryClient(
        server.url,
        username="ci",
        password=PASSWORD,
        connect_timeout=0.5,
        read_timeout=0.5,
        deadline=DEADLINE_S,
        retries=1,
        backoff=0.01,
        max_backoff=0.2,
        page_size=2,
        max_pages=4,
        max_body_bytes=4096,
        max_redirects=3,
        warn=warnings.append,
    )
    started = time.monotonic()
    try:
        result = run(registry)
    except RegistryError as error:
        texts = _texts(error)
        assert "\n" not in str(error)
        assert str(error).startswith(f"registry {server.url}: ")
        event(f"{call}: error")
    else:
        assert isinstance(result, expected)
        if isinstance(result, dict):
            assert all(isinstance(info, ImageInfo) for info in result.values())
        texts = [json.dumps(result, default=repr)]
        event(f"{call}: result")
    finally:
        elapsed = time.monotonic() - started
        registry.close()
        root.removeHandler(records)
        root.setLevel(level)
    assert elapsed < DEADLINE_S + MARGIN_S, elapsed
    texts += [repr(registry), *warnings, *records.messages]
    leaks = [t for t in texts if PASSWORD in t or "Fuzz7" in t]
    assert not leaks, leaks
