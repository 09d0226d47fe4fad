"""RegistryClient and RegistryResource against real servers.

Real: Debian's `docker-registry` (CNCF distribution 2.8) started on loopback by the session
fixtures, once open and once behind htpasswd (bcrypt); images are pushed to it over the HTTP API.
Real sockets, fake server: the Zot-like fake (`fakes_zot.py`) for what docker-registry lacks (sorted
paging with a Link header, GraphQL search, Zot's lowercase challenge, a bearer-token realm) and for
the failure modes; it also stands in for a proxy that answers 403. The registry-down case uses a
closed loopback port. Nothing is mocked inside httpx.
"""

import base64
from collections.abc import Iterator
from typing import Any

import dagster as dg
import httpx
import pytest

from rocm_assets.core.registry.client import (
    MANIFEST_ACCEPT,
    ImageInfo,
    RegistryClient,
    RegistryError,
)
from rocm_assets.core.registry.refs import (
    ForeignImageError,
    ImageRef,
    ImageRefError,
    parse_challenge,
    parse_image_ref,
)
from rocm_assets.defs.resources.registry import RegistryResource
from rocm_assets_tests.helpers import free_port
from rocm_assets_tests.servers.fakes import Auth, Failure, FakeZot
from rocm_assets_tests.servers.registry import RegistryServer

DIGEST = "sha256:" + "ab" * 32
CREDS_HINT = "ROCM_REGISTRY_USERNAME/ROCM_REGISTRY_PASSWORD"


def fast_client(url: str, **options: Any) -> RegistryClient:
    """A client whose retry backoff is tiny, so retried cases stay quick."""
    return RegistryClient(url, **{"backoff": 0.001, "max_backoff": 0.05, **options})


@pytest.fixture
def zot_client(zot_fake: FakeZot) -> Iterator[RegistryClient]:
    with fast_client(zot_fake.url) as client:
        yield client


# ##### IMAGE REFERENCES, CHALLENGES, SETTINGS (no server)


@pytest.mark.parametrize(
    ("ref", "expected"),
    [
        # The farm's own images: host:port, a namespace, an arch-suffixed tag.
        (
            "127.0.0.1:5000/rocm-pytorch/pytorch:2.15.0-10.1.0-full-gfx1250",
            ImageRef("127.0.0.1:5000", "rocm-pytorch/pytorch", "2.15.0-10.1.0-full-gfx1250", None),
        ),
        # A docker-image:// context from the bake file.
        (
            "docker-image://zot.example:5000/rocm/base:t1",
            ImageRef("zot.example:5000", "rocm/base", "t1", None),
        ),
        # No host: Docker Hub, as docker reads it.
        (
            "rocm/dev-ubuntu-26.04:10.1.0-full",
            ImageRef("docker.io", "rocm/dev-ubuntu-26.04", "10.1.0-full", None),
        ),
        ("ubuntu", ImageRef("docker.io", "library/ubuntu", "latest", None)),
        # Pinned by digest only, and by tag and digest.
        (f"localhost/app@{DIGEST}", ImageRef("localhost", "app", None, DIGEST)),
        (f"zot.example/a/b:t@{DIGEST}", ImageRef("zot.example", "a/b", "t", DIGEST)),
    ],
)
def test_parse_image_ref(ref: str, expected: ImageRef) -> None:
    assert parse_image_ref(ref) == expected


def test_image_ref_reference_and_str() -> None:
    pinned = parse_image_ref(f"zot.example/a/b:t@{DIGEST}")
    assert pinned.reference == DIGEST
    assert str(pinned) == f"zot.example/a/b:t@{DIGEST}"
    assert parse_image_ref("zot.example/a/b:t").reference == "t"


