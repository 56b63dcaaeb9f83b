"""Reading an exchange off the hot path: a whole body under a cap, a non-streaming reply
through its decoder, and an exchange's pieces with the ones a hedged race already read first.

The streaming loop calls `Exchange.receive` itself (and catches the exchange's own `failures`);
these helpers make those failures `UpstreamError`s, so their callers catch one type.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._errors import FrameTooLarge
from ._upstream import upstream_error

if TYPE_CHECKING:
    from ._events import UniEvent
    from ._upstream import Exchange
    from ._wire import WireDecoder

__all__ = ["Replay", "read_bounded", "read_reply", "receive"]


class Replay:
    """An exchange's pieces with the ones already read (by a hedged race's winner) first."""

    __slots__ = ("_pending", "_response")

    def __init__(self, pending: list[bytes], response: Exchange) -> None:
        self._pending = pending
        self._response = response

    async def receive(self) -> bytes:
        """The next piece: a pending one first."""
        if self._pending:
            return self._pending.pop(0)
        return await self._response.receive()


async def read_bounded(response: Exchange, limit: int, provider: str) -> bytes:
    """The whole reply (an error body), refused (`FrameTooLarge`) once it grows past `limit`
    bytes: the rest is never read."""
    parts: list[bytes] = []
    size = 0
    while part := await receive(response):
        size += len(part)
        if size > limit:
            raise FrameTooLarge(limit, size, provider=provider)
        parts.append(part)
    return b"".join(parts)


async def receive(response: Exchange) -> bytes:
    """The next piece, the transport's own failures made `UpstreamError`s (off the hot path)."""
    try:
        return await response.receive()
    except Exception as exc:
        error = upstream_error(response, exc)
        if error is None or error is exc:
            raise
        raise error from exc


async def read_reply(
    response: Exchange, decoder: WireDecoder, events: list[UniEvent], limit: int
) -> None:
    """A non-streaming reply, whole, through `decoder` into `events`; refused
    (`FrameTooLarge`) once it grows past `limit` bytes. It ends at the end of the body, or at
    the reply's stop (a message transport's socket may stay open after it)."""
    size = 0
    while part := await receive(response):
        size += len(part)
        if size > limit:
            raise FrameTooLarge(limit, size, provider=decoder.provider)
        decoder.feed(part, events)
        if decoder.stopped:
            return
    decoder.close(events)
