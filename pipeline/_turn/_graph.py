"""The turn's actor graph: named actors joined by bounded channels that carry batches.

```
source (Handler) ──lanes──► grammar ──UniEvents──► accumulator ──SinkBatch──► sink, sink...
 attempts, deadlines,        checks MMSP's          message, run events,      terminal, JSONL,
 retries, rescue; frames     grammar; owes the      the turn's two logs       a hub, callbacks
 and dialect                 attempt resets
```

Each actor is a unit that runs alone on channels: `GrammarActor.run(receive, send)`,
`AccumulatorActor.run(receive)`, `sink_actor(sink, receive, given)`, and the source,
`Handler.run(outlet)`. How they are connected is the policy's `graph`:

- `chained` (the default): where a neighbour never blocks, it is chained onto the task before
  it, as stream engines chain operators (Flink's operator chaining): the grammar runs inside the
  source's decoder, the accumulator's step is called on the source's task as each batch is
  decoded (`AccumulatorActor.offer`), and so is every sink that takes a batch without waiting
  (`deliver_nowait`). A hop costs a scheduler round and a channel operation; these neighbours
  never wait, so they pay neither. Only sinks that may wait on I/O get their own task.
- `hops`: every actor on its own task, with real channels between them (`ChannelOutlet` from
  the source, bounded by `channel_size`). The grammar's verdict on each attempt returns to the
  source at the attempt's end (`ChannelOutlet.settle`): one round trip per attempt, so the
  source still classifies every failure (a grammar breach is permanent) before it retries.

Both give the same events. A slow sink blocks everything upstream of it (backpressure).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast

import attrs
import msgspec
import trio

from .._core._accumulator import Accumulator
from .._core._errors import RilletError
from .._core._events import UniEvent
from .._core._grammar import Grammar, wall_clock_ms
from .._core._markers import AttemptOpen, AttemptReset, Batch, Status
from .._core._runevents import RunEvent, RunEventBuilder

if TYPE_CHECKING:
    from .._core._policy import Outcome
    from ._handler import Handler
    from ._history import PlainLog

__all__ = [
    "AccumulatorActor",
    "ChannelOutlet",
    "GrammarActor",
    "Sink",
    "SinkBatch",
    "UniItem",
    "finish_sinks",
    "route_for",
    "run_hops",
    "sink_actor",
]

T = TypeVar("T")
T_in = TypeVar("T_in", contravariant=True)
UniItem = UniEvent | AttemptReset
SINK_GRACE = 2.0  # seconds a cancelled run still gives its sinks for the final events


@attrs.frozen
class SinkBatch:
    """What a sink receives: the run events and the MMSP items of one batch, in order."""

    run: Sequence[RunEvent]
    uni: Sequence[UniItem]


class Sink(Protocol):
    """Where a turn's events go: a terminal, a JSONL file, a hub, the application's code.

    `deliver` may block: that is backpressure, and the turn waits. `close` is called once, after
    the last batch (which holds `run.done`), even when the turn is cancelled.

    A sink that can take a batch without waiting may also have `deliver_nowait(batch) -> bool`:
    the turn then calls it on its own task as each batch is decoded (no task of its own, no
    hop), and falls back to `deliver` for a batch it returns False for.
    """

    async def deliver(self, batch: SinkBatch) -> None:
        """Take one batch."""
        ...

    async def close(self) -> None:
        """The turn is over."""
        ...


# --- the source's side of a hop ----------------------------------------------------------------


class Settle(msgspec.Struct, frozen=True, gc=False):
    """Source to grammar (`hops`): the attempt is over (`close`: its body ended, so the grammar
    closes too); the grammar's verdict goes back in `verdict`."""

    close: bool
    verdict: GrammarVerdict


@attrs.define(eq=False)
class GrammarVerdict:
    """The grammar actor's word on one attempt (a `Verdict`): its first error, and how many
    UniEvents it released."""

    error: RilletError | None = None
    emitted: int = 0
    finish: str | None = None  # the provider's own finish reason (`Grammar.provider_finish`)
    cache_write: int | None = None  # `Grammar.cache_write_tokens`
    response_id: str = ""  # `Grammar.message_id`
    response_model: str = ""  # `Grammar.model`
    done: trio.Event = attrs.field(factory=trio.Event)