@pytest.mark.parametrize(
    ("ref", "cause"),
    [
        ("zot.example/Rocm/App:t", "'Rocm/App' is not a valid repository"),
        ("zot.example/app:-bad", "'-bad' is not a valid tag"),
        ("zot.example/app@sha256:zz", "'sha256:zz' is not a digest"),
    ],
)
def test_parse_image_ref_rejects_bad_refs(ref: str, cause: str) -> None:
    with pytest.raises(ImageRefError) as caught:
        parse_image_ref(ref)
    assert str(caught.value) == f"bad image reference {ref!r}: {cause}"


def test_split_ref_local_and_foreign() -> None:
    with RegistryClient("http://127.0.0.1:5000") as client:
        assert client.split_ref("127.0.0.1:5000/rocm/pytorch:t") == ("rocm/pytorch", "t")
        assert client.is_local("127.0.0.1:5000/rocm/pytorch:t")
        assert not client.is_local("localhost:5000/rocm/pytorch:t")
        with pytest.raises(ForeignImageError) as caught:
            client.split_ref("rocm/dev-ubuntu-26.04:10.1.0-full")
    assert str(caught.value) == (
        "image docker.io/rocm/dev-ubuntu-26.04:10.1.0-full is on docker.io, "
        "not on the registry http://127.0.0.1:5000"
    )
    # The default port counts as written or not.
    with RegistryClient("https://Zot.Example") as client:
        assert client.split_ref("zot.example:443/a:t") == ("a", "t")


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        # Zot on /v2/: lowercase scheme, unquoted realm.
        ("basic realm=zot", ("basic", {"realm": "zot"})),
        ('Basic realm="rocm-test"', ("basic", {"realm": "rocm-test"})),
        (
            'Bearer realm="https://auth.example/token",service="zot",'
            'scope="repository:rocm/pytorch:pull,push"',
            (
                "bearer",
                {
                    "realm": "https://auth.example/token",
                    "service": "zot",
                    "scope": "repository:rocm/pytorch:pull,push",
                },
            ),
        ),
        (
            "BEARER REALM=http://h/token,Service=s",
            ("bearer", {"realm": "http://h/token", "service": "s"}),
        ),
    ],
)
def test_parse_challenge(header: str, expected: tuple[str, dict[str, str]]) -> None:
    assert parse_challenge(header) == expected


@pytest.mark.parametrize(
    ("url", "message"),
    [
        (
            "zot.example:5000",
            "bad registry URL 'zot.example:5000': expected http(s)://host[:port], "
            "e.g. https://zot.example:5000",
        ),
        (
            "http://zot.example:5000/v2",
            "bad registry URL 'http://zot.example:5000/v2': the registry must be at the root, no path",
        ),
        (
            "https://ci:s3cret-pw@zot.example:5000",
            f"the registry URL must not contain credentials; set {CREDS_HINT} instead",
        ),
    ],
)
def test_bad_registry_urls(url: str, message: str) -> None:
    with pytest.raises(RegistryError) as caught:
        RegistryClient(url)
    assert str(caught.value) == message


def test_username_needs_password() -> None:
    with pytest.raises(RegistryError) as caught:
        RegistryClient("http://127.0.0.1:5000", username="ci")
    assert str(caught.value) == (
        "registry http://127.0.0.1:5000: set both ROCM_REGISTRY_USERNAME and "
        "ROCM_REGISTRY_PASSWORD, or neither"
    )


def test_from_env() -> None:
    env = {
        "ROCM_REGISTRY_URL": "https://zot.example:5000/",
        "ROCM_REGISTRY_USERNAME": "ci",
        "ROCM_REGISTRY_PASSWORD": "hunter2-secret",
    }
    with RegistryClient.from_env(env) as client:
        assert client.url == "https://zot.example:5000"
        assert client.host == "zot.example:5000"
        assert repr(client) == (
            "RegistryClient(url='https://zot.example:5000', auth='basic', requests=0)"
        )
    # --registry on the CLI overrides the URL, the credentials still come from the env.
    with RegistryClient.from_env(env, url="http://127.0.0.1:5000") as client:
        assert client.url == "http://127.0.0.1:5000"
    with pytest.raises(RegistryError) as caught:
        RegistryClient.from_env({})
    assert str(caught.value) == (
        "ROCM_REGISTRY_URL is not set; point it at the registry, e.g. https://zot.example:5000"
    )


