"""Live readers on the server that drives a run, with the run log on a real `redis-server`: every
run kind (a turn, a chain, an agent) reaches them whole, through `answer.done` and `run.done`.

The hub that appends a run feeds its own readers from its appends (no read of Redis for them),
so a run whose last appends were cut short on the producing side would leave exactly these
readers waiting while Redis, and every other server's readers, had it all.
"""

from __future__ import annotations

import contextlib
import functools
import json
import secrets
from typing import TYPE_CHECKING, Any

import httpx
import pytest
import trio
from rillet._agent._demo_tools import demo_tools
from rillet._agent._loop import run_agent
from rillet._core._errors import AppendConflict
from rillet._core._request import TurnRequest, user
from rillet._core._runevents import RunDone, RunEvent, decode_run_event
from rillet._hub._redis import open_redis_hub
from rillet._turn._api import run_turn
from rillet.transports import SSEDecoder
from rillet.transports.server import ServerConfig, serve
from rillet.transports.testing import open_loopback_provider, status_reply

from ..cli.test_cli_agents import tool_then_answer
from ..server_support import POLICY, chat_provider, kind, text_reply
from .test_redis_hub import (
    deltas,
    done,
    new_run,
    read_to_end,
    redis_server,  # noqa: F401 - the session fixture
    redis_url,  # noqa: F401 - its URL
)

if TYPE_CHECKING:
    from .test_redis_hub import RedisServer

pytestmark = pytest.mark.slow


def _whole(events: list[RunEvent]) -> None:
    """Gapless from seq 1, one `answer.done`, and `run.done` completed last."""
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    kinds = [kind(e) for e in events]
    assert kinds.count("answer.done") == 1, kinds
    assert kinds[-2:] == ["answer.done", "run.done"], kinds
    end = events[-1]
    assert isinstance(end, RunDone)
    assert end.status == "completed", end


async def _read_live(client: httpx.AsyncClient, path: str) -> list[RunEvent]:
    """The run's events over SSE until `run.done` (the test's deadline bounds the wait)."""
    decoder = SSEDecoder()
    got: list[RunEvent] = []
    async with client.stream("GET", path) as response:
        assert response.status_code == 200
        with trio.CancelScope() as cut:
            async for chunk in response.aiter_raw():
                for frame in decoder.feed(chunk):
                    got.append(decode_run_event(frame.data))
                    if type(got[-1]) is RunDone:
                        cut.cancel()
    return got


@pytest.mark.parametrize("run_kind", ["turn", "agent"])
async def test_a_reader_on_the_server_driving_the_run_gets_it_through_run_done(
    redis_server: RedisServer,  # noqa: F811
    run_kind: str,
) -> None:
    """A server on Redis (`--tools demo` for the agent): a reader that subscribes while the run
    goes, on that server, gets every event through `run.done`."""
    if run_kind == "agent":
        script: Any = tool_then_answer("get_weather", {"city": "Paris"}, delay=0.05)
    else:
        script = [text_reply(["one ", "two ", "three"], chunk_delay=0.05)]
    tools = "demo" if run_kind == "agent" else None
    async with open_loopback_provider(script) as loopback:
        config = ServerConfig(
            provider=chat_provider(loopback.url),
            port=0,
            redis_url=redis_server.url,
            tools=tools,
            policy=POLICY,
        )
        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                url = await nursery.start(functools.partial(serve, config))
                async with httpx.AsyncClient(base_url=url) as client:
                    run = (await client.post("/v1/runs", json={"prompt": "weather?"})).json()
                    path = f"/v1/runs/{run['run_id']}/events?token={run['token']}"
                    events = await _read_live(client, path)
                nursery.cancel_scope.cancel()
    _whole(events)
    if run_kind == "agent":
        assert "tool.completed" in [kind(e) for e in events]


@pytest.mark.parametrize("run_kind", ["turn", "chain", "agent"])
async def test_a_live_subscriber_on_the_producing_hub_gets_every_run_kind_whole(
    redis_server: RedisServer,  # noqa: F811
    run_kind: str,
) -> None:
    """Each run kind delivering into the Redis hub, followed live on that same hub: the
    subscription ends with the run's `run.done`, every event once, as Redis keeps them."""
    request = TurnRequest(messages=[user("weather?")])
    run_id = secrets.token_hex(12)
    if run_kind == "agent":
        script: Any = tool_then_answer("get_weather", {"city": "Paris"}, delay=0.02)
    elif run_kind == "chain":
        script = [status_reply(429), text_reply(["a ", "b ", "c"], chunk_delay=0.02)]
    else:
        script = [text_reply(["a ", "b ", "c"], chunk_delay=0.02)]
    async with (
        open_loopback_provider(script) as loopback,
        open_redis_hub(redis_server.url) as hub,
    ):
        provider = chat_provider(loopback.url)
        sink = await hub.open_run(run_id)
        options: dict[str, Any] = {"sinks": [sink], "run_id": run_id, "policy": POLICY}
        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                if run_kind == "agent":
                    start: Any = functools.partial(
                        run_agent, request, provider, tools=demo_tools(), **options
                    )
                elif run_kind == "chain":  # the first is rate-limited: the second answers
                    start = functools.partial(run_turn, request, [provider, provider], **options)
                else:
                    start = functools.partial(run_turn, request, provider, **options)
                handle = await nursery.start(lambda task_status: start(task_status=task_status))
                with await hub.follow(run_id) as sub:
                    entries = [entry async for entry in sub]
                assert (await handle.result()).ok
            kept = await hub.follow(run_id)  # what Redis holds, read after the end
            stored = [entry async for entry in kept]
    events = [entry.event for entry in entries]
    _whole(events)
    assert [e.data for e in entries] == [e.data for e in stored]
    if run_kind == "chain":
        assert len(loopback.requests) == 2
        assert json.loads(entries[-1].data)["status"] == "completed"


async def test_an_append_cut_short_leaves_the_producers_readers_reading_redis(
    redis_url: str,  # noqa: F811
) -> None:
    """An append cancelled midway on the producing hub (Redis may or may not have taken it):
    the subscribers that hub fed from its own appends read the stream from then on, so they
    get whatever lands there, through `run.done` (at once: not when the lease's renewal
    finds the run ended)."""
    run_id = new_run()
    with trio.fail_after(10):
        async with open_redis_hub(redis_url, lease=180.0, lease_interval=60.0) as a:
            await a.open_run(run_id)
            await a.append(run_id, deltas(run_id, 1, 2))
            sub = await a.follow(run_id)  # fed by a's own appends
            with trio.CancelScope() as cut:
                cut.cancel()
                await a.append(run_id, deltas(run_id, 3, 3))
            with contextlib.suppress(AppendConflict):  # written again, if it was not
                await a.append(run_id, deltas(run_id, 3, 3))
            await a.append(run_id, [done(run_id, 4)])
            entries = await read_to_end(sub)
    assert [e.seq for e in entries] == [1, 2, 3, 4]
