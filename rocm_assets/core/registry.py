"""Client for the OCI registry the farm publishes to: Zot in production, any Distribution server.

Pure core (no dagster): the observation sensor and preflight build on it. Only a 404 means absent;
every other failure raises `RegistryError`, one line naming the registry URL and the cause, never
a credential. Zot's GraphQL search is used when the server offers it, so listing a repository's
tags and digests costs one request instead of one per tag.
"""

import base64
import email.utils
import json
import logging
import os
import re
import ssl
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Self

import httpx

from rocm_assets.core.constants import (
    REGISTRY_CA_ENV,
    REGISTRY_PASSWORD_ENV,
    REGISTRY_URL_ENV,
    REGISTRY_USERNAME_ENV,
)

logger = logging.getLogger(__name__)

# docker-registry answers 404 for an OCI manifest unless Accept lists the OCI types, so every HEAD
# sends all four; Zot ignores Accept.
MANIFEST_ACCEPT = ", ".join(
    (
        "application/vnd.oci.image.index.v1+json",
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
        "application/vnd.docker.distribution.manifest.v2+json",
    )
)
SEARCH_PATH = "/v2/_zot/ext/search"
# limit 0 means "everything" in Zot, so one request returns every tag of the repository.
_IMAGE_LIST_QUERY = (
    "{ImageList(repo: %s, requestedPage: {limit: 0, offset: %d, sortBy: ALPHABETIC_ASC}) "
    "{Page {TotalCount} Results {RepoName Tag Digest PushTimestamp}}}"
)
_CREDENTIALS_HINT = f"check {REGISTRY_USERNAME_ENV}/{REGISTRY_PASSWORD_ENV}"

_CHALLENGE_PARAM = re.compile(r'([A-Za-z_][\w-]*)\s*=\s*(?:"([^"]*)"|([^,\s]*))')
_REPO_COMPONENT = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*")
_TAG = re.compile(r"\w[\w.-]{0,127}")
_DIGEST = re.compile(r"[a-z0-9]+(?:[.+_-][a-z0-9]+)*:[0-9a-fA-F]{32,}")


class RegistryError(Exception):
    """A registry request failed: never means "absent". The message is one line, secret-free."""

    def __init__(self, message: str, *, url: str | None = None, status: int | None = None) -> None:
        super().__init__(" ".join(message.split()))
        self.url = url
        self.status = status


class ImageRefError(RegistryError):
    """An image reference that cannot be parsed."""


class ForeignImageError(RegistryError):
    """An image reference that names another registry host than the client's."""


@dataclass(frozen=True)
class ImageInfo:
    tag: str
    digest: str
    # Zot's PushTimestamp (epoch seconds); None when the server does not say.
    pushed_at: float | None = None


@dataclass(frozen=True)
class ImageRef:
    host: str
    repo: str
    tag: str | None
    digest: str | None

    @property
    def reference(self) -> str:
        """What a manifest request names: the digest when pinned, else the tag."""
        return self.digest or self.tag or "latest"

    def __str__(self) -> str:
        text = f"{self.host}/{self.repo}"
        if self.tag:
            text += f":{self.tag}"
        if self.digest:
            text += f"@{self.digest}"
        return text


def parse_image_ref(ref: str) -> ImageRef:
    """Split `host[:port]/ns/repo[:tag][@digest]` (or a `docker-image://` context) like docker."""
    text = ref.strip().removeprefix("docker-image://")
    name, at, digest = text.partition("@")
    if at and not _DIGEST.fullmatch(digest):
        raise ImageRefError(f"bad image reference {ref!r}: {digest!r} is not a digest")
    tag = None
    colon = name.rfind(":")
    if colon > name.rfind("/"):
        name, tag = name[:colon], name[colon + 1 :]
        if not _TAG.fullmatch(tag):
            raise ImageRefError(f"bad image reference {ref!r}: {tag!r} is not a valid tag")
    first, slash, rest = name.partition("/")
    # Docker's rule: the first component is a registry host only if it looks like one.
    if slash and ("." in first or ":" in first or first == "localhost"):
        host, repo = first, rest
    else:
        host, repo = "docker.io", name if slash else f"library/{name}"
    if not all(_REPO_COMPONENT.fullmatch(part) for part in repo.split("/")):
        raise ImageRefError(f"bad image reference {ref!r}: {repo!r} is not a valid repository")
    if tag is None and not digest:
        tag = "latest"
    return ImageRef(host=host, repo=repo, tag=tag, digest=digest or None)


