"""Hedged requests: more than one source actor racing for one attempt's reply.

With `Policy(hedge_after=s)`, an attempt that has no first lane event `s` seconds after its
request was sent sends the same request again; the first of the two to deliver a lane event
wins the attempt, and the other is cancelled at once, its exchange closed: it has delivered
nothing, so its output is never read, and it is never billed for more than the tokens it had
produced by then. A contestant that ends without an event (an error status, a transport
failure, an empty body) does not win while the other may still deliver; when both end so, the
first request's ending is the attempt's. A request that fails before the hedge is due ends the
attempt as it would without hedging (its ladder decides).

The race only covers the wait for the first event. Each contestant reads its reply until a lane
event comes out of a probe decoder of its own; the winner hands over its exchange with the
pieces it read, which the handler decodes again through the attempt's own decoder, so what
goes downstream is exactly what an unhedged attempt would have sent.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs
import trio

from .._core._dialect import HttpRequest
from .._core._errors import RilletError, UpstreamError
from .._core._upstream import Exchange, Upstream, upstream_error
from .._core._wire import WireDecoder

__all__ = ["Opened", "open_hedged"]


@attrs.define(eq=False)
class Opened:
    """One contestant's opening: its exchange and the pieces it read (the last may be `b""`,
    the end), or the transport's failure.

    Attributes:
        index: 0 for the first request, 1 for the hedge.
        exchange: the open exchange (None when the transport failed).
        pieces: what it read before it stopped.
        error: the transport's failure, if it failed.
        delivered: whether a lane event came.
        finished: whether it stopped on its own (rather than being cancelled).
    """

    index: int
    exchange: Exchange | None = None
    pieces: list[bytes] = attrs.field(factory=list)
    error: UpstreamError | None = None
    delivered: bool = False
    finished: bool = False


@attrs.define(eq=False)
class _Race:
    upstream: Upstream
    request: HttpRequest
    probe: Callable[[], WireDecoder]
    hedge_after: float
    on_send: Callable[[int], None]
    scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    results: list[Opened | None] = attrs.field(factory=lambda: [None, None])
    winner: Opened | None = None
    hedged: bool = False

    async def contestant(self, index: int) -> None:
        if index == 1:
            await trio.sleep(self.hedge_after)
            if self.winner is not None:
                return  # the first request already settled the attempt: no hedge
            self.hedged = True
        opened = Opened(index)
        self.results[index] = opened  # before sending: whatever it opens is closed after
        self.on_send(index)
        await self._open(opened)
        self._settle(opened)

    async def _open(self, opened: Opened) -> None:
        try:
            opened.exchange = await self.upstream.open(self.request)
        except UpstreamError as exc:
            opened.error = exc
            return
        exchange = opened.exchange
        if exchange.status >= 300:
            return  # the handler reads the error body
        probe = self.probe()
        while True:
            try:
                piece = await exchange.receive()
            except Exception as exc:
                error = upstream_error(exchange, exc)
                if error is None:
                    raise
                opened.error = error
                return
            opened.pieces.append(piece)
            if not piece:
                return  # the end, before any event
            try:
                probe.feed(piece)
            except RilletError:
                return  # a broken frame: the handler's own decoder will say what it is
            if probe.lane_events:
                opened.delivered = True
                return

    def _settle(self, opened: Opened) -> None:
        """A contestant has opened (or ended); decide the race when it can be decided."""
        opened.finished = True
        if self.winner is not None:
            return
        if opened.delivered:
            self._win(opened)
            return
        first, hedge = self.results
        assert first is not None
        if not self.hedged:
            self._win(first)  # ended before the hedge was due: the attempt's ending
        elif first.finished and hedge is not None and hedge.finished:
            self._win(first)  # neither delivered: the first request's ending

    def _win(self, opened: Opened) -> None:
        self.winner = opened
        self.scope.cancel()  # the other contestant stops, its exchange closed


async def open_hedged(
    upstream: Upstream,
    request: HttpRequest,
    *,
    hedge_after: float,
    probe: Callable[[], WireDecoder],
    on_send: Callable[[int], None],
) -> Opened:
    """Race the request against a hedge sent `hedge_after` seconds later (if no first event
    came by then); the winning contestant's opening. `on_send(index)` is called as each request
    is sent. Raises nothing but cancellation: a transport failure is in the result."""
    race = _Race(upstream, request, probe, hedge_after, on_send)
    winner: Opened | None = None
    try:
        with race.scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(race.contestant, 0)
                nursery.start_soon(race.contestant, 1)
        winner = race.winner
    finally:  # the loser's exchange (every one, if the caller was cancelled) is closed
        for result in race.results:
            if result is not None and result is not winner and result.exchange is not None:
                await result.exchange.aclose()
    assert winner is not None
    return winner
