"""What the served wires' endpoints share (MMSP's stream, OpenAI's Chat Completions, the AI SDK's
UI message stream): the provider a model name routes to, and a turn run behind the admission
while its connection is watched, its items handed through a channel (`ChannelSink`) to the
wire's own pump."""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import attrs
import trio
from rillet._core._errors import RilletError
from rillet._core._events import UniEvent
from rillet._core._markers import AttemptReset
from rillet._core._policy import Policy
from rillet._turn._api import run_turn
from rillet._turn._turn import SinkBatch, Turn, UniItem
from rillet.providers._registry import provider_from_env

from ._log import log_run_end, log_run_start
from ._replies import GONE, CloseConnection, ErrorReply
from ._streamed import HeldHead, end_stream, until_gone

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Sequence

    from rillet._core._dialect import Provider
    from rillet._core._request import TurnRequest

    from ._capacity import Ticket
    from ._http11 import HttpConnection
    from ._shared import Shared

__all__ = [
    "ChannelSink",
    "DirectDeltas",
    "DirectWriter",
    "Handed",
    "ModelNotFound",
    "route_model",
    "run_kept_turn",
    "run_wire_turn",
]

logger = logging.getLogger("rillet.transports.server")


Handed = list[UniItem] | bytes
"""What the turn hands a wire's pump: MMSP items to write, or bytes already encoded (`b""`:
write out what is parked on the connection)."""


class DirectWriter(Protocol):
    """A wire's way to write a batch from the turn's own task (see `ChannelSink`)."""

    def encode(self, items: Sequence[UniItem]) -> bytes | None:
        """The bytes of a batch that needs nothing but writing (its state moves on: they must
        go out), or None for one the pump must see (a reset, the stop, no head yet)."""

    def write_nowait(self, data: bytes) -> bytes | None:
        """Write `data` now (`HeldHead.write_nowait`): None once written, else what the pump
        must still send."""


@attrs.define(eq=False)
class ChannelSink:
    """Hands a turn's MMSP items to the connection that streams them (backpressure: a client
    that reads slowly slows its own turn, nobody else's).

    A batch goes the short way when it can: once the wire has set `direct`, a batch that
    needs nothing but writing is encoded and written to the socket on the turn's own task,
    when nothing handed to the pump is still unwritten (`owed`) and the socket takes it at
    once; no task switch, no channel. Anything else (the head, a reset, the stop, a full
    socket) goes through the channel to the wire's pump, in order."""

    send: trio.MemorySendChannel[Handed]
    receive: trio.MemoryReceiveChannel[Handed]
    """The pump's end of the channel."""
    direct: DirectWriter | None = None
    """Set by the wire's pump once it can take the short way."""
    owed: int = 0
    """What was handed to the pump that it has not finished writing (`done`)."""
    _stashed: bytes | None = None  # encoded, then refused by a full channel: `deliver` sends it

    def deliver_nowait(self, batch: SinkBatch) -> bool:
        """Write the batch's MMSP items at once, or hand them on from the turn's own task when
        the channel has room (no sink task between the turn and the connection); False when
        it is full."""
        uni = batch.uni
        if not uni:
            return True
        handed: bytes | None = None
        direct = self.direct
        if direct is not None and not self.owed:
            data = direct.encode(uni)
            if data is not None:
                handed = direct.write_nowait(data) if data else None
                if handed is None:
                    return True
        try:
            self.send.send_nowait(list(uni) if handed is None else handed)
        except trio.WouldBlock:
            self._stashed = handed  # encoded already: the very bytes must go
            return False
        except GONE:  # the response is over; the turn is cancelled
            return True
        self.owed += 1
        return True

    async def deliver(self, batch: SinkBatch) -> None:
        """Hand the batch's MMSP items on (waiting while the connection is behind)."""
        handed: Handed | None = self._stashed
        self._stashed = None
        if handed is None and batch.uni:
            handed = list(batch.uni)
        if handed is not None:
            with contextlib.suppress(*GONE):  # the response is over; the turn is cancelled
                self.owed += 1
                await self.send.send(handed)

    def done(self) -> None:
        """The pump has written what it was last handed."""
        self.owed -= 1

    async def close(self) -> None:
        """The turn is over: end the channel."""
        await self.send.aclose()


@attrs.define(eq=False)
class DirectDeltas:
    """The `DirectWriter` of a wire whose plain deltas each encode on their own (`frame`):
    once the head is out, a batch of them is written on the turn's own task; a reset or the
    stop goes to the pump, which alone knows what they mean there."""

    head: HeldHead
    frame: Callable[[UniEvent], bytes]
    """An event's bytes on the wire (b"" for one the wire has no place for)."""
    count: Callable[[int], None]
    """Counts the events written (the server's metrics)."""

    def encode(self, items: Sequence[UniItem]) -> bytes | None:
        """The batch's bytes, or None when the pump must see it."""
        if not self.head.started:
            return None
        for item in items:
            if type(item) is AttemptReset or item.event_type == "stop":  # type: ignore[union-attr]
                return None
        frame = self.frame
        out = [frame(item) for item in items]  # type: ignore[arg-type]
        self.count(len(out))
        return b"".join(out)

    def write_nowait(self, data: bytes) -> bytes | None:
        """`HeldHead.write_nowait`."""
        return self.head.write_nowait(data)


