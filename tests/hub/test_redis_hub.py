"""The Redis run log: two hubs ("two servers") in one process sharing a real `redis-server`, and
two delivery servers sharing it end to end.

A session fixture starts `redis-server` on a free loopback port (no persistence, in a temporary
directory) and stops it after the run; where `redis-server` is not installed these tests are
skipped, saying so (`make deps` installs it). Tests that stop Redis mid-run start a second
`redis-server` of their own.
"""

from __future__ import annotations

import functools
import gc
import logging
import secrets
import shutil
import socket
import subprocess
import time
import warnings
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

import attrs
import coredis
import httpx
import pytest
import trio
from rillet._core._errors import (
    AppendConflict,
    CursorExpired,
    CursorInvalid,
    HubError,
    HubUnavailable,
    RunExists,
    SubscriberDropped,
    UnknownRun,
)
from rillet._core._events import encode_json
from rillet._core._request import TurnRequest, user
from rillet._core._runevents import AnswerDelta, RunDone, RunEvent
from rillet._hub._redis import RedisHub, RedisHubSink, open_redis_hub
from rillet._turn._api import run_turn
from rillet._turn._turn import SinkBatch, TurnResult
from rillet.transports.server import ServerConfig, serve
from rillet.transports.testing import open_loopback_provider

from ..server.test_server_ws import connect, receive_all
from ..server_support import POLICY, chat_provider, read_sse, text_reply, texts
from ..sinks_support import completed_done

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
    from pathlib import Path

    from rillet._hub._hub import Entry, Subscription

# coredis 6.9 leaves the memory streams of a connection attempt that failed unclosed: a
# ResourceWarning when they are collected, expected wherever Redis is down on purpose here.
_UNCLOSED = "ignore:Unclosed <MemoryObject:ResourceWarning"
pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings(_UNCLOSED)]


@pytest.fixture(autouse=True)
def _collect_failed_connections() -> Iterator[None]:
    """Collect what failed connection attempts left behind within this module's tests, so that
    no later test meets their warnings."""
    yield
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Unclosed <MemoryObject", ResourceWarning)
        gc.collect()


# --- a real redis-server --------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


@attrs.define
class RedisServer:
    """A `redis-server` process on a loopback port, without persistence."""

    process: subprocess.Popen[bytes]
    port: int

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @classmethod
    def start(cls, directory: Path) -> RedisServer:
        binary = shutil.which("redis-server")
        assert binary is not None
        port = _free_port()
        args = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
        args += ["--appendonly", "no", "--dir", str(directory), "--loglevel", "warning"]
        process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.2) as sock:
                    sock.sendall(b"PING\r\n")
                    if sock.recv(16).startswith(b"+PONG"):
                        break
            except OSError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                raise RuntimeError(f"redis-server did not start on port {port}")
            time.sleep(0.02)
        return cls(process, port)

    def kill(self) -> None:
        """Stop it at once (SIGKILL): an outage, not a shutdown."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=10)


@pytest.fixture(scope="session")
def redis_server(
    pytestconfig: pytest.Config, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RedisServer]:
    """One `redis-server` for the whole test run."""
    if shutil.which("redis-server") is None:
        reason = "redis-server is not installed (`make deps` installs it): Redis hub tests skipped"
        reporter = pytestconfig.pluginmanager.get_plugin("terminalreporter")
        capture = pytestconfig.pluginmanager.get_plugin("capturemanager")
        if reporter is not None and capture is not None:
            with capture.global_and_fixture_disabled():
                reporter.write_line(f"\n{reason}")
        pytest.skip(reason)
    server = RedisServer.start(tmp_path_factory.mktemp("redis"))
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    return redis_server.url


@pytest.fixture
def doomed_redis(tmp_path: Path, redis_server: RedisServer) -> Iterator[RedisServer]:
    """A `redis-server` of this test's own, to stop mid-run."""
    server = RedisServer.start(tmp_path)
    try:
        yield server
    finally:
        server.kill()


