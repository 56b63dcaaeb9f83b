"""A subscriber that joins a run far behind its head (a late joiner, a resume from an old seq)
replays what the log held at its own pace: only live events it leaves unread count against its
buffer allowance. In memory and on a real Redis."""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import pytest
import trio
from rillet._core._errors import SubscriberDropped
from rillet._hub._hub import Hub
from rillet._hub._redis import RedisHub, open_redis_hub

from .test_redis_hub import deltas, done, new_run, read_to_end, redis_server, redis_url  # noqa: F401

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from rillet._hub._hub import Subscription

pytestmark = pytest.mark.filterwarnings("ignore:Unclosed <MemoryObject:ResourceWarning")

KEPT = 3000  # events the log holds when the subscriber joins
BUFFER = 100


class MemoryHub:
    """The memory hub behind the same awaitable calls as the Redis hub's."""

    def __init__(self) -> None:
        self.hub = Hub()

    async def open(self, run_id: str) -> None:
        self.hub.create(run_id)

    async def append(self, run_id: str, first: int, last: int) -> None:
        self.hub.append(run_id, deltas(run_id, first, last))

    async def end(self, run_id: str, seq: int) -> None:
        self.hub.append(run_id, [done(run_id, seq)])

    async def follow(self, run_id: str, after: int) -> Subscription:
        return self.hub.subscribe(run_id, after, buffer=BUFFER)


class OnRedis(MemoryHub):
    def __init__(self, hub: RedisHub) -> None:
        self.redis = hub

    async def open(self, run_id: str) -> None:
        await self.redis.create(run_id)

    async def append(self, run_id: str, first: int, last: int) -> None:
        for start in range(first, last + 1, 500):
            await self.redis.append(run_id, deltas(run_id, start, min(start + 499, last)))

    async def end(self, run_id: str, seq: int) -> None:
        await self.redis.append(run_id, [done(run_id, seq)])

    async def follow(self, run_id: str, after: int) -> Subscription:
        return await self.redis.follow(run_id, after, buffer=BUFFER)


@asynccontextmanager
async def hub_of(kind: str, request: pytest.FixtureRequest) -> AsyncIterator[Any]:
    if kind == "memory":
        yield MemoryHub()
        return
    async with open_redis_hub(request.getfixturevalue("redis_url")) as hub:
        yield OnRedis(hub)


async def until_tail_read(sub: Subscription, seq: int) -> None:
    """Wait until the subscription's run (its window, on Redis) holds `seq`."""
    while sub.run.last_seq < seq:
        await sub.run.wait()


@pytest.mark.parametrize("kind", ["memory", "redis"])
async def test_a_late_joiner_replaying_the_kept_log_is_not_dropped_by_new_events(
    kind: str, request: pytest.FixtureRequest
) -> None:
    run_id = new_run()
    with trio.fail_after(20):
        async with hub_of(kind, request) as hub:
            await hub.open(run_id)
            await hub.append(run_id, 1, KEPT)
            sub = await hub.follow(run_id, 0)
            first = await sub.next_batch()
            await hub.append(run_id, KEPT + 1, KEPT + BUFFER - 1)  # live, with the end: its all
            await hub.end(run_id, KEPT + BUFFER)
            rest = await read_to_end(sub)
            sub.close()
    seqs = [e.seq for e in first + rest]
    assert seqs == list(range(1, KEPT + BUFFER + 1))


@pytest.mark.parametrize("kind", ["memory", "redis"])
async def test_a_late_joiner_is_dropped_once_unread_live_events_outgrow_its_buffer(
    kind: str, request: pytest.FixtureRequest
) -> None:
    run_id = new_run()
    with trio.fail_after(20):
        async with hub_of(kind, request) as hub:
            await hub.open(run_id)
            await hub.append(run_id, 1, KEPT)
            sub = await hub.follow(run_id, 0)
            await hub.append(run_id, KEPT + 1, KEPT + BUFFER + 1)  # one past its allowance
            await until_tail_read(sub, KEPT + BUFFER + 1)
            with pytest.raises(SubscriberDropped) as dropped:
                await read_to_end(sub)
            sub.close()
    assert dropped.value.reason == "fell_behind"
    assert dropped.value.last_seq == 0


async def test_a_hub_drops_a_subscriber_through_its_public_api_first_reason_kept() -> None:
    hub = Hub()
    hub.create("r")
    hub.append("r", deltas("r", 1, 3))
    sub = hub.subscribe("r", 0, buffer=BUFFER)
    assert sub.run.last_seq == 3  # the run it follows, as the hub keeps it
    assert sub.hub is hub
    sub.check_dropped()  # not dropped: nothing raised
    sub.drop("fell_behind")
    sub.drop("log_unavailable")
    assert sub.drop_reason == "fell_behind"
    assert sub.cancel_scope.cancel_called
    with pytest.raises(SubscriberDropped) as dropped:
        sub.check_dropped()
    assert dropped.value.reason == "fell_behind"
    with pytest.raises(SubscriberDropped):
        await sub.next_batch()
