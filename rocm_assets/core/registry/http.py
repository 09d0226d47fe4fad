"""The HTTP half of the registry client: bounded exchanges with a server that may be hostile.

One `RegistryHttp` per client. Each public client call runs inside `operation`, which starts the
overall deadline the transport enforces on every socket operation (`deadline_http`) and turns
anything unforeseen into a `RegistryError`. `exchange` sends one request, follows redirects by
hand (hops capped, a loop named as one, credentials never forwarded to another origin), and reads
the body up to a size cap. Every error goes through `error`, which removes the registry password,
its encodings and the bearer tokens from the message, whatever a server echoed back; `operation`
removes them from the exceptions an error leaving it carries as its cause or context.
"""

import ssl
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

import httpx

from rocm_assets.core.common.constants import (
    REGISTRY_CA_ENV,
    REGISTRY_PASSWORD_ENV,
    REGISTRY_USERNAME_ENV,
)
from rocm_assets.core.common.text import bounded, shown
from rocm_assets.core.registry.deadline import Deadline, DeadlineTransport
from rocm_assets.core.registry.errors import RegistryError as RegistryError


@dataclass(frozen=True)
class Reply:
    """A response, closed, with its body read under the cap (empty for HEAD)."""

    response: httpx.Response
    body: bytes

    @property
    def status(self) -> int:
        return self.response.status_code

    @property
    def headers(self) -> httpx.Headers:
        return self.response.headers