# --- helpers ------------------------------------------------------------------------------------


def new_run() -> str:
    return secrets.token_hex(12)


def deltas(run_id: str, first: int, last: int) -> list[RunEvent]:
    """`answer.delta` events with seqs `first`..`last`."""
    return [
        AnswerDelta(run_id=run_id, seq=n, elapsed_ms=n, delta=f"{n} ")
        for n in range(first, last + 1)
    ]


def done(run_id: str, seq: int) -> RunEvent:
    return completed_done(run_id, seq)


async def take(sub: Subscription, count: int) -> list[Entry]:
    """Exactly `count` entries from a subscription."""
    got: list[Entry] = []
    while len(got) < count:
        got += await sub.next_batch(limit=count - len(got))
    return got


async def read_to_end(sub: Subscription) -> list[Entry]:
    return [entry async for entry in sub]


async def eventually(check: Callable[[], Awaitable[bool]]) -> None:
    """Wait until `check()` holds, polling (the test's deadline bounds it)."""
    while True:
        if await check():
            return
        await trio.sleep(0.005)


@asynccontextmanager
async def two_hubs(url: str, **options: object) -> AsyncIterator[tuple[RedisHub, RedisHub]]:
    """Two hubs on one Redis, as two servers would have."""
    async with open_redis_hub(url, **options) as a, open_redis_hub(url, **options) as b:
        yield a, b


@asynccontextmanager
async def probe(url: str) -> AsyncIterator[coredis.Redis[bytes]]:
    """A plain client, to look at Redis from outside the hubs."""
    client: coredis.Redis[bytes] = coredis.Redis.from_url(url)
    async with client:
        yield client


async def clients(client: coredis.Redis[bytes]) -> tuple[int, int]:
    """Redis's connected and blocked clients."""
    info = await client.info("clients")
    return int(str(info["connected_clients"])), int(str(info["blocked_clients"]))


# --- two hubs, one Redis --------------------------------------------------------------------------


async def test_a_subscriber_on_the_other_hub_sees_every_event_in_order_and_resumes_once(
    redis_url: str,
) -> None:
    run_id = new_run()
    events = [*deltas(run_id, 1, 40), done(run_id, 41)]
    with trio.fail_after(10):
        async with two_hubs(redis_url) as (a, b):
            sink = await a.open_run(run_id)
            first = await b.follow(run_id)
            watcher = await b.follow(run_id)

            async def produce() -> None:
                for i in range(0, len(events), 4):
                    await sink.deliver(SinkBatch(events[i : i + 4], ()))
                    await trio.sleep(0.005)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(produce)
                before = await take(first, 13)
                first.close()  # the client goes away from B...
                resumed = await a.follow(run_id, before[-1].seq)  # ...and resumes on A
                after = await read_to_end(resumed)
                seen = await read_to_end(watcher)
            stats = b.statistics()
    assert [e.seq for e in before + after] == list(range(1, 42))  # the union, exactly once
    assert [e.data for e in before + after] == [encode_json(e) for e in events]
    assert [e.data for e in seen] == [encode_json(e) for e in events]
    assert [e.event for e in seen] == events
    assert sink.failed is None
    assert stats["delivered"] == 41  # B read each event from Redis once, for both subscribers


