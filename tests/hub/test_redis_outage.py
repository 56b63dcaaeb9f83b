"""The Redis run log after an outage: Redis that stops answering mid-run, then comes back with
its data (a pause, a network cut), against a real `redis-server` of the test's own."""

from __future__ import annotations

import os
import signal
from contextlib import contextmanager
from typing import TYPE_CHECKING

import pytest
import trio
from rillet._core._request import TurnRequest, user
from rillet._core._runevents import AnswerDelta, RunDone
from rillet._hub._redis import RedisHubSink
from rillet._turn._api import run_turn
from rillet.transports.testing import open_loopback_provider

from ..server_support import POLICY, chat_provider, text_reply
from .test_redis_hub import (
    RedisServer,
    doomed_redis,  # noqa: F401  (a fixture)
    new_run,
    read_to_end,
    redis_server,  # noqa: F401  (a fixture)
    take,
    two_hubs,
)

if TYPE_CHECKING:
    from collections.abc import Iterator

    from rillet._turn._turn import TurnResult

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:Unclosed <MemoryObject:ResourceWarning"),
]


@contextmanager
def paused(server: RedisServer) -> Iterator[None]:
    """Redis stops answering (SIGSTOP) for the block, keeping its data, then goes on."""
    os.kill(server.process.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(server.process.pid, signal.SIGCONT)


async def test_a_run_cut_by_an_outage_ends_for_subscribers_on_every_hub_once_redis_is_back(
    doomed_redis: RedisServer,  # noqa: F811
) -> None:
    words = [f"{n} " for n in range(80)]
    run_id = new_run()
    results: list[TurnResult] = []
    with trio.fail_after(20):
        async with (
            open_loopback_provider([text_reply(words, chunk_delay=0.01)]) as loopback,
            two_hubs(doomed_redis.url, timeout=0.5, retry_interval=0.2) as (a, b),
        ):
            sink = await a.open_run(run_id)
            assert isinstance(sink, RedisHubSink)
            remote = await b.follow(run_id)
            request = TurnRequest(messages=[user("Hi")])

            async def turn() -> None:
                provider = chat_provider(loopback.url)
                results.append(
                    await run_turn(request, provider, sinks=[sink], policy=POLICY, run_id=run_id)
                )

            async with trio.open_nursery() as nursery:
                nursery.start_soon(turn)
                await take(remote, 5)
                with paused(doomed_redis):
                    await trio.sleep(1.5)  # past the hub's timeout: the append fails
            # Redis is back with the run's keys; the run's producer has stopped appending
            rest = await read_to_end(remote)
            remote.close()
            later = await read_to_end(await b.follow(run_id))  # a resume from seq 1, elsewhere
            here = await read_to_end(await a.follow(run_id))  # and on the hub that ran it
    [result] = results
    assert result.ok
    assert result.text == "".join(words)
    assert sink.failed is not None
    seqs = [e.seq for e in later]
    assert seqs == list(range(1, len(seqs) + 1))
    assert [e.data for e in here] == [e.data for e in later]
    assert [e.seq for e in rest][-1] == seqs[-1]
    end = later[-1].event
    assert isinstance(end, RunDone)
    assert (end.status, end.code) == ("error", "log_unavailable")
    assert [type(e.event) for e in later].count(RunDone) == 1
    text = "".join(e.event.delta for e in later if isinstance(e.event, AnswerDelta))
    assert "".join(words).startswith(text)
    assert text != "".join(words)