def test_missing_ca_bundle_is_named() -> None:
    env = {
        "ROCM_REGISTRY_URL": "https://zot.example:5000",
        "ROCM_REGISTRY_CA": "/nonexistent/ca.pem",
    }
    with pytest.raises(RegistryError) as caught:
        RegistryClient.from_env(env)
    assert str(caught.value).startswith(
        "registry https://zot.example:5000: cannot load the CA bundle /nonexistent/ca.pem "
        "(ROCM_REGISTRY_CA): "
    )


def test_injected_transport_carries_every_request() -> None:
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, headers={"Docker-Content-Digest": DIGEST})

    with fast_client("https://zot.example:5000", transport=httpx.MockTransport(answer)) as client:
        assert client.digest("rocm/pytorch", "gfx942") == DIGEST
    assert [str(request.url) for request in seen] == [
        "https://zot.example:5000/v2/rocm/pytorch/manifests/gfx942"
    ]
    # The full list: docker-registry hides OCI manifests from a HEAD that does not accept them.
    assert seen[0].headers["Accept"] == MANIFEST_ACCEPT
    assert MANIFEST_ACCEPT.split(", ") == [
        "application/vnd.oci.image.index.v1+json",
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
        "application/vnd.docker.distribution.manifest.v2+json",
    ]


# ##### REAL docker-registry, OPEN


@pytest.mark.real
def test_docker_registry_tags_ignore_paging(registry_server: RegistryServer) -> None:
    repo = registry_server.new_repo("rocm/pytorch")
    pushed = {tag: registry_server.push_image(repo, tag, tag.encode()) for tag in "bdace"}
    with fast_client(registry_server.url, page_size=2) as client:
        tags = client.tags(repo)
        # docker-registry ignores n and sends no Link: one request returns every tag, unsorted.
        assert sorted(tags) == sorted(pushed)
        assert client.requests == 1
        assert client.digest(repo, "c") == pushed["c"]
        assert client.digest(repo, pushed["c"]) == pushed["c"]


@pytest.mark.real
def test_docker_registry_absent(registry_server: RegistryServer) -> None:
    repo = registry_server.new_repo("rocm/vllm")
    registry_server.push_image(repo, "present")
    with fast_client(registry_server.url) as client:
        assert client.digest(repo, "missing-gfx1250") is None
        assert client.digest(registry_server.new_repo("nobody/pushed"), "t") is None
        assert client.tags(registry_server.new_repo("nobody/pushed")) == []
        # The first 404 is trusted only after GET /v2/ proved this is a registry; once.
        assert client.requests == 4


@pytest.mark.real
def test_docker_registry_repo_images_falls_back(registry_server: RegistryServer) -> None:
    first, second = registry_server.new_repo("rocm/a"), registry_server.new_repo("rocm/b")
    digests = {tag: registry_server.push_image(first, tag, tag.encode()) for tag in ("x", "y")}
    registry_server.push_image(second, "z")
    with fast_client(registry_server.url) as client:
        assert client.repo_images(first) == {
            tag: ImageInfo(tag, digest, None) for tag, digest in digests.items()
        }
        # No GraphQL here: the probe (404) + tags/list + one HEAD per tag.
        assert client.requests == 1 + 1 + 2
        assert set(client.repo_images(second)) == {"z"}
        # The probe result is cached: no second POST.
        assert client.requests == 4 + 1 + 1
        client.check()


# ##### REAL docker-registry, HTPASSWD