class RegistryHttp:
    """Bounded HTTP exchanges with one registry (see the module docstring).

    `secrets` is the list of strings no message may show; the client appends tokens to it.
    """

    def __init__(
        self,
        url: str,
        *,
        verify: ssl.SSLContext | bool,
        connect_timeout: float,
        read_timeout: float,
        deadline: float,
        max_body_bytes: int,
        max_redirects: int,
        transport: httpx.BaseTransport | None,
        secrets: list[str],
    ) -> None:
        self.url = url
        self.deadline = deadline
        self.max_body_bytes = max_body_bytes
        self.max_redirects = max_redirects
        self.requests = 0
        self._secrets = secrets
        self._deadline = Deadline()
        # The transport is driven directly, not through httpx.Client: the client would log each
        # reply's status line (a hostile reason phrase can carry the password) and keep cookies.
        self._transport = transport or DeadlineTransport(self._deadline, verify)
        self._base = httpx.URL(url)
        self._timeout = httpx.Timeout(read_timeout, connect=connect_timeout).as_dict()

    def close(self) -> None:
        self._transport.close()

    @contextmanager
    def operation(self, what: str) -> Iterator[None]:
        """One public call: its deadline starts here, and only RegistryError leaves it."""
        if self._deadline.at is not None:
            yield  # nested (repo_images calling digest): the outer operation's rules hold
            return
        self._deadline.at = time.monotonic() + self.deadline
        try:
            yield
        except RegistryError as exc:
            self._scrub_chain(exc)
            raise
        except Exception as exc:
            self._scrub_chain(exc)
            # The boundary: a library surprise or a bug is still one line naming the registry.
            raise self.error(
                f"{what} failed unexpectedly: {type(exc).__name__}: {self.clip(str(exc))}"
            ) from self.safe_cause(exc)
        finally:
            self._deadline.at = None

    def expired(self) -> bool:
        return self._deadline.expired()

    def pause(self, seconds: float) -> bool:
        """Sleep before a retry if the deadline leaves time for one; False when it does not."""
        left = self._deadline.remaining()
        if left is not None and seconds >= left:
            return False
        time.sleep(seconds)
        return True

    def is_registry(self, url: httpx.URL) -> bool:
        """Whether `url` is on the registry itself (the only server credentials go to)."""
        return _origin(url) == _origin(httpx.URL(self.url))

    # ---------------------------------------------------------------- one exchange

    def exchange(
        self,
        method: str,
        url: str | httpx.URL,
        what: str,
        *,
        headers: Mapping[str, str],
        params: Mapping[str, str] | None = None,
        json_body: object = None,
    ) -> Reply:
        """One request, its redirects followed by hand (capped, loops named), its body capped.

        Raises:
            httpx.HTTPError: transport failures, for the caller to retry or word.
            RegistryError: a redirect loop, too many hops, an oversized or encoded body.
        """
        target = self._base.join(url)
        if params:
            target = target.copy_merge_params(dict(params))
        request = self._build(method, target, headers, json_body=json_body)
        hops = [request.url]
        while True:
            # A server echoing the password into a redirect, Link or realm URL would have this
            # client send it on, to wherever that URL points: refused instead.
            if self._leaks(str(request.url)):
                raise self.error(f"{what}: the server sent a URL that carries the credentials")
            self.requests += 1
            response = self._transport.handle_request(request)
            response.request = request
            try:
                if not response.has_redirect_location:
                    body = b"" if method == "HEAD" else self._read_body(response, what)
                    return Reply(response, body)
                request = self._redirected(request, response, what, hops)
            finally:
                response.close()

    def _redirected(
        self, request: httpx.Request, response: httpx.Response, what: str, hops: list[httpx.URL]
    ) -> httpx.Request:
        location = response.headers["Location"]
        try:
            target = response.url.join(location)
        except httpx.InvalidURL:
            raise self.error(
                f"{what} was redirected to {self.quote(location)}, not a URL"
            ) from None
        if target.scheme not in ("http", "https") or not target.host:
            raise self.error(f"{what} was redirected to {self.quote(location)}, not an http(s) URL")
        if target in hops:
            trail = " -> ".join(self.clip(str(hop), 80) for hop in [*hops, target][-4:])
            raise self.error(f"redirect loop for {what}: {trail}")
        if len(hops) > self.max_redirects:
            raise self.error(
                f"more than {self.max_redirects} redirects for {what} "
                f"(the last to {self.clip(str(target), 80)})"
            )
        hops.append(target)
        method = request.method
        if (response.status_code == 303 and method != "HEAD") or (
            response.status_code in (301, 302) and method == "POST"
        ):
            method = "GET"
        headers = request.headers.copy()
        for stale in ("Host", "Content-Length", "Content-Type"):
            headers.pop(stale, None)
        # Credentials go to the server they were meant for, never to where it redirects.
        if _origin(target) != _origin(request.url):
            headers.pop("Authorization", None)
        content = None
        if method == "POST":
            content = request.content
            headers["Content-Type"] = request.headers.get("Content-Type", "application/json")
        return self._build(method, target, headers, content=content)

    def _read_body(self, response: httpx.Response, what: str) -> bytes:
        encoding = response.headers.get("Content-Encoding", "").strip().lower()
        if encoding not in ("", "identity"):
            raise self.error(
                f"the reply to {what} is {self.quote(encoding)}-encoded; identity was asked for"
            )
        too_big = f"the reply to {what} is larger than {_size(self.max_body_bytes)}, the cap"
        declared = response.headers.get("Content-Length", "").strip()
        if declared.isascii() and declared.isdigit() and int(declared[:20]) > self.max_body_bytes:
            raise self.error(too_big)
        body = bytearray()
        for chunk in response.iter_raw():
            body += chunk
            if len(body) > self.max_body_bytes:
                raise self.error(f"{too_big}; stopped reading")
        return bytes(body)

    def _build(
        self,
        method: str,
        url: httpx.URL,
        headers: Mapping[str, str],
        *,
        json_body: object = None,
        content: bytes | None = None,
    ) -> httpx.Request:
        return httpx.Request(
            method,
            url,
            # Compressed replies would be inflated past the body cap before it could apply.
            headers={"User-Agent": "rocm-assets", "Accept-Encoding": "identity", **headers},
            json=json_body,
            content=content,
            extensions={"timeout": self._timeout},
        )

    # ---------------------------------------------------------------- errors

    def error(
        self, cause: str, *, status: int | None = None, transient: bool = False
    ) -> RegistryError:
        """`registry <url>: <cause>` with every secret removed."""
        return RegistryError(
            self.scrub(f"registry {self.url}: {cause}"),
            url=self.url,
            status=status,
            transient=transient,
        )

    def safe_cause(self, exc: BaseException) -> BaseException | None:
        """`exc`, to chain an error to, unless something in its chain holds a secret."""
        return None if self._leaks(_chain_text(exc)) else exc

    def past_deadline(self, what: str) -> RegistryError:
        return self.error(
            f"{what} did not finish within the {self.deadline:g} s deadline of this operation "
            "(connect to last byte, retries and pages included): the registry answers too slowly"
        )

    def final_failure(self, exc: httpx.HTTPError, what: str) -> RegistryError | None:
        """The error for a transport failure that retrying cannot mend, else None."""
        if self._deadline.expired():
            return self.past_deadline(what)
        tls = tls_failure(exc)
        if tls is not None:
            # A certificate does not fix itself in a second: never retried.
            return self.error(f"TLS failure with {_host(self.url)} for {what}: {tls}")
        if isinstance(exc, httpx.TimeoutException) and not isinstance(exc, httpx.ConnectTimeout):
            # A read timeout is not retried: the server is up but slow, and a sensor tick
            # should fail in one timeout, not several.
            return self.error(f"timed out waiting for the reply to {what} ({self.clip(str(exc))})")
        if not isinstance(exc, httpx.TransportError):
            return self.error(f"{what} failed: {type(exc).__name__}: {self.clip(str(exc))}")
        return None

    def quote(self, value: str) -> str:
        """A server's value as a message quotes it: secrets removed first, then shortened."""
        return shown(self.scrub(value))

    def clip(self, text: str, limit: int = 200) -> str:
        """Server-provided text on one short line, secrets removed before it is cut."""
        return bounded(self.scrub(text), limit)

    def add_secret(self, secret: str) -> None:
        self._secrets.append(secret)

    def scrub(self, text: str) -> str:
        for secret in sorted(self._secrets, key=len, reverse=True):
            text = text.replace(secret, "***")
        return text

    def _scrub_chain(self, exc: BaseException) -> None:
        """Scrub the secrets from the messages of `exc` and of what it was raised from or while
        handling, in place: an error raised in an `except` keeps that exception as `__context__`
        even `from None` (a reason phrase echoing the password reached h11's "illegal status
        line" that way)."""
        for current in _chain(exc):
            current.args = tuple(self.scrub(a) if isinstance(a, str) else a for a in current.args)
            if isinstance(current, OSError) and isinstance(current.strerror, str):
                # OSError's message is its strerror, set from the args when it was made.
                current.strerror = self.scrub(current.strerror)

    def _leaks(self, text: str) -> bool:
        return any(secret in text for secret in self._secrets)