@attrs.define(eq=False)
class ChannelOutlet:
    """The source's outlet in `hops`: a bounded channel to the grammar actor.

    `offer` sends without waiting and keeps what found no room for `drain`; `settle` ends an
    attempt and waits for the grammar's verdict; `failed` says, without waiting, whether the
    grammar has already refused this attempt (the source then stops reading)."""

    send: trio.MemorySendChannel[Batch]
    grammar_downstream: bool = True
    wants_deltas: bool = True
    failed: bool = False
    _owed: list[Batch] = attrs.field(factory=list)

    def offer(self, items: Batch) -> bool:
        """Pass the batch on; False if it must wait for room (then `drain`)."""
        if not self._owed:
            try:
                self.send.send_nowait(items)
            except trio.WouldBlock:
                pass
            else:
                return True
        self._owed.append(items)
        return False

    async def drain(self) -> None:
        """Wait until every batch `offer` kept has gone."""
        while self._owed:
            await self.send.send(self._owed[0])
            del self._owed[0]

    async def settle(self, *, close: bool) -> GrammarVerdict:
        """End the attempt; the grammar's verdict on it."""
        await self.drain()
        verdict = GrammarVerdict()
        await self.send.send([cast("Any", Settle(close, verdict))])
        await verdict.done.wait()
        self.failed = False
        return verdict


# --- the grammar actor --------------------------------------------------------------------------


class Counts(Protocol):
    """The turn's facts about what was released: the UniEvents, and whether any attempt
    released any (the source's, `Handler`)."""

    events: int
    emitted_attempt: bool


_MARKERS = frozenset({AttemptOpen, Settle, Status, AttemptReset, UniEvent})  # all but lanes


@attrs.define(eq=False)
class GrammarActor:
    """Lane events in, checked UniEvents out: one fresh `Grammar` per attempt.

    It owes consumers the `AttemptReset` after an attempt that released anything and failed:
    it sends it right before the next UniEvent, naming the attempt that event belongs to. UniEvents
    that come in already checked (the rescue's, decoded whole by the source) pass through. After
    a breach it drops the attempt's lanes until the attempt settles.
    """

    provider: str
    outlet: ChannelOutlet | None = None  # told at once when an attempt fails
    counts: Counts | None = None  # the turn's facts it keeps up to date (the source's)
    clock: Callable[[], int] = wall_clock_ms
    _grammar: Grammar | None = None
    _attempt: int = 0
    _emitted: int = 0
    _error: RilletError | None = None
    _owed_reset: bool = False
    _out: list[Batch] = attrs.field(factory=list, repr=False)
    _batch: Batch = attrs.field(factory=list, repr=False)

    def step(self, items: Batch, out: list[Batch]) -> None:
        """Take one batch; append what it releases to `out`, one batch per run of markers then
        UniEvents (markers always lead a batch)."""
        self._out = out
        self._batch = []
        lanes: list[Any] = []  # consecutive lane events: checked in one call
        for item in cast("list[Any]", items):  # lane events and the source's markers
            kind = type(item)
            if kind not in _MARKERS:
                lanes.append(item)
                continue
            if lanes:
                self._check(lanes)
                lanes = []
            if kind is AttemptOpen:
                self._grammar = Grammar(self.provider, clock=self.clock)
                self._attempt = item.attempt
                self._emitted = 0
                self._error = None
            elif kind is Settle:
                self._settle(item)
            elif kind is UniEvent:
                self._release([item])
            else:
                self._marker(item)
        if lanes:
            self._check(lanes)
        if self._batch:
            out.append(self._batch)
        self._batch = []

    def _check(self, lanes: list[Any]) -> None:
        """Lane events through the attempt's grammar; after a breach, dropped."""
        if self._error is not None or self._grammar is None:
            return
        released: list[UniEvent] = []
        try:
            self._grammar.feed_many(lanes, released)
        except RilletError as exc:
            self._fail(exc)
        self._release(released)  # what came before the breach still goes

    def _marker(self, item: Any) -> None:
        if self._batch and type(self._batch[-1]) is UniEvent:
            self._out.append(self._batch)
            self._batch = []
        self._batch.append(item)

    def _release(self, events: list[UniEvent]) -> None:
        if not events:
            return
        if self._owed_reset:
            self._owed_reset = False
            self._marker(AttemptReset(self._attempt))
        self._emitted += len(events)
        self._batch += events
        counts = self.counts
        if counts is not None:
            counts.events += len(events)
            counts.emitted_attempt = True

    def _fail(self, error: RilletError) -> None:
        self._error = error
        if self.outlet is not None:
            self.outlet.failed = True

    def _settle(self, settle: Settle) -> None:
        if settle.close and self._error is None and self._grammar is not None:
            try:
                released = self._grammar.close()
            except RilletError as exc:
                self._fail(exc)
            else:
                self._release(released)
        verdict = settle.verdict
        verdict.error = self._error
        verdict.emitted = self._emitted
        if self._grammar is not None:
            verdict.finish = self._grammar.provider_finish
            verdict.cache_write = self._grammar.cache_write_tokens
            verdict.response_id = self._grammar.message_id
            verdict.response_model = self._grammar.model
        if self._emitted:
            self._owed_reset = True  # a next attempt means this one failed: its events are void
        self._grammar = None
        verdict.done.set()

    async def run(
        self, receive: trio.MemoryReceiveChannel[Batch], send: trio.MemorySendChannel[Batch]
    ) -> None:
        """Check every batch that comes in; forward what it releases (backpressure: waits for
        room downstream). Ends, closing `send`, when `receive` is closed."""
        async with receive, send:
            async for items in receive:
                out: list[Batch] = []
                self.step(items, out)
                for batch in out:
                    await send.send(batch)


