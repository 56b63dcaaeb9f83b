"""A run whose server is gone, on a real `redis-server`: the server driving a run holds a lease
that expires unless renewed; a hub that sees an open run without one ends it with `run.done`
(`error`, `server_lost`), once across servers, so live readers and later resumes reach an end.

A hub that stops (its context left, as a process that died stops) renews nothing more: that is
the producer's death here. Leases are short (a fraction of a second) so the tests are quick;
Redis counts them in real time, so these waits are real.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pytest
import trio
from rillet._core._runevents import RunDone
from rillet._hub._redis import RedisHub, open_redis_hub
from rillet._hub._redis_layout import keys
from rillet._turn._turn import SinkBatch

from .test_redis_hub import (
    deltas,
    done,
    new_run,
    probe,
    read_to_end,
    redis_server,  # noqa: F401 - the session fixture
    redis_url,  # noqa: F401 - its URL
)

if TYPE_CHECKING:
    from rillet._hub._hub import Entry, Subscription

pytestmark = pytest.mark.slow

LEASE = {"lease": 0.3, "lease_interval": 0.1, "block": 0.1}


def _lost(entry: Entry) -> bool:
    event = entry.event
    return isinstance(event, RunDone) and (event.status, event.code) == ("error", "server_lost")


async def _stream_ends(url: str, run_id: str) -> list[str]:
    """The types of the `run.done` entries the run's stream holds."""
    async with probe(url) as client:
        items = await client.xrange(keys(run_id)[1], "-", "+")
    found = [json.loads(item.field_values[b"e"]) for item in items]
    return [e["code"] for e in found if e["type"] == "run.done"]


async def test_readers_of_a_run_whose_server_is_gone_get_server_lost_once(
    redis_url: str,  # noqa: F811
) -> None:
    """The producer goes away mid-run; two hubs each with a live reader: both readers get the
    events, then one `run.done` `server_lost`, the same entry, and the stream holds it once."""
    run_id = new_run()
    with trio.fail_after(10):
        async with open_redis_hub(redis_url, **LEASE) as b, open_redis_hub(redis_url, **LEASE) as c:
            async with open_redis_hub(redis_url, **LEASE) as a:
                sink = await a.open_run(run_id)
                await sink.deliver(SinkBatch(deltas(run_id, 1, 3), ()))
                here, there = await b.follow(run_id), await c.follow(run_id)
            started = trio.current_time()  # a is gone: nothing renews its lease
            async with trio.open_nursery() as nursery:
                got: dict[str, list[Entry]] = {}

                async def read(name: str, sub: Subscription) -> None:
                    got[name] = await read_to_end(sub)

                nursery.start_soon(read, "b", here)
                nursery.start_soon(read, "c", there)
            waited = trio.current_time() - started
    assert [e.seq for e in got["b"]] == [1, 2, 3, 4]
    assert [e.data for e in got["b"]] == [e.data for e in got["c"]]
    assert _lost(got["b"][-1])
    assert waited < LEASE["lease"] + 1.0  # the lease, a block, a margin
    assert await _stream_ends(redis_url, run_id) == ["server_lost"]


async def test_a_resume_after_the_server_is_gone_gets_the_end_at_once(
    redis_url: str,  # noqa: F811
) -> None:
    """No one followed the run when its server went; a resume from its last seq, later, on a hub
    whose reads block for 5 s, gets `run.done` `server_lost` at once rather than waiting."""
    run_id = new_run()
    with trio.fail_after(10):
        async with open_redis_hub(redis_url, **LEASE) as a:
            sink = await a.open_run(run_id)
            await sink.deliver(SinkBatch(deltas(run_id, 1, 5), ()))
        await trio.sleep(LEASE["lease"] + 0.2)  # the lease expires
        async with open_redis_hub(redis_url, block=5.0) as later:
            with trio.fail_after(1):
                entries = await read_to_end(await later.follow(run_id, 5))
            assert await later.ended(run_id)
    assert [e.seq for e in entries] == [6]
    assert _lost(entries[0])


async def test_a_quiet_run_whose_server_is_alive_keeps_its_lease(
    redis_url: str,  # noqa: F811
) -> None:
    """A run that appends nothing for ten lease periods (waiting for an approval, a slow
    provider) is still driven: its lease is renewed, no one ends it, and it ends as its
    server says."""
    run_id = new_run()
    with trio.fail_after(10):
        async with open_redis_hub(redis_url, **LEASE) as a, open_redis_hub(redis_url, **LEASE) as b:
            sink = await a.open_run(run_id)
            await sink.deliver(SinkBatch(deltas(run_id, 1, 1), ()))
            sub = await b.follow(run_id)
            await trio.sleep(10 * LEASE["lease"])
            assert not await b.ended(run_id)
            await sink.deliver(SinkBatch([done(run_id, 2)], ()))
            entries = await read_to_end(sub)
    assert [e.seq for e in entries] == [1, 2]
    assert json.loads(entries[-1].data)["code"] == "completed"


async def test_a_run_closed_without_its_end_is_ended_for_the_producers_own_readers(
    redis_url: str,  # noqa: F811
) -> None:
    """A producer that closes a run's sink without `run.done` drives it no more: its lease
    runs out, and a subscriber on that same hub (fed by its appends until then) reads the
    `server_lost` end from Redis."""
    run_id = new_run()
    with trio.fail_after(10):
        async with open_redis_hub(redis_url, **LEASE) as a:
            sink = await a.open_run(run_id)
            await sink.deliver(SinkBatch(deltas(run_id, 1, 2), ()))
            sub = await a.follow(run_id)
            await sink.close()
            entries = await read_to_end(sub)
    assert [e.seq for e in entries] == [1, 2, 3]
    assert _lost(entries[-1])


async def test_two_hubs_ending_the_same_lost_run_append_one_end(
    redis_url: str,  # noqa: F811
) -> None:
    """Both hubs notice the lost run at the same moment: one `run.done`, both see the run over."""
    run_id = new_run()
    with trio.fail_after(10):
        async with open_redis_hub(redis_url, **LEASE) as a:
            sink = await a.open_run(run_id)
            await sink.deliver(SinkBatch(deltas(run_id, 1, 2), ()))
        await trio.sleep(LEASE["lease"] + 0.2)
        async with open_redis_hub(redis_url) as b, open_redis_hub(redis_url) as c:
            answers: list[bool] = []
            async with trio.open_nursery() as nursery:
                for hub in (b, c, b, c):
                    nursery.start_soon(_ended, hub, run_id, answers)
    assert answers == [True] * 4
    assert await _stream_ends(redis_url, run_id) == ["server_lost"]


async def _ended(hub: RedisHub, run_id: str, answers: list[bool]) -> None:
    answers.append(await hub.ended(run_id))