def base_url(url: str) -> httpx.URL:
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
        raise RegistryError(f"bad registry URL {shown(text)}: {exc}") from exc
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise RegistryError(
            f"bad registry URL {shown(text)}: expected http(s)://host[:port], "
            "e.g. https://zot.example:5000"
        )
    if parsed.path not in ("", "/") or parsed.query or parsed.fragment:
        raise RegistryError(
            f"bad registry URL {shown(text)}: the registry must be at the root, no path"
        )
    return parsed


def tls_verify(url: str, verify_tls: bool, ca_bundle: str | None) -> ssl.SSLContext | bool:
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


def tls_failure(exc: BaseException) -> str | None:
    """The TLS reason behind a transport error (certificate, handshake), or None if not TLS."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, ssl.SSLCertVerificationError):
            reason = current.verify_message or current.reason or "not trusted"
            return (
                f"the server's certificate is not trusted ({bounded(str(reason), 120)}); set "
                f"{REGISTRY_CA_ENV} to the CA that signed it, or fix the host in the URL"
            )
        if isinstance(current, ssl.SSLError):
            reason = current.reason or str(current)
            return (
                f"the TLS handshake failed ({bounded(str(reason), 120)}); "
                "does this port serve https?"
            )
        current = current.__cause__ or current.__context__
    return None


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """`exc` and what it was raised from or while handling, each once."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _chain_text(exc: BaseException) -> str:
    return " ".join(f"{current!s} {current.args!r}" for current in _chain(exc))


def _origin(url: httpx.URL) -> tuple[str, str, int | None]:
    return url.scheme, url.host.lower(), url.port


def _host(url: str) -> str:
    return httpx.URL(url).netloc.decode("ascii")


def _size(count: int) -> str:
    return f"{count / (1 << 20):g} MiB" if count >= 1 << 20 else f"{count} bytes"