@pytest.mark.real
def test_docker_registry_basic_auth(registry_server_auth: RegistryServer) -> None:
    server = registry_server_auth
    repo = server.new_repo("rocm/pytorch")
    digest = server.push_image(repo, "gfx942")
    with fast_client(server.url, username=server.username, password=server.password) as client:
        client.check()
        assert client.tags(repo) == ["gfx942"]
        assert client.digest(repo, "gfx942") == digest
        assert client.repo_images(repo) == {"gfx942": ImageInfo("gfx942", digest, None)}


@pytest.mark.real
def test_docker_registry_without_credentials(registry_server_auth: RegistryServer) -> None:
    repo = registry_server_auth.new_repo("rocm/pytorch")
    with fast_client(registry_server_auth.url) as client, pytest.raises(RegistryError) as caught:
        client.digest(repo, "gfx942")
    assert str(caught.value) == (
        f"registry {registry_server_auth.url}: 401 Unauthorized for HEAD "
        f"/v2/{repo}/manifests/gfx942: the registry needs credentials; set {CREDS_HINT}"
    )
    assert caught.value.status == 401


@pytest.mark.real
def test_docker_registry_wrong_password(registry_server_auth: RegistryServer) -> None:
    repo = registry_server_auth.new_repo("rocm/pytorch")
    wrong = "not-the-" + str(registry_server_auth.password)
    client = fast_client(registry_server_auth.url, username="rocm-ci", password=wrong)
    with client, pytest.raises(RegistryError) as caught:
        client.tags(repo)
    assert str(caught.value) == (
        f"registry {registry_server_auth.url}: 401 Unauthorized for GET /v2/{repo}/tags/list: "
        f"the credentials were rejected; check {CREDS_HINT}"
    )
    for text in (str(caught.value), repr(caught.value), repr(client)):
        assert wrong not in text
        assert str(registry_server_auth.password) not in text


# ##### A PROXY THAT ANSWERS 403 (fake proxy in front of the real docker-registry)


