"""An in-memory upstream: scripted replies, no socket. For sans-network tests and for embedding
a provider that lives in the same process."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs
import trio
from rillet._core._dialect import HttpRequest

__all__ = ["MemoryExchange", "MemoryReply", "MemoryUpstream"]


@attrs.frozen
class MemoryReply:
    """One scripted reply.

    Attributes:
        pieces: the reply's pieces, in order (body chunks, or whole messages).
        status: its status.
        headers: its headers (names are lower-cased on the way out).
        delay: seconds before each piece (`trio.sleep`, so a mock clock drives it).
    """

    pieces: Sequence[bytes] = ()
    status: int = 200
    headers: Mapping[str, str] = attrs.field(factory=dict)
    delay: float = 0.0


class MemoryExchange:
    """A reply played from memory, paced by its delay.

    Attributes:
        read: how many pieces it has handed over.
        closed: whether it was closed.
    """

    __slots__ = ("_delay", "_headers", "_pieces", "closed", "read", "status")

    def __init__(
        self, pieces: Sequence[bytes], status: int, headers: Mapping[str, str], delay: float
    ) -> None:
        self._pieces = pieces
        self.read = 0
        self._delay = delay
        self.status = status
        self._headers = {k.lower(): v for k, v in headers.items()}
        self.closed = False

    @property
    def headers(self) -> Mapping[str, str]:
        """The reply's headers, names lower-cased."""
        return self._headers

    async def receive(self) -> bytes:
        """The next piece; `b""` after the last, or once closed."""
        if self.closed or self.read >= len(self._pieces):
            return b""
        if self._delay:
            await trio.sleep(self._delay)
        piece = self._pieces[self.read]
        self.read += 1
        return piece

    async def aclose(self) -> None:
        """Nothing more is read."""
        self.closed = True


@attrs.define(eq=False)
class MemoryUpstream:
    """Answers request n with `replies[n]` (the last one repeats) and keeps every request.

    Attributes:
        replies: the script.
        requests: the requests it was sent, in order.
        exchanges: the exchanges it opened (each says whether it was closed).
    """

    replies: Sequence[MemoryReply]
    requests: list[HttpRequest] = attrs.field(factory=list)
    exchanges: list[MemoryExchange] = attrs.field(factory=list)

    def __attrs_post_init__(self) -> None:
        if not self.replies:
            raise ValueError("a MemoryUpstream needs at least one reply")

    async def open(self, request: HttpRequest) -> MemoryExchange:
        """The next scripted reply."""
        self.requests.append(request)
        reply = self.replies[min(len(self.requests), len(self.replies)) - 1]
        exchange = MemoryExchange(reply.pieces, reply.status, reply.headers, reply.delay)
        self.exchanges.append(exchange)
        await trio.lowlevel.checkpoint()
        return exchange

    async def aclose(self) -> None:
        """Nothing to release."""
