"""The fan-out hub: per run, an append-only bounded log of run events, and any number of
subscribers following it, each at its own pace.

Theory of operation
-------------------
A run's events are appended once, each encoded to JSON once (every subscriber sends the same
bytes). A subscriber is a cursor into the log, not a copy of it: appending never waits for a
subscriber and costs the same with one or a thousand. Each subscriber has a buffer allowance:
when the log's head runs further ahead of its cursor than that, it is dropped, with a reason,
and the transport that carries it closes (WebSocket 1013, SSE end of stream). It resumes from
its last seq with a new subscription, so nobody is silently skipped and nobody slows the run or
the others. The allowance counts events appended after it subscribed: a late joiner (or a resume
from an old seq) replays what the log already held at its own pace, and is dropped only when the
live events it has not read outgrow its allowance.

The log of a run (`RunState`) is bounded in events and bytes, and the logs of all runs together
too (`MemoryRunLog`, where the logs live in this process): past a bound the oldest events (or,
across runs, the oldest finished runs) are forgotten, and a cursor below what is kept is refused
(`CursorExpired`, never a gap). A run is kept `retention` seconds after its `run.done`, then
forgotten (`UnknownRun`). A run's state and the subscriptions following it are one concept:
the state keeps its subscribers, each subscriber reads the state.

Two implementations share one interface, `RunHub`, which is all a server uses: `Hub` keeps
the logs in this process (`MemoryRunLog`, the default); `rillet._hub._redis.RedisHub` keeps them
in Redis Streams, so that any server sharing that Redis serves any run's subscribers. Both hand
out the same `Subscription`: the same buffer allowance, drop reasons, resume and expiry rules.

Waking subscribers
------------------
A subscriber that has read everything waits in `next_batch`, parked on its own (no event per
append). An append wakes one of them, the leader, whatever the number waiting; the leader, as it
wakes, hands the new entries to every other waiting subscriber that has a `push` writer (one
list for all, so a transport encodes them once) and wakes only those whose writer did not take
them. A transport that can write without blocking (a socket with room) so delivers without a
task switch per subscriber; appends that arrive before the leader runs go out together.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import attrs
import trio

from .._core._errors import (
    CursorExpired,
    CursorInvalid,
    HubError,
    RunExists,
    SubscriberDropped,
    UnknownRun,
)
from .._core._events import encode_json
from .._core._runevents import Entry, RunDone, RunEvent

if TYPE_CHECKING:
    from collections.abc import Sequence

    from .._turn._graph import Sink, SinkBatch

__all__ = [
    "ENTRY_BYTES",
    "MEMORY_BUDGET",
    "RUN_BYTES",
    "Entry",
    "Hub",
    "HubSink",
    "MemoryRunLog",
    "RunHub",
    "RunLog",
    "RunState",
    "Subscription",
    "entry_cost",
    "parse_cursor",
]


def parse_cursor(run_id: str, raw: str | None) -> int:
    """A resume cursor as a seq: `""`/None (from the start) -> 0; `"<run_id>:<seq>"` (an SSE
    `Last-Event-ID`) or a bare `"<seq>"` (`?after=`). Raises `CursorInvalid` otherwise."""
    if raw is None or raw == "":
        return 0
    text = raw
    if ":" in raw:
        owner, _, text = raw.rpartition(":")
        if owner != run_id:
            raise CursorInvalid("another run's cursor")
    if not (text.isascii() and text.isdigit()) or len(text) > 18:
        raise CursorInvalid("not a sequence number")
    return int(text)


MEMORY_BUDGET = 256 * 1024 * 1024
"""The memory a server's kept state may take: its kept runs' cap (`MemoryRunLog`), and what
other kept state (an MCP server's sessions) is sized from."""

ENTRY_BYTES = 144
"""Bytes an entry holds besides what its JSON's size accounts for: the `Entry`, the event's
struct, the integers of its seq and time, its place in the log's list (136 on the heap, and
the allocator's 5 %)."""

RUN_BYTES = 2048
"""Bytes a kept run holds however few its events: its `RunState` (with its event and the
dictionary slots that find it) and a server's record of it (its token's digest)."""


_LEAD = 256  # pushes in one leader's turn (a few milliseconds of writing)


class RunState:
    """One run's kept log and its live subscribers: what a `RunLog` holds for each run."""

    __slots__ = (
        "_changed",
        "_leading",
        "_pos",
        "_sweep",
        "access",
        "base",
        "cost",
        "done_at",
        "entries",
        "nbytes",
        "parked",
        "run_id",
        "subscribers",
    )

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.entries: list[Entry] = []
        self.base = 1  # seq of entries[0]
        self.nbytes = 0
        self.cost = RUN_BYTES  # what it is estimated to hold in memory (`entry_cost`)
        self.done_at: float | None = None
        self.subscribers: set[Subscription] = set()
        self.access: bytes | None = None  # what its server checks tokens against, if given
        self._changed = trio.Event()
        # subscribers waiting in `next_batch` with nothing left to read, and their tasks
        self.parked: dict[Subscription, trio.lowlevel.Task] = {}
        self._leading = False  # a leader was woken and has not finished its sweep
        self._sweep: list[Subscription] = []  # the parked subscribers the sweep visits
        self._pos = 0  # the next one to visit

    @property
    def last_seq(self) -> int:
        return self.base + len(self.entries) - 1

    @property
    def done(self) -> bool:
        return self.done_at is not None

    def wake(self) -> None:
        """Something changed: wake the waiters of `wait`, and one parked subscriber (the leader,
        which hands the news to the others as it wakes)."""
        self._changed.set()
        self._changed = trio.Event()
        if self.parked and not self._leading:
            sub = next(iter(self.parked))
            self._leading = sub._leads = True
            trio.lowlevel.reschedule(self.parked.pop(sub))

    async def wait(self) -> None:
        await self._changed.wait()

    def abandon(self) -> None:
        """A sweep that failed (a bug): wake every parked subscriber, so none waits for a
        leader that is gone."""
        self._sweep, self._pos, self._leading = [], 0, False
        parked, self.parked = self.parked, {}
        for task in parked.values():
            trio.lowlevel.reschedule(task)

    def lead(self) -> None:
        """The leader's turn: push what is new to parked subscribers that have a `push`
        writer, and wake those without one, those whose writer refused, and all once the run is
        done (they return from `next_batch`). A sweep visits every parked subscriber once, in
        turns of `_LEAD` pushes: past that, the turn is handed to another parked subscriber,
        so the tasks of the rest of the program run in between."""
        head = self.last_seq
        done = self.done
        parked = self.parked
        batches: dict[int, list[Entry]] = {}  # by first index: cursors are mostly alike
        sweep = self._sweep
        pos = self._pos
        turn = 0
        while True:
            if pos == len(sweep):
                if not any(sub.cursor < head for sub in parked) and not (done and parked):
                    self._sweep, self._pos, self._leading = [], 0, False
                    return
                sweep, pos = list(parked), 0
            sub = sweep[pos]
            pos += 1
            task = parked.get(sub)
            if task is None:  # woken, or its wait was cancelled, since the sweep began
                continue
            if turn == _LEAD:  # hand the turn over: it reads its own events as it wakes
                self._sweep, self._pos = sweep, pos
                del parked[sub]
                sub._leads = True
                trio.lowlevel.reschedule(task)
                return
            if sub.cursor < head:
                turn += 1
                start = sub.cursor + 1 - self.base
                push = sub.push
                if push is not None and start >= 0 and not sub._closed:
                    batch = batches.get(start)
                    if batch is None:
                        batch = batches[start] = self.entries[start:]
                    try:
                        taken = push(batch)
                    except Exception:  # the woken reader meets the failure on its own path
                        taken = False
                    if taken:
                        sub.cursor = head
                        if not done:
                            continue
            elif not done:
                continue
            if parked.pop(sub, None) is not None:  # a push may have cancelled its wait
                trio.lowlevel.reschedule(task)


class RunLog(Protocol):
    """Where run logs live: the hub's storage interface."""

    def create(self, run_id: str) -> None:
        """Open a new, empty run log; `RunExists` if it is open."""
        ...

    def append(self, run_id: str, events: Sequence[RunEvent]) -> list[Entry]:
        """Append events whose seqs continue the log without a gap; the entries written."""
        ...

    def get(self, run_id: str) -> RunState:
        """The run's log; `UnknownRun` if there is none."""
        ...


def entry_cost(entry: Entry) -> int:
    """What a kept entry is estimated to cost the process, measured (`python -m bench.kept_runs`):
    2.5 bytes a byte of its JSON on the heap (the JSON itself, which msgspec leaves in a buffer
    up to half as large again, and the event's own strings, its text about as long as the
    JSON), and `ENTRY_BYTES` for the objects around them; 5 % more for the allocator's own
    overhead, which resident memory adds to what tracemalloc sees."""
    return len(entry.data) * 21 // 8 + ENTRY_BYTES


@attrs.define(eq=False)
class MemoryRunLog:
    """Run logs in this process's memory, bounded per run and across all runs.

    Past a total bound, the oldest finished runs are forgotten first; if the live runs alone
    are over it, the oldest events of the largest one go (a resume below them is
    `CursorExpired`). Finished runs are also forgotten `retention` seconds after their
    `run.done`, by `sweep` (a server calls it on a timer) or when a run is created.

    Attributes:
        max_events: events kept per run before the oldest are forgotten.
        max_bytes: JSON bytes kept per run before the oldest are forgotten.
        max_total_events: events kept across all runs.
        max_total_bytes: memory the kept runs may hold, estimated as measured (`entry_cost`:
            2.625 times the JSON and 144 bytes an event; `RUN_BYTES`, 2 KiB, a run).
        retention: seconds a run is kept after its `run.done`.
    """

    max_events: int = 100_000
    max_bytes: int = 64 * 1024 * 1024
    max_total_events: int = 1_000_000
    max_total_bytes: int = MEMORY_BUDGET
    retention: float = 300.0
    total_events: int = 0
    total_bytes: int = 0
    evicted: int = 0  # finished runs forgotten to stay within the totals
    _runs: dict[str, RunState] = attrs.field(factory=dict)
    _finished: dict[str, None] = attrs.field(factory=dict)  # in the order they finished
    _next_sweep: float = 0.0

    def create(self, run_id: str) -> None:
        """Open a new, empty run log."""
        now = trio.current_time()
        if now >= self._next_sweep:
            self._next_sweep = now + min(self.retention, 60.0)
            self.sweep()
        if run_id in self._runs:
            raise RunExists(f"run {run_id} exists")
        self._runs[run_id] = RunState(run_id)
        self.total_bytes += RUN_BYTES

    def get(self, run_id: str) -> RunState:
        """The run's log."""
        run = self._runs.get(run_id)
        if run is None or self._expired(run, trio.current_time()):
            self._forget(run_id)
            raise UnknownRun(run_id)
        return run

    def append(self, run_id: str, events: Sequence[RunEvent]) -> list[Entry]:
        """Append events; each one's seq must be the next (a gap or repeat raises HubError)."""
        run = self.get(run_id)
        if run.done:
            raise HubError("run is done")
        written = []
        seq = run.last_seq
        cost = 0
        for event in events:
            seq += 1
            if event.seq != seq:
                raise HubError(f"expected seq {seq}, got {event.seq}")
            entry = Entry(seq, event, encode_json(event))
            written.append(entry)
            run.nbytes += len(entry.data)
            cost += entry_cost(entry)
            if type(event) is RunDone:
                run.done_at = trio.current_time()
                self._finished[run_id] = None
        run.entries += written
        run.cost += cost
        self.total_events += len(written)
        self.total_bytes += cost
        self._trim(run)
        if self._over(1):
            self._evict()
        return written

    def runs(self) -> list[str]:
        """The ids of the runs kept now."""
        return list(self._runs)

    def sweep(self) -> None:
        """Forget the runs whose retention is over."""
        now = trio.current_time()
        expired = []
        for run_id in self._finished:  # in the order they finished: the first kept ends it
            if not self._expired(self._runs[run_id], now):
                break
            expired.append(run_id)
        for run_id in expired:
            self._forget(run_id)

    def _forget(self, run_id: str) -> None:
        run = self._runs.pop(run_id, None)
        self._finished.pop(run_id, None)
        if run is not None:
            self.total_events -= len(run.entries)
            self.total_bytes -= run.cost

    def _over(self, fraction: float) -> bool:
        return (
            self.total_events > self.max_total_events * fraction
            or self.total_bytes > self.max_total_bytes * fraction
        )

    def _evict(self) -> None:
        """Back under 7/8 of the totals (amortised): the oldest finished runs first, then the
        oldest events of the largest live runs."""
        while self._finished and self._over(7 / 8):
            self._forget(next(iter(self._finished)))
            self.evicted += 1
        while self._over(1):
            live = max(self._runs.values(), key=lambda run: run.cost, default=None)
            if live is None or len(live.entries) <= 1:
                return
            self._drop_head(live, max(len(live.entries) // 8, 1), self.max_bytes)

    def _trim(self, run: RunState) -> None:
        over = len(run.entries) - self.max_events
        if over <= 0 and run.nbytes <= self.max_bytes:
            return
        # forget in slices of at least 1/8 of the cap: trimming stays amortised O(1) per event
        self._drop_head(run, max(over, self.max_events // 8, 1), self.max_bytes)

    def _drop_head(self, run: RunState, drop: int, max_bytes: int) -> None:
        """Forget at least `drop` of the oldest entries, and more until the run's JSON is
        under 7/8 of `max_bytes`; the newest is always kept."""
        freed = cost = n = 0
        for entry in run.entries:
            if n >= drop and run.nbytes - freed <= max_bytes * 7 // 8:
                break
            freed += len(entry.data)
            cost += entry_cost(entry)
            n += 1
        if n > len(run.entries) - 1:  # always keep the newest event
            n = len(run.entries) - 1
            freed = sum(len(e.data) for e in run.entries[:n])
            cost = sum(entry_cost(e) for e in run.entries[:n])
        del run.entries[:n]
        run.base += n
        run.nbytes -= freed
        run.cost -= cost
        self.total_events -= n
        self.total_bytes -= cost

    def _expired(self, run: RunState, now: float) -> bool:
        return run.done_at is not None and now - run.done_at > self.retention


class _Owner(Protocol):
    """What a subscription tells its hub: that it stopped following."""

    def unsubscribed(self, sub: Subscription) -> None:
        """A subscription of this hub stopped following its run."""
        ...


@attrs.define(eq=False)
class Subscription:
    """A cursor following one run's log. Iterate it for entries, or call `next_batch`.

    Raises `SubscriberDropped` when it fell behind its buffer, `CursorExpired` when the log
    forgot events it still needed. Ends (StopAsyncIteration) after `run.done`.

    Attributes:
        cursor: the last seq given out.
        buffer: how many events appended since it subscribed it may fall behind the log's
            head (what the log held when it subscribed it replays at its own pace).
        joined: the log's head when it subscribed.
        drop_reason: why it was dropped, if it was.
        cancel_scope: cancelled when it is dropped, so a transport blocked writing to a client
            that stopped reading wakes up: run the writing inside it.
        push: a writer the hub may hand new entries to while this subscriber waits in
            `next_batch` with nothing left to read, instead of waking it: it must not block,
            and returns True when it took them all (the cursor moves past them) and False,
            having taken none, when `next_batch` should return them instead. Every subscriber
            pushed in one round gets the same list. Both hubs push (the Redis hub from the
            window of a run it follows).
    """

    _hub: _Owner
    _run: RunState
    cursor: int
    buffer: int
    drop_reason: str | None = None
    cancel_scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    _closed: bool = False
    _batch: list[Entry] = attrs.field(factory=list)  # what iteration has yet to hand out
    _taken: int = 0
    push: Callable[[list[Entry]], bool] | None = None
    _leads: bool = False  # woken as the leader
    joined: int = 0

    def behind(self, head: int) -> int:
        """How far it fell behind the live log: events past both its cursor and the head it
        joined at (a late joiner replaying what was kept has not fallen behind)."""
        return head - max(self.cursor, self.joined)

    @property
    def run(self) -> RunState:
        """The state of the run it follows, as its hub keeps it (a hub's own subclass of
        `RunState` for a hub that keeps more)."""
        return self._run

    @property
    def hub(self) -> object:
        """The hub it subscribed through (a hub's own subscriber class casts it to its hub)."""
        return self._hub

    def drop(self, reason: str) -> None:
        """Drop it with `reason` (the first reason stays) and cancel `cancel_scope`: its
        reader then meets `SubscriberDropped`. Hubs call it; a subscriber that no longer wants
        the run leaves by `aclose`."""
        if self.drop_reason is None:
            self.drop_reason = reason
            self.cancel_scope.cancel()

    def check_dropped(self) -> None:
        """Raise `SubscriberDropped` if it was dropped."""
        if self.drop_reason is not None:
            raise SubscriberDropped(self.drop_reason, self.cursor)

    @property
    def lag(self) -> int:
        """How many events it is behind the log's head."""
        return self._run.last_seq - self.cursor

    @property
    def at_end(self) -> bool:
        """Whether the run is over and this subscriber was given all of it."""
        return self._run.done and self.cursor >= self._run.last_seq

    async def next_batch(self, limit: int = 256) -> list[Entry]:
        """Every entry available now after the cursor (at most `limit`), waiting for one if
        there is none; an empty list once the run is done and read to its end."""
        run = self._run
        while True:
            self.check_dropped()
            if self.cursor < run.last_seq:
                start = self.cursor + 1 - run.base
                if start < 0:
                    raise CursorExpired(run.base)
                batch = run.entries[start : start + limit]
                self.cursor = batch[-1].seq
                return batch
            if run.done:
                return []
            await self.wait_appended()

    async def wait_appended(self) -> None:
        """Wait, parked in the run, until an append wakes this subscriber (perhaps as the
        leader, which then pushes to the others) or the run ends."""
        run = self._run
        run.parked[self] = trio.lowlevel.current_task()

        def abort(_: trio.lowlevel.RaiseCancelT) -> trio.lowlevel.Abort:
            run.parked.pop(self, None)
            return trio.lowlevel.Abort.SUCCEEDED

        await trio.lowlevel.wait_task_rescheduled(abort)
        if self._leads:
            self._leads = False
            try:
                run.lead()
            except BaseException:
                run.abandon()
                raise

    def __aiter__(self) -> Subscription:
        # a plain async iterator, not a generator: a reader may stop at any point (`break`)
        # without leaving a suspended generator for the garbage collector
        return self

    async def __anext__(self) -> Entry:
        if self._taken == len(self._batch):
            self._batch = await self.next_batch()
            self._taken = 0
            if not self._batch:
                raise StopAsyncIteration
        entry = self._batch[self._taken]
        self._taken += 1
        return entry

    def close(self) -> None:
        """Stop following (idempotent)."""
        if not self._closed:
            self._closed = True
            self._run.subscribers.discard(self)
            self._hub.unsubscribed(self)

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


class RunHub(Protocol):
    """What a server needs of a hub, whichever keeps the logs: open a run (its sink), follow a
    run from a cursor, tell who may read a run, and which runs are still kept.

    Attributes:
        subscribers: live subscriptions through this hub.
    """

    subscribers: int

    async def open_run(
        self, run_id: str, *, access: bytes | None = None, spec: bytes | None = None
    ) -> Sink:
        """Open a new run and return the sink that appends its events. `access` (what the
        server checks its readers' and actors' tokens against) is kept with the run for
        `access`; `spec`, what another server needs to take the run over should this one be
        lost, with a hub shared between servers. Raises `RunExists`, `HubUnavailable`."""
        ...

    async def follow(
        self, run_id: str, after: int = 0, *, buffer: int | None = None
    ) -> Subscription:
        """Follow a run from the event after seq `after`, replaying what is kept, then live.
        Raises `UnknownRun`, `CursorInvalid`, `CursorExpired`, `HubUnavailable`, `HubError`."""
        ...

    async def access(self, run_id: str) -> bytes | None:
        """The `access` a run was opened with; None for an unknown run or none given."""
        ...

    async def kept(self, run_ids: Sequence[str]) -> set[str]:
        """Which of these runs are still kept (not forgotten after their retention)."""
        ...

    async def ended(self, run_id: str) -> bool:
        """Whether the run is over (its `run.done` is in the log; on a shared hub, also a run
        whose server is gone, which is ended then as `server_lost`); False for an unknown
        run. Raises `HubUnavailable`."""
        ...

    async def sweep(self) -> None:
        """Forget what has expired (a server calls it on a timer)."""
        ...

    def statistics(self) -> dict[str, int]:
        """Counters for monitoring."""
        ...


@attrs.define(eq=False)
class Hub:
    """Run logs plus live fan-out, in one process.

    Attributes:
        log: where run logs live.
        buffer: the default subscriber buffer allowance, in events.
        max_subscribers_per_run: further subscriptions are refused (`HubError`).
    """

    log: MemoryRunLog = attrs.field(factory=MemoryRunLog)
    buffer: int = 1024
    max_subscribers_per_run: int = 10_000
    subscribers: int = 0
    appended: int = 0

    def create(self, run_id: str) -> None:
        """Open a run."""
        self.log.create(run_id)

    def append(self, run_id: str, events: Sequence[RunEvent]) -> None:
        """Append events and wake the run's subscribers; never blocks. Subscribers that fell
        behind their buffer are dropped here."""
        if not events:
            return
        self.log.append(run_id, events)
        self.appended += len(events)
        run = self.log.get(run_id)
        head = run.last_seq
        for sub in [s for s in run.subscribers if s.behind(head) > s.buffer]:
            sub.drop("fell_behind")
            run.subscribers.discard(sub)
        run.wake()

    def subscribe(self, run_id: str, after: int = 0, *, buffer: int | None = None) -> Subscription:
        """Follow a run from the event after seq `after` (0: from the start), replaying what
        the log keeps, then live. Raises `UnknownRun`, `CursorInvalid` (past the last event),
        `CursorExpired` (below what is kept), or `HubError` (too many subscribers)."""
        run = self.log.get(run_id)
        if after < 0 or after > run.last_seq:
            raise CursorInvalid("past the last event")
        if after + 1 < run.base:
            raise CursorExpired(run.base)
        if len(run.subscribers) >= self.max_subscribers_per_run:
            raise HubError("too many subscribers for this run")
        sub = Subscription(self, run, after, buffer if buffer is not None else self.buffer)
        sub.joined = run.last_seq
        if not run.done:
            run.subscribers.add(sub)
        self.subscribers += 1
        return sub

    def unsubscribed(self, sub: Subscription) -> None:
        """A subscription stopped following its run: one subscriber fewer."""
        self.subscribers = max(0, self.subscribers - 1)

    def sink(self, run_id: str) -> HubSink:
        """A turn sink that appends the run's events to this hub (creating the run)."""
        self.create(run_id)
        return HubSink(self, run_id)

    def statistics(self) -> dict[str, int]:
        """Runs kept, live subscriptions, events appended so far."""
        return {
            "runs": len(self.log.runs()),
            "subscribers": self.subscribers,
            "appended": self.appended,
        }

    # --- the `RunHub` interface: nothing here waits --------------------------------------------

    async def open_run(
        self, run_id: str, *, access: bytes | None = None, spec: bytes | None = None
    ) -> HubSink:
        """Open a run (`sink`), keeping `access` with it (`spec` has no use here: no other
        server shares this hub)."""
        sink = self.sink(run_id)
        self.log.get(run_id).access = access
        return sink

    async def follow(
        self, run_id: str, after: int = 0, *, buffer: int | None = None
    ) -> Subscription:
        """`subscribe`."""
        return self.subscribe(run_id, after, buffer=buffer)

    async def access(self, run_id: str) -> bytes | None:
        """The `access` the run was opened with."""
        try:
            return self.log.get(run_id).access
        except UnknownRun:
            return None

    async def sweep(self) -> None:
        """Forget the runs whose retention is over (`MemoryRunLog.sweep`)."""
        self.log.sweep()
        await trio.lowlevel.checkpoint()

    async def ended(self, run_id: str) -> bool:
        """Whether the run's log has its `run.done`."""
        try:
            return self.log.get(run_id).done
        except UnknownRun:
            return False

    async def kept(self, run_ids: Sequence[str]) -> set[str]:
        """Which of these runs the log still keeps."""
        out = set()
        for run_id in run_ids:
            try:
                self.log.get(run_id)
            except UnknownRun:
                continue
            out.add(run_id)
        return out


@attrs.define(eq=False)
class HubSink:
    """Delivers a turn's run events into the hub: never blocks the turn."""

    hub: Hub
    run_id: str

    def deliver_nowait(self, batch: SinkBatch) -> bool:
        """Append the batch's run events (on the turn's task: an append never waits)."""
        self.hub.append(self.run_id, batch.run)
        return True

    async def deliver(self, batch: SinkBatch) -> None:
        """Append the batch's run events."""
        self.hub.append(self.run_id, batch.run)

    async def close(self) -> None:
        """Nothing to release: the log outlives the turn for its retention."""
