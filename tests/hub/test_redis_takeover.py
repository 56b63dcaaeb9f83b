"""Taking over a run whose server is gone, on a real `redis-server`: a run opened with a spec
is offered to a hub's `takeover` once its lease runs out; the hub that claims it appends from
the next seq, and the old producer, if it comes back, is fenced off (its appends and its lease
renewals are refused). A run without a spec, or one no taker accepts, ends `server_lost`.

Leases are short (a fraction of a second) so the tests are quick; Redis counts them in real
time, so these waits are real.
"""

from __future__ import annotations

import functools
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

import httpx
import pytest
import trio
from rillet._core._errors import AppendConflict
from rillet._core._runevents import RunDone
from rillet._hub._redis import Claim, RedisHub, open_redis_hub
from rillet._hub._redis_layout import lease_key
from rillet._turn._turn import SinkBatch
from rillet.transports.server import ServerConfig, serve
from rillet.transports.testing import open_loopback_provider

from ..server_support import chat_provider, text_reply
from .test_redis_hub import (
    deltas,
    done,
    new_run,
    probe,
    read_to_end,
    redis_server,  # noqa: F401 - the session fixture
    redis_url,  # noqa: F401 - its URL
)
from .test_redis_lease import LEASE, _stream_ends

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from .test_redis_hub import RedisServer

pytestmark = pytest.mark.slow

SPEC = b'{"model":"m","request":{"messages":[]}}'


class Taker:
    """A hub's `takeover`: records each offer and, when it accepts, claims the run."""

    def __init__(self, *, accept: bool = True) -> None:
        self.accept = accept
        self.hub: RedisHub | None = None
        self.offers: list[str] = []
        self.claims: list[Claim] = []
        self.claimed = trio.Event()

    async def __call__(self, run_id: str) -> bool:
        self.offers.append(run_id)
        if not self.accept:
            return False
        assert self.hub is not None
        claim = await self.hub.claim(run_id)
        if claim is not None:
            self.claims.append(claim)
            self.claimed.set()
        return True


@asynccontextmanager
async def taking(url: str, taker: Taker, **options: float) -> AsyncIterator[RedisHub]:
    """A hub on `url` whose lost runs are offered to `taker`."""
    async with open_redis_hub(url, **{**LEASE, **options}) as hub:
        taker.hub = hub
        hub.takeover = taker
        yield hub


def _lost(event: object) -> bool:
    return isinstance(event, RunDone) and event.code == "server_lost"


async def test_a_lost_run_with_a_spec_is_taken_over_and_read_as_one_gapless_stream(
    redis_url: str,  # noqa: F811
) -> None:
    """The producer goes away after seq 3; no one follows the run on the taker's hub (its own
    look for lost runs finds it): the taker appends from seq 4, and a reader on a third hub
    gets 1..6 once each, ending as the taker ended it, never `server_lost`."""
    run_id = new_run()
    taker = Taker()
    with trio.fail_after(10):
        async with taking(redis_url, taker) as b, open_redis_hub(redis_url, **LEASE) as c:
            async with open_redis_hub(redis_url, **LEASE) as a:
                sink = await a.open_run(run_id, access=b"k" * 32, spec=SPEC)
                await sink.deliver(SinkBatch(deltas(run_id, 1, 3), ()))
                reader = await c.follow(run_id)
            await taker.claimed.wait()  # a is gone: its lease runs out, b finds the run
            claim = taker.claims[0]
            await claim.sink.deliver(SinkBatch([*deltas(run_id, 4, 5), done(run_id, 6)], ()))
            entries = await read_to_end(reader)
            assert b.statistics()["taken_over"] == 1
    assert (claim.run_id, claim.last, claim.spec, claim.access) == (run_id, 3, SPEC, b"k" * 32)
    assert claim.elapsed_ms == deltas(run_id, 3, 3)[0].elapsed_ms
    assert [e.seq for e in entries] == [1, 2, 3, 4, 5, 6]
    assert not any(_lost(e.event) for e in entries)
    assert await _stream_ends(redis_url, run_id) == ["completed"]


async def test_the_old_producer_is_fenced_off_once_its_run_is_taken(
    redis_url: str,  # noqa: F811
) -> None:
    """A producer that stalls past its lease (it renews nothing: a hung process) and then
    comes back: the run is another hub's by then; the old producer's appends are refused,
    even the one whose seq comes next, and the log holds only the taker's."""
    run_id = new_run()
    taker = Taker()
    with trio.fail_after(10):
        async with open_redis_hub(redis_url, lease=0.3, lease_interval=60.0) as a:
            sink = await a.open_run(run_id, spec=SPEC)
            await sink.deliver(SinkBatch(deltas(run_id, 1, 2), ()))
            async with taking(redis_url, taker) as b:
                await taker.claimed.wait()
                with pytest.raises(AppendConflict):
                    await a.append(run_id, deltas(run_id, 3, 3))
                await sink.deliver(SinkBatch(deltas(run_id, 3, 3), ()))  # logged, not raised
                await taker.claims[0].sink.deliver(SinkBatch([done(run_id, 3)], ()))
                entries = await read_to_end(await b.follow(run_id))
                async with probe(redis_url) as client:
                    owner = await client.get(lease_key(run_id))
    assert isinstance(sink.failed, AppendConflict)
    assert owner is None  # the taker's `run.done` ended its lease
    assert [e.seq for e in entries] == [1, 2, 3]
    assert isinstance(entries[-1].event, RunDone)
    assert entries[-1].event.code == "completed"


