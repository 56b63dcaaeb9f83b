"""A run taken over whose provider keeps its reply (OpenAI's background responses,
`OpenAIResponsesDialect(resume=True)`): the taker reads that reply again from its start rather
than asking anew, so the answer is the same one and is not generated (or paid) twice.

The lost server is a hub that opened the run (its spec, as a server writes it), noted the kept
reply's id, streamed part of the answer and stopped renewing its lease; the taker is a real
server on the same `redis-server`, in front of a loopback provider playing OpenAI's recorded
background stream. Leases are short, so the waits are short, and real (Redis counts them)."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import msgspec
import trio
from rillet._core._dialect import Provider, Secret
from rillet._core._request import TurnRequest, user
from rillet._core._runevents import AnswerDelta, RunDone, RunStarted
from rillet._hub._redis import open_redis_hub
from rillet._turn._turn import SinkBatch
from rillet.providers import OpenAIResponsesDialect
from rillet.transports.server import ServerConfig, serve
from rillet.transports.testing import RecordedRequest, Reply, open_loopback_provider

from ..hub.test_redis_hub import new_run, redis_server, redis_url  # noqa: F401
from ..turn.test_provider_resume import RECORDED, RESPONSE_ID, TEXT

if TYPE_CHECKING:
    from rillet._hub._hub import Entry

LEASE = {"lease": 0.3, "lease_interval": 0.1, "block": 0.1}


def _spec(provider: Provider) -> bytes:
    """The spec a server opens a turn run with (`_runs._Spec`): model, upstream, request."""
    return msgspec.json.encode(
        {
            "model": provider.model,
            "dialect": "OpenAIResponsesDialect",
            "base_url": provider.base_url,
            "request": TurnRequest(messages=[user("2+2?")]),
        }
    )


async def test_a_taken_over_run_reads_the_kept_reply_again_instead_of_asking_anew(
    redis_url: str,  # noqa: F811
) -> None:
    run_id = new_run()

    def script(request: RecordedRequest, _: int) -> Reply:
        return Reply(chunks=(RECORDED,))  # the kept reply, whole, from its start

    with trio.fail_after(20):
        async with open_loopback_provider(script) as loopback:
            provider = Provider(
                OpenAIResponsesDialect(resume=True),
                f"{loopback.url}/v1",
                "gpt-4o",
                api_key=Secret("sk-loopback-0123456789abcdef"),
            )
            async with open_redis_hub(redis_url, lease=0.3, lease_interval=60.0) as lost:
                sink = await lost.open_run(run_id, access=b"a" * 32, spec=_spec(provider))
                await lost.keep(run_id, RESPONSE_ID)
                started = RunStarted(run_id=run_id, seq=1, elapsed_ms=0, model="gpt-4o")
                partial = AnswerDelta(run_id=run_id, seq=2, elapsed_ms=5, delta="2 + 2")
                await sink.deliver(SinkBatch([started, partial], ()))
            async with open_redis_hub(redis_url, **LEASE) as hub, trio.open_nursery() as nursery:
                config = ServerConfig(provider=provider, port=0, redis_url=redis_url)
                await nursery.start(functools.partial(serve, config, hub=hub))
                follower = await hub.follow(run_id)
                entries: list[Entry] = []
                while not entries or not isinstance(entries[-1].event, RunDone):
                    entries += await follower.next_batch()
                follower.close()
                nursery.cancel_scope.cancel()
    events = [msgspec.json.decode(e.data) for e in entries]
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    types = [e["type"] for e in events]
    assert types[:4] == ["run.started", "answer.delta", "status", "attempt.reset"]
    assert events[2]["phase"] == "taken_over"
    assert "".join(e["delta"] for e in events[4:] if e["type"] == "answer.delta") == TEXT
    assert (events[-1]["status"], events[-1]["code"]) == ("completed", "completed")
    (read,) = loopback.requests  # read again, never asked anew: one generation in all
    assert read.method == "GET"
    assert read.path == f"/v1/responses/{RESPONSE_ID}?stream=true"