async def run_hops(source: Handler, accumulate: AccumulatorActor, size: int) -> Outcome:
    """The source, the grammar and the accumulator each on its own task, joined by channels of
    `size` batches; the source's outcome once everything it sent has been accumulated."""
    to_grammar, grammar_in = trio.open_memory_channel[Batch](size)
    to_accumulator, accumulator_in = trio.open_memory_channel[Batch](size)
    outlet = ChannelOutlet(to_grammar)
    grammar = GrammarActor(source.provider.label, outlet, source)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(grammar.run, grammar_in, to_accumulator)
        nursery.start_soon(accumulate.run, accumulator_in)
        async with to_grammar:
            return await source.run(outlet)


# --- the accumulator actor ----------------------------------------------------------------------


class Log(Protocol[T_in]):
    """What the accumulator appends to: one of the turn's append-only logs."""

    @property
    def end(self) -> int:
        """The position after the last item."""
        ...

    def extend(self, items: Sequence[T_in]) -> None:
        """Append, waking readers."""
        ...

    def forget(self, position: int) -> None:
        """Drop the items before absolute `position`."""
        ...


@attrs.define
class Given:
    """How much of the turn's logs one sink has been given."""

    run: int = 0
    uni: int = 0

    def took(self, batch: SinkBatch) -> None:
        """The sink has taken `batch`."""
        self.run += len(batch.run)
        self.uni += len(batch.uni)


async def finish_sinks(
    sinks: Sequence[Sink],
    run_log: PlainLog[RunEvent],
    uni_log: PlainLog[UniItem],
    given: Sequence[Given],
    *,
    cancelled: bool,
) -> None:
    """What each sink is still owed from the logs (the final events, and whatever a cancel cut
    off), then its `close`: the end of a turn's and of a run's delivery alike. A run that ended
    on its own waits for its sinks however slow (backpressure: nothing is dropped); a cancelled
    one gives them a shielded grace period. `close` always runs, shielded, within its own grace
    period. A sink that raises does not keep the others from their end: its error is raised
    once every sink has had its turn."""
    grace = trio.current_time() + SINK_GRACE
    failure: Exception | None = None
    for sink, sink_given in zip(sinks, given, strict=True):
        batch = SinkBatch(run_log.since(sink_given.run), uni_log.since(sink_given.uni))
        try:
            try:
                if cancelled:
                    with trio.CancelScope(shield=True, deadline=grace):
                        await sink.deliver(batch)
                else:
                    await sink.deliver(batch)
                sink_given.took(batch)
            finally:
                with trio.CancelScope(shield=True), trio.move_on_after(SINK_GRACE):
                    await sink.close()
        except Exception as exc:
            failure = failure or exc
    if failure is not None:
        raise failure


