"""An httpx transport on which a whole request ends by one deadline, not by httpx's per-phase timeouts.

httpx's timeouts bound each socket wait, and a read's limit starts again with every chunk: an endpoint that
trickles a byte at a time (in its headers or its body) holds a request for as long as it likes. Here every socket
wait (connect, TLS, each write, each read) is cut to the time left before the deadline set by `within()` for the
calling thread, so the request fails with a timeout at that deadline whatever the endpoint sends.
"""

from __future__ import annotations

import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import httpcore
import httpx

_local = threading.local()


@contextmanager
def within(deadline: float) -> Iterator[None]:
    """Requests this thread makes in the block through a DeadlineTransport end by `deadline` (time.monotonic())."""
    previous = getattr(_local, "deadline", None)
    _local.deadline = deadline
    try:
        yield
    finally:
        _local.deadline = previous


def _left(timeout: float | None, error: type[httpcore.TimeoutException]) -> float | None:
    deadline = getattr(_local, "deadline", None)
    if deadline is None:
        return timeout
    left = deadline - time.monotonic()
    if left <= 0:
        raise error("the request's deadline passed")
    return left if timeout is None else min(timeout, left)


class _Stream(httpcore.NetworkStream):
    def __init__(self, inner: httpcore.NetworkStream) -> None:
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, _left(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, _left(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, ssl_context: Any, server_hostname: str | None = None,
                  timeout: float | None = None) -> httpcore.NetworkStream:
        return _Stream(self._inner.start_tls(ssl_context, server_hostname, _left(timeout, httpcore.ConnectTimeout)))

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _Backend(httpcore.NetworkBackend):
    def __init__(self) -> None:
        self._inner = httpcore.SyncBackend()

    def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                    socket_options: Iterable[Any] | None = None) -> httpcore.NetworkStream:
        return _Stream(self._inner.connect_tcp(host, port, _left(timeout, httpcore.ConnectTimeout), local_address,
                                               socket_options))

    def connect_unix_socket(self, path: str, timeout: float | None = None,
                            socket_options: Iterable[Any] | None = None) -> httpcore.NetworkStream:
        return _Stream(self._inner.connect_unix_socket(path, _left(timeout, httpcore.ConnectTimeout), socket_options))

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


class DeadlineTransport(httpx.HTTPTransport):
    """httpx's own transport (its error mapping, pooling and TLS) over a connection pool whose sockets honour
    `within()`. httpx takes no network backend, so the pool it made is replaced by one that does."""

    def __init__(self, max_connections: int = 100) -> None:
        super().__init__()
        if not isinstance(self._pool, httpcore.ConnectionPool):  # an httpx whose internals moved: say so, never go unbounded
            raise TypeError(f"httpx.HTTPTransport holds a {type(self._pool).__name__}, not a ConnectionPool")
        # httpx's own limits (httpx.Limits' defaults), with room for every caller allowed at once: a caller waiting
        # for a pooled connection would wait out its deadline instead of being refused at once.
        self._pool = httpcore.ConnectionPool(
            ssl_context=httpx.create_ssl_context(), max_connections=max(max_connections, 100),
            max_keepalive_connections=20, keepalive_expiry=5.0, network_backend=_Backend())


def proxied(url: str) -> bool:
    """Whether the environment routes requests to `url` through a proxy (HTTPS_PROXY, HTTP_PROXY, ALL_PROXY, less
    NO_PROXY): httpx uses such a proxy only with its own transport, so a DeadlineTransport must not replace it."""
    parts = urllib.parse.urlsplit(url)
    proxies = urllib.request.getproxies()
    if not (proxies.get(parts.scheme) or proxies.get("all")):
        return False
    return not urllib.request.proxy_bypass(parts.hostname or "")
