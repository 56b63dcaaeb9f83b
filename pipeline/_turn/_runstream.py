"""One public run made of several turns: an agent's steps, a chain's providers.

Each turn runs as it always does, with its own run-event builder, and hands its batches to a
`StepSink`. The sink adopts them into the run's one stream (`RunEventBuilder.adopt`: the run's
id, one gapless `seq`, the run's clock), leaving out what only the whole run may say: the
turn's `run.started`, `answer.done` and `run.done` (the step keeps them, to read how it ended).
The run's own events (a step's `status`, `tool.started`, `approval.required`...) join the same
stream through `RunStream.emit`. Sinks get every batch in `seq` order: whoever holds the lock
delivers everything a sink has not had yet.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import trio

from .._core._markers import AttemptReset
from .._core._runevents import (
    AnswerDelta,
    AnswerDone,
    AttemptResetEvent,
    ReasoningDelta,
    RunDone,
    RunEvent,
    RunEventBuilder,
    RunStarted,
)
from ._graph import Given, Sink, SinkBatch, UniItem, finish_sinks
from ._history import PlainLog

__all__ = ["RunStream", "StepSink"]


@attrs.define(eq=False)
class RunStream:
    """The logs and sinks of one run, fed by its turns' `StepSink`s and by the run itself.

    Attributes:
        attempts: the attempts every turn of the run made, as each turn's `run.done` said:
            a turn cancelled before its result reached the run counts too.
        requests: the requests every turn of the run sent, counted the same way.
    """

    builder: RunEventBuilder
    sinks: Sequence[Sink]
    run_log: PlainLog[RunEvent]
    uni_log: PlainLog[UniItem]
    history: bool = True
    attempts: int = 0
    requests: int = 0
    _given: list[Given] = attrs.field(init=False)
    _lock: trio.Lock = attrs.field(factory=trio.Lock, init=False)

    def __attrs_post_init__(self) -> None:
        self._given = [Given() for _ in self.sinks]

    async def emit(self, runs: Sequence[RunEvent], unis: Sequence[UniItem] = ()) -> None:
        """Append to the logs, then bring every sink up to date (waiting as it makes us)."""
        self.run_log.extend(runs)
        self.uni_log.extend(unis)
        await self.catch_up()

    async def catch_up(self) -> None:
        """Bring every sink up to date with the logs, waiting as it makes us."""
        async with self._lock:
            for sink, given in zip(self.sinks, self._given, strict=True):
                batch = SinkBatch(self.run_log.since(given.run), self.uni_log.since(given.uni))
                if not batch.run and not batch.uni:
                    continue
                nowait = getattr(sink, "deliver_nowait", None)
                if nowait is None or not nowait(batch):
                    await sink.deliver(batch)
                given.took(batch)
            self._forget()

    def _forget(self) -> None:
        """Without history, keep only what some sink has not been given yet."""
        if self.history:
            return
        for log, taken in (
            (self.run_log, [g.run for g in self._given]),
            (self.uni_log, [g.uni for g in self._given]),
        ):
            log.forget(min(taken, default=log.base + len(log.items)))

    @property
    def busy(self) -> bool:
        """Whether a delivery that waits is under way (then nothing may overtake it)."""
        return self._lock.locked()

    def catch_up_nowait(self) -> bool:
        """Bring every sink up to date without waiting, as far as each takes it; False when
        one could not take its batch (then `catch_up`)."""
        if self._lock.locked():
            return False
        for sink, given in zip(self.sinks, self._given, strict=True):
            batch = SinkBatch(self.run_log.since(given.run), self.uni_log.since(given.uni))
            if not batch.run and not batch.uni:
                continue
            nowait = getattr(sink, "deliver_nowait", None)
            if nowait is None or not nowait(batch):
                return False
            given.took(batch)
        self._forget()
        return True

    async def finish(self, runs: Sequence[RunEvent], *, cancelled: bool) -> None:
        """The closing events, what each sink is still owed, then every sink's `close`. A
        cancelled run gives its sinks a shielded grace period; `close` always runs. A sink that
        raises does not keep the others from their end: its error is raised after them."""
        self.run_log.extend(runs)
        self.run_log.close()
        self.uni_log.close()
        try:
            await finish_sinks(
                self.sinks, self.run_log, self.uni_log, self._given, cancelled=cancelled
            )
        finally:
            self._forget()

    def step_sink(self, *, hold_text: bool = False) -> StepSink:
        """A sink for one turn of this run; with `hold_text` its answer text is kept back
        (buffered delivery) until `StepSink.release`."""
        return StepSink(self, hold_text=hold_text)


@attrs.define(eq=False)
class StepSink:
    """Where one turn of a run delivers: its events adopted into the run's stream.

    Attributes:
        done: the turn's own `run.done` (how the step ended), once it came.
        answer: the turn's own `answer.done`, if it had one.
        delivered_text: whether any answer text of this turn reached the public stream.
        held: answer and reasoning fragments kept back (`hold_text`), since the turn's last
            reset.
        held_uni: the turn's MMSP stream kept back with them (`hold_text`), since that reset.
    """

    stream: RunStream
    hold_text: bool = False
    done: RunDone | None = None
    answer: AnswerDone | None = None
    delivered_text: bool = False
    held: list[RunEvent] = attrs.field(factory=list)
    held_uni: list[UniItem] = attrs.field(factory=list)

    _adopted: SinkBatch | None = attrs.field(default=None, repr=False)

    def deliver_nowait(self, batch: SinkBatch) -> bool:
        """Adopt the turn's events and pass them on at once when every sink of the run takes
        them without waiting (no task, no hop); False leaves the rest to `deliver`, which
        the turn then calls with this same batch."""
        if self.stream.busy:
            return False
        self._adopt(batch)
        self._adopted = batch
        if not self.stream.catch_up_nowait():
            return False
        self._adopted = None
        return True

    async def deliver(self, batch: SinkBatch) -> None:
        """Adopt the turn's events into the run's stream, waiting as its sinks make us."""
        if batch is not self._adopted:
            self._adopt(batch)
        self._adopted = None
        await self.stream.catch_up()

    def _adopt(self, batch: SinkBatch) -> None:
        builder = self.stream.builder
        runs: list[RunEvent] = []  # what joins the run's stream, adopted once per batch
        for event in batch.run:
            kind = type(event)
            if kind is AnswerDelta or kind is ReasoningDelta:
                if self.hold_text:  # a candidate's reasoning waits with its text
                    self.held.append(event)
                    continue
                self.delivered_text = self.delivered_text or kind is AnswerDelta
            elif kind is RunStarted:
                continue
            elif kind is RunDone:
                assert isinstance(event, RunDone)
                self.done = event
                self.stream.attempts += event.attempts
                self.stream.requests += event.requests
                continue
            elif kind is AnswerDone:
                assert isinstance(event, AnswerDone)
                self.answer = event
                builder.finish_reason = event.finish_reason
                continue
            elif kind is AttemptResetEvent:
                self.held.clear()
            runs.append(event)
        self.stream.run_log.extend(builder.adopt_many(runs))
        if not self.hold_text:
            self.stream.uni_log.extend(batch.uni)
            return
        for item in batch.uni:  # a candidate's stream waits with its text
            if type(item) is AttemptReset:
                self.held_uni.clear()  # nothing before it went out: nothing to void
            else:
                self.held_uni.append(item)

    async def release(self, *, text: bool = True) -> None:
        """Send what was held on: the answer text and reasoning to the public stream (unless
        `text` is False: then they are dropped) and the turn's MMSP stream."""
        builder = self.stream.builder
        runs = [builder.adopt(event) for event in self.held] if text else []
        unis, self.held_uni = self.held_uni, []
        self.held.clear()
        self.delivered_text = self.delivered_text or any(type(e) is AnswerDelta for e in runs)
        await self.stream.emit(runs, unis)

    async def close(self) -> None:
        """The turn is over; the run goes on."""
