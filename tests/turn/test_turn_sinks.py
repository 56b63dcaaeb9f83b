"""The Turn API's sinks, a turn kept without its history (`history=False`), and the opt-ins,
in virtual time against the scripted provider of `handler_support`."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import attrs
import httpx
import pytest
import trio
import trio.testing
from rillet import NoHistoryError
from rillet._core._events import ToolCallDone, encode_json
from rillet._core._markers import AttemptReset
from rillet._core._policy import Outcome
from rillet._core._runevents import (
    AnswerDelta,
    AnswerDone,
    ReasoningDelta,
    RunEvent,
    ToolCallReady,
    ToolCallStarted,
)
from rillet._turn._api import open_turn, run_turn
from rillet._turn._turn import CallbackSink, SinkBatch, Turn, UniItem

from ..handler_support import (
    END_CANCELLED,
    END_OK,
    HANG,
    OK,
    OK_SEEN,
    REQUEST,
    ROLE,
    SILENT,
    TEXT,
    USAGE,
    Answer,
    FakeProvider,
    SlowSink,
    expect,
    ok,
    openai_chunk,
    openai_events,
    partial,
    policy,
    provider_for,
    rebuild,
    seen,
    tool_stream,
)
from ..turn_support import (
    DONE,
    client_for,
    opened,
    options,
    paced,
    read_all,
    read_uni,
)

pytestmark = pytest.mark.usefixtures("graph")  # every turn here runs under both graphs

if TYPE_CHECKING:
    from collections.abc import AsyncIterator


# --- sinks ----------------------------------------------------------------------------------------


async def test_callback_sink_sees_every_event_in_order(
    autojump_clock: trio.testing.MockClock,
) -> None:
    runs: list[RunEvent] = []
    unis: list[UniItem] = []
    fake = FakeProvider([partial(2), ok()])
    async with (
        client_for(fake) as client,
        open_turn(
            REQUEST,
            provider_for(),
            **options(client, sinks=[CallbackSink(runs.append, unis.append)]),
        ) as turn,
    ):
        events = await read_all(turn)
        items = await read_uni(turn)
    assert runs == events
    assert unis == items
    assert seen(runs) == expect("start", "D*2", "reset", *OK_SEEN, END_OK)


async def test_a_slow_sink_gets_everything_and_run_done(
    autojump_clock: trio.testing.MockClock,
) -> None:
    sinks = [SlowSink(50.0), SlowSink(0.0)]
    fake = FakeProvider([ok()])
    async with client_for(fake) as client:
        result = await run_turn(
            REQUEST, provider_for(), **options(client, sinks=sinks, policy=policy(channel_size=1))
        )
    assert result.outcome is Outcome.COMPLETED
    assert len(fake.sent) == 1
    for sink in sinks:
        delivered = [e for batch in sink.batches for e in batch.run]
        assert seen(delivered) == expect("start", *OK_SEEN, END_OK)
        assert sink.closed == 1


async def test_a_cancelled_turn_still_gives_its_sinks_run_done(
    autojump_clock: trio.testing.MockClock,
) -> None:
    sink = SlowSink(1.0)
    fake = FakeProvider([partial(1, HANG)])
    async with client_for(fake) as client:
        with trio.move_on_after(30.0):
            await run_turn(REQUEST, provider_for(), **options(client, sinks=[sink]))
    delivered = [e for batch in sink.batches for e in batch.run]
    assert seen(delivered) == expect("start", "D", END_CANCELLED)
    assert sink.closed == 1
    assert trio.current_time() == pytest.approx(31.0)  # one delivery's grace, not more


async def test_a_sink_stuck_on_the_final_batch_of_a_cancelled_turn_gets_a_grace_period(
    autojump_clock: trio.testing.MockClock,
) -> None:
    sink = SlowSink(3600.0)
    fake = FakeProvider([SILENT])
    async with client_for(fake) as client:
        with trio.move_on_after(5.0):
            await run_turn(REQUEST, provider_for(), **options(client, sinks=[sink]))
    assert trio.current_time() == pytest.approx(5.0 + 2.0)
    assert sink.closed == 1


@attrs.define(eq=False)
class HalfInlineSink:
    """Takes every other batch on the turn's task; the rest through a slow `deliver`."""

    batches: list[SinkBatch] = attrs.field(factory=list)
    inline: int = 0
    awaited: int = 0
    closed: int = 0

    def deliver_nowait(self, batch: SinkBatch) -> bool:
        if (self.inline + self.awaited) % 2:
            return False
        self.inline += 1
        self.batches.append(batch)
        return True

    async def deliver(self, batch: SinkBatch) -> None:
        await trio.sleep(5.0)
        self.awaited += 1
        self.batches.append(batch)

    async def close(self) -> None:
        self.closed += 1


@pytest.mark.chained_only
async def test_a_sink_that_takes_batches_on_the_turns_task_gets_everything_in_order(
    autojump_clock: trio.testing.MockClock,
) -> None:
    sink = HalfInlineSink()
    fake = FakeProvider([paced(partial(2), 0.5), paced(ok(), 0.5)])
    async with client_for(fake) as client, trio.open_nursery() as nursery:
        turn: Turn = await nursery.start(
            functools.partial(run_turn, REQUEST, provider_for(), **options(client, sinks=[sink]))
        )
        events = await read_all(turn)
    delivered = [e for batch in sink.batches for e in batch.run]
    assert delivered == events  # every event, once, in order
    assert seen(delivered) == expect("start", "D*2", "reset", *OK_SEEN, END_OK)
    assert sink.inline > 0
    assert sink.awaited > 0  # the refused ones waited: backpressure, not a drop
    assert sink.closed == 1