async def test_new_entries_wake_one_parked_subscriber_which_pushes_to_the_others(
    redis_url: str,
) -> None:
    run_id = new_run()
    pushed: dict[int, list[int]] = {0: [], 1: [], 2: []}
    returned: dict[int, list[int]] = {}

    def writer(n: int) -> Callable[[list[Entry]], bool]:
        def push(batch: list[Entry]) -> bool:
            pushed[n].extend(e.seq for e in batch)
            return True

        return push

    async def reader(n: int, sub: Subscription) -> None:
        returned[n] = [e.seq for e in await sub.next_batch()]

    with trio.fail_after(10):
        async with two_hubs(redis_url) as (a, b):
            await a.create(run_id)
            await a.append(run_id, deltas(run_id, 1, 1))
            subs = [await b.follow(run_id, 1) for _ in range(3)]
            async with trio.open_nursery() as nursery:
                for n, sub in enumerate(subs):
                    sub.push = writer(n)
                    nursery.start_soon(reader, n, sub)
                tail = b._tails[run_id]
                await eventually(lambda: _true(len(tail.parked) == 3))
                await a.append(run_id, deltas(run_id, 2, 4))  # one Lua call: one XREAD reply
                await eventually(lambda: _true(len(returned) == 1 and len(tail.parked) == 2))
                waiting = set(tail.parked)  # the two written to wait on, never woken
                nursery.cancel_scope.cancel()
    (leader,) = returned
    assert returned[leader] == [2, 3, 4]  # the leader read them itself
    others = [n for n in pushed if n != leader]
    assert [pushed[n] for n in others] == [[2, 3, 4], [2, 3, 4]]  # the others were written to
    assert pushed[leader] == []
    assert waiting == {subs[n] for n in others}
    assert [subs[n].cursor for n in range(3)] == [4, 4, 4]


async def test_a_failed_tail_wakes_every_parked_subscriber_with_the_reason(redis_url: str) -> None:
    run_id = new_run()
    reasons: list[str] = []

    async def reader(sub: Subscription) -> None:
        with pytest.raises(SubscriberDropped) as dropped:
            await sub.next_batch()
        reasons.append(dropped.value.reason)

    with trio.fail_after(10):
        async with two_hubs(redis_url) as (a, b):
            await a.create(run_id)
            await a.append(run_id, deltas(run_id, 1, 1))
            subs = [await b.follow(run_id, 1) for _ in range(3)]  # no push writer, no scope
            async with trio.open_nursery() as nursery:
                for sub in subs:
                    nursery.start_soon(reader, sub)
                tail = b._tails[run_id]
                await eventually(lambda: _true(len(tail.parked) == 3))
                tail.fail("log_unavailable")
    assert reasons == ["log_unavailable"] * 3


async def _true(value: bool) -> bool:
    await trio.lowlevel.checkpoint()
    return value


