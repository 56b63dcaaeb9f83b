"""The memory hub's wake-up: an append wakes one waiting subscriber (the leader), which hands the
new entries to the other waiting subscribers' `push` writers, in turns, and wakes only those that
could not take them. Every subscriber still gets every entry once, in order."""

from __future__ import annotations

import collections
from typing import TYPE_CHECKING

import attrs
import rillet._hub._hub
import trio
from rillet._core._runevents import AnswerDelta, RunEvent
from rillet._hub._hub import Entry, Hub, Subscription

from ..sinks_support import completed_done

if TYPE_CHECKING:
    import pytest

RUN = "run"


def delta(seq: int) -> RunEvent:
    return AnswerDelta(run_id=RUN, seq=seq, elapsed_ms=seq, delta=f"{seq} ")


def done(seq: int) -> RunEvent:
    return completed_done(RUN, seq)


@attrs.define(eq=False)
class Reader:
    """A subscriber: what its writer took (pushed) and what its task read (`next_batch`)."""

    sub: Subscription
    accept: bool = True
    fail: bool = False
    seqs: list[int] = attrs.field(factory=list)
    pushed: list[list[Entry]] = attrs.field(factory=list)
    pushers: list[trio.lowlevel.Task] = attrs.field(factory=list)  # the task each push ran in
    reads: int = 0  # batches `next_batch` returned

    def push(self, batch: list[Entry]) -> bool:
        if self.fail:
            raise RuntimeError("a writer bug")
        if not self.accept:
            return False
        self.pushed.append(batch)
        self.pushers.append(trio.lowlevel.current_task())
        self.seqs += [entry.seq for entry in batch]
        return True

    async def run(self) -> None:
        while batch := await self.sub.next_batch():
            self.reads += 1
            self.seqs += [entry.seq for entry in batch]


async def follow_all(hub: Hub, readers: list[Reader], nursery: trio.Nursery) -> None:
    for reader in readers:
        reader.sub.push = reader.push
        nursery.start_soon(reader.run)
    await wait_parked(hub, len(readers))


async def wait_parked(hub: Hub, n: int) -> None:
    run = hub.log.get(RUN)
    with trio.fail_after(5):
        while len(run.parked) < n or run._leading:
            await trio.lowlevel.checkpoint()


def readers_of(hub: Hub, n: int, *, accept: bool = True, fail: bool = False) -> list[Reader]:
    return [Reader(hub.subscribe(RUN), accept=accept, fail=fail) for _ in range(n)]


async def test_pushed_subscribers_get_every_entry_once_in_order_and_one_task_wakes_per_append() -> (
    None
):
    hub = Hub()
    hub.create(RUN)
    readers = readers_of(hub, 5)
    appends = 6
    async with trio.open_nursery() as nursery:
        await follow_all(hub, readers, nursery)
        for seq in range(1, appends + 1):
            hub.append(RUN, [delta(seq)])
            await wait_parked(hub, 5)
        hub.append(RUN, [done(appends + 1)])
    for reader in readers:
        assert reader.seqs == list(range(1, appends + 2))
    assert sum(r.reads for r in readers) == appends + 1  # the leader's own, one per append
    assert sum(len(r.pushed) for r in readers) == 4 * (appends + 1)  # the others were pushed


async def test_one_sweep_hands_every_subscriber_the_same_list() -> None:
    hub = Hub()
    hub.create(RUN)
    readers = readers_of(hub, 4)
    async with trio.open_nursery() as nursery:
        await follow_all(hub, readers, nursery)
        hub.append(RUN, [delta(1), delta(2)])
        await wait_parked(hub, 4)
        nursery.cancel_scope.cancel()
    batches = [r.pushed[0] for r in readers if r.pushed]
    assert len(batches) == 3
    assert all(batch is batches[0] for batch in batches)  # encoded once by a transport
    assert [e.seq for e in batches[0]] == [1, 2]


