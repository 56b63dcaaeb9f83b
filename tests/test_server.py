"""The delivery server over HTTP: runs, SSE fan-out and resume, limits and refusals.

A real server on 127.0.0.1 (port 0) in the test's nursery, the loopback provider behind it, and
real clients: httpx, or a raw socket where the bytes themselves are the point. The helpers here
are shared with the WebSocket and MMSP tests.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import re
import socket
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import attrs
import httpx
import msgspec
import pytest
import trio
import trio.testing
from rillet._hub import Hub, HubSink, MemoryRunLog
from rillet._policy import Policy
from rillet._runevents import (
    AnswerDelta,
    AnswerDone,
    AttemptResetEvent,
    RunDone,
    RunEvent,
    decode_run_event,
)
from rillet.frames import SSEDecoder, SSEEvent
from rillet.providers._base import Provider, Secret
from rillet.providers._openai_chat import OpenAIChatDialect
from rillet.transports.server import Limits, ServerConfig, ServerConfigError, serve
from rillet.transports.testing import (
    LoopbackProvider,
    Reply,
    Script,
    open_loopback_provider,
    openai_text_stream,
    split,
    status_reply,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Sequence

    from rillet._turn import SinkBatch

POLICY = Policy(backoff_base=0.01, random=lambda: 0.0)
WORDS = ["Hello", ", ", "world", "!"]
PROVIDER_KEY = "sk-provider-secret-0123456789abcdef"
_RCVBUF = (socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)  # a client that backs up quickly


# --- helpers (shared with test_server_ws and test_server_mmsp) -----------------------------------


def chat_provider(url: str, *, api_key: str | None = None) -> Provider:
    """An OpenAI Chat Completions provider on the loopback server."""
    return Provider(
        dialect=OpenAIChatDialect(),
        base_url=f"{url}/v1",
        model="gpt-4o-mini",
        api_key=Secret(api_key) if api_key else None,
    )


def text_reply(words: Sequence[str] = WORDS, *, per_chunk: int = 1, **fields: Any) -> Reply:
    """A complete text stream, `per_chunk` SSE frames per chunk."""
    stream = openai_text_stream(list(words))
    frames = [frame + b"\n\n" for frame in stream.split(b"\n\n") if frame]
    chunks = tuple(b"".join(frames[i : i + per_chunk]) for i in range(0, len(frames), per_chunk))
    return Reply(chunks=chunks, **fields)


def dropped_then_ok(words: Sequence[str], kept: int) -> list[Reply]:
    """A stream that breaks after `kept` text fragments, then a whole one: a retry with a
    reset."""
    stream = openai_text_stream(list(words))
    frames = stream.split(b"\n\n")
    cut = len(b"\n\n".join(frames[: 1 + kept])) + 2
    return [Reply(chunks=(stream,), drop_after_bytes=cut), text_reply(words)]


@attrs.define
class Served:
    """A running server and what it runs on."""

    url: str
    loopback: LoopbackProvider
    hub: Hub
    client: httpx.AsyncClient

    @property
    def ws_base(self) -> str:
        return "ws" + self.url.removeprefix("http")

    async def start(self, prompt: str = "Hi", **fields: Any) -> dict[str, str]:
        """Start a run; its `{"run_id", "token", ...}`."""
        reply = await self.client.post("/v1/runs", json={"prompt": prompt, **fields})
        assert reply.status_code == 201, reply.text
        answer: dict[str, str] = reply.json()
        return answer

    def log(self, run_id: str) -> list[bytes]:
        """The run's log as the hub keeps it: every entry's JSON."""
        return [entry.data for entry in self.hub.log.get(run_id).entries]

    async def wait_for(self, run_id: str, seq: int | None = None) -> None:
        """Wait until the run's log holds `seq` (None: its `run.done`), following the hub."""
        head = self.hub.log.get(run_id).last_seq
        with self.hub.subscribe(run_id, head) as sub:  # from the head: trimming cannot bite
            if head == seq:
                return
            async for entry in sub:
                if entry.seq == seq:
                    return


