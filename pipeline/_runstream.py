"""One public run made of several turns: an agent's steps, a fallback chain's providers.

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

from ._runevents import (
    AnswerDelta,
    AnswerDone,
    AttemptResetEvent,
    RunDone,
    RunEvent,
    RunEventBuilder,
    RunStarted,
)
from ._turn import Sink, SinkBatch, UniItem, _Given, _Log

__all__ = ["RunStream", "StepSink"]

_SINK_GRACE = 2.0  # seconds a cancelled run still gives its sinks for the final events


@attrs.define(eq=False)
class RunStream:
    """The logs and sinks of one run, fed by its turns' `StepSink`s and by the run itself."""

    builder: RunEventBuilder
    sinks: Sequence[Sink]
    run_log: _Log[RunEvent]
    uni_log: _Log[UniItem]
    _given: list[_Given] = attrs.field(init=False)
    _lock: trio.Lock = attrs.field(factory=trio.Lock, init=False)

    def __attrs_post_init__(self) -> None:
        self._given = [_Given() for _ in self.sinks]

    async def emit(self, runs: Sequence[RunEvent], unis: Sequence[UniItem] = ()) -> None:
        """Append to the logs, then bring every sink up to date (waiting as it makes us)."""
        self.run_log.extend(runs)
        self.uni_log.extend(unis)
        async with self._lock:
            for sink, given in zip(self.sinks, self._given, strict=True):
                batch = SinkBatch(self.run_log.since(given.run), self.uni_log.since(given.uni))
                if not batch.run and not batch.uni:
                    continue
                nowait = getattr(sink, "deliver_nowait", None)
                if nowait is None or not nowait(batch):
                    await sink.deliver(batch)
                given.took(batch)

    async def finish(self, runs: Sequence[RunEvent], *, cancelled: bool) -> None:
        """The closing events, what each sink is still owed, then every sink's `close`. A
        cancelled run gives its sinks a shielded grace period; `close` always runs."""
        self.run_log.extend(runs)
        self.run_log.close()
        self.uni_log.close()
        grace = trio.current_time() + _SINK_GRACE
        for sink, given in zip(self.sinks, self._given, strict=True):
            batch = SinkBatch(self.run_log.since(given.run), self.uni_log.since(given.uni))
            try:
                if cancelled:
                    with trio.CancelScope(shield=True, deadline=grace):
                        await sink.deliver(batch)
                else:
                    await sink.deliver(batch)
                given.took(batch)
            finally:
                with trio.CancelScope(shield=True), trio.move_on_after(_SINK_GRACE):
                    await sink.close()

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
        held: answer fragments kept back (`hold_text`), since the turn's last reset.
    """

    stream: RunStream
    hold_text: bool = False
    done: RunDone | None = None
    answer: AnswerDone | None = None
    delivered_text: bool = False
    held: list[AnswerDelta] = attrs.field(factory=list)

    async def deliver(self, batch: SinkBatch) -> None:
        """Adopt the turn's events into the run's stream."""
        builder = self.stream.builder
        runs: list[RunEvent] = []
        for event in batch.run:
            kind = type(event)
            if kind is RunStarted:
                continue
            if kind is RunDone:
                assert isinstance(event, RunDone)
                self.done = event
                continue
            if kind is AnswerDone:
                assert isinstance(event, AnswerDone)
                self.answer = event
                builder.finish_reason = event.finish_reason
                continue
            if kind is AnswerDelta:
                assert isinstance(event, AnswerDelta)
                if self.hold_text:
                    self.held.append(event)
                    continue
                self.delivered_text = True
            elif kind is AttemptResetEvent:
                self.held.clear()
            runs.append(builder.adopt(event))
        await self.stream.emit(runs, batch.uni)

    async def release(self) -> None:
        """Send the held answer text on to the public stream."""
        builder = self.stream.builder
        runs = [builder.adopt(event) for event in self.held]
        self.held.clear()
        self.delivered_text = self.delivered_text or bool(runs)
        await self.stream.emit(runs)

    async def close(self) -> None:
        """The turn is over; the run goes on."""
