"""An httpx transport whose every socket operation is bounded by one overall deadline.

httpx bounds each read, not a whole request: a server that sends one byte every few seconds never
trips a read timeout and holds the caller forever. This transport runs httpcore's own connection
pools on a network backend that shortens every connect, TLS handshake, read and write to the time
left before `Deadline.at`, so an operation ends at its deadline whatever the server does.

Proxies come from the environment (HTTP_PROXY, HTTPS_PROXY, ALL_PROXY, NO_PROXY, as urllib reads
them), since a client with its own transport does not get httpx's; http and https proxies only.
"""

import ssl
import time
import urllib.request
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import httpcore
import httpx

# Most specific first: httpcore's exceptions as the httpx ones the caller handles.
_MAPPED: tuple[tuple[type[Exception], type[httpx.TransportError]], ...] = (
    (httpcore.ConnectTimeout, httpx.ConnectTimeout),
    (httpcore.ReadTimeout, httpx.ReadTimeout),
    (httpcore.WriteTimeout, httpx.WriteTimeout),
    (httpcore.PoolTimeout, httpx.PoolTimeout),
    (httpcore.TimeoutException, httpx.TimeoutException),
    (httpcore.ConnectError, httpx.ConnectError),
    (httpcore.ReadError, httpx.ReadError),
    (httpcore.WriteError, httpx.WriteError),
    (httpcore.NetworkError, httpx.NetworkError),
    (httpcore.RemoteProtocolError, httpx.RemoteProtocolError),
    (httpcore.LocalProtocolError, httpx.LocalProtocolError),
    (httpcore.ProtocolError, httpx.ProtocolError),
    (httpcore.ProxyError, httpx.ProxyError),
    (httpcore.UnsupportedProtocol, httpx.UnsupportedProtocol),
)
_KEEPALIVE_S = 5.0


class Deadline:
    """When the current operation must end (time.monotonic), or None between operations."""

    def __init__(self) -> None:
        self.at: float | None = None

    def remaining(self) -> float | None:
        return None if self.at is None else self.at - time.monotonic()

    def expired(self) -> bool:
        left = self.remaining()
        return left is not None and left <= 0

    def bound(
        self, timeout: float | None, timed_out: type[httpcore.TimeoutException]
    ) -> float | None:
        """`timeout` shortened to the time left; `timed_out` raised once none is left."""
        left = self.remaining()
        if left is None:
            return timeout
        if left <= 0:
            raise timed_out("the operation's deadline passed")
        return left if timeout is None else min(timeout, left)


class _DeadlineStream(httpcore.NetworkStream):
    def __init__(self, stream: httpcore.NetworkStream, deadline: Deadline) -> None:
        self._stream = stream
        self._deadline = deadline

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._stream.read(max_bytes, self._deadline.bound(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._stream.write(buffer, self._deadline.bound(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._stream.close()

    def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.NetworkStream:
        bounded = self._deadline.bound(timeout, httpcore.ConnectTimeout)
        return _DeadlineStream(
            self._stream.start_tls(ssl_context, server_hostname, bounded), self._deadline
        )

    def get_extra_info(self, info: str) -> Any:
        return self._stream.get_extra_info(info)


class _DeadlineBackend(httpcore.NetworkBackend):
    def __init__(self, deadline: Deadline) -> None:
        self._deadline = deadline
        self._backend = httpcore.SyncBackend()

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        # Name resolution inside connect is the one step no socket timeout reaches.
        bounded = self._deadline.bound(timeout, httpcore.ConnectTimeout)
        stream = self._backend.connect_tcp(host, port, bounded, local_address, socket_options)
        return _DeadlineStream(stream, self._deadline)

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore.NetworkStream:
        bounded = self._deadline.bound(timeout, httpcore.ConnectTimeout)
        stream = self._backend.connect_unix_socket(path, bounded, socket_options)
        return _DeadlineStream(stream, self._deadline)

    def sleep(self, seconds: float) -> None:
        self._backend.sleep(seconds)


class _ResponseStream(httpx.SyncByteStream):
    def __init__(self, stream: Iterable[bytes], request: httpx.Request) -> None:
        self._stream = stream
        self._request = request

    def __iter__(self) -> Iterator[bytes]:
        with _mapped(self._request):
            yield from self._stream

    def close(self) -> None:
        close = getattr(self._stream, "close", None)
        if close is not None:
            with _mapped(self._request):
                close()


@contextmanager
def _mapped(request: httpx.Request) -> Iterator[None]:
    try:
        yield
    except Exception as exc:
        for source, target in _MAPPED:
            if isinstance(exc, source):
                raise target(str(exc), request=request) from exc
        raise


class DeadlineTransport(httpx.BaseTransport):
    """httpx's transport on httpcore pools whose sockets obey `deadline`; proxies from the env."""

    def __init__(self, deadline: Deadline, verify: ssl.SSLContext | bool) -> None:
        self._ssl = httpx.create_ssl_context(verify=verify)
        self._backend = _DeadlineBackend(deadline)
        self._direct = httpcore.ConnectionPool(
            ssl_context=self._ssl, keepalive_expiry=_KEEPALIVE_S, network_backend=self._backend
        )
        self._proxied: dict[str, httpcore.HTTPProxy] = {}

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if not isinstance(request.stream, httpx.SyncByteStream):
            raise TypeError("DeadlineTransport sends synchronous requests only")
        pool = self._pool(request.url)
        core_request = httpcore.Request(
            method=request.method,
            url=httpcore.URL(
                scheme=request.url.raw_scheme,
                host=request.url.raw_host,
                port=request.url.port,
                target=request.url.raw_path,
            ),
            headers=request.headers.raw,
            content=request.stream,
            extensions=request.extensions,
        )
        with _mapped(request):
            response = pool.handle_request(core_request)
        return httpx.Response(
            status_code=response.status,
            headers=response.headers,
            stream=_ResponseStream(response.stream, request),
            extensions=response.extensions,
        )

    def _pool(self, url: httpx.URL) -> httpcore.ConnectionPool:
        proxies = urllib.request.getproxies_environment()
        proxy = proxies.get(url.scheme) or proxies.get("all")
        if not proxy or urllib.request.proxy_bypass_environment(url.host, proxies):
            return self._direct
        pool = self._proxied.get(proxy)
        if pool is None:
            # The proxy URL may hold its own credentials: the message never quotes it.
            unusable = httpx.ProxyError(
                f"the {url.scheme} proxy set in the environment is not an http(s) URL"
            )
            try:
                settings = httpx.Proxy(proxy)
            except (ValueError, httpx.InvalidURL):
                raise unusable from None
            if settings.url.scheme not in ("http", "https"):
                raise unusable
            pool = httpcore.HTTPProxy(
                proxy_url=httpcore.URL(
                    scheme=settings.url.raw_scheme,
                    host=settings.url.raw_host,
                    port=settings.url.port,
                    target=settings.url.raw_path,
                ),
                proxy_auth=settings.raw_auth,
                proxy_headers=settings.headers.raw,
                ssl_context=self._ssl,
                proxy_ssl_context=settings.ssl_context,
                keepalive_expiry=_KEEPALIVE_S,
                network_backend=self._backend,
            )
            self._proxied[proxy] = pool
        return pool

    def close(self) -> None:
        self._direct.close()
        for pool in self._proxied.values():
            pool.close()
