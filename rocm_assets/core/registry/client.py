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
import time
import urllib.parse
from collections.abc import Callable, Collection, Mapping
from datetime import datetime
from typing import Any, Self

import httpx

from rocm_assets.core.common.constants import (
    REGISTRY_CA_ENV,
    REGISTRY_PASSWORD_ENV,
    REGISTRY_URL_ENV,
    REGISTRY_USERNAME_ENV,
)
from rocm_assets.core.registry.errors import ImageInfo as ImageInfo, RegistryError as RegistryError
from rocm_assets.core.registry.http import RegistryHttp, Reply, base_url, tls_verify
from rocm_assets.core.registry.refs import (
    DIGEST,
    TAG,
    ForeignImageError,
    ImageRef,
    parse_challenge,
    parse_image_ref,
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

# sha512 in hex is 128 digits; anything much longer is not a digest a registry sent honestly.
_MAX_DIGEST = 200


def _push_time(value: object) -> float | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        stamp = datetime.fromisoformat(value).timestamp()
    except (ValueError, OverflowError, OSError):
        return None
    # Go's zero time (year 1) is how Zot says "unknown".
    return stamp if stamp > 0 else None


def _attempts(count: int) -> str:
    return "1 attempt" if count == 1 else f"{count} attempts"


def _retry_after(headers: httpx.Headers) -> float | None:
    value = (headers.get("Retry-After") or "").strip()
    if not value:
        return None
    if re.fullmatch(r"[0-9]{1,9}", value):
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
        return max(0.0, when.timestamp() - time.time())
    except (TypeError, ValueError, OverflowError, IndexError, OSError):
        # An HTTP date parser meets whatever a server sends; a bad value means "no advice".
        return None


class RegistryClient:
    """One client against one registry; use as a context manager.

    Each public call is one operation with an overall deadline, connect to last byte, retries,
    token fetches, redirects and pages included (`deadline`, by default connect_timeout +
    read_timeout: what one slow but honest request takes). A reply is read up to
    `max_body_bytes`, a listing up to `max_pages` pages, redirects up to `max_redirects` hops; a
    loop, a TLS failure or anything unforeseen is one RegistryError line naming the registry and
    the cause. No password or token, even one a server echoes back, appears in a message, a
    warning or a repr.

    `requests` counts every HTTP request sent (retries, redirects and token fetches included),
    so callers can measure what a sensor tick costs.
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
        deadline: float | None = None,
        retries: int = 2,
        backoff: float = 0.5,
        max_backoff: float = 10.0,
        page_size: int = 1000,
        max_pages: int = 100,
        max_body_bytes: int = 16 << 20,
        max_redirects: int = 10,
        transport: httpx.BaseTransport | None = None,
        warn: Callable[[str], None] | None = None,
    ) -> None:
        base = base_url(url)
        self.url = f"{base.scheme}://{base.netloc.decode('ascii')}"
        self.host = base.netloc.decode("ascii")
        self._scheme = base.scheme
        if (username is None) != (password is None):
            raise RegistryError(
                f"registry {self.url}: set both {REGISTRY_USERNAME_ENV} and "
                f"{REGISTRY_PASSWORD_ENV}, or neither",
                url=self.url,
            )
        self._basic = None
        # What no message may show: the password as given, URL-encoded and inside Basic; the
        # bearer tokens join as they are fetched.
        secrets: list[str] = []
        if username is not None and password is not None:
            encoded = base64.b64encode(f"{username}:{password}".encode()).decode("ascii")
            self._basic = f"Basic {encoded}"
            secrets += [s for s in (password, urllib.parse.quote(password, safe=""), encoded) if s]
        self.retries = retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.page_size = page_size
        self.max_pages = max_pages
        self._warn = warn or logger.warning
        # Bearer tokens per scope, and which scope each repository's requests were challenged for.
        self._tokens: dict[str, str] = {}
        self._scope_of: dict[str, str] = {}
        self._search: bool | None = None
        self._confirmed = False
        self._net = RegistryHttp(
            self.url,
            verify=tls_verify(self.url, verify_tls, ca_bundle),
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            deadline=connect_timeout + read_timeout if deadline is None else deadline,
            max_body_bytes=max_body_bytes,
            max_redirects=max_redirects,
            transport=transport,
            secrets=secrets,
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

    @property
    def requests(self) -> int:
        return self._net.requests

    @property
    def deadline(self) -> float:
        return self._net.deadline

    def __repr__(self) -> str:
        auth = "basic" if self._basic else "anonymous"
        return f"RegistryClient(url={self.url!r}, auth={auth!r}, requests={self.requests})"

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        self._net.close()

    # ---------------------------------------------------------------- public API

    def check(self) -> None:
        """Raise RegistryError unless GET /v2/ answers 200: reachable, a registry, authorized."""
        with self._net.operation("GET /v2/"):
            reply = self._request("GET", "/v2/", repo="", expect={200, 404})
            if reply.status == 404:
                raise self._net.error(
                    f"404 for GET /v2/: this is not an OCI registry; check {REGISTRY_URL_ENV}",
                    status=404,
                )
            self._confirmed = True

    def tags(self, repo: str) -> list[str]:
        """Every tag of `repo`, in the server's order; [] for a repository nobody pushed yet."""
        with self._net.operation(f"listing the tags of {repo}"):
            return self._tags(repo)

    def digest(self, repo: str, reference: str) -> str | None:
        """The manifest digest of `repo:reference` (a tag or a digest), or None on a 404."""
        url = f"/v2/{repo}/manifests/{reference}"
        with self._net.operation(f"HEAD {url}"):
            reply = self._request(
                "HEAD", url, repo=repo, headers={"Accept": MANIFEST_ACCEPT}, expect={200, 404}
            )
            if reply.status == 404:
                self._confirm_registry()
                return None
            digest = reply.headers.get("Docker-Content-Digest")
            if not digest:
                raise self._net.error(
                    f"HEAD {url} answered 200 without a Docker-Content-Digest header"
                )
            return self._checked_digest(digest, f"HEAD {url}")

    def repo_images(self, repo: str) -> dict[str, ImageInfo]:
        """Every tag of `repo` with its digest: one GraphQL request on Zot, else 1 + one per tag.

        A tag that tags/list names but whose manifest is 404 is left out (it cannot be pulled, so
        it is absent), and `warn` is called with a line naming it.
        """
        with self._net.operation(f"reading the images of {repo}"):
            if self._search is not False:
                images = self._search_images(repo)
                if images is not None:
                    return images
            images = {}
            for tag in self._tags(repo):
                digest = self.digest(repo, tag)
                if digest is None:
                    self._warn(
                        self._net.scrub(
                            f"registry {self.url}: {repo}:{tag} is listed by tags/list but its "
                            "manifest is 404; treating that tag as absent"
                        )
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

    def _tags(self, repo: str) -> list[str]:
        url = f"/v2/{repo}/tags/list"
        params: dict[str, str] | None = {"n": str(self.page_size)}
        found: list[str] = []
        seen: set[str] = set()
        for _ in range(self.max_pages):
            what = f"GET {self._path(url)}"
            reply = self._request("GET", url, repo=repo, params=params, expect={200, 404})
            if reply.status == 404:
                if not found:
                    self._confirm_registry()
                    return []
                # Zot answers 404 when `last` no longer exists: the tag went away mid-listing.
                raise self._net.error(
                    f"404 for {what} while paging the tags of {repo}: the tag list changed "
                    "during the listing; retry",
                    status=404,
                )
            tags = self._json(reply, what).get("tags") or []
            if not isinstance(tags, list) or not all(isinstance(tag, str) for tag in tags):
                raise self._net.error(
                    f"unexpected reply to {what}: 'tags' is not a list of strings"
                )
            bad = next((tag for tag in tags if not TAG.fullmatch(tag)), None)
            if bad is not None:
                raise self._net.error(
                    f"unexpected reply to {what}: {self._net.quote(bad)} is not a tag"
                )
            fresh = [tag for tag in tags if tag not in seen]
            found.extend(fresh)
            seen.update(fresh)
            next_link = reply.response.links.get("next", {}).get("url")
            if not next_link:
                return found
            if not fresh:
                raise self._net.error(f"{what}: the Link header does not advance the listing")
            # The Link is relative and may carry an unencoded `last`; it has its own n and last.
            url, params = self._next_page(reply, next_link, what), None
        raise self._net.error(
            f"stopped listing the tags of {repo} after {self.max_pages} pages, the page cap: "
            "the server's Link header kept advancing"
        )

    def _next_page(self, reply: Reply, link: str, what: str) -> str:
        try:
            target = reply.response.url.join(link)
        except httpx.InvalidURL:
            raise self._net.error(
                f"{what}: the Link header {self._net.quote(link)} is not a URL"
            ) from None
        # The next page carries the credentials: it must be on the registry, as the first was.
        if not self._net.is_registry(target):
            raise self._net.error(
                f"{what}: the Link header points to another server "
                f"({self._net.clip(target.host, 80)}); not followed"
            )
        return str(target)

    def _confirm_registry(self) -> None:
        # A 404 means "absent" only from a registry: a wrong URL would make everything "missing".
        if not self._confirmed:
            self.check()

    def _search_images(self, repo: str) -> dict[str, ImageInfo] | None:
        images: dict[str, ImageInfo] = {}
        offset = 0
        where = f"GraphQL ImageList for {repo}"
        for _ in range(self.max_pages):
            query = _IMAGE_LIST_QUERY % (json.dumps(repo), offset)
            # Keyed like /v2/, not by repository: a token server scopes search apart from pulls.
            reply = self._request(
                "POST", SEARCH_PATH, repo="", json_body={"query": query}, expect={200, 404, 405}
            )
            if reply.status != 200:
                self._search = False
                return None
            self._search = True
            page = self._image_list(self._json(reply, f"POST {SEARCH_PATH}"), repo)
            results = page.get("Results") or []
            if not isinstance(results, list):
                raise self._net.error(f"{where}: Results is not a list")
            offset += len(results)
            for item in results:
                tag = item.get("Tag") if isinstance(item, dict) else None
                digest = item.get("Digest") if isinstance(item, dict) else None
                if not isinstance(tag, str) or not isinstance(digest, str) or not digest:
                    raise self._net.error(f"{where} returned an entry without a digest")
                if not TAG.fullmatch(tag):
                    raise self._net.error(f"{where}: {self._net.quote(tag)} is not a tag")
                if item.get("RepoName", repo) == repo:
                    digest = self._checked_digest(digest, where)
                    images[tag] = ImageInfo(tag, digest, _push_time(item.get("PushTimestamp")))
            # limit 0 returns everything; page on only if a server capped the reply anyway.
            counts = page.get("Page")
            total = counts.get("TotalCount") if isinstance(counts, dict) else None
            if not results or not isinstance(total, int) or offset >= total:
                return images
        raise self._net.error(f"stopped reading the {where} after {self.max_pages} pages, the cap")

    def _image_list(self, data: dict[str, Any], repo: str) -> dict[str, Any]:
        errors = data.get("errors")
        if errors:
            first = errors[0] if isinstance(errors, list) else errors
            message = first.get("message") if isinstance(first, dict) else first
            raise self._net.error(
                f"GraphQL ImageList for {repo} failed: {self._net.clip(str(message))}"
            )
        payload = data.get("data")
        page = payload.get("ImageList") if isinstance(payload, dict) else None
        if not isinstance(page, dict):
            raise self._net.error(f"unexpected reply to POST {SEARCH_PATH}: no data.ImageList")
        return page

    def _checked_digest(self, digest: str, what: str) -> str:
        if len(digest) > _MAX_DIGEST or not DIGEST.fullmatch(digest):
            raise self._net.error(f"{what}: {self._net.quote(digest)} is not a digest")
        return digest

    def _json(self, reply: Reply, what: str) -> dict[str, Any]:
        try:
            data = json.loads(reply.body)
        except (ValueError, RecursionError) as exc:
            # RecursionError: a reply nested thousands deep, which json cannot descend.
            raise self._net.error(
                f"malformed JSON in the reply to {what}: {self._net.clip(str(exc))}"
            ) from self._net.safe_cause(exc)
        if not isinstance(data, dict):
            raise self._net.error(f"unexpected reply to {what}: not a JSON object")
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
    ) -> Reply:
        """Send with auth and bounded retries; return a reply whose status is in `expect`."""
        what = f"{method} {self._path(url, query=False)}"
        attempt = 0
        token_fetched = False
        while True:
            attempt += 1
            if self._net.expired():
                raise self._net.past_deadline(what)
            try:
                reply = self._net.exchange(
                    method,
                    url,
                    what,
                    params=params,
                    headers={**self._auth_headers(repo), **(headers or {})},
                    json_body=json_body,
                )
            except httpx.HTTPError as exc:
                cause = self._net.safe_cause(exc)
                final = self._net.final_failure(exc, what)
                if final is not None:
                    raise final from cause
                if attempt <= self.retries and self._net.pause(self._backoff(attempt)):
                    continue
                if isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout)):
                    raise self._net.error(
                        f"cannot connect for {what} after {_attempts(attempt)} "
                        f"({self._net.clip(str(exc))}); is the registry running and the URL right?",
                        transient=True,
                    ) from cause
                raise self._net.error(
                    f"{what} failed after {_attempts(attempt)}: {self._net.clip(str(exc))}",
                    transient=True,
                ) from cause
            status = reply.status
            if status == 401 and not token_fetched:
                challenge = self._bearer_challenge(reply)
                if challenge is not None:
                    self._fetch_token(challenge, repo)
                    token_fetched = True
                    attempt -= 1
                    continue
            if (status == 429 or status >= 500) and attempt <= self.retries:
                delay = max(_retry_after(reply.headers) or 0.0, self._backoff(attempt))
                # A server asking for a long pause gets the error now; the next tick retries.
                if delay <= self.max_backoff and self._net.pause(delay):
                    continue
            if status in expect:
                return reply
            raise self._status_error(reply, what, attempt)

    def _path(self, url: str, *, query: bool = True) -> str:
        # A Link can name any path: it is quoted like any other server value.
        parsed = httpx.URL(url)
        return self._net.clip(
            parsed.raw_path.decode("ascii", "replace") if query else parsed.path, 120
        )

    def _backoff(self, attempt: int) -> float:
        return min(self.max_backoff, self.backoff * 2 ** (attempt - 1))

    def _bearer_challenge(self, reply: Reply) -> dict[str, str] | None:
        for header in reply.headers.get_list("WWW-Authenticate"):
            scheme, params = parse_challenge(header)
            if scheme == "bearer" and params.get("realm"):
                return params
        return None

    def _fetch_token(self, challenge: dict[str, str], repo: str) -> None:
        realm = challenge["realm"]
        named = self._net.clip(realm, 120)
        try:
            realm_url = httpx.URL(realm)
        except httpx.InvalidURL:
            raise self._net.error(f"the token realm {named} is not a URL") from None
        if realm_url.scheme not in ("http", "https") or not realm_url.host:
            raise self._net.error(f"the token realm {named} is not an http(s) URL")
        params = {key: challenge[key] for key in ("service", "scope") if key in challenge}
        headers = {"Authorization": self._basic} if self._basic else {}
        what = f"GET {named}"
        try:
            reply = self._net.exchange("GET", realm_url, what, params=params, headers=headers)
        except httpx.HTTPError as exc:
            cause = self._net.safe_cause(exc)
            if self._net.expired():
                raise self._net.past_deadline(what) from cause
            raise self._net.error(
                f"cannot get a token from {named}: {self._net.clip(str(exc))}"
            ) from cause
        if reply.status in (401, 403):
            raise self._net.error(
                f"the token server {named} refused the credentials ({reply.status}); "
                f"{_CREDENTIALS_HINT}",
                status=reply.status,
            )
        if reply.status != 200:
            raise self._net.error(
                f"the token server {named} answered {reply.status}", status=reply.status
            )
        data = self._json(reply, what)
        token = data.get("token") or data.get("access_token")
        if not isinstance(token, str) or not token:
            raise self._net.error(f"the token server {named} returned no token")
        self._net.add_secret(token)
        scope = challenge.get("scope", "")
        self._tokens[scope] = token
        self._scope_of[repo] = scope

    def _status_error(self, reply: Reply, what: str, attempts: int) -> RegistryError:
        status = reply.status
        reason = self._net.clip(reply.response.reason_phrase, 60) or "error"
        if status == 401:
            if "Authorization" in reply.response.request.headers:
                cause = f"the credentials were rejected; {_CREDENTIALS_HINT}"
            else:
                cause = (
                    f"the registry needs credentials; set {REGISTRY_USERNAME_ENV}/"
                    f"{REGISTRY_PASSWORD_ENV}"
                )
        elif status == 403:
            cause = f"a proxy may be answering for {self.host}; make sure no_proxy covers it"
        elif status == 429:
            wait = _retry_after(reply.headers)
            cause = f"rate limited after {_attempts(attempts)}" + (
                f" (Retry-After {wait:.0f} s)" if wait is not None else ""
            )
        elif status >= 500:
            cause = f"server error after {_attempts(attempts)}"
        else:
            cause = "unexpected status"
        return self._net.error(
            f"{status} {reason} for {what}: {cause}",
            status=status,
            transient=status >= 500 or status == 429,
        )


def _host_key(host: str, scheme: str) -> tuple[str, int]:
    url = httpx.URL(f"{scheme}://{host}")
    return url.host.lower(), url.port or (443 if scheme == "https" else 80)