@asynccontextmanager
async def serving(
    script: Script | None = None,
    *,
    hub: Hub | None = None,
    client_options: dict[str, Any] | None = None,
    provider_key: str | None = None,
    **config: Any,
) -> AsyncIterator[Served]:
    """The loopback provider playing `script`, and the server in front of it."""
    hub = hub or Hub()
    async with open_loopback_provider(script or [text_reply()]) as loopback:
        config.setdefault("provider", chat_provider(loopback.url, api_key=provider_key))
        config.setdefault("policy", POLICY)
        server = ServerConfig(port=0, **config)
        async with trio.open_nursery() as nursery:
            url: str = await nursery.start(
                lambda task_status: serve(server, hub=hub, task_status=task_status)
            )
            options = {"timeout": None, **(client_options or {})}  # each test has its deadline
            async with httpx.AsyncClient(base_url=url, **options) as client:
                yield Served(url, loopback, hub, client)
            nursery.cancel_scope.cancel()


@attrs.define
class Stream:
    """What an SSE client read."""

    status: int
    headers: httpx.Headers
    events: list[SSEEvent]
    comments: int
    clean_end: bool  # the body ended properly (not cut, not reset)

    @property
    def run_events(self) -> list[RunEvent]:
        return [decode_run_event(event.data) for event in self.events]

    @property
    def seqs(self) -> list[int]:
        return [event.seq for event in self.run_events]


async def read_sse(
    client: httpx.AsyncClient,
    url: str,
    *,
    headers: dict[str, str] | None = None,
    limit: int | None = None,
) -> Stream:
    """Read an SSE response to its end, or stop (closing it) after `limit` events."""
    decoder = SSEDecoder()
    events: list[SSEEvent] = []
    clean = False
    async with client.stream("GET", url, headers=headers) as response:
        if response.status_code != 200:
            await response.aread()
            return Stream(response.status_code, response.headers, [], 0, True)
        # Stopping early cancels the read instead of breaking out of it: the body's generators
        # then finish rather than being left suspended.
        with trio.CancelScope() as cut:
            try:
                async for chunk in response.aiter_raw():
                    events += decoder.feed(chunk)
                    if limit is not None and len(events) >= limit:
                        del events[limit:]
                        cut.cancel()
                clean = True
            except httpx.RemoteProtocolError:
                pass
    return Stream(response.status_code, response.headers, events, decoder.comments, clean)


def kind(event: RunEvent) -> str:
    """A run event's `type`."""
    return str(type(event).__struct_config__.tag)


def texts(events: Sequence[RunEvent]) -> str:
    """The answer text rebuilt as a client must: append deltas, clear on a reset."""
    text = ""
    for event in events:
        if isinstance(event, AttemptResetEvent):
            text = ""
        elif isinstance(event, AnswerDelta):
            text += event.delta
    return text