@pytest.mark.real
def test_proxy_403_names_no_proxy(
    registry_server: RegistryServer, zot_fake: FakeZot, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = registry_server.new_repo("rocm/pytorch")
    registry_server.push_image(repo, "t")
    zot_fake.fail = "403"
    monkeypatch.setenv("HTTP_PROXY", zot_fake.url)
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    with fast_client(registry_server.url) as client, pytest.raises(RegistryError) as caught:
        client.digest(repo, "t")
    assert str(caught.value) == (
        f"registry {registry_server.url}: 403 Forbidden for HEAD /v2/{repo}/manifests/t: "
        f"a proxy may be answering for {registry_server.host}; make sure no_proxy covers it"
    )
    assert zot_fake.log == [("HEAD", f"{registry_server.url}/v2/{repo}/manifests/t", None)]
    # The fix the message names works: with no_proxy covering the host the request goes direct.
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    with fast_client(registry_server.url) as client:
        assert client.digest(repo, "t") is not None
    assert len(zot_fake.log) == 1


# ##### ZOT-LIKE FAKE: PAGING, GRAPHQL, CHALLENGES, TOKENS


def test_zot_tags_paging_follows_link(zot_fake: FakeZot) -> None:
    tags = ["2.15.0-gfx1250", "2.15.0-gfx942", "a", "b", "c"]
    for tag in reversed(tags):
        zot_fake.put("rocm/pytorch", tag)
    with fast_client(zot_fake.url, page_size=2) as client:
        assert client.tags("rocm/pytorch") == tags
        assert client.requests == 3
    assert [path for _, path, _ in zot_fake.log] == [
        "/v2/rocm/pytorch/tags/list?n=2",
        "/v2/rocm/pytorch/tags/list?n=2&last=2.15.0-gfx942",
        "/v2/rocm/pytorch/tags/list?n=2&last=b",
    ]


def test_zot_tag_deleted_mid_listing_is_an_error(zot_fake: FakeZot) -> None:
    for tag in ("a", "b", "c"):
        zot_fake.put("rocm/pytorch", tag)
    # Zot answers 404 with an empty body once `last` no longer exists.
    zot_fake.on_tags_page = lambda repo: zot_fake.repos[repo].pop("a", None)
    with fast_client(zot_fake.url, page_size=1) as client, pytest.raises(RegistryError) as caught:
        client.tags("rocm/pytorch")
    assert str(caught.value) == (
        f"registry {zot_fake.url}: 404 for GET /v2/rocm/pytorch/tags/list?n=1&last=a while paging "
        "the tags of rocm/pytorch: the tag list changed during the listing; retry"
    )


def test_zot_unknown_repo_and_tag_are_absent(zot_fake: FakeZot, zot_client: RegistryClient) -> None:
    zot_fake.put("rocm/pytorch", "gfx942")
    # NAME_UNKNOWN (repo) and MANIFEST_UNKNOWN (tag) are both a plain 404: absent.
    assert zot_client.tags("rocm/nothing") == []
    assert zot_client.digest("rocm/nothing", "gfx942") is None
    assert zot_client.digest("rocm/pytorch", "gfx1250") is None


def test_zot_graphql_one_request_per_repo(zot_fake: FakeZot, zot_client: RegistryClient) -> None:
    pushed = {
        "gfx942": zot_fake.put("rocm/pytorch", "gfx942", pushed_at=1_760_000_000.25),
        "gfx1250": zot_fake.put("rocm/pytorch", "gfx1250", pushed_at=1_760_000_100.5),
        # Go's zero time: Zot does not know when it was pushed.
        "gfx90a": zot_fake.put("rocm/pytorch", "gfx90a"),
    }
    images = zot_client.repo_images("rocm/pytorch")
    assert images == {
        "gfx942": ImageInfo("gfx942", pushed["gfx942"], pytest.approx(1_760_000_000.25)),
        "gfx1250": ImageInfo("gfx1250", pushed["gfx1250"], pytest.approx(1_760_000_100.5)),
        "gfx90a": ImageInfo("gfx90a", pushed["gfx90a"], None),
    }
    assert zot_client.requests == 1
    assert zot_client.repo_images("rocm/nothing") == {}
    assert zot_client.requests == 2
    assert zot_fake.requests_to("/v2/_zot/ext/search") == 2


def test_zot_without_search_falls_back_once(zot_fake: FakeZot, zot_client: RegistryClient) -> None:
    zot_fake.search = False
    digest = zot_fake.put("rocm/a", "t")
    zot_fake.put("rocm/b", "t")
    assert zot_client.repo_images("rocm/a") == {"t": ImageInfo("t", digest, None)}
    assert set(zot_client.repo_images("rocm/b")) == {"t"}
    assert zot_fake.requests_to("/v2/_zot/ext/search") == 1


def test_tag_listed_without_manifest(zot_fake: FakeZot) -> None:
    zot_fake.search = False
    digest = zot_fake.put("rocm/pytorch", "gfx942")
    zot_fake.put_dangling("rocm/pytorch", "gfx1250")
    warnings: list[str] = []
    with fast_client(zot_fake.url, warn=warnings.append) as client:
        # Decision: the tag cannot be pulled, so it is absent; the warning says why.
        assert client.repo_images("rocm/pytorch") == {"gfx942": ImageInfo("gfx942", digest, None)}
        assert client.digest("rocm/pytorch", "gfx1250") is None
    assert warnings == [
        f"registry {zot_fake.url}: rocm/pytorch:gfx1250 is listed by tags/list but its manifest "
        "is 404; treating that tag as absent"
    ]


def test_zot_lowercase_basic_challenge(zot_fake: FakeZot) -> None:
    zot_fake.auth = "basic"
    digest = zot_fake.put("rocm/pytorch", "gfx942")
    with fast_client(zot_fake.url) as client, pytest.raises(RegistryError) as caught:
        client.check()
    assert str(caught.value) == (
        f"registry {zot_fake.url}: 401 Unauthorized for GET /v2/: the registry needs "
        f"credentials; set {CREDS_HINT}"
    )
    assert zot_fake.log[-1][2] is None
    with fast_client(
        zot_fake.url, username=zot_fake.username, password=zot_fake.password
    ) as client:
        assert client.repo_images("rocm/pytorch") == {"gfx942": ImageInfo("gfx942", digest, None)}
        # Basic goes with the first request, not after a challenge.
        assert client.requests == 1
    assert zot_fake.log[-1][2] == "Basic"


def test_zot_bearer_token_flow(zot_fake: FakeZot) -> None:
    zot_fake.auth = "bearer"
    digest = zot_fake.put("rocm/pytorch", "gfx942")
    zot_fake.put("rocm/vllm", "gfx942")
    with fast_client(
        zot_fake.url, username=zot_fake.username, password=zot_fake.password
    ) as client:
        assert client.tags("rocm/pytorch") == ["gfx942"]
        # 401 with the challenge, the token from the realm (with Basic), the retry.
        assert client.requests == 3
        assert zot_fake.tokens_issued == 1
        assert client.digest("rocm/pytorch", "gfx942") == digest
        # The token is cached per scope: no new challenge for the same repository.
        assert client.requests == 4
        assert client.tags("rocm/vllm") == ["gfx942"]
        assert zot_fake.tokens_issued == 2
        zot_fake.expire_tokens()
        assert client.digest("rocm/pytorch", "gfx942") == digest
        assert zot_fake.tokens_issued == 3
        # Search is challenged without a repository scope: its own token, then cached too.
        assert set(client.repo_images("rocm/pytorch")) == {"gfx942"}
        assert zot_fake.tokens_issued == 4
        assert set(client.repo_images("rocm/vllm")) == {"gfx942"}
        assert client.digest("rocm/pytorch", "gfx942") == digest
        assert zot_fake.tokens_issued == 4
        tokens = set(zot_fake.tokens)
        assert all(token not in repr(client) for token in tokens)
    schemes = [(method, path.split("?")[0], scheme) for method, path, scheme in zot_fake.log[:4]]
    assert schemes == [
        ("GET", "/v2/rocm/pytorch/tags/list", "Basic"),
        ("GET", "/token", "Basic"),
        ("GET", "/v2/rocm/pytorch/tags/list", "Bearer"),
        ("HEAD", "/v2/rocm/pytorch/manifests/gfx942", "Bearer"),
    ]


def test_zot_bearer_realm_refuses(zot_fake: FakeZot) -> None:
    zot_fake.auth = "bearer"
    with fast_client(zot_fake.url, username="ci", password="wrong-secret") as client:
        with pytest.raises(RegistryError) as caught:
            client.tags("rocm/pytorch")
    assert str(caught.value) == (
        f"registry {zot_fake.url}: the token server {zot_fake.url}/token refused the "
        f"credentials (401); check {CREDS_HINT}"
    )


# ##### BAD CASES: each an error with its exact cause, never "absent" nor "present"


def test_registry_down() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    client = fast_client(url, username="ci", password="down-secret")
    with client, pytest.raises(RegistryError) as caught:
        client.tags("rocm/pytorch")
    message = str(caught.value)
    assert "down-secret" not in message
    assert message.startswith(
        f"registry {url}: cannot connect for GET /v2/rocm/pytorch/tags/list after 3 attempts ("
    )
    assert message.endswith("); is the registry running and the URL right?")
    assert client.requests == 3


def test_401(zot_fake: FakeZot) -> None:
    zot_fake.fail = "401"
    client = fast_client(zot_fake.url, username=zot_fake.username, password=zot_fake.password)
    with client, pytest.raises(RegistryError) as caught:
        client.tags("rocm/pytorch")
    assert str(caught.value) == (
        f"registry {zot_fake.url}: 401 Unauthorized for GET /v2/rocm/pytorch/tags/list: "
        f"the credentials were rejected; check {CREDS_HINT}"
    )


def test_403_names_the_proxy(zot_fake: FakeZot, zot_client: RegistryClient) -> None:
    zot_fake.fail = "403"
    with pytest.raises(RegistryError) as caught:
        zot_client.repo_images("rocm/pytorch")
    assert str(caught.value) == (
        f"registry {zot_fake.url}: 403 Forbidden for POST /v2/_zot/ext/search: a proxy may be "
        f"answering for {zot_fake.host}; make sure no_proxy covers it"
    )
    assert caught.value.status == 403


def test_500_is_retried_then_an_error(zot_fake: FakeZot, zot_client: RegistryClient) -> None:
    zot_fake.fail = "500"
    with pytest.raises(RegistryError) as caught:
        zot_client.digest("rocm/pytorch", "gfx942")
    assert str(caught.value) == (
        f"registry {zot_fake.url}: 500 Internal Server Error for HEAD "
        "/v2/rocm/pytorch/manifests/gfx942: server error after 3 attempts"
    )
    assert zot_fake.requests_to("/v2/rocm/pytorch/manifests/gfx942") == 3


def test_500_then_recovery(zot_fake: FakeZot, zot_client: RegistryClient) -> None:
    digest = zot_fake.put("rocm/pytorch", "gfx942")
    zot_fake.fail, zot_fake.fail_times = "500", 2
    assert zot_client.digest("rocm/pytorch", "gfx942") == digest
    assert zot_client.requests == 3


def test_429_honours_retry_after(zot_fake: FakeZot, zot_client: RegistryClient) -> None:
    zot_fake.put("rocm/pytorch", "gfx942")
    zot_fake.fail, zot_fake.fail_times, zot_fake.retry_after = "429", 1, "0"
    assert zot_client.tags("rocm/pytorch") == ["gfx942"]
    assert zot_client.requests == 2
    # A pause longer than the client's cap is reported now rather than slept through.
    zot_fake.fail, zot_fake.fail_times, zot_fake.retry_after = "429", None, "120"
    with pytest.raises(RegistryError) as caught:
        zot_client.tags("rocm/pytorch")
    assert str(caught.value) == (
        f"registry {zot_fake.url}: 429 Too Many Requests for GET /v2/rocm/pytorch/tags/list: "
        "rate limited after 1 attempt (Retry-After 120 s)"
    )
    assert zot_client.requests == 3


def test_slow_past_the_read_timeout(zot_fake: FakeZot) -> None:
    zot_fake.fail = "slow"
    with fast_client(zot_fake.url, read_timeout=0.2) as client:
        with pytest.raises(RegistryError) as caught:
            client.tags("rocm/pytorch")
        # Not retried: a slow server fails a tick in one timeout.
        assert client.requests == 1
    assert str(caught.value).startswith(
        f"registry {zot_fake.url}: timed out waiting for the reply to GET "
        "/v2/rocm/pytorch/tags/list ("
    )


def test_malformed_json(zot_fake: FakeZot, zot_client: RegistryClient) -> None:
    zot_fake.put("rocm/pytorch", "gfx942")
    zot_fake.fail = "malformed"
    with pytest.raises(RegistryError) as caught:
        zot_client.tags("rocm/pytorch")
    assert str(caught.value).startswith(
        f"registry {zot_fake.url}: malformed JSON in the reply to GET /v2/rocm/pytorch/tags/list: "
        "Expecting value: line 1 column "
    )
    with pytest.raises(RegistryError) as caught:
        zot_client.repo_images("rocm/pytorch")
    assert str(caught.value).startswith(
        f"registry {zot_fake.url}: malformed JSON in the reply to POST /v2/_zot/ext/search: "
    )


def test_a_404_from_a_non_registry_is_not_absent(zot_fake: FakeZot) -> None:
    zot_fake.fail = "404"
    with fast_client(zot_fake.url) as client, pytest.raises(RegistryError) as caught:
        client.digest("rocm/pytorch", "gfx942")
    assert str(caught.value) == (
        f"registry {zot_fake.url}: 404 for GET /v2/: this is not an OCI registry; "
        "check ROCM_REGISTRY_URL"
    )


@pytest.mark.parametrize("failure", ["401", "403", "500", "slow", "malformed"])
def test_errors_are_never_absent_nor_present(zot_fake: FakeZot, failure: Failure) -> None:
    zot_fake.put("rocm/pytorch", "gfx942")
    zot_fake.fail = failure
    with fast_client(zot_fake.url, read_timeout=0.2) as client:
        calls = [lambda: client.tags("rocm/pytorch"), lambda: client.repo_images("rocm/pytorch")]
        # A HEAD has no JSON body to be malformed; every other mode applies to it too.
        if failure != "malformed":
            calls.append(lambda: client.digest("rocm/pytorch", "gfx942"))
        for call in calls:
            with pytest.raises(RegistryError):
                call()


# ##### CREDENTIALS NEVER SHOW


@pytest.mark.parametrize(
    ("failure", "auth"),
    [
        ("401", None),
        ("403", None),
        ("500", None),
        ("slow", None),
        ("malformed", None),
        # The token realm refuses the password the client sends it.
        (None, "bearer"),
    ],
)
def test_credentials_never_in_repr_or_errors(
    zot_fake: FakeZot, failure: Failure, auth: Auth
) -> None:
    password = zot_fake.password
    zot_fake.fail, zot_fake.auth = failure, auth
    if auth == "bearer":
        zot_fake.password = "another-" + password
    encoded = base64.b64encode(f"{zot_fake.username}:{password}".encode()).decode()
    client = fast_client(
        zot_fake.url, username=zot_fake.username, password=password, read_timeout=0.2
    )
    with client, pytest.raises(RegistryError) as caught:
        client.tags("rocm/pytorch")
    for text in (str(caught.value), repr(caught.value), repr(client), str(vars(caught.value))):
        assert password not in text
        assert encoded not in text
    assert "\n" not in str(caught.value)


@pytest.mark.real
def test_resource_repr_hides_password(
    registry_server_auth: RegistryServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = registry_server_auth
    password = str(server.password)
    plain = RegistryResource(url=server.url, username=server.username, password=password)
    assert password not in repr(plain)
    assert password not in str(plain)
    monkeypatch.setenv("ROCM_REGISTRY_URL", server.url)
    monkeypatch.setenv("ROCM_REGISTRY_USERNAME", str(server.username))
    monkeypatch.setenv("ROCM_REGISTRY_PASSWORD", password)
    monkeypatch.delenv("ROCM_REGISTRY_CA", raising=False)
    repo = server.new_repo("rocm/pytorch")
    digest = server.push_image(repo, "gfx942")
    # The EnvVars resolve when Dagster builds the resource, as in a run.
    with dg.build_resources({"registry": RegistryResource.from_env()}) as resources:
        registry = resources.registry
        assert password not in repr(registry)
        assert registry.password == password
        with registry.client() as client:
            assert client.digest(repo, "gfx942") == digest
            assert password not in repr(client)


def test_resource_from_env_binds_only_what_is_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROCM_REGISTRY_URL", "http://127.0.0.1:5000")
    for name in ("ROCM_REGISTRY_USERNAME", "ROCM_REGISTRY_PASSWORD", "ROCM_REGISTRY_CA"):
        monkeypatch.delenv(name, raising=False)
    # An open registry needs no credential variables: nothing unset is bound.
    with dg.build_resources({"registry": RegistryResource.from_env()}) as resources:
        assert resources.registry.username is None
        with resources.registry.client() as client:
            assert repr(client) == (
                "RegistryClient(url='http://127.0.0.1:5000', auth='anonymous', requests=0)"
            )
