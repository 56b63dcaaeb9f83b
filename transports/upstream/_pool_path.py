"""The short way to a plain httpx client's connection pool, for the requests a turn sends.

`httpx.AsyncClient.send` runs a request through layers a turn's request does not need when the
client is plain (no auth, no event hooks, no cookies yet, no mounts or proxies, no redirects
followed): it parses the URL and merges headers into a new `httpx.Request`, runs the auth and
redirect flows, picks a transport, and that transport turns the request into an
`httpcore.Request` for its pool. Those layers cost more than the rest of a turn's start put
together. `PoolPath` builds the `httpcore.Request` itself, with the very header list httpx
would have built (the client's default headers, the request's over them, `Host` first and
`Content-Length` last), and hands it to the pool of the client's own transport: the same
connections, the same bytes on the wire, the same httpx exceptions (httpx's own mapping), the
same cookies kept and the same `httpx` log line.

A client that is not plain takes `AsyncClient.send` as before (`PoolPath.of` says None). A
client whose transport is an `ObservedTransport` over httpx's own is plain: the short way
reports each request's status to it as the transport would have.
"""

from __future__ import annotations

import functools
import logging
from typing import TYPE_CHECKING, Any

import httpx

from ._observed import ObservedTransport

try:  # httpx's own pieces of its transport: without them, every request takes `send`
    from httpx._transports import default as _httpx_transport
except ImportError:  # pragma: no cover - an httpx that moved them
    _httpx_transport = None  # type: ignore[assignment]
AsyncResponseStream: Any = getattr(_httpx_transport, "AsyncResponseStream", None)
map_httpcore_exceptions: Any = getattr(_httpx_transport, "map_httpcore_exceptions", None)


if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

__all__ = ["PoolPath"]

_logger = logging.getLogger("httpx")  # the logger `AsyncClient.send` writes its line to


@functools.lru_cache(maxsize=256)
def _target(url: str) -> tuple[Any, bytes] | None:
    """The pool's URL for `url` and its `Host` header, as httpx parses them; None for a URL
    httpx would treat otherwise (credentials in it, a scheme other than HTTP)."""
    parsed = httpx.URL(url)
    if parsed.userinfo or parsed.scheme not in ("http", "https") or not parsed.host:
        return None
    import httpcore

    pool_url = httpcore.URL(
        scheme=parsed.raw_scheme, host=parsed.raw_host, port=parsed.port, target=parsed.raw_path
    )
    return pool_url, parsed.netloc


class PoolPath:
    """Requests straight to a plain client's pool (see the module's docstring)."""

    __slots__ = ("_client", "_limits", "_observe", "_pool", "_timeout")

    def __init__(
        self,
        client: httpx.AsyncClient,
        pool: Any,
        observe: Callable[[str, int | None], object] | None = None,
    ) -> None:
        self._client = client
        self._pool = pool
        self._observe = observe  # an `ObservedTransport`'s report
        self._limits: httpx.Timeout | None = None
        self._timeout: dict[str, float | None] = {}

    def _timeouts(self) -> dict[str, float | None]:
        """The client's connect, write and pool timeouts, with no read timeout (as
        `HttpUpstream` asks of `send`)."""
        limits = self._client.timeout
        if limits is not self._limits:
            self._limits = limits
            self._timeout = httpx.Timeout(
                None, connect=limits.connect, write=limits.write, pool=limits.pool
            ).as_dict()
        return self._timeout

    @classmethod
    def of(cls, client: httpx.AsyncClient) -> PoolPath | None:
        """The short way for `client`, or None when its requests need `AsyncClient.send`."""
        if map_httpcore_exceptions is None or AsyncResponseStream is None:
            return None
        transport = getattr(client, "_transport", None)
        observe = None
        if type(transport) is ObservedTransport:  # its reports are made here instead
            observe, transport = transport.observe, transport.inner
        if type(transport) is not httpx.AsyncHTTPTransport:
            return None
        pool = getattr(transport, "_pool", None)
        hooks = client.event_hooks
        if (
            pool is None
            or getattr(client, "_mounts", None)
            or client.auth is not None
            or client.follow_redirects
            or hooks.get("request")
            or hooks.get("response")
            or client.is_closed
        ):
            return None
        return cls(client, pool, observe)

    def usable(self, url: str) -> bool:
        """Whether a request to `url` may take the short way now (a cookie the client has
        been given since must be sent, which `AsyncClient.send` does)."""
        client = self._client
        return not client.cookies.jar and not client.is_closed and _target(url) is not None

    def headers(
        self, method: str, url: str, headers: Mapping[str, str], body: bytes
    ) -> list[tuple[bytes, bytes]]:
        """The header list httpx's `build_request` would make for this request."""
        target = _target(url)
        assert target is not None
        given = {k.lower() for k in headers}
        defaults = self._client.headers.raw
        merged = [(k, v) for k, v in defaults if k.decode("latin-1").lower() not in given]
        merged += [(k.encode("ascii"), v.encode("ascii")) for k, v in headers.items()]
        names = {k.lower() for k, _ in merged}
        if body and b"content-length" not in names:
            merged.append((b"Content-Length", str(len(body)).encode("ascii")))
        auto: list[tuple[bytes, bytes]] = []
        if b"host" not in names:
            auto.append((b"Host", target[1]))
        if (
            not body
            and b"content-length" not in names
            and b"transfer-encoding" not in names
            and method.upper() in ("POST", "PUT", "PATCH")
        ):
            auto.append((b"Content-Length", b"0"))
        return auto + merged

    async def send(
        self, method: str, url: str, headers: Mapping[str, str], body: bytes
    ) -> httpx.Response:
        """Send the request through the pool; the response, its body not read yet."""
        import httpcore

        target = _target(url)
        assert target is not None
        assert map_httpcore_exceptions is not None
        assert AsyncResponseStream is not None
        request = httpcore.Request(
            method=method.upper().encode("ascii"),
            url=target[0],
            headers=self.headers(method, url, headers, body),
            content=body,
            extensions={"timeout": self._timeouts()},
        )
        observe = self._observe
        try:
            with map_httpcore_exceptions():
                reply = await self._pool.handle_async_request(request)
        except BaseException:
            if observe is not None:
                observe(url, None)
            raise
        if observe is not None:
            observe(url, reply.status)
        response = httpx.Response(
            status_code=reply.status,
            headers=reply.headers,
            stream=AsyncResponseStream(reply.stream),
            extensions=reply.extensions,
        )
        if "set-cookie" in response.headers:  # kept as `AsyncClient.send` keeps them
            response.request = self._client.build_request(method, url, headers=headers)
            self._client.cookies.extract_cookies(response)
        if _logger.isEnabledFor(logging.INFO):
            _logger.info(
                'HTTP Request: %s %s "%s %d %s"',
                method.upper(),
                httpx.URL(url),
                response.http_version,
                response.status_code,
                response.reason_phrase,
            )
        return response
