"""Run logs on Redis Streams: every server sharing one Redis serves every run's subscribers.

A run is two keys in one hash slot, a hash and a stream (`_redis_layout` holds the layout and the
scripts). An append is one Lua call per batch (the run must be open and the seqs must continue
the stream; `XADD ... MAXLEN ~ max_events` per entry; the TTLs refreshed): atomic and one round
trip, and Redis itself refuses a duplicate or out-of-order entry id, so a second producer of a
run fails (`AppendConflict`). An open run expires `open_ttl` seconds after its last append (a
producer that died leaves nothing behind for long); its `run.done` sets both keys to expire
after `retention`.

A dead producer: the hub that drives a run holds its lease (a key that expires `lease` seconds
after it was last renewed), renewed by each append and every `lease_interval` seconds while
the run is open here, and the run names it as its `owner`. Each hub also looks, every
`lease_interval` seconds, for open runs whose lease ran out (`rillet:leases`), and so does
one that follows such a run (its tail, idle for `block` seconds, asks; so does a new
subscription, and a cancel or an answer for the run). A run opened with a `spec` is offered
to `takeover` (the server's: it may start the run again from its spec, here): the hub claims
it in one Lua call that checks the run's state and lease, makes this hub its owner and takes
its lease, so exactly one server continues it, with the next seq; the old producer, should it
come back, is fenced off (its appends and renewals are refused, and its turn is stopped).
Any other lost run (or one no server takes within a lease more) is ended with `run.done`
(`error`, `server_lost`) after what the stream kept, in one Lua call that checks the lease and
the run's state together: exactly one server appends it, however many notice, and every
reader, and every later resume, reaches that end.

Fan-out: for each run that has subscribers here, the hub keeps ONE tail, an `XREAD BLOCK` loop, and
a window of the newest entries in memory; its subscribers are cursors into that window, with the
memory hub's `Subscription` semantics (buffer allowance, dropped with a reason when behind,
`CursorExpired` below what the stream keeps) and its waking: new entries wake one parked subscriber,
which pushes them to the others' writers (no task switch per subscriber). A subscriber behind the
window (a resume from an old seq) catches up with `XRANGE` reads of its own, then follows the
window. A tail ends after `run.done`, or when its last subscriber leaves (its blocked read is
cancelled). The hub that appends a run needs no read for it: each append, once Redis took it, goes
into that run's window here as it was written (the same bytes and order every other hub reads).
An append cut short (cancelled: Redis may have taken it all the same), or a run this hub stops
driving, turns that window into an ordinary tail that reads the stream from what it has.

A blocked `XREAD` holds its connection. Cancelling one makes coredis (6.9) discard that
connection without giving its slot back to the pool, so each tail reads on a one-connection
client of its own, opened and closed with the tail: the shared pool never sees a blocked read.

Failures are loud, never a silent fallback: an unreachable Redis refuses the hub at start and
refuses new runs (`HubUnavailable`); an outage mid-run stops that run's delivery (logged as an
error; the turn itself runs on and returns its result), and its subscribers are dropped with
reason `log_unavailable`. Once Redis answers again, the producing hub ends the cut run with
`run.done` (`error`, `log_unavailable`) after what the stream kept, so a subscriber on any
server that follows it then reaches an end instead of waiting for the run's keys to expire.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, NoReturn, cast

import attrs
import coredis
import trio
from coredis.exceptions import RedisError, ResponseError
from coredis.retry import NoRetryPolicy
from coredis.tokens import PureToken

from .._core._codes import retryable
from .._core._errors import (
    AppendConflict,
    CursorExpired,
    CursorInvalid,
    HubError,
    HubUnavailable,
    RunExists,
    SubscriberDropped,
    UnknownRun,
)
from .._core._events import encode_json
from .._core._runevents import RunDone
from . import _redis_layout as layout
from ._hub import Entry, RunState, Subscription

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Sequence

    from .._core._runevents import RunEvent
    from .._turn._turn import SinkBatch

__all__ = ["Claim", "RedisHub", "RedisHubSink", "RedisSubscription", "open_redis_hub"]

logger = logging.getLogger(__name__)

_UNAVAILABLE = "log_unavailable"
_LOST = "server_lost"
_FAILURES = (RedisError, OSError, TimeoutError)
_SCAN = 100  # lost runs looked at per pass


@attrs.frozen
class _Info:
    """What the hub knows of a run in Redis."""

    state: str
    access: bytes | None
    first: int
    last: int
    leased: bool
    spec: bool  # it may be taken over


@attrs.frozen
class Claim:
    """A run this hub took over from a server that is gone: it produces it from now on.

    Attributes:
        run_id: the run.
        last: the last seq its log holds; this hub appends from the next.
        spec: what the run's first server kept for a taker (its own encoding).
        access: the run's access digests.
        elapsed_ms: the last event's `elapsed_ms` (the continuation's start from its own).
        sink: appends the run's events from now on, as this hub's.
        kept: the id of the reply the run's provider keeps, if its producer said one.
    """

    run_id: str
    last: int
    spec: bytes
    access: bytes | None
    elapsed_ms: int
    sink: RedisHubSink
    kept: str | None = None


class _Tail(RunState):
    """One run as this hub follows it: a window of its newest entries, the subscribers here,
    and the task tailing the stream (none for a run read after its `run.done`)."""

    __slots__ = ("failed", "fed", "scope")

    def __init__(self, run_id: str, last_seq: int, *, done: bool, fed: bool = False) -> None:
        super().__init__(run_id)
        self.base = last_seq + 1
        self.failed: str | None = None
        self.fed = fed  # fed by this hub's own appends, not by a read
        self.scope = trio.CancelScope()
        if done:
            self.done_at = trio.current_time()

    def fail(self, reason: str) -> None:
        """Drop every subscriber with `reason` and stop serving them."""
        if self.failed is None:
            self.failed = reason
        for sub in list(self.subscribers):
            sub.drop(reason)
        self.subscribers.clear()
        self.wake()
        self.abandon()  # every parked subscriber wakes to meet the failure


@attrs.define(eq=False)
class RedisSubscription(Subscription):
    """A `Subscription` whose events below the hub's window come from Redis (`XRANGE`)."""

    @property
    def _tail(self) -> _Tail:
        return cast("_Tail", self.run)

    async def next_batch(self, limit: int = 256) -> list[Entry]:
        """Every entry available now after the cursor (at most `limit`), waiting for one if
        there is none; an empty list once the run is done and read to its end."""
        tail = self._tail
        while True:
            self.check_dropped()
            if tail.failed is not None:
                self._fail(tail.failed)
            if self.cursor < tail.last_seq:
                start = self.cursor + 1 - tail.base
                if start >= 0:
                    batch = tail.entries[start : start + limit]
                else:
                    batch = await self._catch_up(min(limit, -start))
                self.cursor = batch[-1].seq
                return batch
            if tail.done:
                return []
            await self.wait_appended()  # as the memory hub's: the leader pushes to the others

    async def _catch_up(self, count: int) -> list[Entry]:
        """Entries after the cursor that the window no longer (or never) held."""
        try:
            hub = cast("RedisHub", self.hub)
            batch = await hub._range(self.run.run_id, self.cursor + 1, count)
        except HubUnavailable:
            self._fail(_UNAVAILABLE)
        if not batch:  # the run expired while it was being read
            self._fail("run_expired")
        if batch[0].seq != self.cursor + 1:
            raise CursorExpired(batch[0].seq)
        return batch

    def _fail(self, reason: str) -> NoReturn:
        self.drop(reason)
        raise SubscriberDropped(self.drop_reason or reason, self.cursor)


