"""Memory per turn: a turn that keeps its history keeps it compactly (text fragments as spans
of the answer's one copy of the text) and still replays exactly what it delivered; the answer
and its `text.done` item share one string; a finished turn keeps a few bytes a fragment."""

from __future__ import annotations

import functools
import gc
import tracemalloc
from typing import TYPE_CHECKING, Any

import pytest
import trio
import trio.testing
from rillet._core._events import (
    TextDelta,
    TextDone,
    ThinkingDelta,
    UniEvent,
    UsageMetadata,
    encode_json,
    stop_event,
)
from rillet._core._markers import AttemptReset
from rillet._core._runevents import RunEvent, RunEventBuilder
from rillet._turn._api import open_turn, run_turn
from rillet._turn._graph import AccumulatorActor
from rillet._turn._history import PlainLog, RunHistory, UniHistory
from rillet._turn._turn import CallbackSink, Turn, UniItem
from rillet.lowlevel import Accumulator

from ..handler_support import (
    FRAGMENTS,
    REQUEST,
    TEXT,
    Answer,
    FakeProvider,
    ok,
    openai_events,
    partial,
    provider_for,
    rescue_ok,
    tool_stream,
)
from ..turn_support import client_for, options

if TYPE_CHECKING:
    from collections.abc import Sequence

pytestmark = pytest.mark.usefixtures("graph")  # every turn here runs under both graphs

MANY = [f"w{i} café 👋 " if i % 7 == 0 else f"w{i} " for i in range(300)]


def _in_two_reads(events: list[bytes]) -> Answer:
    """These events in two reads: several events a batch, so batches share stamps."""
    half = len(events) // 2
    return Answer(body=[b"".join(events[:half]), b"".join(events[half:])])


SCRIPTS: dict[str, tuple[list[Answer], Answer | None]] = {
    "one attempt": ([ok()], None),
    "retried after a partial answer": ([partial(3), partial(2), ok()], None),
    "rescued after partial answers": ([partial(4)], rescue_ok()),
    "a tool call": ([tool_stream(['{"city"', ': "Paris"}'])], None),
    "many fragments in few reads": ([_in_two_reads(openai_events(MANY))], None),
    "empty and repeated fragments": ([Answer(body=openai_events(["", "a", "", "a", "ab"]))], None),
}


async def _delivered_and_replayed(
    answers: list[Answer], rescue: Answer | None
) -> tuple[list[RunEvent], list[UniItem], Turn]:
    """A turn with history: what its sink was given, and its handle once it has ended (with a
    live reader of each log checked against the sink on the way)."""
    fake = FakeProvider(answers, rescue=rescue)
    runs: list[RunEvent] = []
    unis: list[UniItem] = []
    live: dict[str, list[Any]] = {}
    sink = CallbackSink(runs.append, unis.append)
    async with (
        client_for(fake) as client,
        trio.open_nursery() as nursery,
    ):
        turn: Turn = await nursery.start(
            functools.partial(run_turn, REQUEST, provider_for(), **options(client, sinks=[sink]))
        )

        async def follow(name: str, source: Any) -> None:
            live[name] = [item async for item in source]

        nursery.start_soon(follow, "run", turn.run_events())
        nursery.start_soon(follow, "uni", turn.uni_events())
        await turn.result()
    assert live["run"] == runs
    assert live["uni"] == unis
    return runs, unis, turn


