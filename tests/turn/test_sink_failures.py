"""A sink that raises, among others: the application's error comes out of the turn (alone: no
error of the turn's own beside it), and every other sink still gets the run gapless up to its
one `run.done`, which says `error` / `internal_error` (the run did not end well, and no one
cancelled it), and is closed."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
import trio
import trio.testing
from rillet import CallbackSink, SinkBatch, TurnRequest, run_turn, user
from rillet._core._runevents import RunDone, RunEvent, decode_run_event
from rillet._hub._hub import Hub
from rillet.transports.sinks import JSONLSink
from rillet.transports.testing import open_loopback_provider

from ..server_support import POLICY, chat_provider, text_reply

if TYPE_CHECKING:
    from pathlib import Path


class AppBug(Exception):
    pass


def raising_at(seq: int) -> CallbackSink:
    """A callback sink whose function raises on the event with this seq."""

    def on_run_event(event: RunEvent) -> None:
        if event.seq == seq:
            raise AppBug(f"seq {event.seq}")

    return CallbackSink(on_run_event=on_run_event)


class RaisingActor:
    """A sink of its own task (its `deliver` awaits) that raises on the batch holding `seq`."""

    def __init__(self, seq: int) -> None:
        self.seq = seq

    async def deliver(self, batch: SinkBatch) -> None:
        await trio.lowlevel.checkpoint()
        if any(e.seq == self.seq for e in batch.run):
            raise AppBug(f"seq {self.seq}")

    async def close(self) -> None:
        pass


async def turn_with(sinks: list[object], *, chain: bool) -> None:
    """A turn of one provider, or of a chain of one (its run stream feeds the sinks)."""
    words = [f"{n} " for n in range(20)]
    async with open_loopback_provider([text_reply(words, chunk_delay=0.001)]) as loopback:
        provider = chat_provider(loopback.url)
        await run_turn(
            TurnRequest(messages=[user("Hi")]),
            [provider] if chain else provider,
            sinks=sinks,  # type: ignore[arg-type]
            policy=POLICY,
            run_id="r1",
        )


def assert_whole(events: list[RunEvent]) -> None:
    """Seqs gapless from 1, and exactly one `run.done`, last."""
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert isinstance(events[-1], RunDone)
    assert [type(e) for e in events].count(RunDone) == 1


@pytest.mark.parametrize("kind", ["callback", "actor"])
@pytest.mark.parametrize("chain", [False, True], ids=["turn", "chain"])
@pytest.mark.parametrize("at", ["mid_run", "run_done"])
async def test_a_sink_that_raises_leaves_the_others_a_whole_run_and_closes_them(
    at: str, chain: bool, kind: str, tmp_path: Path
) -> None:
    hub = Hub()
    path = tmp_path / "run.jsonl"
    jsonl = JSONLSink(path)
    probe: list[RunEvent] = []
    with trio.fail_after(10):
        await turn_with([CallbackSink(on_run_event=probe.append)], chain=chain)
    end = len(probe)
    seq = 5 if at == "mid_run" else end  # the run's own `run.done` is its last seq
    with (
        trio.fail_after(10),
        pytest.RaisesGroup(AppBug, allow_unwrapped=True, flatten_subgroups=True),
    ):
        raising = raising_at(seq) if kind == "callback" else RaisingActor(seq)
        await turn_with([raising, hub.sink("r1"), jsonl], chain=chain)
    kept = [entry.event for entry in hub.log.get("r1").entries]
    written = [decode_run_event(line) for line in path.read_bytes().splitlines()]
    assert_whole(kept)
    assert written == kept
    assert hub.log.get("r1").done  # followers reach the end; the run is swept in time
    assert jsonl._closed
    done = kept[-1]
    assert isinstance(done, RunDone)
    if at == "mid_run":
        assert (done.status, done.code) == ("error", "internal_error")
    else:  # raised at the run's own end: the run had completed
        assert (done.status, done.code) == ("completed", "completed")


@pytest.fixture
def loop_clock() -> trio.testing.MockClock:
    """Virtual time that jumps only after 20 ms of real idleness (bytes in flight on loopback
    are not silence): the grace passes at once, the turn's reads in real time."""
    return trio.testing.MockClock(autojump_threshold=0.02)


class StuckAtTheEnd:
    """A sink that takes every batch on the turn's task, but whose `deliver` (the end's) never
    returns."""

    def __init__(self) -> None:
        self.closed = False

    def deliver_nowait(self, batch: SinkBatch) -> bool:
        return True

    async def deliver(self, batch: SinkBatch) -> None:
        await trio.sleep_forever()

    async def close(self) -> None:
        self.closed = True


@pytest.mark.parametrize("chain", [False, True], ids=["turn", "chain"])
async def test_a_turn_a_sink_failed_gives_the_others_a_grace_not_a_wait_forever(
    chain: bool, loop_clock: trio.testing.MockClock
) -> None:
    stuck = StuckAtTheEnd()
    with (
        trio.fail_after(60),  # virtual seconds: the grace is a few
        pytest.RaisesGroup(AppBug, allow_unwrapped=True, flatten_subgroups=True),
    ):
        await turn_with([raising_at(5), stuck], chain=chain)
    assert stuck.closed