class ModelNotFound(Exception):
    """The model asked for is not one this server serves (each wire says so its own way)."""


def route_model(shared: Shared, model: str | None) -> Provider:
    """The provider for `model`: a name the server offers (or none: its default) is the server's
    own provider; `kind/model` (e.g. `anthropic/claude-sonnet-4-5`) is that provider kind,
    configured from the server's `route_env`, when the kind is in its `route_kinds`. Raises
    `ModelNotFound` otherwise, `ErrorReply` (400) for a kind that cannot be configured."""
    offered = shared.offered_models()
    if model is None or not model or model in offered or not offered:
        try:
            return shared.provider(model or None, mmsp=False)
        except ErrorReply as reply:
            if reply.status == 404:
                raise ModelNotFound(model) from None
            raise
    kind, slash, name = model.partition("/")
    if not slash or not name or kind not in shared.config.route_kinds:
        raise ModelNotFound(model)
    try:
        return provider_from_env(kind, model=name, env=shared.config.route_env)
    except RilletError as exc:
        logger.warning("no provider for a routed model: %s", type(exc).__name__)
        raise ErrorReply(400, "invalid_request_error", "model unavailable") from None


@contextlib.asynccontextmanager
async def _serving(
    shared: Shared, turn_request: TurnRequest, provider: Provider, route: str
) -> AsyncIterator[tuple[Turn, ChannelSink]]:
    """A turn run with the server's policy behind one `ChannelSink`, counted and logged (its
    start line, then its end line once it has ended, as the runs API logs its runs)."""
    policy = shared.config.policy or Policy()
    sink = ChannelSink(*trio.open_memory_channel[Handed](policy.channel_size))
    shared.metrics.streams_started += 1
    shared.metrics.serving(provider)
    async with trio.open_nursery() as nursery:
        turn: Turn = await nursery.start(
            functools.partial(
                run_turn,
                turn_request,
                provider,
                sinks=[sink],
                policy=policy,
                client=shared.client,
                admission=shared.streams,
                history=False,
                prices=shared.config.prices,
                max_cost=shared.config.max_cost,
            )
        )
        log_run_start(turn.run_id, provider, route)
        yield turn, sink
    result = await turn.result()
    shared.metrics.finished(result)
    log_run_end(turn.run_id, provider, route, result)


async def admitted(shared: Shared, http: HttpConnection, ticket: Ticket) -> bool:
    """A slot for the ticket: at once when one is free, else waited for while the client stays
    (probed with a `100 Continue`); False when it left first."""
    if shared.admission.try_admit(ticket):
        return True
    admit = functools.partial(shared.admission.admit, ticket)
    return await until_gone(http, admit, waiting=True)


async def run_wire_turn(
    shared: Shared,
    http: HttpConnection,
    ticket: Ticket,
    turn_request: TurnRequest,
    provider: Provider,
    pump: Callable[[Turn, ChannelSink], Awaitable[None]],
    *,
    route: str,
    whole: bool = False,
) -> None:
    """Wait for a slot (while the client stays), run the turn with the server's policy, and let
    `pump` write it; a client that leaves cancels the turn. The ticket is released here.

    `route`: the wire's name in the run's start and end log lines (`log_run_start`,
    `log_run_end`, as the runs API logs its runs): MMSP's `stream`, OpenAI's `chat`, the AI
    SDK's `ui`. Every served wire logs both lines and counts its provider's requests.

    `whole`: the reply is one response sent when the turn ends, so no head goes out before it
    that an SSE comment could follow: a client that closes is probed with a `100 Continue`,
    as in the queue, and does not keep the turn (and its provider request) going to its end."""
    try:
        if not await admitted(shared, http, ticket):
            raise CloseConnection
        completed = False
        async with _serving(shared, turn_request, provider, route) as (turn, sink):
            try:
                body = functools.partial(pump, turn, sink)
                completed = await until_gone(http, body, waiting=whole)
            finally:
                if not completed:
                    turn.cancel()
        await end_stream(http, completed, shared.limits.close_timeout)
    finally:
        shared.admission.release(ticket)


async def run_kept_turn(
    shared: Shared,
    ticket: Ticket,
    turn_request: TurnRequest,
    provider: Provider,
    pump: Callable[[Turn, ChannelSink], Awaitable[None]],
    *,
    route: str,
    started: Callable[[Turn], object],
) -> None:
    """A turn whose stream outlives any one reader (a kept UI stream): it waits for a slot,
    runs with the server's policy and `pump` writes it, whoever reads; `started` gets the turn
    once it runs (to stop it). The ticket is released here."""
    try:
        await shared.admission.admit(ticket)
        async with _serving(shared, turn_request, provider, route) as (turn, sink):
            started(turn)
            try:
                await pump(turn, sink)
            except BaseException:
                turn.cancel()
                raise
    finally:
        shared.admission.release(ticket)