def parse_challenge(header: str) -> tuple[str, dict[str, str]]:
    """`Bearer realm="r",service="s"` -> ("bearer", {...}); Zot's `basic realm=x` form too."""
    scheme, _, rest = header.strip().partition(" ")
    params = {}
    for match in _CHALLENGE_PARAM.finditer(rest):
        quoted, bare = match.group(2), match.group(3)
        # First wins: a second challenge joined into the same header must not override it.
        params.setdefault(match.group(1).lower(), quoted if quoted is not None else bare)
    return scheme.lower(), params


def _push_time(value: object) -> float | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        stamp = datetime.fromisoformat(value).timestamp()
    except ValueError:
        return None
    # Go's zero time (year 1) is how Zot says "unknown".
    return stamp if stamp > 0 else None


def _attempts(count: int) -> str:
    return "1 attempt" if count == 1 else f"{count} attempts"


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("Retry-After")
    if value is None:
        return None
    if value.strip().isdigit():
        return float(value.strip())
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


class RegistryClient:
    """One httpx.Client against one registry; use as a context manager.

    `requests` counts every HTTP request sent (retries and token fetches included), so callers
    can measure what a sensor tick costs.
    """

    def __init__(
        self,
        url: str,
        *,
        username: str | None = None,
        password: str | None = None,
        verify_tls: bool = True,
        ca_bundle: str | None = None,
        connect_timeout: float = 5.0,
        read_timeout: float = 30.0,
        retries: int = 2,
        backoff: float = 0.5,
        max_backoff: float = 10.0,
        page_size: int = 1000,
        transport: httpx.BaseTransport | None = None,
        warn: Callable[[str], None] | None = None,
    ) -> None:
        base = _base_url(url)
        self.url = f"{base.scheme}://{base.netloc.decode('ascii')}"
        self.host = base.netloc.decode("ascii")
        self._scheme = base.scheme
        if (username is None) != (password is None):
            raise RegistryError(
                f"registry {self.url}: set both {REGISTRY_USERNAME_ENV} and "
                f"{REGISTRY_PASSWORD_ENV}, or neither",
                url=self.url,
            )
        self._basic = (
            "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode("ascii")
            if username is not None
            else None
        )
        self.retries = retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.page_size = page_size
        self.requests = 0
        self._warn = warn or logger.warning
        # Bearer tokens per scope, and which scope each repository's requests were challenged for.
        self._tokens: dict[str, str] = {}
        self._scope_of: dict[str, str] = {}
        self._search: bool | None = None
        self._confirmed = False
        self._http = httpx.Client(
            base_url=self.url,
            verify=_tls_verify(self.url, verify_tls, ca_bundle),
            timeout=httpx.Timeout(read_timeout, connect=connect_timeout),
            transport=transport,
            follow_redirects=True,
            headers={"User-Agent": "rocm-assets"},
            event_hooks={"request": [self._count]},
        )

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] | None = None, *, url: str | None = None, **options: Any
    ) -> Self:
        """Build from ROCM_REGISTRY_URL/_USERNAME/_PASSWORD/_CA; `url` overrides the env URL."""
        env = os.environ if environ is None else environ
        url = url or env.get(REGISTRY_URL_ENV, "").strip()
        if not url:
            raise RegistryError(
                f"{REGISTRY_URL_ENV} is not set; point it at the registry, "
                "e.g. https://zot.example:5000"
            )
        return cls(
            url,
            username=env.get(REGISTRY_USERNAME_ENV) or None,
            password=env.get(REGISTRY_PASSWORD_ENV) or None,
            ca_bundle=env.get(REGISTRY_CA_ENV) or None,
            **options,
        )

    def __repr__(self) -> str:
        auth = "basic" if self._basic else "anonymous"
        return f"RegistryClient(url={self.url!r}, auth={auth!r}, requests={self.requests})"

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    # ---------------------------------------------------------------- public API

    def check(self) -> None:
        """Raise RegistryError unless GET /v2/ answers 200: reachable, a registry, authorized."""
        response = self._request("GET", "/v2/", repo="", expect={200, 404})
        if response.status_code == 404:
            raise self._error(
                f"404 for GET /v2/: this is not an OCI registry; check {REGISTRY_URL_ENV}",
                status=404,
            )
        self._confirmed = True

    def tags(self, repo: str) -> list[str]:
        """Every tag of `repo`, in the server's order; [] for a repository nobody pushed yet."""
        url = f"/v2/{repo}/tags/list"
        params: dict[str, str] | None = {"n": str(self.page_size)}
        found: list[str] = []
        seen: set[str] = set()
        while True:
            what = f"GET {httpx.URL(url).raw_path.decode('ascii')}"
            response = self._request("GET", url, repo=repo, params=params, expect={200, 404})
            if response.status_code == 404:
                if not found:
                    self._confirm_registry()
                    return []
                # Zot answers 404 when `last` no longer exists: the tag went away mid-listing.
                raise self._error(
                    f"404 for {what} while paging the tags of {repo}: the tag list changed "
                    "during the listing; retry",
                    status=404,
                )
            tags = self._json(response, what).get("tags") or []
            if not isinstance(tags, list) or not all(isinstance(tag, str) for tag in tags):
                raise self._error(f"unexpected reply to {what}: 'tags' is not a list of strings")
            fresh = [tag for tag in tags if tag not in seen]
            found.extend(fresh)
            seen.update(fresh)
            next_link = response.links.get("next", {}).get("url")
            if not next_link:
                return found
            if not fresh:
                raise self._error(f"{what}: the Link header does not advance the listing")
            # The Link is relative and may carry an unencoded `last`; it has its own n and last.
            url, params = str(response.url.join(next_link)), None

    def digest(self, repo: str, reference: str) -> str | None:
        """The manifest digest of `repo:reference` (a tag or a digest), or None on a 404."""
        url = f"/v2/{repo}/manifests/{reference}"
        response = self._request(
            "HEAD", url, repo=repo, headers={"Accept": MANIFEST_ACCEPT}, expect={200, 404}
        )
        if response.status_code == 404:
            self._confirm_registry()
            return None
        digest = response.headers.get("Docker-Content-Digest")
        if not digest:
            raise self._error(f"HEAD {url} answered 200 without a Docker-Content-Digest header")
        return digest

    def repo_images(self, repo: str) -> dict[str, ImageInfo]:
        """Every tag of `repo` with its digest: one GraphQL request on Zot, else 1 + one per tag.

        A tag that tags/list names but whose manifest is 404 is left out (it cannot be pulled, so
        it is absent), and `warn` is called with a line naming it.
        """
        if self._search is not False:
            images = self._search_images(repo)
            if images is not None:
                return images
        images = {}
        for tag in self.tags(repo):
            digest = self.digest(repo, tag)
            if digest is None:
                self._warn(
                    f"registry {self.url}: {repo}:{tag} is listed by tags/list but its manifest "
                    "is 404; treating that tag as absent"
                )
                continue
            images[tag] = ImageInfo(tag=tag, digest=digest)
        return images

    def split_ref(self, ref: str | ImageRef) -> tuple[str, str]:
        """(repo, tag-or-digest) of an image on this registry; ForeignImageError otherwise."""
        image = parse_image_ref(ref) if isinstance(ref, str) else ref
        if not self.is_local(image):
            raise ForeignImageError(
                f"image {image} is on {image.host}, not on the registry {self.url}", url=self.url
            )
        return image.repo, image.reference

    def is_local(self, ref: str | ImageRef) -> bool:
        """Whether the reference names this registry's host (default ports compared as such)."""
        image = parse_image_ref(ref) if isinstance(ref, str) else ref
        return _host_key(image.host, self._scheme) == _host_key(self.host, self._scheme)

    # ---------------------------------------------------------------- internals

    def _count(self, request: httpx.Request) -> None:
        self.requests += 1

    def _error(self, cause: str, *, status: int | None = None) -> RegistryError:
        return RegistryError(f"registry {self.url}: {cause}", url=self.url, status=status)

    def _confirm_registry(self) -> None:
        # A 404 means "absent" only from a registry: a wrong URL would make everything "missing".
        if not self._confirmed:
            self.check()

    def _search_images(self, repo: str) -> dict[str, ImageInfo] | None:
        images: dict[str, ImageInfo] = {}
        offset = 0
        while True:
            query = _IMAGE_LIST_QUERY % (json.dumps(repo), offset)
            # Keyed like /v2/, not by repository: a token server scopes search apart from pulls.
            response = self._request(
                "POST", SEARCH_PATH, repo="", json_body={"query": query}, expect={200, 404, 405}
            )
            if response.status_code != 200:
                self._search = False
                return None
            self._search = True
            page = self._image_list(self._json(response, f"POST {SEARCH_PATH}"), repo)
            results = page.get("Results") or []
            offset += len(results)
            for item in results:
                tag, digest = item.get("Tag"), item.get("Digest")
                if not isinstance(tag, str) or not isinstance(digest, str) or not digest:
                    raise self._error(
                        f"GraphQL ImageList for {repo} returned an entry without a digest"
                    )
                if item.get("RepoName", repo) == repo:
                    images[tag] = ImageInfo(tag, digest, _push_time(item.get("PushTimestamp")))
            # limit 0 returns everything; page on only if a server capped the reply anyway.
            total = (page.get("Page") or {}).get("TotalCount")
            if not results or not isinstance(total, int) or offset >= total:
                return images

    def _image_list(self, data: dict[str, Any], repo: str) -> dict[str, Any]:
        errors = data.get("errors")
        if errors:
            first = errors[0].get("message") if isinstance(errors[0], dict) else errors[0]
            raise self._error(f"GraphQL ImageList for {repo} failed: {first}")
        page = (data.get("data") or {}).get("ImageList")
        if not isinstance(page, dict):
            raise self._error(f"unexpected reply to POST {SEARCH_PATH}: no data.ImageList")
        return page

    def _json(self, response: httpx.Response, what: str) -> dict[str, Any]:
        try:
            data = json.loads(response.content)
        except ValueError as exc:
            raise self._error(f"malformed JSON in the reply to {what}: {exc}") from exc
        if not isinstance(data, dict):
            raise self._error(f"unexpected reply to {what}: not a JSON object")
        return data

    def _auth_headers(self, repo: str) -> dict[str, str]:
        scope = self._scope_of.get(repo)
        token = self._tokens.get(scope) if scope is not None else None
        if token is not None:
            return {"Authorization": f"Bearer {token}"}
        if self._basic:
            return {"Authorization": self._basic}
        return {}

    def _request(
        self,
        method: str,
        url: str,
        *,
        repo: str,
        expect: Collection[int],
        params: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
        json_body: object = None,
    ) -> httpx.Response:
        """Send with auth and bounded retries; return a response whose status is in `expect`."""
        what = f"{method} {httpx.URL(url).path}"
        attempt = 0
        token_fetched = False
        while True:
            attempt += 1
            try:
                response = self._http.request(
                    method,
                    url,
                    params=params,
                    json=json_body,
                    headers={**self._auth_headers(repo), **(headers or {})},
                )
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                if attempt <= self.retries:
                    time.sleep(self._backoff(attempt))
                    continue
                raise self._error(
                    f"cannot connect for {what} after {_attempts(attempt)} ({exc}); "
                    "is the registry running and the URL right?"
                ) from exc
            except httpx.TimeoutException as exc:
                # A read timeout is not retried: the server is up but slow, and a sensor tick
                # should fail in one timeout, not several.
                raise self._error(f"timed out waiting for the reply to {what} ({exc})") from exc
            except httpx.TransportError as exc:
                if attempt <= self.retries:
                    time.sleep(self._backoff(attempt))
                    continue
                raise self._error(f"{what} failed after {_attempts(attempt)}: {exc}") from exc
            status = response.status_code
            if status == 401 and not token_fetched:
                challenge = self._bearer_challenge(response)
                if challenge is not None:
                    self._fetch_token(challenge, repo)
                    token_fetched = True
                    attempt -= 1
                    continue
            if (status == 429 or status >= 500) and attempt <= self.retries:
                delay = _retry_after(response)
                delay = max(delay or 0.0, self._backoff(attempt))
                # A server asking for a long pause gets the error now; the next tick retries.
                if delay <= self.max_backoff:
                    time.sleep(delay)
                    continue
            if status in expect:
                return response
            raise self._status_error(response, what, attempt)

    def _backoff(self, attempt: int) -> float:
        return min(self.max_backoff, self.backoff * 2 ** (attempt - 1))

    def _bearer_challenge(self, response: httpx.Response) -> dict[str, str] | None:
        for header in response.headers.get_list("WWW-Authenticate"):
            scheme, params = parse_challenge(header)
            if scheme == "bearer" and params.get("realm"):
                return params
        return None

    def _fetch_token(self, challenge: dict[str, str], repo: str) -> None:
        realm = challenge["realm"]
        params = {key: challenge[key] for key in ("service", "scope") if key in challenge}
        headers = {"Authorization": self._basic} if self._basic else {}
        try:
            response = self._http.get(realm, params=params, headers=headers)
        except httpx.HTTPError as exc:
            raise self._error(f"cannot get a token from {realm}: {exc}") from exc
        if response.status_code in (401, 403):
            raise self._error(
                f"the token server {realm} refused the credentials "
                f"({response.status_code}); {_CREDENTIALS_HINT}",
                status=response.status_code,
            )
        if response.status_code != 200:
            raise self._error(
                f"the token server {realm} answered {response.status_code}",
                status=response.status_code,
            )
        data = self._json(response, f"GET {realm}")
        token = data.get("token") or data.get("access_token")
        if not isinstance(token, str) or not token:
            raise self._error(f"the token server {realm} returned no token")
        scope = challenge.get("scope", "")
        self._tokens[scope] = token
        self._scope_of[repo] = scope

    def _status_error(self, response: httpx.Response, what: str, attempts: int) -> RegistryError:
        status = response.status_code
        reason = response.reason_phrase or "error"
        if status == 401:
            if "Authorization" in response.request.headers:
                cause = f"the credentials were rejected; {_CREDENTIALS_HINT}"
            else:
                cause = (
                    f"the registry needs credentials; set {REGISTRY_USERNAME_ENV}/"
                    f"{REGISTRY_PASSWORD_ENV}"
                )
        elif status == 403:
            cause = f"a proxy may be answering for {self.host}; make sure no_proxy covers it"
        elif status == 429:
            wait = _retry_after(response)
            cause = f"rate limited after {_attempts(attempts)}" + (
                f" (Retry-After {wait:.0f} s)" if wait is not None else ""
            )
        elif status >= 500:
            cause = f"server error after {_attempts(attempts)}"
        else:
            cause = "unexpected status"
        return self._error(f"{status} {reason} for {what}: {cause}", status=status)


