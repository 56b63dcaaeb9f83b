"""The Turn API: `run_turn` via `nursery.start`, `open_turn`, several consumers of
`uni_events()` / `run_events()`, `result()` and cancellation, in virtual time against the
scripted provider of `handler_support` (sinks, `history=False` and the opt-ins:
`test_turn_sinks`)."""

from __future__ import annotations

import functools
import gc
import gzip
import zlib

import pytest
import trio
import trio.testing
from rillet._core._events import TextDone, UniEvent
from rillet._core._markers import AttemptReset
from rillet._core._policy import Outcome
from rillet._core._runevents import (
    AnswerDelta,
    RunDone,
    RunEvent,
    RunStarted,
)
from rillet._turn._api import open_turn, run_turn
from rillet._turn._ratelimit import RateLimiter
from rillet._turn._turn import SinkBatch, Turn, TurnResult, UniItem

from ..handler_support import (
    END_CANCELLED,
    END_OK,
    HANG,
    OK,
    OK_SEEN,
    REQUEST,
    SILENT,
    TEXT,
    Answer,
    FakeProvider,
    check_envelope,
    check_uni,
    expect,
    ok,
    partial,
    policy,
    provider_for,
    rebuild,
    seen,
    status,
)
from ..turn_support import (
    client_for,
    opened,
    options,
    paced,
    read_all,
    read_uni,
)

pytestmark = pytest.mark.usefixtures("graph")  # every turn here runs under both graphs


# --- run_turn and open_turn -----------------------------------------------------------------------


async def test_nursery_start_hands_over_a_live_turn(
    autojump_clock: trio.testing.MockClock,
) -> None:
    fake = FakeProvider([paced(ok())])
    async with client_for(fake) as client, trio.open_nursery() as nursery:
        turn: Turn = await nursery.start(
            functools.partial(run_turn, REQUEST, provider_for(), **options(client))
        )
        assert isinstance(turn, Turn)
        assert turn.request is REQUEST
        first: list[tuple[float, RunEvent]] = []
        async for event in turn.run_events():
            first.append((trio.current_time(), event))
            if isinstance(event, AnswerDelta):
                break
        streaming = not turn.done
        assert streaming  # the first delta arrived while the turn still streamed
        assert first[-1][0] == pytest.approx(2.0)
        result = await turn.result()
    ended = turn.done
    assert ended
    assert result.outcome is Outcome.COMPLETED
    assert result.text == TEXT
    assert isinstance(first[0][1], RunStarted)
    assert first[0][1].provider == "openai-chat"
    assert first[0][1].model == "test-model"
    assert all(e.run_id == turn.run_id for _, e in first)


async def test_awaiting_run_turn_returns_the_same_result(
    autojump_clock: trio.testing.MockClock,
) -> None:
    fake = FakeProvider([ok()])
    async with client_for(fake) as client:
        result = await run_turn(REQUEST, provider_for(), **options(client), run_id="run-1")
    assert result.outcome is Outcome.COMPLETED
    assert result.text == TEXT
    assert result.ok


async def test_run_id_is_given_or_random(autojump_clock: trio.testing.MockClock) -> None:
    fake = FakeProvider([ok()])
    ids = []
    async with client_for(fake) as client:
        for run_id in ("mine", None, None):
            async with open_turn(REQUEST, provider_for(), **options(client), run_id=run_id) as t:
                ids.append(t.run_id)
                events = await read_all(t)
                assert {e.run_id for e in events} == {t.run_id}
    assert ids[0] == "mine"
    assert len(set(ids)) == 3


async def test_open_turn_runs_the_turn_for_the_block(
    autojump_clock: trio.testing.MockClock,
) -> None:
    fake = FakeProvider([ok()])
    async with opened(fake) as turn:
        events = await read_all(turn)
        result = await turn.result()
    assert seen(events) == expect("start", *OK_SEEN, END_OK)
    assert result.outcome is Outcome.COMPLETED
    check_envelope(events, turn.run_id)


async def test_leaving_open_turn_early_cancels_the_turn(
    autojump_clock: trio.testing.MockClock,
) -> None:
    fake = FakeProvider([partial(1, HANG)])
    async with opened(fake) as turn:
        async for event in turn.run_events():
            if isinstance(event, AnswerDelta):
                break
    left = trio.current_time()
    assert turn.done
    result = await turn.result()
    events = await read_all(turn)
    assert result.outcome is Outcome.CANCELLED
    assert seen(events) == expect("start", "D", END_CANCELLED)
    assert left == 0.0
    assert fake.bodies[0].closed
    assert len(fake.sent) == 1


async def test_an_error_in_the_open_turn_block_comes_out_and_cancels(
    autojump_clock: trio.testing.MockClock,
) -> None:
    fake = FakeProvider([SILENT])
    async with client_for(fake) as client:
        with pytest.RaisesGroup(KeyError, flatten_subgroups=True):
            async with open_turn(REQUEST, provider_for(), **options(client)) as turn:
                await trio.sleep(1.0)
                raise KeyError("the application's own error")
    events = await read_all(turn)
    assert seen(events)[-1] == END_CANCELLED
    assert trio.current_time() == pytest.approx(1.0)