async def test_the_taker_holds_the_lease_and_the_old_producer_cannot_renew_it(
    redis_url: str,  # noqa: F811
) -> None:
    """Once taken, the run's lease names the taker; the old producer's renewal, when it comes,
    finds the run another's and stops driving it (no longer renewed or ended by it)."""
    run_id = new_run()
    taker = Taker()
    with trio.fail_after(10):
        async with open_redis_hub(redis_url, lease=0.3, lease_interval=0.6) as a:
            await a.open_run(run_id, spec=SPEC)
            await a.append(run_id, deltas(run_id, 1, 1))
            async with probe(redis_url) as client:
                await client.delete([lease_key(run_id)])  # as if a had stalled past it
            async with taking(redis_url, taker) as b:
                await taker.claimed.wait()
                async with probe(redis_url) as client:
                    holder = await client.get(lease_key(run_id))
                while a.statistics()["producing"]:  # noqa: ASYNC110 - a renewal is refused
                    await trio.sleep(0.05)
                await taker.claims[0].sink.deliver(SinkBatch([done(run_id, 2)], ()))
                assert b.statistics()["producing"] == 0
    assert holder == b.owner.encode()


async def test_a_lost_run_without_a_spec_is_not_offered_and_ends_server_lost(
    redis_url: str,  # noqa: F811
) -> None:
    run_id = new_run()
    taker = Taker()
    with trio.fail_after(10):
        async with taking(redis_url, taker) as b:
            async with open_redis_hub(redis_url, **LEASE) as a:
                sink = await a.open_run(run_id)
                await sink.deliver(SinkBatch(deltas(run_id, 1, 2), ()))
                reader = await b.follow(run_id)
            entries = await read_to_end(reader)
    assert [e.seq for e in entries] == [1, 2, 3]
    assert _lost(entries[-1].event)
    assert run_id not in taker.offers


async def test_a_lost_run_no_taker_accepts_ends_server_lost_once(
    redis_url: str,  # noqa: F811
) -> None:
    """The taker has no room (it declines): the run ends `server_lost` as before, and only
    once, though two hubs were offered it."""
    run_id = new_run()
    first, second = Taker(accept=False), Taker(accept=False)
    with trio.fail_after(10):
        async with taking(redis_url, first) as b, taking(redis_url, second) as c:
            async with open_redis_hub(redis_url, **LEASE) as a:
                sink = await a.open_run(run_id, spec=SPEC)
                await sink.deliver(SinkBatch(deltas(run_id, 1, 2), ()))
                reader = await b.follow(run_id)
            entries = await read_to_end(reader)
            await c.ended(run_id)
    assert [e.seq for e in entries] == [1, 2, 3]
    assert _lost(entries[-1].event)
    assert run_id in first.offers + second.offers
    assert await _stream_ends(redis_url, run_id) == ["server_lost"]


async def test_of_two_hubs_offered_a_lost_run_exactly_one_takes_it(
    redis_url: str,  # noqa: F811
) -> None:
    run_id = new_run()
    takers = [Taker(), Taker()]
    with trio.fail_after(10):
        async with taking(redis_url, takers[0]) as b, taking(redis_url, takers[1]) as c:
            async with open_redis_hub(redis_url, **LEASE) as a:
                sink = await a.open_run(run_id, spec=SPEC)
                await sink.deliver(SinkBatch(deltas(run_id, 1, 1), ()))
            with trio.move_on_after(LEASE["lease"] + 1.0):  # both look, several times
                while True:
                    await b.ended(run_id)
                    await c.ended(run_id)
                    await trio.sleep(0.05)
            claims = [claim for taker in takers for claim in taker.claims]
            assert len(claims) == 1
            await claims[0].sink.deliver(SinkBatch([done(run_id, 2)], ()))
    assert await _stream_ends(redis_url, run_id) == ["completed"]


async def test_a_server_gives_its_hub_the_lease_its_config_names(
    redis_server: RedisServer,  # noqa: F811
) -> None:
    """`ServerConfig.hub_options` reach the Redis hub a server opens: a run it drives holds a
    lease of the configured length (1.5 s here, 9 s by default)."""
    async with open_loopback_provider(lambda request, n: text_reply(stall_after=3)) as loopback:
        config = ServerConfig(
            provider=chat_provider(loopback.url),
            port=0,
            redis_url=redis_server.url,
            hub_options={"lease": 1.5, "lease_interval": 0.5},
        )
        with trio.fail_after(20):
            async with trio.open_nursery() as nursery, probe(redis_server.url) as client:
                url = await nursery.start(functools.partial(serve, config))
                async with httpx.AsyncClient(base_url=url) as http:
                    run = (await http.post("/v1/runs", json={"prompt": "hi"})).json()
                ttl = await client.pttl(lease_key(run["run_id"]))
                nursery.cancel_scope.cancel()
    assert 0 < ttl <= 1500, ttl