@attrs.define(eq=False)
class AccumulatorActor:
    """UniEvents and markers in; the message, the run events and the two logs kept, and one
    `SinkBatch` to every sink.

    `offer` is its step: chained, the source calls it on its own task as each batch arrives (no
    scheduler round, no channel hop); a sink's full channel is still backpressure on the caller
    (`offer` says so and `drain` waits). `run` is the same step as a task of its own (`hops`).
    """

    accumulator: Accumulator
    builder: RunEventBuilder
    uni_log: Log[UniItem]
    run_log: Log[RunEvent]
    history: bool
    routes: list[Route]
    given: list[Given]
    _owed: list[tuple[Route, SinkBatch]] = attrs.field(factory=list)

    grammar_downstream = False  # as the source's outlet: it takes checked UniEvents
    failed = False

    @property
    def wants_deltas(self) -> bool:
        """Whether a sink or the logs read the deltas: with neither, the accumulator alone
        reads them, and only their strings (the source may send `DeltaRun`s)."""
        return bool(self.routes) or self.history

    async def settle(self, *, close: bool) -> GrammarVerdict:
        """Never called: the grammar runs in the source (`grammar_downstream` is False)."""
        raise NotImplementedError

    def offer(self, items: Batch) -> bool:
        """Take a batch; False if a sink's channel had no room for it (then `drain`)."""
        accumulator, builder = self.accumulator, self.builder
        runs: list[RunEvent] = []
        unis: list[UniItem] = []
        # markers (a reset, a status) come first in a batch (`Outlet`), UniEvents after them
        first = 0
        while first < len(items):
            item = items[first]
            if type(item) is AttemptReset:
                accumulator.reset()
                unis.append(item)
                runs.append(builder.reset(item.attempt))
            elif type(item) is Status:
                runs.append(builder.status(item.phase, item.attempt, item.delay, item.reason))
            else:
                break
            first += 1
        events: list[UniEvent] = items[first:] if first else items  # type: ignore[assignment]
        if not self.routes and not self.history:
            # no sink and no reader: the run events and the logs would reach no one (and runs
            # of deltas may stand for the deltas, `wants_deltas`)
            accumulator.feed_many(events)
            return True
        if events:
            accumulator.feed_many(events)
            builder.uni_many(events, runs)
            unis += events
        try:
            if self.routes and (runs or unis):  # the sinks first: the logs' keeping can wait
                out = SinkBatch(runs, unis)
                for route in self.routes:
                    if not route.offer(out):
                        self._owed.append((route, out))
        finally:  # kept even when a sink raised: what the others are owed stays gapless
            self._keep(runs, unis)
        return not self._owed

    def _keep(self, runs: list[RunEvent], unis: list[UniItem]) -> None:
        if not self.history:  # keep only what a sink has not been given yet
            given = self.given
            uni, run = self.uni_log, self.run_log
            uni.extend(unis)
            run.extend(runs)
            if len(given) == 1:
                uni.forget(given[0].uni)
                run.forget(given[0].run)
            else:
                uni.forget(min(g.uni for g in given))
                run.forget(min(g.run for g in given))
        else:
            self.uni_log.extend(unis)
            self.run_log.extend(runs)

    async def drain(self) -> None:
        """Wait until every sink has taken what `offer` could not pass on."""
        while self._owed:
            route, out = self._owed[0]
            await route.wait(out)
            del self._owed[0]

    async def run(self, receive: trio.MemoryReceiveChannel[Batch]) -> None:
        """The step as a task: every batch that comes in, until `receive` is closed."""
        async with receive:
            async for items in receive:
                if not self.offer(items):
                    await self.drain()


# --- sinks ----------------------------------------------------------------------------------------


@attrs.define(eq=False)
class Route:
    """How batches reach one sink: its channel to its actor, or its `deliver_nowait` called
    on the caller's task (`send` None)."""

    sink: Sink
    given: Given
    send: trio.MemorySendChannel[SinkBatch] | None
    nowait: Callable[[SinkBatch], bool] | None

    def offer(self, batch: SinkBatch) -> bool:
        """Pass the batch on without waiting; False if it must wait (then `wait`)."""
        if self.send is not None:
            try:
                self.send.send_nowait(batch)
            except trio.WouldBlock:
                return False
            return True
        assert self.nowait is not None
        if not self.nowait(batch):
            return False
        self.given.took(batch)
        return True

    async def wait(self, batch: SinkBatch) -> None:
        """Pass the batch on, waiting as long as the sink makes us (backpressure)."""
        if self.send is not None:
            await self.send.send(batch)
            return
        await self.sink.deliver(batch)
        self.given.took(batch)


def route_for(
    sink: Sink, given: Given, nursery: trio.Nursery, size: int, *, chained: bool
) -> Route:
    """The route to one sink: chained onto the caller's task when it takes a batch without
    waiting (and the graph chains), else a sink actor in `nursery` behind a channel."""
    nowait: Callable[[SinkBatch], bool] | None = getattr(sink, "deliver_nowait", None)
    if nowait is not None and chained:
        return Route(sink, given, None, nowait)
    send, receive = trio.open_memory_channel[SinkBatch](size)
    nursery.start_soon(sink_actor, sink, receive, given)
    return Route(sink, given, send, None)


async def sink_actor(
    sink: Sink, receive: trio.MemoryReceiveChannel[SinkBatch], given: Given
) -> None:
    """Feeds one sink everything waiting as one batch; its slowness is backpressure on the
    turn. A sink that raises leaves the channel open: its error cancels the turn's nursery,
    which ends the sender's wait, and the error stays the only one the turn raises (a closed
    channel would add the sender's `BrokenResourceError` to it)."""
    async for batch in receive:
        while True:
            try:
                more = receive.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel):
                break
            batch = SinkBatch([*batch.run, *more.run], [*batch.uni, *more.uni])
        await sink.deliver(batch)
        given.took(batch)
    await receive.aclose()
