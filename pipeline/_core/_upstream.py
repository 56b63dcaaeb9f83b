"""The upstream transport: how a request a dialect describes reaches its provider. Sans-I/O types.

A dialect describes its request (`HttpRequest`: method, URL, headers, a body, and for a
provider that streams over a socket the client messages to send) without knowing what carries
it. An `Upstream` carries it: `open` sends the request and returns an `Exchange`, whose
`status` and `headers` are known at once and whose `receive` hands over the reply piece by
piece: the body's bytes as they arrive (HTTP, a replay file, a subprocess's stdout), or one
whole message per call (a WebSocket), as the dialect's framing says. `aclose` ends the exchange
at any point, even while the caller is being cancelled.

The handler speaks only this protocol. HTTP on httpx is the default implementation
(`rillet.transports.upstream.HttpUpstream`, which also wraps any `httpx.AsyncClient` a caller
passes); WebSocket, replay and in-memory upstreams implement it too, and so may an
application's own (a model served by a local process, a message bus).

A transport reports its own failures (refused, reset, cut off, a broken protocol) as
`UpstreamError`; the handler turns each into a transport-shaped `TransportError` for the
provider. A reply the provider sends (any status, any bytes) is never an `UpstreamError`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from ._errors import UpstreamError

if TYPE_CHECKING:
    from collections.abc import Awaitable, Mapping

    from ._dialect import HttpRequest

__all__ = ["Exchange", "Upstream", "upstream_error"]


class Exchange(Protocol):
    """One request in flight: the reply's status and headers, then its pieces.

    A fast path, optional: an exchange whose `receive` is its transport's own call (no frame of
    its own per read) may let that transport's exceptions out, if it names them in a
    `failures` tuple and turns each into an `UpstreamError` with `failure(exc)`.

    Also optional: `async def finish()`, called when the reply has said it is complete before
    its body ended, to read the body's end if it comes at once (HTTP keeps the connection for
    the next request); bounded, it never raises.
    """

    @property
    def status(self) -> int:
        """The reply's status (HTTP's numbers; a transport without statuses says 200)."""
        ...

    @property
    def headers(self) -> Mapping[str, str]:
        """The reply's headers, names lower-cased."""
        ...

    def receive(self) -> Awaitable[bytes]:
        """(Awaited) the next piece of the reply: bytes of a byte stream, or one whole message of a
        message transport; `b""` once the reply has ended. Raises `UpstreamError` when the
        transport fails."""
        ...

    async def aclose(self) -> None:
        """Stop: the rest of the reply is never read. Safe to call twice and while cancelled;
        never raises."""
        ...


class Upstream(Protocol):
    """What carries a turn's requests to its provider (HTTP, WebSocket, a replay, a process)."""

    async def open(self, request: HttpRequest) -> Exchange:
        """Send `request`; return the exchange once the reply's head has come. Raises
        `UpstreamError` when the transport fails. Cancelling it leaves nothing open."""
        ...

    async def aclose(self) -> None:
        """Release what the upstream holds (connections, processes)."""
        ...


def upstream_error(exchange: object, exc: BaseException) -> UpstreamError | None:
    """`exc` as an `UpstreamError`: itself, or one of the exchange's own `failures` made one;
    None for anything else (not the transport's failure: let it be)."""
    if isinstance(exc, UpstreamError):
        return exc
    failures: tuple[type[BaseException], ...] = getattr(exchange, "failures", ())
    if failures and isinstance(exc, failures):
        error: UpstreamError = exchange.failure(exc)  # type: ignore[attr-defined]
        return error
    return None