async def test_appends_before_the_leader_runs_go_out_in_one_push() -> None:
    hub = Hub()
    hub.create(RUN)
    readers = readers_of(hub, 3)
    async with trio.open_nursery() as nursery:
        await follow_all(hub, readers, nursery)
        for seq in (1, 2, 3):
            hub.append(RUN, [delta(seq)])  # no checkpoint between: the leader has not run
        await wait_parked(hub, 3)
        nursery.cancel_scope.cancel()
    pushed = [r.pushed for r in readers if r.pushed]
    assert [[e.seq for e in batch] for batches in pushed for batch in batches] == [[1, 2, 3]] * 2


async def test_a_writer_that_refuses_or_fails_leaves_the_entries_to_next_batch() -> None:
    hub = Hub()
    hub.create(RUN)
    refusing = readers_of(hub, 2, accept=False)
    failing = readers_of(hub, 2, fail=True)
    readers = refusing + failing
    async with trio.open_nursery() as nursery:
        await follow_all(hub, readers, nursery)
        for seq in range(1, 4):
            hub.append(RUN, [delta(seq)])
            await wait_parked(hub, 4)
        hub.append(RUN, [done(4)])
    for reader in readers:
        assert reader.seqs == [1, 2, 3, 4]
        assert not reader.pushed
        assert reader.reads == 4  # each woke for every append


async def test_a_sweep_past_the_turn_size_is_handed_over_and_reaches_everyone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(rillet._hub._hub, "_LEAD", 2)  # the leader's turn lives with RunState
    hub = Hub()
    hub.create(RUN)
    readers = readers_of(hub, 9)
    async with trio.open_nursery() as nursery:
        await follow_all(hub, readers, nursery)
        for seq in range(1, 4):
            hub.append(RUN, [delta(seq)])
            await wait_parked(hub, 9)
        hub.append(RUN, [done(4)])
    for reader in readers:
        assert reader.seqs == [1, 2, 3, 4]
    first = [r.pushers[0] for r in readers if r.pushers and r.pushed[0][0].seq == 1]
    turns = collections.Counter(first)  # the first append's pushes, by the task they ran in
    assert len(turns) >= 3  # 8 others: a leader pushes 2 and hands over to one that reads
    assert max(turns.values()) == 2


async def test_a_subscriber_whose_wait_was_cancelled_is_not_pushed_to() -> None:
    hub = Hub()
    hub.create(RUN)
    reader = Reader(hub.subscribe(RUN))
    reader.sub.push = reader.push
    with trio.move_on_after(0.01):
        await reader.sub.next_batch()
    assert not hub.log.get(RUN).parked
    other = Reader(hub.subscribe(RUN))
    async with trio.open_nursery() as nursery:
        await follow_all(hub, [other], nursery)
        hub.append(RUN, [delta(1)])
        hub.append(RUN, [done(2)])
    assert not reader.pushed  # not waiting: its next `next_batch` reads them
    assert [e.seq for e in await reader.sub.next_batch()] == [1, 2]
    assert other.seqs == [1, 2]


async def test_a_sweep_that_fails_wakes_everyone_waiting(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(self: object) -> None:
        raise RuntimeError("a bug in the sweep")

    monkeypatch.setattr(rillet._hub._hub.RunState, "lead", broken)
    hub = Hub()
    hub.create(RUN)
    readers = readers_of(hub, 3)
    failed: list[Reader] = []

    async def run(reader: Reader) -> None:
        try:
            await reader.run()
        except RuntimeError:
            failed.append(reader)

    with trio.fail_after(5):  # nobody left waiting for a leader that is gone
        async with trio.open_nursery() as nursery:
            for reader in readers:
                reader.sub.push = reader.push
                nursery.start_soon(run, reader)
            await wait_parked(hub, 3)
            hub.append(RUN, [delta(1)])
            hub.append(RUN, [done(2)])
    assert len(failed) == 1  # the leader
    assert all(r.seqs == [1, 2] for r in readers if r not in failed)  # the others, woken