class EagerBody(httpx.AsyncByteStream):
    """A body that is all in memory: its reads never yield to trio (a replay, a test
    transport). Counts what the client pulled; hands over nothing more once closed."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks
        self.pulled = 0
        self.closed = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            if self.closed:
                return
            self.pulled += 1
            yield chunk

    async def aclose(self) -> None:
        self.closed = True


async def test_a_turn_over_a_body_that_never_yields_still_lets_others_run_and_is_cancellable(
    autojump_clock: trio.testing.MockClock,
) -> None:
    events = openai_events([f"w{i} " for i in range(5000)])
    body = EagerBody(events)
    client = httpx.AsyncClient(
        transport=httpx.MockTransport(
            lambda request: httpx.Response(
                200, headers={"content-type": "text/event-stream"}, stream=body
            )
        )
    )
    async with client, trio.open_nursery() as nursery:
        turn: Turn = await nursery.start(
            functools.partial(run_turn, REQUEST, provider_for(), **options(client))
        )
        async for event in turn.run_events():
            if isinstance(event, AnswerDelta):
                turn.cancel()  # the consumer got to run while the body was still being read
                break
        result = await turn.result()
    assert result.outcome is Outcome.CANCELLED
    assert body.pulled < len(events) // 10


# --- history=False -------------------------------------------------------------------------------


async def test_a_turn_without_history_gives_its_sinks_everything_and_keeps_nothing(
    autojump_clock: trio.testing.MockClock,
) -> None:
    runs: list[RunEvent] = []
    unis: list[UniItem] = []
    fake = FakeProvider([partial(2), ok()])
    async with client_for(fake) as client, trio.open_nursery() as nursery:
        turn: Turn = await nursery.start(
            functools.partial(
                run_turn,
                REQUEST,
                provider_for(),
                **options(client, sinks=[CallbackSink(runs.append, unis.append)], history=False),
            )
        )
        with pytest.raises(NoHistoryError) as caught:
            turn.uni_events()
        assert caught.value.run_id == turn.run_id
        with pytest.raises(NoHistoryError):
            turn.run_events()
        result = await turn.result()
    assert result.outcome is Outcome.COMPLETED
    assert result.text == TEXT
    assert seen(runs) == expect("start", "D*2", "reset", *OK_SEEN, END_OK)
    assert sum(isinstance(item, AttemptReset) for item in unis) == 1
    # what every sink was given is forgotten
    assert turn._uni.items == []
    assert turn._run.items == []
    assert isinstance(runs[-2], AnswerDone)


async def test_a_cancelled_turn_without_history_still_owes_its_slow_sink_every_event(
    autojump_clock: trio.testing.MockClock,
) -> None:
    sink = SlowSink(1.0)  # takes 1 s per batch: the channel holds what it has not taken
    fake = FakeProvider([paced(partial(5, HANG), 0.1)])
    async with client_for(fake) as client:
        with trio.move_on_after(30.0):
            await run_turn(
                REQUEST,
                provider_for(),
                **options(client, sinks=[sink], history=False, policy=policy(channel_size=1)),
            )
    delivered = [e for batch in sink.batches for e in batch.run]
    assert seen(delivered) == expect("start", "D*5", END_CANCELLED)
    assert [e.seq for e in delivered] == list(range(1, len(delivered) + 1))  # gapless
    assert sink.closed == 1


# --- opt-ins --------------------------------------------------------------------------------------


def reasoning_then_text() -> Answer:
    """Reasoning, then the answer text, in one reply."""
    return Answer(
        body=[
            ROLE,
            openai_chunk({"reasoning_content": "Think "}),
            openai_chunk({"reasoning_content": "hard."}),
            *OK[1:6],
            openai_chunk({}, finish="stop"),
            USAGE,
            DONE,
        ]
    )


@pytest.mark.parametrize("opted", [False, True])
async def test_reasoning_reaches_the_run_events_only_when_opted_in(
    autojump_clock: trio.testing.MockClock, opted: bool
) -> None:
    fake = FakeProvider([reasoning_then_text()])
    async with opened(fake, reasoning=opted) as turn:
        events = await read_all(turn)
    reasoning = [e.delta for e in events if isinstance(e, ReasoningDelta)]
    assert reasoning == (["Think ", "hard."] if opted else [])
    assert seen(events) == expect("start", *(["R*2"] if opted else []), *OK_SEEN, END_OK)
    assert rebuild(events) == TEXT


@pytest.mark.parametrize("opted", [False, True])
async def test_tool_arguments_reach_the_run_events_only_when_opted_in(
    autojump_clock: trio.testing.MockClock, opted: bool
) -> None:
    fake = FakeProvider([tool_stream(['{"city": ', '"Paris"}'])])
    async with (
        client_for(fake) as client,
        open_turn(REQUEST, provider_for(), **options(client, tool_arguments=opted)) as turn,
    ):
        events = await read_all(turn)
        result = await turn.result()
    completed = [e for e in events if isinstance(e, ToolCallReady)]
    assert len(completed) == 1
    assert completed[0].name == "get_weather"
    assert completed[0].tool_call_id == "call_1"
    assert completed[0].arguments == ({"city": "Paris"} if opted else None)
    assert encode_json(completed[0]).startswith(b'{"type":"tool_call.done"')
    started = [e for e in events if isinstance(e, ToolCallStarted)]
    assert [(e.name, e.tool_call_id) for e in started] == [("get_weather", "call_1")]
    assert result.message.content_items == [
        ToolCallDone(name="get_weather", arguments={"city": "Paris"}, tool_call_id="call_1")
    ]
    assert result.message.finish_reason == "tool_call"