async def raw_exchange(url: str, request: bytes, *, until_close: bool = True) -> bytes:
    """Send raw bytes, read until the server closes the connection."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    stream = await trio.open_tcp_stream(host, int(port))
    async with stream:
        await stream.send_all(request)
        received = bytearray()
        while data := await stream.receive_some(65536):
            received += data
            if not until_close:
                break
    return bytes(received)


# --- SSE delivery ---------------------------------------------------------------------------------


async def test_sse_delivers_every_event_in_order_with_run_scoped_ids() -> None:
    with trio.fail_after(5):
        async with serving() as served:
            run = await served.start()
            stream = await read_sse(served.client, run["events_url"])
            log = served.log(run["run_id"])
    assert stream.status == 200
    assert stream.headers["content-type"].startswith("text/event-stream")
    assert stream.headers["cache-control"] == "no-cache, no-transform"
    assert stream.headers["x-accel-buffering"] == "no"
    assert stream.clean_end
    events = stream.run_events
    assert stream.seqs == list(range(1, len(events) + 1))
    assert isinstance(events[-1], RunDone)
    assert events[-1].status == "completed"
    assert sum(isinstance(e, RunDone) for e in events) == 1
    assert texts(events) == "".join(WORDS)
    assert [e.id for e in stream.events] == [f"{run['run_id']}:{n}" for n in stream.seqs]
    # the data is the hub's pre-encoded JSON, byte for byte
    assert [e.data.encode() for e in stream.events] == log


@pytest.mark.parametrize("how", ["last-event-id", "after"])
async def test_resume_after_a_cut_at_every_point_gets_each_event_once(how: str) -> None:
    with trio.fail_after(10):
        async with serving() as served:
            run = await served.start()
            await served.wait_for(run["run_id"])
            log = served.log(run["run_id"])
            for k in range(len(log) + 1):
                first = await read_sse(served.client, run["events_url"], limit=k)
                assert len(first.events) == k
                url, headers = run["events_url"], {}
                if k and how == "last-event-id":
                    headers["last-event-id"] = first.events[-1].id
                elif k:
                    url += f"&after={first.seqs[-1]}"
                rest = await read_sse(served.client, url, headers=headers)
                if k == len(log):  # nothing left: an EventSource is told to stop
                    assert rest.status == 204
                got = [e.data.encode() for e in first.events + rest.events]
                assert got == log, k


async def test_resume_of_a_live_run_cut_mid_stream_is_exact() -> None:
    words = [f"w{n} " for n in range(40)]
    script = [text_reply(words, chunk_delay=0.005)]
    with trio.fail_after(10):
        async with serving(script) as served:
            for k in (1, 5, 17):
                run = await served.start()
                first = await read_sse(served.client, run["events_url"], limit=k)
                assert not served.hub.log.get(run["run_id"]).done  # cut while it streams
                rest = await read_sse(
                    served.client,
                    run["events_url"],
                    headers={"last-event-id": first.events[-1].id},
                )
                events = first.run_events + rest.run_events
                assert [e.seq for e in events] == list(range(1, len(events) + 1))
                assert isinstance(events[-1], RunDone)
                assert texts(events) == "".join(words)


async def test_a_late_joiner_without_cursor_starts_at_seq_1_then_follows_live() -> None:
    words = [f"{n}," for n in range(60)]
    with trio.fail_after(10):
        async with serving([text_reply(words, chunk_delay=0.003)]) as served:
            run = await served.start()
            await served.wait_for(run["run_id"], 20)
            stream = await read_sse(served.client, run["events_url"])
    assert stream.seqs[0] == 1
    assert stream.seqs == list(range(1, len(stream.seqs) + 1))
    assert texts(stream.run_events) == "".join(words)


async def test_a_slow_subscriber_is_dropped_and_resumes_while_a_fast_one_gets_everything() -> None:
    words = ["x" * 2000 for _ in range(200)]
    script = [text_reply(words, headers_delay=0.2)]
    small = {"transport": httpx.AsyncHTTPTransport(socket_options=[_RCVBUF])}
    with trio.fail_after(10):
        async with serving(
            script,
            hub=Hub(buffer=64),
            limits=Limits(send_buffer=4096),
            client_options=small,
        ) as served:
            run = await served.start()
            fast_done = trio.Event()
            fast: list[Stream] = []

            async def read_fast() -> None:
                async with httpx.AsyncClient() as other:
                    fast.append(await read_sse(other, run["events_url"]))
                fast_done.set()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(read_fast)
                async with served.client.stream("GET", run["events_url"]) as response:
                    decoder = SSEDecoder()
                    slow: list[SSEEvent] = []
                    async for chunk in response.aiter_raw():
                        slow += decoder.feed(chunk)
                        if not fast_done.is_set():
                            await fast_done.wait()  # stop reading until the run is over
            metrics = (await served.client.get("/metrics.json")).json()
            async with httpx.AsyncClient() as other:
                resumed = await read_sse(
                    other, run["events_url"], headers={"last-event-id": slow[-1].id}
                )
            log = served.log(run["run_id"])
    assert [e.data.encode() for e in fast[0].events] == log  # the fast one got everything
    assert not any(isinstance(decode_run_event(e.data), RunDone) for e in slow)  # cut short
    assert metrics["subscribers_dropped"] == 1
    assert [e.data.encode() for e in slow + resumed.events] == log  # each once, in order


async def test_heartbeat_comments_while_the_run_is_silent(
    mock_clock: trio.testing.MockClock,
) -> None:
    mock_clock.autojump_threshold = 0.02
    stream = openai_text_stream(["Hel", "lo"])
    script = [Reply(chunks=split(stream, len(stream) // 3 + 1), stall_after=1)]
    comments_at: list[float] = []
    events: list[SSEEvent] = []
    with trio.fail_after(120):
        async with serving(script) as served:
            run = await served.start()
            decoder = SSEDecoder()
            with trio.move_on_after(40):
                async with served.client.stream("GET", run["events_url"]) as response:
                    async for chunk in response.aiter_raw():
                        before = decoder.comments
                        events += decoder.feed(chunk)
                        comments_at += [trio.current_time()] * (decoder.comments - before)
            last = decoder.last_event_id
    assert events  # the run said something before going silent
    assert last == events[-1].id  # comments carry no id
    assert len(comments_at) == 2
    assert comments_at[0] == pytest.approx(15, abs=0.5)
    assert comments_at[1] == pytest.approx(30, abs=0.5)


async def test_a_reset_reaches_subscribers_and_the_text_is_rebuilt_once() -> None:
    words = ["one ", "two ", "three ", "four"]
    with trio.fail_after(5):
        async with serving(dropped_then_ok(words, 2)) as served:
            run = await served.start()
            stream = await read_sse(served.client, run["events_url"])
    events = stream.run_events
    kinds = [kind(e) for e in events]
    assert kinds.count("attempt.reset") == 1
    assert kinds.index("attempt.reset") > kinds.index("answer.delta")
    assert texts(events) == "".join(words)
    assert isinstance(events[-2], AnswerDone)
    assert events[-1].status == "completed"  # type: ignore[union-attr]


# --- cursors --------------------------------------------------------------------------------------


@pytest.mark.parametrize("cursor", ["x", "-1", "1.5", "99", "0123456789abcdef01234567:2"])
async def test_bad_cursors_are_refused_with_400_and_no_event(cursor: str) -> None:
    with trio.fail_after(5):
        async with serving() as served:
            run = await served.start()
            await served.wait_for(run["run_id"])
            by_header = await read_sse(
                served.client, run["events_url"], headers={"last-event-id": cursor}
            )
            by_query = await served.client.get(run["events_url"] + f"&after={cursor}")
    assert by_header.status == 400
    assert not by_header.events
    assert by_query.status_code == 400
    assert by_query.json()["error"]["type"] == "cursor_invalid"


async def test_a_cursor_below_the_kept_log_is_410_cursor_expired() -> None:
    words = [f"{n} " for n in range(40)]
    hub = Hub(log=MemoryRunLog(max_events=16))
    with trio.fail_after(5):
        async with serving([text_reply(words)], hub=hub) as served:
            run = await served.start()
            await served.wait_for(run["run_id"])
            expired = await served.client.get(run["events_url"] + "&after=1")
            joined = await served.client.get(run["events_url"])
            first_kept = hub.log.get(run["run_id"]).base
    assert expired.status_code == 410
    assert expired.json()["error"]["type"] == "cursor_expired"
    assert expired.json()["error"]["first_kept"] == first_kept
    assert joined.status_code == 410  # joining from seq 1 would leave a gap too


async def test_resume_after_run_done_replays_within_retention_then_404() -> None:
    hub = Hub(log=MemoryRunLog(retention=0.3))
    with trio.fail_after(5):
        async with serving(hub=hub) as served:
            run = await served.start()
            await served.wait_for(run["run_id"])
            replay = await read_sse(served.client, run["events_url"] + "&after=2")
            await trio.sleep(0.4)
            later = await served.client.get(run["events_url"])
    assert replay.seqs[0] == 3
    assert isinstance(replay.run_events[-1], RunDone)
    assert replay.clean_end
    assert later.status_code == 404


# --- who may read and start -----------------------------------------------------------------------


async def test_another_runs_token_and_an_unknown_run_get_the_same_bytes() -> None:
    head = "GET {} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    with trio.fail_after(5):
        async with serving() as served:
            mine, other = await served.start(), await served.start()
            wrong = f"/v1/runs/{mine['run_id']}/events?token={other['token']}"
            unknown = f"/v1/runs/{'ab' * 12}/events?token={other['token']}"
            nothing = f"/v1/runs/{mine['run_id']}/events"
            answers = [
                await raw_exchange(served.url, head.format(target).encode())
                for target in (wrong, unknown, nothing)
            ]
            bearer = await served.client.get(
                f"/v1/runs/{mine['run_id']}/events",
                headers={"authorization": f"Bearer {other['token']}"},
            )
    assert answers[0].startswith(b"HTTP/1.1 404 ")
    assert answers[0] == answers[1] == answers[2]
    assert bearer.status_code == 404
    assert bearer.content == answers[0].split(b"\r\n\r\n", 1)[1]


async def test_a_client_that_sends_the_server_key_everywhere_reads_its_run_by_its_token() -> None:
    """`Authorization: Bearer <server key>` on every request, the run named by `?token=`."""
    key = "server-key-0123456789"
    with trio.fail_after(10):
        async with serving(api_key=Secret(key)) as served:
            auth = {"authorization": f"Bearer {key}"}
            started = await served.client.post("/v1/runs", json={"prompt": "Hi"}, headers=auth)
            run = started.json()
            events = await served.client.get(run["events_url"], headers=auth)
            wrong = await served.client.get(
                f"/v1/runs/{run['run_id']}/events?token={'x' * 43}", headers=auth
            )
    assert started.status_code == 201
    assert events.status_code == 200
    assert '"type":"run.done"' in events.text
    assert wrong.status_code == 404  # the server key is not a run's token


async def test_a_run_started_without_a_host_header_names_the_address_it_reached() -> None:
    """HTTP/1.0 may send no `Host`: the run's URLs name the address and port the client reached
    (the server listens on port 0, any), and they work."""
    body = b'{"prompt": "Hi"}'
    head = b"POST /v1/runs HTTP/1.0\r\nContent-Type: application/json\r\n"
    with trio.fail_after(10):
        async with serving() as served:
            raw = await raw_exchange(
                served.url, head + b"Content-Length: %d\r\n\r\n" % len(body) + body
            )
            answer = msgspec.json.decode(raw.split(b"\r\n\r\n", 1)[1])
            events = await served.client.get(answer["events_url"])
    assert raw.startswith(b"HTTP/1.1 201 ")
    assert answer["events_url"].startswith(served.url + "/v1/runs/")
    assert answer["ws_url"].startswith(served.url.replace("http", "ws", 1) + "/v1/runs/")
    assert events.status_code == 200
    assert '"type":"run.done"' in events.text


async def test_without_the_server_key_401_and_no_run_starts() -> None:
    key = "server-key-0123456789"
    with trio.fail_after(5):
        async with serving(api_key=Secret(key)) as served:
            missing = await served.client.post("/v1/runs", json={"prompt": "Hi"})
            wrong = await served.client.post(
                "/v1/runs", json={"prompt": "Hi"}, headers={"authorization": "Bearer nope"}
            )
            runs = served.hub.statistics()["runs"]
            requests = len(served.loopback.requests)
            right = await served.client.post(
                "/v1/runs", json={"prompt": "Hi"}, headers={"authorization": f"Bearer {key}"}
            )
    assert missing.status_code == wrong.status_code == 401
    assert missing.headers["www-authenticate"] == "Bearer"
    assert missing.json()["error"]["type"] == "unauthorized"
    assert runs == 0
    assert requests == 0
    assert right.status_code == 201


async def test_serving_off_loopback_without_a_key_is_refused_at_start() -> None:
    provider = chat_provider("http://127.0.0.1:9")
    with pytest.raises(ServerConfigError, match="server key"):
        await serve(ServerConfig(provider=provider, host="0.0.0.0", port=0))
    ServerConfig(provider=provider, host="0.0.0.0", api_key=Secret("k" * 16)).check()
    ServerConfig(provider=provider, host="::1").check()
    ServerConfig(provider=provider, host="localhost").check()


async def test_a_body_over_the_limit_is_413_and_starts_nothing() -> None:
    limits = Limits(max_body=1024)
    big = msgspec.json.encode({"prompt": "x" * 2000})
    head = (
        b"POST /v1/runs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n"
    )
    chunks = b"".join(b"%x\r\n%s\r\n" % (100, big[i : i + 100]) for i in range(0, 1500, 100))
    with trio.fail_after(5):
        async with serving(limits=limits) as served:
            declared = await served.client.post(
                "/v1/runs", content=big, headers={"content-type": "application/json"}
            )
            streamed = await raw_exchange(served.url, head + chunks)  # no end: cut off at 413
            runs = served.hub.statistics()["runs"]
    assert declared.status_code == 413
    assert declared.json()["error"]["type"] == "body_too_large"
    assert streamed.startswith(b"HTTP/1.1 413 ")
    assert b"connection: close" in streamed.lower()
    assert runs == 0


async def test_subscribers_over_the_per_run_and_per_client_limits_get_429() -> None:
    script = [text_reply(headers_delay=0.3)]
    with trio.fail_after(5):
        for limits in (
            Limits(max_subscribers_per_run=2),
            Limits(max_subscribers_per_client=2),
        ):
            async with serving(script, limits=limits) as served:
                run = await served.start()
                async with (
                    served.client.stream("GET", run["events_url"]) as one,
                    served.client.stream("GET", run["events_url"]) as two,
                ):
                    assert one.status_code == two.status_code == 200
                    third = await served.client.get(run["events_url"])
                assert third.status_code == 429
                assert third.json()["error"]["type"] == "too_many_subscribers"
                again = await read_sse(served.client, run["events_url"])  # freed on close
                assert again.status == 200


async def test_a_request_head_not_finished_in_time_is_closed(
    mock_clock: trio.testing.MockClock,
) -> None:
    mock_clock.autojump_threshold = 0.02
    with trio.fail_after(60):
        async with serving() as served:
            host, port = served.url.removeprefix("http://").rsplit(":", 1)
            stream = await trio.open_tcp_stream(host, int(port))
            start = trio.current_time()
            await stream.send_all(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
            assert await stream.receive_some(1024) == b""  # closed, no answer
            waited = trio.current_time() - start
            await stream.aclose()
            healthy = await served.client.get("/healthz")
    assert waited == pytest.approx(10, abs=0.5)
    assert healthy.status_code == 200


async def test_unknown_routes_are_404_and_wrong_methods_405() -> None:
    with trio.fail_after(5):
        async with serving() as served:
            unknown = await served.client.get("/nope")
            runs = await served.client.get("/v1/runs")
            stream = await served.client.get("/v1/stream")
            health = await served.client.post("/healthz", json={})
    assert unknown.status_code == 404
    assert runs.status_code == stream.status_code == health.status_code == 405
    assert runs.headers["allow"] == "POST"
    assert health.headers["allow"] == "GET, HEAD"


async def test_cross_site_requests_and_rebound_names_are_refused() -> None:
    with trio.fail_after(5):
        async with serving() as served:
            other_site = await served.client.post(
                "/v1/runs", json={"prompt": "Hi"}, headers={"origin": "https://evil.example"}
            )
            same_site = await served.client.post(
                "/v1/runs", json={"prompt": "Hi"}, headers={"origin": served.url}
            )
            as_text = await served.client.post(
                "/v1/runs", content=b'{"prompt": "Hi"}', headers={"content-type": "text/plain"}
            )
            rebound = await served.client.get("/healthz", headers={"host": "evil.example"})
    assert other_site.status_code == 403
    assert same_site.status_code == 201
    assert as_text.status_code == 415  # a type a page may send cross-site without asking
    assert rebound.status_code == 403


async def test_keep_alive_answers_requests_in_turn_on_one_connection() -> None:
    request = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    last = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    with trio.fail_after(5):
        async with serving() as served:
            answer = await raw_exchange(served.url, request * 2 + last)
    assert answer.count(b"HTTP/1.1 200 ") == 3
    assert answer.count(b'{"status":"ok"}') == 3


async def test_a_run_can_be_cancelled_with_its_token() -> None:
    script = [text_reply([f"{n} " for n in range(200)], chunk_delay=0.01)]
    with trio.fail_after(5):
        async with serving(script) as served:
            run = await served.start()
            wrong = await served.client.delete(
                f"/v1/runs/{run['run_id']}", headers={"authorization": "Bearer nope"}
            )
            cancel = await served.client.delete(
                f"/v1/runs/{run['run_id']}", headers={"authorization": f"Bearer {run['token']}"}
            )
            stream = await read_sse(served.client, run["events_url"])
    assert wrong.status_code == 404
    assert cancel.status_code == 202
    done = stream.run_events[-1]
    assert isinstance(done, RunDone)
    assert (done.status, done.code) == ("cancelled", "cancelled")


class SlowSink(HubSink):
    """A hub sink that takes its time: batches queue up on their way to it."""

    async def deliver(self, batch: SinkBatch) -> None:
        await trio.sleep(0.005)
        await super().deliver(batch)


class SlowHub(Hub):
    def sink(self, run_id: str) -> HubSink:
        self.create(run_id)
        return SlowSink(self, run_id)


async def test_a_run_cancelled_with_batches_in_flight_still_ends_gapless_with_run_done() -> None:
    script = [text_reply([f"{n} " for n in range(400)], chunk_delay=0.001)]
    with trio.fail_after(5):
        async with serving(script, hub=SlowHub()) as served:
            run = await served.start()
            await served.wait_for(run["run_id"], 20)
            auth = {"authorization": f"Bearer {run['token']}"}
            await served.client.delete(f"/v1/runs/{run['run_id']}", headers=auth)
            stream = await read_sse(served.client, run["events_url"])
    assert stream.seqs == list(range(1, len(stream.seqs) + 1))
    done = stream.run_events[-1]
    assert isinstance(done, RunDone)
    assert done.status == "cancelled"


# --- what never leaks -----------------------------------------------------------------------------


async def test_text_that_looks_like_sse_fields_arrives_as_one_exact_delta() -> None:
    sneaky = "x\n\nevent: admin\nid: 1\r\ndata: y\x00"
    with trio.fail_after(5):
        async with serving([text_reply([sneaky])]) as served:
            run = await served.start()
            stream = await read_sse(served.client, run["events_url"])
    assert all(e.event == "message" for e in stream.events)
    assert [e.id for e in stream.events] == [f"{run['run_id']}:{n}" for n in stream.seqs]
    deltas = [e for e in stream.run_events if isinstance(e, AnswerDelta)]
    assert [d.delta for d in deltas] == [sneaky]


async def test_provider_keys_and_messages_never_reach_events_or_logs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    leak = {"error": {"message": f"Incorrect API key provided: {PROVIDER_KEY}", "type": "x"}}
    script = [status_reply(401, body=leak)]
    caplog.set_level(logging.DEBUG)
    with trio.fail_after(5):
        async with serving(script, provider_key=PROVIDER_KEY) as served:
            run = await served.start()
            stream = await read_sse(served.client, run["events_url"])
            sent = served.loopback.requests[0].headers["authorization"]
    assert sent == f"Bearer {PROVIDER_KEY}"  # the key was used...
    body = b"".join(e.data.encode() for e in stream.events)
    assert PROVIDER_KEY.encode() not in body  # ...and never came back
    assert b"Incorrect API key" not in body
    done = stream.run_events[-1]
    assert isinstance(done, RunDone)
    assert (done.status, done.code) == ("error", "provider_error")
    assert PROVIDER_KEY not in caplog.text


# --- the page, health and metrics -----------------------------------------------------------------


async def test_the_page_is_served_with_a_policy_that_allows_only_its_own_script() -> None:
    with trio.fail_after(5):
        async with serving() as served:
            page = await served.client.get("/")
            head = await served.client.head("/")
    assert page.status_code == 200
    assert page.headers["content-type"] == "text/html; charset=utf-8"
    assert "EventSource" in page.text
    script = re.search(r"<script>(.*?)</script>", page.text, re.DOTALL)
    assert script is not None
    digest = base64.b64encode(hashlib.sha256(script.group(1).encode()).digest()).decode()
    csp = page.headers["content-security-policy"]
    assert f"script-src 'sha256-{digest}'" in csp
    assert "default-src 'none'" in csp
    assert head.status_code == 200
    assert head.content == b""
    assert head.headers["content-length"] == str(len(page.content))


async def test_health_and_metrics() -> None:
    with trio.fail_after(5):
        async with serving() as served:
            run = await served.start()
            await read_sse(served.client, run["events_url"])
            health = await served.client.get("/healthz")
            metrics = (await served.client.get("/metrics.json")).json()
    assert health.json() == {"status": "ok"}
    assert metrics["runs_started"] == 1
    assert metrics["runs_active"] == 0
    assert metrics["subscribers"] == 0
    assert metrics["events_per_second"] > 0
    ttfe = metrics["time_to_first_event_ms"]
    assert ttfe["count"] == 1
    assert ttfe["p50"] is not None
    assert ttfe["p50"] <= ttfe["p95"] <= ttfe["p99"]