async def test_a_turn_without_a_policy_gets_the_default_safety_net(
    autojump_clock: trio.testing.MockClock,
) -> None:
    fake = FakeProvider([SILENT, ok()])
    async with client_for(fake) as client:
        result = await run_turn(REQUEST, provider_for(), client=client, limiter=RateLimiter())
    assert result.outcome is Outcome.COMPLETED
    assert fake.times[0] == 0.0
    assert 120.09 <= fake.times[1] <= 120.1  # cut at 120 s, then 100 ms less up to 10 % jitter


# --- consumers ----------------------------------------------------------------------------------


async def test_every_consumer_sees_the_same_streams_whenever_it_starts(
    autojump_clock: trio.testing.MockClock,
) -> None:
    fake = FakeProvider([paced(partial(3, HANG)), paced(ok())])
    runs: dict[str, list[RunEvent]] = {}
    unis: dict[str, list[UniItem]] = {}

    async def read_from(name: str, turn: Turn, delay: float) -> None:
        await trio.sleep(delay)
        runs[name] = await read_all(turn)

    async def read_uni_from(name: str, turn: Turn, delay: float) -> None:
        await trio.sleep(delay)
        unis[name] = await read_uni(turn)

    async with client_for(fake) as client, trio.open_nursery() as nursery:
        turn: Turn = await nursery.start(
            functools.partial(run_turn, REQUEST, provider_for(), **options(client))
        )
        for name, delay in (("early", 0.0), ("mid", 3.5), ("late", 500.0)):
            nursery.start_soon(read_from, name, turn, delay)
            nursery.start_soon(read_uni_from, name, turn, delay)
    assert runs["early"] == runs["mid"] == runs["late"]
    assert unis["early"] == unis["mid"] == unis["late"]
    events = runs["early"]
    assert seen(events) == expect("start", "D*3", "reset", *OK_SEEN, END_OK)
    check_envelope(events, turn.run_id)
    assert rebuild(events) == TEXT
    check_uni(unis["early"])
    resets = [i for i, item in enumerate(unis["early"]) if isinstance(item, AttemptReset)]
    assert len(resets) == 1
    before = unis["early"][: resets[0]]
    assert [type(i.content_items[0]).__name__ for i in before if isinstance(i, UniEvent)] == [
        "TextDelta"
    ] * 3  # the voided group has no text.done


async def test_run_events_after_a_seq_resume_there(
    autojump_clock: trio.testing.MockClock,
) -> None:
    fake = FakeProvider([ok()])
    async with opened(fake) as turn:
        events = await read_all(turn)
        for after in (0, 1, 4, len(events) - 1, len(events)):
            tail = [e async for e in turn.run_events(after=after)]
            assert tail == events[after:]
            assert [e.seq for e in tail] == list(range(after + 1, len(events) + 1))


async def test_a_consumer_may_stop_reading_at_any_point(
    autojump_clock: trio.testing.MockClock,
) -> None:
    fake = FakeProvider([paced(ok())])
    async with opened(fake) as turn:
        for _ in range(3):
            async for _event in turn.run_events():
                break
            async for _item in turn.uni_events():
                break
        gc.collect()  # an abandoned async generator would warn here
        events = await read_all(turn)
    assert seen(events)[-1] == END_OK


async def test_uni_events_are_the_mmsp_stream_with_resets(
    autojump_clock: trio.testing.MockClock,
) -> None:
    fake = FakeProvider([partial(2), ok()])
    async with opened(fake) as turn:
        items = await read_uni(turn)
        result = await turn.result()
    assert [type(i).__name__ for i in items] == ["UniEvent"] * 2 + ["AttemptReset"] + [
        "UniEvent"
    ] * 7
    reset = items[2]
    assert isinstance(reset, AttemptReset)
    assert reset.attempt == 2
    last = items[-1]
    assert isinstance(last, UniEvent)
    assert last.event_type == "stop"
    assert last.finish_reason == "stop"
    done = items[-2]
    assert isinstance(done, UniEvent)
    assert done.content_items == [TextDone(text=TEXT)]
    assert result.message.content_items == [TextDone(text=TEXT)]
    assert result.events == 2 + 7


# --- result() -------------------------------------------------------------------------------------


@pytest.mark.parametrize("coding", ["gzip", "deflate", "identity"])
async def test_a_content_coded_stream_is_decoded_before_framing(
    autojump_clock: trio.testing.MockClock, coding: str
) -> None:
    raw = b"".join(OK)
    packed = {
        "gzip": gzip.compress(raw),
        "deflate": zlib.compress(raw),
        "identity": raw,
    }[coding]
    # cut the coded bytes anywhere: the decoder's reads are not the coder's blocks
    body = [packed[i : i + 7] for i in range(0, len(packed), 7)]
    fake = FakeProvider([Answer(body=body, headers={"content-encoding": coding})])
    async with client_for(fake) as client:
        result = await run_turn(REQUEST, provider_for(), **options(client))
    assert result.outcome is Outcome.COMPLETED
    assert result.text == TEXT
    assert result.attempts == 1