async def test_a_second_producer_for_a_run_is_refused_and_the_log_keeps_the_first(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    run_id = new_run()
    with trio.fail_after(10):
        async with two_hubs(redis_url) as (a, b):
            await a.create(run_id)
            with pytest.raises(RunExists):
                await b.create(run_id)
            await a.append(run_id, deltas(run_id, 1, 3))
            with pytest.raises(AppendConflict) as duplicate:
                await b.append(run_id, deltas(run_id, 3, 4))
            with pytest.raises(AppendConflict):
                await b.append(run_id, deltas(run_id, 2, 2))  # out of order
            with pytest.raises(AppendConflict):  # next in line, but not b's run: fenced off
                await b.append(run_id, deltas(run_id, 4, 4))
            with pytest.raises(HubError, match="expected seq 4, got 6") as gap:
                await a.append(run_id, deltas(run_id, 6, 6))
            sink = RedisHubSink(b, run_id)
            with caplog.at_level(logging.ERROR, logger="rillet._hub._redis"):
                await sink.deliver(SinkBatch(deltas(run_id, 3, 3), ()))  # logged, not raised
            reader = await b.follow(run_id)
            kept = await take(reader, 3)
            reader.close()
    assert (duplicate.value.run_id, duplicate.value.seq) == (run_id, 3)
    assert not isinstance(gap.value, AppendConflict)
    assert isinstance(sink.failed, AppendConflict)
    assert "second producer" in caplog.text
    assert [e.data for e in kept] == [encode_json(e) for e in deltas(run_id, 1, 3)]


async def test_the_stream_is_trimmed_and_a_cursor_below_it_expires(redis_url: str) -> None:
    run_id = new_run()
    with trio.fail_after(10):
        async with open_redis_hub(redis_url, max_events=100, window=64) as hub:
            await hub.create(run_id)
            for first in range(1, 2001, 50):
                await hub.append(run_id, deltas(run_id, first, first + 49))
            with pytest.raises(CursorExpired) as expired:
                await hub.follow(run_id, 0)
            first_kept = expired.value.first_kept
            with pytest.raises(CursorInvalid):
                await hub.follow(run_id, 2001)
            sub = await hub.follow(run_id, first_kept - 1)
            caught_up = await take(sub, 2000 - first_kept + 1)
            lagging = await hub.follow(run_id, 2000, buffer=10**6)
            for first in range(2001, 4001, 50):  # trimmed past the lagging cursor meanwhile
                await hub.append(run_id, deltas(run_id, first, first + 49))
            with pytest.raises(CursorExpired) as behind:
                await lagging.next_batch()
            sub.close()
            lagging.close()
    assert 1 < first_kept <= 2000 - 100 + 1  # MAXLEN ~ keeps at least max_events
    assert [e.seq for e in caught_up] == list(range(first_kept, 2001))
    assert behind.value.first_kept > 2001


async def test_a_done_run_is_kept_for_its_retention_then_forgotten(redis_url: str) -> None:
    run_id = new_run()
    with trio.fail_after(10):
        async with (
            two_hubs(redis_url, retention=0.5, open_ttl=60) as (a, b),
            probe(redis_url) as raw,
        ):
            await a.create(run_id, access=b"digest")
            await a.append(run_id, deltas(run_id, 1, 3))
            open_ttl = await raw.pttl(f"rillet:{{{run_id}}}:log")
            await a.append(run_id, [done(run_id, 4)])
            done_ttl = await raw.pttl(f"rillet:{{{run_id}}}:log")
            replay = await read_to_end(await b.follow(run_id, 1))
            before = (await b.kept([run_id]), await b.access(run_id))
            await trio.sleep(0.8)
            with pytest.raises(UnknownRun):
                await b.follow(run_id)
            after = (await b.kept([run_id]), await b.access(run_id))
    assert 50_000 < open_ttl <= 60_000
    assert 0 < done_ttl <= 500
    assert [e.seq for e in replay] == [2, 3, 4]
    assert before == ({run_id}, b"digest")
    assert after == (set(), None)


async def test_a_subscriber_past_its_buffer_is_dropped_and_resumes_on_the_other_hub(
    redis_url: str,
) -> None:
    run_id = new_run()
    with trio.fail_after(10):
        async with two_hubs(redis_url) as (a, b):
            await a.create(run_id)
            slow = await b.follow(run_id, buffer=5)
            await a.append(run_id, deltas(run_id, 1, 20))

            async def dropped_yet() -> bool:  # B's tail drops it as the events arrive
                return slow.drop_reason is not None

            await eventually(dropped_yet)
            with pytest.raises(SubscriberDropped) as dropped:
                await slow.next_batch()
            slow.close()
            resumed = await a.follow(run_id, dropped.value.last_seq)
            await a.append(run_id, [done(run_id, 21)])
            rest = await read_to_end(resumed)
    assert dropped.value.reason == "fell_behind"
    assert slow.cancel_scope.cancel_called  # a transport writing to it is woken
    assert [e.seq for e in rest] == list(range(1, 22))


async def test_cancelling_a_blocked_tail_leaves_the_connection_pool_usable(redis_url: str) -> None:
    run_id = new_run()
    with trio.fail_after(20):
        async with (
            two_hubs(redis_url, max_connections=2, block=30.0) as (a, b),
            probe(redis_url) as raw,
        ):
            await a.create(run_id)
            await a.append(run_id, deltas(run_id, 1, 1))
            before = await clients(raw)

            async def tail_blocked() -> bool:
                return (await clients(raw))[1] > before[1]

            async def tail_gone() -> bool:
                return await clients(raw) == before

            for _ in range(12):  # more than the pool holds
                sub = await b.follow(run_id, 1)
                await eventually(tail_blocked)  # B's tail waits in XREAD BLOCK
                with trio.move_on_after(0.01):
                    await sub.next_batch()  # a read given up while it waits
                sub.close()  # the last subscriber: the blocked XREAD is cancelled
                await eventually(tail_gone)  # and its connection closed
            with trio.fail_after(2):
                sub = await b.follow(run_id)
                await a.append(run_id, [*deltas(run_id, 2, 3), done(run_id, 4)])
                got = await read_to_end(sub)
                sub.close()
            stats = b.statistics()
    assert [e.seq for e in got] == [1, 2, 3, 4]
    assert stats["runs"] == 0  # no tail left behind


async def test_redis_stopped_mid_turn_fails_delivery_loudly_yet_the_turn_returns_its_result(
    doomed_redis: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    words = [f"{n} " for n in range(80)]
    run_id = new_run()
    results: list[TurnResult] = []
    with trio.fail_after(15):
        async with (
            open_loopback_provider([text_reply(words, chunk_delay=0.01)]) as loopback,
            two_hubs(doomed_redis.url, timeout=1.0) as (a, b),
        ):
            sink = await a.open_run(run_id)
            remote, local = await b.follow(run_id), await a.follow(run_id)
            request = TurnRequest(messages=[user("Hi")])

            async def turn() -> None:
                result = await run_turn(
                    request, chat_provider(loopback.url), sinks=[sink], policy=POLICY, run_id=run_id
                )
                results.append(result)

            with caplog.at_level(logging.ERROR, logger="rillet._hub._redis"):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(turn)
                    await take(remote, 5)
                    doomed_redis.kill()
                with pytest.raises(SubscriberDropped) as remote_dropped:
                    await read_to_end(remote)
                with pytest.raises(SubscriberDropped) as local_dropped:
                    await read_to_end(local)
                with pytest.raises(HubUnavailable):
                    await a.open_run(new_run())  # new runs are refused
                with pytest.raises(HubUnavailable):
                    await b.follow(run_id)
            remote.close()
            local.close()
    logged = caplog.text
    caplog.clear()  # its records hold tracebacks of the failed connections: let them go now
    [result] = results
    assert result.ok
    assert result.text == "".join(words)
    assert isinstance(sink.failed, HubUnavailable)
    assert f"run {run_id}: its events can no longer be delivered" in logged
    assert remote_dropped.value.reason == local_dropped.value.reason == "log_unavailable"


async def test_a_hub_on_an_unreachable_redis_refuses_to_open() -> None:
    url = f"redis://:secret-password@127.0.0.1:{_free_port()}/0"
    with trio.fail_after(10), pytest.raises(HubUnavailable, match="unavailable") as refused:
        async with open_redis_hub(url, timeout=2.0):
            pass
    assert "secret-password" not in str(refused.value)


# --- two delivery servers, one Redis --------------------------------------------------------------


@asynccontextmanager
async def two_servers(
    redis: str, words: list[str], *, chunk_delay: float
) -> AsyncIterator[tuple[httpx.AsyncClient, httpx.AsyncClient]]:
    """Two rillet servers sharing `redis`, in front of one loopback provider; a client for each."""
    script = [text_reply(words, chunk_delay=chunk_delay)] * 4
    async with open_loopback_provider(script) as loopback:
        config = ServerConfig(
            provider=chat_provider(loopback.url), port=0, policy=POLICY, redis_url=redis
        )
        async with trio.open_nursery() as nursery:
            url1: str = await nursery.start(functools.partial(serve, config))
            url2: str = await nursery.start(functools.partial(serve, config))
            async with (
                httpx.AsyncClient(base_url=url1, timeout=None) as one,
                httpx.AsyncClient(base_url=url2, timeout=None) as two,
            ):
                yield one, two
            nursery.cancel_scope.cancel()


async def test_a_run_started_on_one_server_streams_over_sse_from_the_other(redis_url: str) -> None:
    words = [f"w{n} " for n in range(40)]
    with trio.fail_after(15):
        async with two_servers(redis_url, words, chunk_delay=0.005) as (one, two):
            started = await one.post("/v1/runs", json={"prompt": "Hi"})
            run = started.json()
            path = f"/v1/runs/{run['run_id']}/events?token={run['token']}"
            part = await read_sse(two, path, limit=6)
            rest = await read_sse(two, path, headers={"last-event-id": part.events[-1].id})
            whole = await read_sse(one, path)
            wrong = await two.get(f"/v1/runs/{run['run_id']}/events?token=not-the-token")
            ws_base = "ws" + str(two.base_url).removeprefix("http").rstrip("/")
            async with connect(f"{ws_base}/v1/runs/{run['run_id']}/ws?token={run['token']}") as ws:
                received = await receive_all(ws)
            cancel = await two.delete(
                f"/v1/runs/{run['run_id']}", headers={"authorization": f"Bearer {run['act_token']}"}
            )
    assert started.status_code == 201
    assert part.seqs + rest.seqs == whole.seqs == list(range(1, len(whole.seqs) + 1))
    assert [e.data for e in part.events + rest.events] == [e.data for e in whole.events]
    assert rest.events[0].id == f"{run['run_id']}:{part.seqs[-1] + 1}"
    assert isinstance(whole.run_events[-1], RunDone)
    assert texts(whole.run_events) == "".join(words)
    assert wrong.status_code == 404
    assert [m.encode() for m in received.messages] == [e.data.encode() for e in whole.events]
    assert (received.code, received.reason) == (1000, "done")
    # handed to the server that ran it, over the control channel (done: nothing to cancel)
    assert (cancel.status_code, cancel.json()) == (202, {"run_id": run["run_id"]})


async def test_a_server_with_an_unreachable_redis_refuses_to_start() -> None:
    url = f"redis://127.0.0.1:{_free_port()}/0"
    config = ServerConfig(provider=chat_provider("http://127.0.0.1:9"), port=0, redis_url=url)
    with trio.fail_after(10), pytest.raises(HubUnavailable, match=url.removesuffix("/0")):
        await serve(config)


async def test_a_redis_outage_closes_subscribers_with_a_reason_and_refuses_new_runs(
    doomed_redis: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    words = [f"{n} " for n in range(200)]
    with trio.fail_after(15):
        async with two_servers(doomed_redis.url, words, chunk_delay=0.01) as (one, two):
            run = (await one.post("/v1/runs", json={"prompt": "Hi"})).json()
            ws_base = "ws" + str(two.base_url).removeprefix("http").rstrip("/")
            async with connect(f"{ws_base}/v1/runs/{run['run_id']}/ws?token={run['token']}") as ws:
                first = await ws.get_message()
                doomed_redis.kill()
                received = await receive_all(ws)
            refused = await one.post("/v1/runs", json={"prompt": "Hi"})
            events = await two.get(f"/v1/runs/{run['run_id']}/events?token={run['token']}")

            async def turn_over() -> bool:  # the turn runs to its end all the same
                metrics: dict[str, int] = (await one.get("/metrics.json")).json()
                return metrics["runs_active"] == 0

            await eventually(turn_over)
    server_log = [r.getMessage() for r in caplog.records if r.name == "rillet.transports.server"]
    caplog.clear()  # its records hold tracebacks of the failed connections: let them go now
    assert first
    assert (received.code, received.reason) == (1013, "log_unavailable")
    assert refused.status_code == 503
    assert refused.json()["error"]["type"] == "log_unavailable"
    assert events.status_code == 503
    assert not [message for message in server_log if "failed" in message]  # no run crashed
