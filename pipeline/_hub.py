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

The logs themselves, their bounds (per run and across all runs) and the hub's errors are in
`rillet._runlog` (re-exported here): a cursor below what is kept is refused (`CursorExpired`,
never a gap), and a run is kept `retention` seconds after its `run.done`, then forgotten
(`UnknownRun`).

Two implementations share one interface, `RunHub`, which is all a server uses: `Hub` keeps
the logs in this process (`MemoryRunLog`, the default); `rillet._redis_hub.RedisHub` keeps them
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

from ._runlog import AppendConflict as AppendConflict
from ._runlog import CursorExpired as CursorExpired
from ._runlog import CursorInvalid as CursorInvalid
from ._runlog import Entry as Entry
from ._runlog import HubError as HubError
from ._runlog import HubUnavailable as HubUnavailable
from ._runlog import MemoryRunLog as MemoryRunLog
from ._runlog import RunExists as RunExists
from ._runlog import RunLog as RunLog
from ._runlog import RunState as RunState
from ._runlog import SubscriberDropped as SubscriberDropped
from ._runlog import UnknownRun as UnknownRun
from ._runlog import parse_cursor as parse_cursor

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ._runevents import RunEvent
    from ._turn import Sink, SinkBatch

__all__ = [
    "AppendConflict",
    "CursorExpired",
    "CursorInvalid",
    "Entry",
    "Hub",
    "HubError",
    "HubSink",
    "HubUnavailable",
    "MemoryRunLog",
    "RunExists",
    "RunHub",
    "RunLog",
    "RunState",
    "SubscriberDropped",
    "Subscription",
    "UnknownRun",
    "parse_cursor",
]


class _Owner(Protocol):
    """What a subscription tells its hub: that it stopped following."""

    def _unsubscribed(self, sub: Subscription) -> None: ...


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

    def _drop(self, reason: str) -> None:
        if self.drop_reason is None:
            self.drop_reason = reason
            self.cancel_scope.cancel()

    def _check(self) -> None:
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
            self._check()
            if self.cursor < run.last_seq:
                start = self.cursor + 1 - run.base
                if start < 0:
                    raise CursorExpired(run.base)
                batch = run.entries[start : start + limit]
                self.cursor = batch[-1].seq
                return batch
            if run.done:
                return []
            await self._park()

    async def _park(self) -> None:
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
            self._hub._unsubscribed(self)

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

    async def open_run(self, run_id: str, *, access: bytes | None = None) -> Sink:
        """Open a new run and return the sink that appends its events. `access` (the digest of
        its readers' token) is kept with the run for `access`. Raises `RunExists`,
        `HubUnavailable`."""
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
            sub._drop("fell_behind")
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

    def _unsubscribed(self, sub: Subscription) -> None:
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

    async def open_run(self, run_id: str, *, access: bytes | None = None) -> HubSink:
        """Open a run (`sink`), keeping `access` with it."""
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