@pytest.mark.parametrize("script", list(SCRIPTS))
async def test_the_history_replays_exactly_what_the_sinks_were_given(
    script: str, autojump_clock: trio.testing.MockClock
) -> None:
    answers, rescue = SCRIPTS[script]
    runs, unis, turn = await _delivered_and_replayed(answers, rescue)
    replayed_runs = [event async for event in turn.run_events()]
    replayed_unis = [item async for item in turn.uni_events()]
    assert replayed_runs == runs
    assert replayed_unis == unis
    # byte for byte as they would go out, and from any cursor
    assert [encode_json(e) for e in replayed_runs] == [encode_json(e) for e in runs]
    assert [encode_json(i) for i in replayed_unis] == [encode_json(i) for i in unis]
    for after in (1, 2, len(runs) // 2, len(runs) - 1, len(runs)):
        assert [event async for event in turn.run_events(after)] == runs[after:]


async def test_a_voided_attempts_fragments_still_replay_after_the_reset(
    autojump_clock: trio.testing.MockClock,
) -> None:
    _, _, turn = await _delivered_and_replayed([partial(3), ok()], None)
    result = await turn.result()
    assert result.text == TEXT
    replayed = [item async for item in turn.uni_events()]
    reset = next(i for i, item in enumerate(replayed) if isinstance(item, AttemptReset))
    voided = [
        item.content_items[0].text  # type: ignore[union-attr]
        for item in replayed[:reset]
        if isinstance(item, UniEvent) and item.content_items
    ]
    assert voided == list(FRAGMENTS[:3])


async def test_a_turns_history_holds_no_object_per_fragment(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with (
        client_for(FakeProvider([Answer(body=openai_events(MANY))])) as client,
        open_turn(REQUEST, provider_for(), **options(client)) as turn,
    ):
        result = await turn.result()
    assert result.text == "".join(MANY)
    for log in (turn._uni, turn._run):
        assert isinstance(log, UniHistory | RunHistory)
        # the 300 fragments are one run; the items around them are kept as they came
        assert len(log._entries) < 10
        assert log.end > len(MANY)


async def test_the_answer_and_its_text_done_item_share_one_string(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with client_for(FakeProvider([ok()])) as client:
        result = await run_turn(REQUEST, provider_for(), **options(client, history=False))
    done = result.message.content_items[0]
    assert isinstance(done, TextDone)
    assert result.text == TEXT
    assert result.text is done.text


async def _retained_per_turn(history: bool, turns: int = 20) -> float:
    """Traced bytes a finished turn of `MANY` keeps (its handle held), after a collection."""
    body = openai_events(MANY)
    kept: list[Turn] = []
    async with client_for(FakeProvider([Answer(body=body)])) as client:

        async def one() -> None:
            async with open_turn(
                REQUEST, provider_for(), **options(client, history=history)
            ) as turn:
                await turn.result()
            kept.append(turn)

        await one()  # first-use allocations
        kept.clear()
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            async with trio.open_nursery() as nursery:
                for _ in range(turns):
                    nursery.start_soon(one)
            gc.collect()
            after = tracemalloc.get_traced_memory()[0]
        finally:
            tracemalloc.stop()
    assert len(kept) == turns
    assert all(t.done for t in kept)
    assert [(await t.result()).text for t in kept] == ["".join(MANY)] * turns
    return (after - before) / turns


async def test_a_finished_turn_keeps_a_few_bytes_a_fragment(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # 300 fragments, 1,800-odd characters (four bytes each: the text holds emoji); a history
    # of one object per fragment would be well over 100 KB
    text_bytes = 4 * len("".join(MANY))
    with_history = await _retained_per_turn(history=True)
    without = await _retained_per_turn(history=False)
    assert with_history - without < 48 * len(MANY)  # the two logs: a few bytes a fragment
    assert without < text_bytes + 12 * 1024  # the text once, and the turn's own objects


# --- the logs on their own ------------------------------------------------------------------------


class _Tee:
    """A log that appends to a plain log and a history at once: the reference and the one
    under test see the same batches."""

    def __init__(self, plain: PlainLog[Any], history: PlainLog[Any]) -> None:
        self.plain = plain
        self.history = history

    @property
    def end(self) -> int:
        return self.plain.end

    def extend(self, items: Sequence[Any]) -> None:
        self.plain.extend(items)
        self.history.extend(items)

    def forget(self, position: int) -> None:
        raise AssertionError("a history is not forgotten")


def _delta(item: Any, at: int = 1_700_000_000_000) -> UniEvent:
    return UniEvent(event_type="delta", content_items=[item], created_at=at)


FINAL = "Wé😀" + "l" * 301 + "ad!"  # the text after the reset, as its `text.done` holds it


def test_every_read_of_a_history_equals_the_plain_log() -> None:
    accumulator = Accumulator()
    builder = RunEventBuilder("run-1", iter(range(1000)).__next__, text=accumulator.answer)
    uni_history = UniHistory(accumulator.answer)
    uni = _Tee(PlainLog(), uni_history)
    run = _Tee(PlainLog(), RunHistory(uni_history, "run-1"))
    actor = AccumulatorActor(accumulator, builder, uni, run, True, [], [])
    usage = UsageMetadata(prompt_tokens=1, response_tokens=2)
    batches: list[list[Any]] = [
        [_delta(TextDelta(text="Hel")), _delta(TextDelta(text="lo"))],
        [_delta(TextDelta(text=""))],  # an empty fragment: no answer.delta, no characters
        [_delta(TextDelta(text=" wor", fidelity={"sig": "x"}))],  # kept as it came
        [_delta(ThinkingDelta(thinking="hmm")), _delta(TextDelta(text="ld"), at=5)],
        [AttemptReset(2), _delta(TextDelta(text="Wé")), _delta(TextDelta(text="😀"), at=1)],
        [_delta(TextDelta(text="l"), at=1 << 40), _delta(TextDelta(text="l" * 299))],
        [_delta(TextDelta(text="l"), at=1 << 70)],  # past what a run holds: kept as it came
        # two items in one event (not the grammar's shape): counted as the accumulator counts
        [UniEvent(event_type="delta", content_items=[TextDelta(text="a"), TextDelta(text="b")])],
        [UniEvent(event_type="delta", content_items=[TextDone(text="c"), TextDelta(text="d")])],
        [_delta(TextDelta(text="!")), _delta(TextDone(text=FINAL))],
        [stop_event(usage, "stop", 9)],
    ]
    for batch in batches:
        actor.offer(batch)
    for tee in (uni, run):
        expected = tee.plain.items
        history = tee.history
        assert history.end == len(expected)
        assert history.since(0) == expected
        for position in range(len(expected) + 1):
            for limit in (1, 2, 3, 256):
                got = history.read(position, limit)
                assert got == expected[position : position + limit], (position, limit)
    kept = uni_history._entries
    assert any(isinstance(e, UniEvent) and e.created_at == 1 << 70 for e in kept)  # as it came
    assert accumulator.text == FINAL
    assert accumulator.answer.parts[0] is accumulator.items[-1].text  # type: ignore[union-attr]


def test_a_history_refuses_to_forget() -> None:
    with pytest.raises(TypeError):
        UniHistory(Accumulator().answer).forget(1)


async def test_a_follower_of_a_log_that_forgets_starts_at_what_is_kept() -> None:
    log: PlainLog[int] = PlainLog()
    log.extend(list(range(600)))
    log.forget(3)
    log.close()
    assert [item async for item in log.follow()] == list(range(3, 600))
    assert [item async for item in log.follow(598)] == [598, 599]