async def test_result_of_a_completed_turn(autojump_clock: trio.testing.MockClock) -> None:
    fake = FakeProvider([paced(partial(2), 0.5), paced(ok(), 0.5)])
    async with client_for(fake) as client:
        result = await run_turn(REQUEST, provider_for(), **options(client))
    assert isinstance(result, TurnResult)
    assert result.outcome is Outcome.COMPLETED
    assert result.ok
    assert result.text == TEXT
    assert result.message.role == "assistant"
    assert result.message.content_items == [TextDone(text=TEXT)]
    assert result.message.finish_reason == "stop"
    assert result.message.usage_metadata is not None
    assert result.message.usage_metadata.prompt_tokens == 12
    assert result.attempts == 2
    assert result.time_to_first_event == pytest.approx(0.5)
    assert result.total_time == pytest.approx(1.5 + 0.1 + 4.5)
    assert not result.partial  # completed, after a voided attempt
    assert result.error is None
    assert result.retry_after is None


async def test_result_of_a_rate_limited_turn_carries_the_wait(
    autojump_clock: trio.testing.MockClock,
) -> None:
    fake = FakeProvider([status(429, retry_after="120")])
    async with client_for(fake) as client:
        result = await run_turn(REQUEST, provider_for(), **options(client))
    assert result.outcome is Outcome.RATE_LIMITED
    assert not result.ok
    assert result.retry_after == 120.0
    assert result.attempts == 1
    assert not result.partial
    assert result.time_to_first_event is None
    assert result.message.content_items == []


async def test_result_waits_for_the_end(autojump_clock: trio.testing.MockClock) -> None:
    fake = FakeProvider([paced(ok(), 10.0)])
    async with client_for(fake) as client, trio.open_nursery() as nursery:
        turn: Turn = await nursery.start(
            functools.partial(run_turn, REQUEST, provider_for(), **options(client))
        )
        results = []

        async def wait() -> None:
            results.append(await turn.result())

        for _ in range(3):
            nursery.start_soon(wait)
        result = await turn.result()
        assert trio.current_time() == pytest.approx(90.0)
    assert results == [result] * 3


# --- cancellation ---------------------------------------------------------------------------------


async def test_turn_cancel_ends_the_turn_cancelled_without_raising(
    autojump_clock: trio.testing.MockClock,
) -> None:
    fake = FakeProvider([partial(2, HANG)])
    async with client_for(fake) as client, trio.open_nursery() as nursery:
        turn: Turn = await nursery.start(
            functools.partial(run_turn, REQUEST, provider_for(), **options(client))
        )
        async for event in turn.run_events():
            if isinstance(event, AnswerDelta) and event.delta == "quick ":
                turn.cancel()
        result = await turn.result()
    events = await read_all(turn)
    assert result.outcome is Outcome.CANCELLED
    assert seen(events) == expect("start", "D*2", END_CANCELLED)
    assert result.text == "The quick "
    assert fake.bodies[0].closed
    assert trio.current_time() == 0.0


async def test_turn_cancel_right_after_start_ends_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # `nursery.start` returns a turn that is already streaming: its request is out
    fake = FakeProvider([ok()])
    async with client_for(fake) as client, trio.open_nursery() as nursery:
        turn: Turn = await nursery.start(
            functools.partial(run_turn, REQUEST, provider_for(), **options(client))
        )
        turn.cancel()
    ended = trio.current_time()
    await trio.sleep(3600)
    events = await read_all(turn)
    result = await turn.result()
    assert ended == 0.0
    assert len(fake.sent) <= 1
    assert result.outcome is Outcome.CANCELLED
    assert result.attempts == len(fake.sent)
    assert seen(events) == expect("start", END_CANCELLED)
    end = events[-1]
    assert isinstance(end, RunDone)
    assert end.attempts == len(fake.sent)
    assert all(body.closed for body in fake.bodies)


async def test_cancel_after_the_provider_finished_but_before_delivery_is_cancelled(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The handler is done, the last batches still wait for a stuck sink: the turn did not
    deliver its reply, so it must not say `completed` with a digest of the partial text."""

    class Stuck:
        async def deliver(self, batch: SinkBatch) -> None:
            await trio.sleep_forever()

        async def close(self) -> None:
            pass

    fake = FakeProvider([Answer(body=[OK[0] + OK[1], OK[2] + OK[3], b"".join(OK[4:])])])
    async with client_for(fake) as client:
        with trio.move_on_after(10.0):
            async with trio.open_nursery() as nursery:
                turn: Turn = await nursery.start(
                    functools.partial(
                        run_turn,
                        REQUEST,
                        provider_for(),
                        **options(client, policy=policy(channel_size=1), sinks=[Stuck()]),
                    )
                )
    result = await turn.result()
    events = await read_all(turn)
    assert result.outcome is Outcome.CANCELLED
    assert seen(events)[-1] == END_CANCELLED
    assert "done" not in seen(events)
    assert result.text == rebuild(events)
    check_envelope(events, turn.run_id)