def _base_url(url: str) -> httpx.URL:
    text = url.strip()
    # Never echo a URL that carries credentials: the message would leak them.
    if "@" in text:
        raise RegistryError(
            "the registry URL must not contain credentials; set "
            f"{REGISTRY_USERNAME_ENV}/{REGISTRY_PASSWORD_ENV} instead"
        )
    try:
        parsed = httpx.URL(text)
    except httpx.InvalidURL as exc:
        raise RegistryError(f"bad registry URL {text!r}: {exc}") from exc
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise RegistryError(
            f"bad registry URL {text!r}: expected http(s)://host[:port], "
            "e.g. https://zot.example:5000"
        )
    if parsed.path not in ("", "/") or parsed.query or parsed.fragment:
        raise RegistryError(f"bad registry URL {text!r}: the registry must be at the root, no path")
    return parsed


def _tls_verify(url: str, verify_tls: bool, ca_bundle: str | None) -> ssl.SSLContext | bool:
    if not verify_tls:
        return False
    if not ca_bundle:
        return True
    try:
        return ssl.create_default_context(cafile=ca_bundle)
    except (OSError, ssl.SSLError) as exc:
        raise RegistryError(
            f"registry {url}: cannot load the CA bundle {ca_bundle} ({REGISTRY_CA_ENV}): {exc}",
            url=url,
        ) from exc


def _host_key(host: str, scheme: str) -> tuple[str, int]:
    url = httpx.URL(f"{scheme}://{host}")
    return url.host.lower(), url.port or (443 if scheme == "https" else 80)
