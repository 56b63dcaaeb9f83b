"""A `PartRun` is read exactly as its fragments one `PartDelta` at a time: the same UniEvents,
the same `.done` items, the same protocol error, whether the grammar takes it in a batch
(`feed_many`, its fast path for the lane streaming now) or alone (`feed`), for the lane at the
head of the queue and for one that is held behind it."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from rillet import RilletError, encode_json
from rillet.lowlevel import (
    Grammar,
    LaneEvent,
    LaneKind,
    MessageDelta,
    MessageStop,
    PartDelta,
    PartRun,
    PartStart,
    PartStop,
)

_KINDS: tuple[LaneKind, ...] = ("text", "thinking", "tool_call")


def _lanes(rng: random.Random) -> list[LaneEvent]:
    """Up to three lanes that open, interleave their fragments (some empty) and close."""
    events: list[LaneEvent] = []
    lanes = [(i, _KINDS[i % 3]) for i in range(rng.randint(1, 3))]
    for index, kind in lanes:
        events.append(PartStart(index=index, kind=kind, name="f", call_id=f"c{index}"))
    for _ in range(rng.randint(0, 30)):
        index, kind = rng.choice(lanes)
        value = rng.choice(["", "a", "bc", "é", "{", '"x"', "}"])
        if rng.random() < 0.05:  # a fragment for a lane that is not open
            index += 7
        events.append(PartDelta(index, kind, value))
    for index, kind in rng.sample(lanes, len(lanes)):
        events.append(PartStop(index, kind))
    events += [MessageDelta(finish_reason="stop"), MessageStop()]
    return events


def _runs(events: list[LaneEvent], rng: random.Random) -> list[LaneEvent]:
    """The same events with some runs of a lane's fragments (non-empty strings, no fidelity)
    as one `PartRun` each, as a stream decoder's `feed_frames` hands them on."""
    out: list[LaneEvent] = []
    run: list[str] | None = None
    key: tuple[int, str] | None = None
    for event in events:
        runnable = type(event) is PartDelta and type(event.value) is str and event.value
        if runnable and rng.random() < 0.8:
            assert isinstance(event, PartDelta)
            if run is None or key != (event.index, event.kind) or rng.random() < 0.1:
                run, key = [], (event.index, event.kind)
                out.append(PartRun(event.index, event.kind, run))
            run.append(event.value)
            continue
        run = None
        out.append(event)
    return out


def _read(events: list[LaneEvent], *, batched: bool) -> tuple[list[Any], str]:
    grammar = Grammar("acme", clock=lambda: 0)
    out: list[Any] = []
    try:
        if batched:
            grammar.feed_many(events, out)
        else:
            for event in events:
                grammar.feed(event, out)
        out += grammar.close()
    except RilletError as exc:
        return [encode_json(e) for e in out], f"{type(exc).__name__}: {exc}"
    return [encode_json(e) for e in out], "complete"


@pytest.mark.parametrize("seed", range(300))
def test_a_run_reads_as_its_fragments(seed: int) -> None:
    rng = random.Random(seed)
    events = _lanes(rng)
    expected = _read(events, batched=False)
    runs = _runs(events, rng)
    assert _read(runs, batched=True) == expected
    assert _read(runs, batched=False) == expected


def test_the_cases_hold_runs_held_lanes_and_errors() -> None:
    cases = []
    for seed in range(300):
        rng = random.Random(seed)
        events = _lanes(rng)
        cases.append((_runs(events, rng), _read(events, batched=False)[1]))
    assert sum(any(type(e) is PartRun for e in runs) for runs, _ in cases) > 200
    assert sum(end != "complete" for _, end in cases) > 10  # fragments for no open lane


def test_a_run_for_a_lane_held_behind_another_waits_its_turn() -> None:
    events: list[LaneEvent] = [
        PartStart(index=0, kind="thinking"),
        PartStart(index=1, kind="text"),
        PartRun(1, "text", ["b", "c"]),  # held: the thinking lane is streaming
        PartRun(0, "thinking", ["a"]),
        PartStop(0, "thinking"),
        PartStop(1, "text"),
        MessageStop(),
    ]
    out, end = _read(events, batched=True)
    assert end == "complete"
    shown = [json.loads(e) for e in out]
    kinds = [
        e["content_items"][0]["type"] if e["content_items"] else e["event_type"] for e in shown
    ]
    assert kinds == [
        "thinking.delta",
        "thinking.done",
        "text.delta",
        "text.delta",
        "text.done",
        "stop",
    ]
    assert (out, end) == _read(events, batched=False)


def test_a_run_of_the_lane_streaming_goes_out_in_one_step() -> None:
    events: list[LaneEvent] = [
        PartStart(index=0, kind="text"),
        PartRun(0, "text", ["Hel", "lo"]),
        PartStop(0, "text"),
        MessageStop(),
    ]
    out, end = _read(events, batched=True)
    assert end == "complete"
    assert [b'"text":"Hel"' in e for e in out[:2]] == [True, False]
    assert b'"text":"lo"' in out[1]
    assert b'"type":"text.done"' in out[2]
    assert b'"text":"Hello"' in out[2]


def test_an_empty_fragment_in_a_run_is_dropped_as_a_delta_would_be() -> None:
    events: list[LaneEvent] = [
        PartStart(index=0, kind="text"),
        PartRun(0, "text", ["a", "", "b"]),
        PartStop(0, "text"),
        MessageStop(),
    ]
    out, _ = _read(events, batched=True)
    assert sum(b'"type":"text.delta"' in e for e in out) == 2