@attrs.define(eq=False)
class RedisHubSink:
    """Delivers a turn's run events into Redis. A failed append stops this run's delivery and is
    logged as an error (with Redis unreachable, the run's subscribers here are dropped with
    `log_unavailable`); it is never raised into the turn, which runs on and returns its result.

    Attributes:
        failed: the error that stopped delivery, if one did.
    """

    hub: RedisHub
    run_id: str
    failed: HubError | None = None

    async def deliver(self, batch: SinkBatch) -> None:
        """Append the batch's run events (nothing more once an append failed)."""
        if self.failed is not None or not batch.run:
            return
        try:
            await self.hub.append(self.run_id, batch.run)
        except HubError as exc:
            self.failed = exc
            logger.error(
                "run %s: its events can no longer be delivered: %s: %s",
                self.run_id,
                type(exc).__name__,
                exc,
            )
            self.hub._delivery_failed(self.run_id, unavailable=isinstance(exc, HubUnavailable))

    async def close(self) -> None:
        """The run's delivery is over: the log outlives it for its retention. A run closed
        without its `run.done` is no longer driven here: its lease is left to expire, and
        then it is ended as `server_lost`."""
        self.hub._stop_producing(self.run_id)


@attrs.define(eq=False)
class RedisHub:
    """Run logs in Redis Streams, fanned out to this process's subscribers. Open it with
    `open_redis_hub`.

    Attributes:
        url: the Redis URL (`redis://`, `rediss://`, `unix://`).
        buffer: the default subscriber buffer allowance, in events.
        max_subscribers_per_run: further subscriptions here are refused (`HubError`).
        max_events: entries a run's stream keeps (`MAXLEN ~`: at least this many).
        retention: seconds a run is kept after its `run.done`.
        open_ttl: seconds an open run is kept after its last append.
        window: newest entries of each followed run kept in memory for its subscribers.
        block: seconds a tail's `XREAD` blocks before it checks the run is still kept.
        read_count: entries a tail reads at most per `XREAD`.
        timeout: seconds any other command may take before Redis counts as unavailable.
        max_connections: the size of the shared connection pool (each tail has its own).
        retry_interval: seconds between tries to end a run an outage cut, once it is back.
        lease: seconds a run's lease lasts unrenewed: an open run whose lease is gone has lost
            the server that drove it, and is ended as `server_lost`.
        lease_interval: seconds between renewals of the leases of the runs this hub drives
            (a third of `lease`, so that two renewals may be late), and between looks for runs
            whose server is gone.
        owner: this hub's id, which its runs name as their producer.
        takeover: offered each lost run that has a spec (its id): True when it took the run
            (`claim`, then produces it) or another server did meanwhile; False to end the run as
            `server_lost`. None: lost runs are ended.
    """

    url: str
    _client: coredis.Redis[bytes]
    _nursery: trio.Nursery
    buffer: int = 1024
    max_subscribers_per_run: int = 10_000
    max_events: int = 100_000
    retention: float = 300.0
    open_ttl: float = 3600.0
    window: int = 4096
    block: float = 5.0
    read_count: int = 1024
    timeout: float = 5.0
    max_connections: int = 64
    retry_interval: float = 1.0
    lease: float = 9.0
    lease_interval: float = 3.0
    owner: str = attrs.field(factory=lambda: secrets.token_hex(8))
    takeover: Callable[[str], Awaitable[bool]] | None = None
    subscribers: int = 0
    appended: int = 0
    delivered: int = 0
    taken_over: int = 0
    _tails: dict[str, _Tail] = attrs.field(factory=dict)
    _producing: dict[str, int] = attrs.field(factory=dict)  # run -> last seq appended here
    _create: Any = attrs.field(init=False, default=None)
    _append: Any = attrs.field(init=False, default=None)
    _info: Any = attrs.field(init=False, default=None)
    _renew: Any = attrs.field(init=False, default=None)
    _lost: Any = attrs.field(init=False, default=None)
    _claim: Any = attrs.field(init=False, default=None)
    _keep: Any = attrs.field(init=False, default=None)
    _offered: set[str] = attrs.field(init=False, factory=set)  # lost runs offered now

    def __attrs_post_init__(self) -> None:
        self._create = self._client.register_script(layout.CREATE)
        self._append = self._client.register_script(layout.APPEND)
        self._info = self._client.register_script(layout.INFO)
        self._renew = self._client.register_script(layout.RENEW)
        self._lost = self._client.register_script(layout.LOST)
        self._claim = self._client.register_script(layout.CLAIM)
        self._keep = self._client.register_script(layout.KEEP)

    def _run_keys(self, run_id: str) -> list[str]:
        """The run's hash, stream and lease keys, as the scripts take them."""
        return [*layout.keys(run_id), layout.lease_key(run_id)]

    @property
    def _lease_ms(self) -> int:
        return max(1, int(self.lease * 1000))

    def _unavailable(self, exc: BaseException) -> HubUnavailable:
        reason = str(exc) or type(exc).__name__
        return HubUnavailable(
            f"the run log at {layout.safe_url(self.url)} is unavailable: {reason}"
        )

    async def ping(self) -> None:
        """Check that Redis answers (and load the hub's scripts); `HubUnavailable` otherwise."""
        try:
            with trio.fail_after(self.timeout):
                await self._client.ping()
                for script in _SCRIPTS:
                    await self._client.script_load(script)
        except (*_FAILURES, trio.TooSlowError) as exc:
            raise self._unavailable(exc) from exc

    async def server_version(self) -> str:
        """The Redis server's version."""
        info = await self._client.info("server")
        return str(info.get("redis_version", "?"))

    # --- producing ------------------------------------------------------------------------------

    async def create(
        self, run_id: str, *, access: bytes | None = None, spec: bytes | None = None
    ) -> None:
        """Open a new, empty run (with `spec`, one another server may take over if this one
        is lost). Raises `RunExists`, `HubUnavailable`."""
        run_keys = self._run_keys(run_id)
        args = [
            access.hex() if access else "",
            int(self.open_ttl * 1000),
            self._lease_ms,
            self.owner,
            spec or b"",
        ]
        try:
            created = await self._create(keys=run_keys, args=args)
            if created:
                await self._client.zadd(layout.LEASES, {run_id: self._lease_deadline()})
        except _FAILURES as exc:
            raise self._unavailable(exc) from exc
        if not created:
            raise RunExists(f"run {run_id} exists")
        self._producing[run_id] = 0

    async def open_run(
        self, run_id: str, *, access: bytes | None = None, spec: bytes | None = None
    ) -> RedisHubSink:
        """Open a run and return the sink that appends its events (`spec`: as `create`'s)."""
        await self.create(run_id, access=access, spec=spec)
        return RedisHubSink(self, run_id)

    def _lease_deadline(self) -> float:
        """When a lease renewed now runs out, as `rillet:leases` scores it."""
        return time.time() * 1000 + self._lease_ms

    async def spec(self, run_id: str) -> bytes | None:
        """The spec an open run was opened with (what a taker reads before it claims the
        run); None for a run without one, done or forgotten. Raises `HubUnavailable`."""
        try:
            with trio.fail_after(self.timeout):
                spec = await self._client.hget(layout.keys(run_id)[0], "spec")
        except (*_FAILURES, trio.TooSlowError) as exc:
            raise self._unavailable(exc) from exc
        return spec

    async def keep(self, run_id: str, reply_id: str) -> None:
        """Note the id of the reply the run's provider keeps (for a server that takes the run
        over), if the run is still this hub's. A failure is logged: it costs a taker only the
        answer generated again."""
        try:
            with trio.fail_after(self.timeout):
                await self._keep(keys=[layout.keys(run_id)[0]], args=[self.owner, reply_id])
        except (*_FAILURES, trio.TooSlowError) as exc:
            logger.warning("run %s: its kept reply's id was not noted: %s", run_id, exc)

    async def claim(self, run_id: str) -> Claim | None:
        """Take over an open run whose lease has run out and that has a spec: this hub is its
        producer from now on (the old one is fenced off). None when it is done, forgotten,
        leased (by its producer, or a server that took it first), or has no spec. Raises
        `HubUnavailable`."""
        try:
            with trio.fail_after(self.timeout):
                reply = await self._claim(
                    keys=self._run_keys(run_id), args=[self.owner, self._lease_ms]
                )
                if reply:
                    await self._client.zadd(layout.LEASES, {run_id: self._lease_deadline()})
        except (*_FAILURES, trio.TooSlowError) as exc:
            raise self._unavailable(exc) from exc
        if not reply:
            return None
        last_id, spec, access, data, kept = reply
        last = layout.seq(last_id)
        elapsed = layout.entry(last_id, {layout.FIELD: data}).event.elapsed_ms if data else 0
        access_hex = layout.text(access)
        self._producing[run_id] = last
        self.taken_over += 1
        logger.warning("run %s: taken over after seq %d (its server's lease expired)", run_id, last)
        return Claim(
            run_id=run_id,
            last=last,
            spec=spec if isinstance(spec, bytes) else str(spec).encode(),
            access=bytes.fromhex(access_hex) if access_hex else None,
            elapsed_ms=elapsed,
            sink=RedisHubSink(self, run_id),
            kept=layout.text(kept) or None,
        )

    async def append(self, run_id: str, events: Sequence[RunEvent]) -> None:
        """Append events whose seqs continue the run's stream. Raises `AppendConflict` (the
        stream already has that seq: another producer), `UnknownRun`, `HubError` (a gap, or the
        run is done), `HubUnavailable`."""
        if not events:
            return
        first = events[0].seq
        done = False
        args: list[Any] = [
            self.max_events,
            int(self.open_ttl * 1000),
            0,
            0,
            self._lease_ms,
            self.owner,
        ]
        entries: list[Entry] = []
        for i, event in enumerate(events):
            if event.seq != first + i:
                raise HubError(f"expected seq {first + i}, got {event.seq}")
            done = done or type(event) is RunDone
            entry = Entry(event.seq, event, encode_json(event))
            entries.append(entry)
            args += (f"{event.seq}-0", entry.data)
        args[2] = max(1, int(self.retention * 1000))
        args[3] = 1 if done else 0
        try:
            await self._append(keys=self._run_keys(run_id), args=args)
        except ResponseError as exc:
            raise self._refused(run_id, first, exc) from exc
        except _FAILURES as exc:
            raise self._unavailable(exc) from exc
        except BaseException:  # cut short (cancelled): Redis may have taken it all the same
            self._read_instead(run_id)
            raise
        self.appended += len(events)
        if done:
            self._producing.pop(run_id, None)
            await self._forget_lease(run_id)
        elif run_id in self._producing:
            self._producing[run_id] = events[-1].seq
        tail = self._tails.get(run_id)
        if tail is not None and tail.fed:
            self._fan_out(tail, entries)

    def _refused(self, run_id: str, first: int, exc: ResponseError) -> HubError:
        message = str(exc)
        if "equal or smaller" in message or "RILLET_FENCED" in message:
            return AppendConflict(run_id, first)
        if "RILLET_UNKNOWN" in message:
            return UnknownRun(run_id)
        if "RILLET_DONE" in message:
            return HubError("run is done")
        if "RILLET_GAP" in message:
            return HubError(message.partition("RILLET_GAP ")[2] or "a gap in the seqs")
        return HubError(f"append refused: {message}")

    def _delivery_failed(self, run_id: str, *, unavailable: bool) -> None:
        """A producer here could not append. When Redis is unreachable, the run's subscribers
        here cannot be served either: they are dropped with `log_unavailable`. A refused append
        (another producer's run) leaves the log as it is: subscribers here that were fed by
        this hub's appends are dropped (`delivery_failed`) to resume from Redis."""
        self._producing.pop(run_id, None)
        if unavailable:  # once Redis answers again, every server's subscribers learn the end
            self._nursery.start_soon(self._end_cut_run, run_id)
        tail = self._tails.get(run_id)
        if tail is None or not (unavailable or tail.fed):
            return
        del self._tails[run_id]
        tail.fail(_UNAVAILABLE if unavailable else "delivery_failed")  # resume reads Redis
        tail.scope.cancel()

    def _read_instead(self, run_id: str) -> None:
        """This hub's appends no longer tell the whole run (one was cut short, or this hub
        stopped driving it): its window here reads the stream from what it has, as any other
        hub's does."""
        tail = self._tails.get(run_id)
        if tail is not None and tail.fed and not tail.done and tail.failed is None:
            tail.fed = False
            self._nursery.start_soon(self._tail, tail)

    def _stop_producing(self, run_id: str) -> None:
        """This hub no longer drives the run: its lease is no longer renewed, and its
        subscribers here read whatever ends it from Redis."""
        if self._producing.pop(run_id, None) is not None:
            self._read_instead(run_id)

    async def _keep_leases(self) -> None:
        """Every `lease_interval` seconds: renew the lease of each open run this hub drives
        (an append renews it too; a run another hub has ended or taken over meanwhile is not
        driven here any more), then look for runs whose server is gone."""
        while True:
            await trio.sleep(self.lease_interval)
            await self._renew_leases()
            try:
                await self._find_lost()
            except HubUnavailable as exc:
                logger.warning("looking for runs whose server is gone failed: %s", exc)

    async def _renew_leases(self) -> None:
        runs = list(self._producing)
        if not runs:
            return
        try:
            with trio.fail_after(self.timeout):
                async with self._client.pipeline(transaction=False) as pipe:
                    replies = [
                        self._renew(
                            keys=[layout.keys(run_id)[0], layout.lease_key(run_id)],
                            args=[self._lease_ms, self.owner],
                            client=pipe,
                        )
                        for run_id in runs
                    ]
                held = [await reply for reply in replies]
                deadline = self._lease_deadline()
                kept: dict[str | bytes, int | float] = {
                    run_id: deadline for run_id, ok in zip(runs, held, strict=True) if ok
                }
                if kept:
                    await self._client.zadd(layout.LEASES, kept)
        except (*_FAILURES, trio.TooSlowError) as exc:
            logger.warning("renewing the leases of %d runs failed: %s", len(runs), exc)
            return
        for run_id, ok in zip(runs, held, strict=True):
            if not ok and run_id in self._producing:
                logger.warning("run %s: its lease is lost; it is no longer driven here", run_id)
                self._stop_producing(run_id)

    async def _find_lost(self) -> None:
        """Offer (or end) the open runs whose lease ran out, as `rillet:leases` says; forget
        there the runs that are over."""
        try:
            with trio.fail_after(self.timeout):
                due = await self._client.zrange(
                    layout.LEASES,
                    0,
                    time.time() * 1000,
                    sortby=PureToken.BYSCORE,
                    offset=0,
                    count=_SCAN,
                )
        except (*_FAILURES, trio.TooSlowError) as exc:
            raise self._unavailable(exc) from exc
        for member in due:
            run_id = layout.text(member)
            if run_id in self._producing:
                continue
            if await self._end_lost(run_id) or await self._run_info(run_id) is None:
                await self._forget_lease(run_id)

    async def _forget_lease(self, run_id: str) -> None:
        """The run is over: it leaves `rillet:leases` (a hint: a failure here costs a look)."""
        try:
            with trio.fail_after(self.timeout):
                await self._client.zrem(layout.LEASES, [run_id])
        except (*_FAILURES, trio.TooSlowError) as exc:
            logger.debug("run %s: not forgotten in %s: %s", run_id, layout.LEASES, exc)

    async def _unclaimed_long(self, run_id: str) -> bool:
        """Whether a lost run that may be taken over has waited a whole lease since its own
        ran out (as `rillet:leases` says) with no server taking it: then it is ended. A
        server that cannot take it (no room, no `takeover`) leaves it to others until then."""
        try:
            with trio.fail_after(self.timeout):
                deadline = await self._client.zscore(layout.LEASES, run_id)
        except (*_FAILURES, trio.TooSlowError) as exc:
            raise self._unavailable(exc) from exc
        return deadline is None or time.time() * 1000 > deadline + self._lease_ms

    async def _offer(self, run_id: str) -> bool:
        """Offer a lost run to `takeover` (once at a time): whether it was taken."""
        if self.takeover is None or run_id in self._offered:
            return False
        self._offered.add(run_id)
        try:
            return await self.takeover(run_id)
        finally:
            self._offered.discard(run_id)

    async def _end_lost(self, run_id: str) -> bool:
        """End an open run whose lease has expired (the server driving it is gone) with
        `run.done` (`error`, `server_lost`) after what the stream keeps: atomically, so only one
        server appends it. Whether the run is over now (ended here or elsewhere)."""
        for _ in range(3):  # another entry may land between the read and the script
            info = await self._run_info(run_id)
            if info is None:
                return False
            state, last, leased = info.state, info.last, info.leased
            if state != "open":
                return True
            if leased or run_id in self._producing or run_id in self._offered:
                return False
            if info.spec:
                if await self._offer(run_id):
                    continue  # taken (here or elsewhere): the next read says by whom
                if not await self._unclaimed_long(run_id):
                    return False  # another server may take it yet
            end = await self._end_after(run_id, last, _LOST)
            args = [last + 1, encode_json(end), max(1, int(self.retention * 1000)), self.max_events]
            try:
                with trio.fail_after(self.timeout):
                    ended = await self._lost(keys=self._run_keys(run_id), args=args)
            except (*_FAILURES, trio.TooSlowError) as exc:
                raise self._unavailable(exc) from exc
            if ended == 1:
                logger.warning("run %s: ended as %s (its server's lease expired)", run_id, _LOST)
                return True
            if ended == 0:  # done, forgotten or leased meanwhile: as the next read says
                continue
        return False

    async def ended(self, run_id: str) -> bool:
        """Whether the run is over: done, or open without a lease (its server is gone; it is
        ended as `server_lost` here and now). False for an unknown run. Raises
        `HubUnavailable`."""
        return await self._end_lost(run_id)

    async def _end_after(self, run_id: str, last: int, code: str) -> RunDone:
        """The `run.done` (`error`, `code`) that ends a run its producer can no longer end,
        after seq `last`, at the time of the last event kept."""
        elapsed = 0
        if last:
            kept = await self._range(run_id, last, 1)
            elapsed = kept[0].event.elapsed_ms if kept else 0
        return RunDone(
            run_id=run_id,
            seq=last + 1,
            elapsed_ms=elapsed,
            status="error",
            code=code,
            attempts=0,  # what the run cost is not in its log: its producer is gone
            requests=0,
            retryable=retryable(code),
        )

    async def _end_cut_run(self, run_id: str) -> None:
        """End a run whose delivery an outage cut: once Redis answers again (retried every
        `retry_interval` seconds while the open run is kept), append `run.done` (`error`,
        `log_unavailable`) after what the stream holds, so that no subscriber on any server
        waits for events that will never come. Nothing is written to a run that is done,
        forgotten, or appended to by another producer meanwhile."""
        deadline = trio.current_time() + self.open_ttl
        conflicts = 0
        while True:
            try:
                info = await self._run_info(run_id)
                if info is None or info.state != "open":
                    return
                end = await self._end_after(run_id, info.last, _UNAVAILABLE)
                await self.append(run_id, [end])
            except HubUnavailable:
                if trio.current_time() >= deadline:
                    return
                await trio.sleep(self.retry_interval)
                continue
            except AppendConflict:  # an entry landed since the read: read again, a few times
                conflicts += 1
                if conflicts == 3:  # someone else is appending: the run is not ours to end
                    return
                continue
            except HubError:  # done or forgotten meanwhile
                return
            logger.warning("run %s: ended as log_unavailable once its log was back", run_id)
            return

    # --- reading --------------------------------------------------------------------------------

    async def _run_info(self, run_id: str) -> _Info | None:
        """The run's state, access, first and last seq kept, whether its lease is held and
        whether it may be taken over; None for an unknown run."""
        try:
            with trio.fail_after(self.timeout):
                reply = await self._info(keys=self._run_keys(run_id))
        except (*_FAILURES, trio.TooSlowError) as exc:
            raise self._unavailable(exc) from exc
        if not reply:
            return None
        state, access, first, last, leased, spec = reply
        access_hex = layout.text(access)
        return _Info(
            state=layout.text(state),
            access=bytes.fromhex(access_hex) if access_hex else None,
            first=layout.seq(first),
            last=layout.seq(last),
            leased=bool(leased),
            spec=bool(spec),
        )

    async def _range(self, run_id: str, start: int, count: int) -> list[Entry]:
        """Up to `count` entries from seq `start` on, as the stream keeps them."""
        try:
            with trio.fail_after(self.timeout):
                reply = await self._client.xrange(layout.keys(run_id)[1], f"{start}-0", "+", count)
        except (*_FAILURES, trio.TooSlowError) as exc:
            raise self._unavailable(exc) from exc
        return [layout.entry(item.identifier, item.field_values) for item in reply]

    async def follow(
        self, run_id: str, after: int = 0, *, buffer: int | None = None
    ) -> RedisSubscription:
        """Follow a run from the event after seq `after` (0: from the start), replaying what the
        stream keeps, then live. Raises `UnknownRun`, `CursorInvalid` (past the last event),
        `CursorExpired` (below what is kept), `HubUnavailable`, or `HubError` (too many
        subscribers here)."""
        info = await self._run_info(run_id)
        if info is None:
            raise UnknownRun(run_id)
        if info.state == "open" and not info.leased and run_id not in self._producing:
            await self._end_lost(run_id)  # its server is gone: taken over, or ended here
            info = await self._run_info(run_id)
            if info is None:
                raise UnknownRun(run_id)
        state, first, last = info.state, info.first, info.last
        if after < 0 or after > last:
            raise CursorInvalid("past the last event")
        if last and after + 1 < first:
            raise CursorExpired(first)
        tail = self._tails.get(run_id)
        if state == "done":
            if tail is None:
                tail = _Tail(run_id, last, done=True)  # read from Redis alone, no tail task
        elif tail is None:
            fed = run_id in self._producing  # this hub appends it: its appends feed the window
            if fed:  # appends done while Redis answered are below the window: read them there
                last = max(last, self._producing[run_id])
            tail = _Tail(run_id, last, done=False, fed=fed)
            self._tails[run_id] = tail
            if not fed:
                self._nursery.start_soon(self._tail, tail)
        if len(tail.subscribers) >= self.max_subscribers_per_run:
            raise HubError("too many subscribers for this run")
        sub = RedisSubscription(self, tail, after, buffer if buffer is not None else self.buffer)
        sub.joined = max(last, tail.last_seq)
        if not tail.done:
            tail.subscribers.add(sub)
        self.subscribers += 1
        return sub

    def unsubscribed(self, sub: Subscription) -> None:
        """A subscription stopped following its run: one subscriber fewer, and the run's tail
        is let go once no one here follows it."""
        self.subscribers = max(0, self.subscribers - 1)
        tail = sub.run
        if self._tails.get(tail.run_id) is tail and not tail.subscribers:
            del self._tails[tail.run_id]
            tail.scope.cancel()  # its blocked read, on its own connection

    async def access(self, run_id: str) -> bytes | None:
        """The `access` the run was opened with; None for an unknown run or none given."""
        info = await self._run_info(run_id)
        return None if info is None else info.access

    async def kept(self, run_ids: Sequence[str]) -> set[str]:
        """Which of these runs Redis still keeps."""
        if not run_ids:
            return set()
        try:
            with trio.fail_after(self.timeout):
                async with self._client.pipeline(transaction=False) as pipe:
                    replies = [pipe.exists([layout.keys(run_id)[0]]) for run_id in run_ids]
                found = [await reply for reply in replies]
        except (*_FAILURES, trio.TooSlowError) as exc:
            raise self._unavailable(exc) from exc
        return {run_id for run_id, n in zip(run_ids, found, strict=True) if n}

    async def sweep(self) -> None:
        """Nothing to do here: Redis forgets a run by its keys' expiry."""
        await trio.lowlevel.checkpoint()

    def statistics(self) -> dict[str, int]:
        """Runs followed here (tails), runs appended to here, live subscriptions, events
        appended and read by the tails."""
        return {
            "runs": len(self._tails),
            "producing": len(self._producing),
            "subscribers": self.subscribers,
            "appended": self.appended,
            "delivered": self.delivered,
            "taken_over": self.taken_over,
        }

    # --- the tail -------------------------------------------------------------------------------

    async def _tail(self, tail: _Tail) -> None:
        """Follow one run's stream with `XREAD BLOCK` on a connection of its own, fanning each
        read out to the subscribers here, until `run.done`, a failure, or no subscriber is
        left (the scope is cancelled)."""
        key = layout.keys(tail.run_id)[1]
        block_ms = max(1, int(self.block * 1000))
        client: coredis.Redis[bytes] = coredis.Redis.from_url(
            self.url,
            max_connections=1,
            stream_timeout=self.block + self.timeout,
            connect_timeout=self.timeout,
            retry_policy=NoRetryPolicy(),
        )
        reason: str | None = None
        with tail.scope:
            try:
                async with client:
                    while not tail.done and tail.failed is None:
                        reply = await client.xread(
                            {key: f"{tail.last_seq}-0"}, count=self.read_count, block=block_ms
                        )
                        if reply:
                            for items in reply.values():
                                self._fan_out(
                                    tail,
                                    [layout.entry(i.identifier, i.field_values) for i in items],
                                )
                        else:  # quiet for `block` seconds: is the run still kept, still driven?
                            info = await self._run_info(tail.run_id)
                            if info is None:
                                reason = "run_expired"  # gone without run.done
                                break
                            if info.state == "open" and not info.leased:
                                await self._end_lost(tail.run_id)  # the next read says what
            except* Exception as group:  # Redis gone, or an entry that is not a run event
                logger.error(
                    "run %s: reading its log failed (%s); its subscribers here are closed with %s",
                    tail.run_id,
                    "; ".join(f"{type(e).__name__}: {e}" for e in group.exceptions),
                    _UNAVAILABLE,
                )
                reason = _UNAVAILABLE
        if reason is not None:
            tail.fail(reason)
        if self._tails.get(tail.run_id) is tail:
            del self._tails[tail.run_id]

    def _fan_out(self, tail: _Tail, entries: list[Entry]) -> None:
        """New entries into the window; subscribers past their allowance dropped; the rest
        woken."""
        fresh = [e for e in entries if e.seq > tail.last_seq]
        if not fresh:
            return
        if fresh[0].seq != tail.last_seq + 1:  # trimmed before this tail read it
            tail.entries.clear()
            tail.base = fresh[0].seq
        tail.entries += fresh
        self.delivered += len(fresh)
        if type(fresh[-1].event) is RunDone:
            tail.done_at = trio.current_time()
        over = len(tail.entries) - self.window
        if over > max(self.window // 8, 0):
            del tail.entries[:over]
            tail.base += over
        head = tail.last_seq
        for sub in [s for s in tail.subscribers if s.behind(head) > s.buffer]:
            sub.drop("fell_behind")
            tail.subscribers.discard(sub)
        if tail.done:
            tail.subscribers.clear()
        tail.wake()


_SCRIPTS = (
    layout.CREATE,
    layout.APPEND,
    layout.INFO,
    layout.RENEW,
    layout.LOST,
    layout.CLAIM,
    layout.KEEP,
)


@asynccontextmanager
async def open_redis_hub(url: str, **options: Any) -> AsyncIterator[RedisHub]:
    """A `RedisHub` on the Redis at `url` for the duration of the block (`options` are its
    attributes: `buffer`, `max_events`, `retention`, ...). Raises `HubUnavailable` at once when
    Redis does not answer: there is no fallback to memory. An exception from the block comes
    out as itself, not wrapped in an exception group."""
    timeout = float(options.get("timeout", 5.0))
    try:
        client: coredis.Redis[bytes] = coredis.Redis.from_url(
            url,
            stream_timeout=timeout,
            connect_timeout=timeout,
            max_connections=int(options.get("max_connections", 64)),
            retry_policy=NoRetryPolicy(),
        )
    except (ValueError, RedisError) as exc:
        raise HubUnavailable(f"not a usable Redis URL: {layout.safe_url(url)} ({exc})") from None
    error: BaseException | None = None
    async with client, trio.open_nursery() as nursery:
        hub = RedisHub(url, client, nursery, **options)
        try:
            await hub.ping()
            nursery.start_soon(hub._keep_leases)
            yield hub
        except GeneratorExit:
            raise
        except BaseException as exc:  # re-raised below, once the tails and the pool are down
            error = exc
        nursery.cancel_scope.cancel()
    if error is not None:
        raise error
