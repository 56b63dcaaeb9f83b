"""The fault-injecting loopback provider: real sockets on 127.0.0.1, httpx as the client.

Tests that assert scripted delays run under a MockClock that jumps only after 10 ms of real time
with every task blocked, so loopback I/O is not mistaken for idleness; their `fail_after` and
`move_on_after` deadlines are virtual. The others run on the real clock.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import httpx
import pytest
import trio
import trio.testing
from rillet.frames import SSEDecoder
from rillet.transports.testing import (
    PING,
    LoopbackProvider,
    RecordedRequest,
    Reply,
    fixture_reply,
    open_loopback_provider,
    openai_text_body,
    openai_text_stream,
    refused_url,
    split,
    sse,
    status_reply,
)

from ..wire_cases import FIXTURES

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

REAL_LIMIT = 5.0  # real seconds: a safety net, never reached by a passing test
VIRTUAL_LIMIT = 1000.0  # virtual seconds: beyond every scripted delay here
FAULTS = (httpx.RemoteProtocolError, httpx.ReadError)


@pytest.fixture
def virtual_clock() -> trio.testing.MockClock:
    """pytest-trio runs a test under any `trio.abc.Clock` among its fixtures."""
    return trio.testing.MockClock(autojump_threshold=0.01)


async def timed_chunks(response: httpx.Response) -> list[tuple[float, bytes]]:
    """Each piece of the raw body with the (virtual) time it arrived."""
    return [(trio.current_time(), chunk) async for chunk in response.aiter_raw()]


async def read_until_cancelled(
    response: httpx.Response, seconds: float
) -> tuple[list[tuple[float, bytes]], bool]:
    """What arrives within `seconds`, and whether the wait was cut short (the body went on)."""
    got: list[tuple[float, bytes]] = []
    with trio.move_on_after(seconds) as scope:
        async for chunk in response.aiter_raw():
            got.append((trio.current_time(), chunk))
    return got, scope.cancelled_caught


async def drain(response: httpx.Response, into: bytearray) -> None:
    """Read the whole body into `into`, so what came before a failure can be checked."""
    async for chunk in response.aiter_raw():
        into += chunk


@pytest.mark.parametrize(
    ("relative", "content_type"),
    [
        ("openai-chat/text.sse", "text/event-stream"),
        ("ollama-chat/text.ndjson", "application/x-ndjson"),
        ("openai-chat/non_streaming.json", "application/json"),
    ],
)
async def test_fixture_reply_streams_the_recorded_bytes_exactly(
    relative: str, content_type: str
) -> None:
    path = FIXTURES / relative
    with trio.fail_after(REAL_LIMIT):
        async with (
            open_loopback_provider([fixture_reply(path, chunk_size=7)]) as provider,
            httpx.AsyncClient() as client,
            client.stream("POST", f"{provider.url}/v1/chat/completions", json={}) as response,
        ):
            body = b"".join([chunk async for chunk in response.aiter_raw()])
    assert response.status_code == 200
    assert response.headers["content-type"] == content_type
    assert response.headers["transfer-encoding"] == "chunked"
    assert body == path.read_bytes()


def test_fixture_reply_refuses_an_unknown_suffix_and_passes_fields_through() -> None:
    path = FIXTURES / "openai-chat" / "text.sse"
    reply = fixture_reply(path, chunk_size=100, chunk_delay=0.5, status=201)
    assert (reply.status, reply.chunk_delay, reply.content_type) == (201, 0.5, "text/event-stream")
    assert b"".join(reply.chunks) == path.read_bytes()
    assert all(len(chunk) == 100 for chunk in reply.chunks[:-1])
    with pytest.raises(ValueError, match="content type"):
        fixture_reply(path.with_suffix(".expected.json").with_suffix(".txt"))


async def test_requests_are_recorded_with_method_path_headers_body_and_time(
    virtual_clock: trio.testing.MockClock,
) -> None:
    with trio.fail_after(VIRTUAL_LIMIT):
        async with (
            open_loopback_provider([Reply(chunks=(b"ok",))]) as provider,
            httpx.AsyncClient(timeout=None) as client,
        ):
            start = trio.current_time()
            await trio.sleep(3.0)
            response = await client.post(
                f"{provider.url}/v1/chat/completions?x=1",
                content=b'{"stream":true}',
                headers={"Authorization": "Bearer k", "X-Trace": "a"},
            )
            await client.get(f"{provider.url}/health")
    assert response.text == "ok"
    first, second = provider.requests
    assert (first.method, first.path, first.body) == (
        "POST",
        "/v1/chat/completions?x=1",
        b'{"stream":true}',
    )
    assert first.headers["authorization"] == "Bearer k"
    assert first.headers["x-trace"] == "a"
    assert first.headers["content-length"] == "15"
    assert first.at == pytest.approx(start + 3.0, abs=1e-6)
    assert (second.method, second.path, second.body) == ("GET", "/health", b"")


async def test_several_requests_share_one_keep_alive_connection() -> None:
    with trio.fail_after(REAL_LIMIT):
        async with (
            open_loopback_provider([fixture_reply(FIXTURES / "openai-chat" / "text.sse")]) as p,
            httpx.AsyncClient() as client,
        ):
            bodies = [(await client.post(p.url, content=b"x")).content for _ in range(3)]
    assert bodies == [(FIXTURES / "openai-chat" / "text.sse").read_bytes()] * 3
    assert [r.connection for r in p.requests] == [0, 0, 0]
    assert p.connections == 1


async def test_concurrent_connections_are_served_at_the_same_time(
    virtual_clock: trio.testing.MockClock,
) -> None:
    done: list[float] = []

    async def fetch(client: httpx.AsyncClient, url: str) -> None:
        response = await client.get(url)
        assert response.content == b"slow"
        done.append(trio.current_time())

    with trio.fail_after(VIRTUAL_LIMIT):
        async with (
            open_loopback_provider([Reply(chunks=(b"slow",), headers_delay=1.0)]) as provider,
            httpx.AsyncClient(timeout=None) as client,
        ):
            start = trio.current_time()
            async with trio.open_nursery() as nursery:
                for _ in range(3):
                    nursery.start_soon(fetch, client, provider.url)
    assert done == pytest.approx([start + 1.0] * 3, abs=1e-6)  # one after another would take 3 s
    assert sorted(r.connection for r in provider.requests) == [0, 1, 2]


async def test_a_script_sequence_is_played_in_order_and_its_last_reply_repeats() -> None:
    script = [status_reply(503), Reply(chunks=(b"one",)), Reply(chunks=(b"last",))]
    with trio.fail_after(REAL_LIMIT):
        async with open_loopback_provider(script) as p, httpx.AsyncClient() as client:
            answers = [await client.get(p.url) for _ in range(5)]
    assert [(a.status_code, a.content) for a in answers[1:]] == [
        (200, b"one"),
        (200, b"last"),
        (200, b"last"),
        (200, b"last"),
    ]
    assert answers[0].status_code == 503


async def test_a_script_function_gets_each_request_and_its_number() -> None:
    def script(request: RecordedRequest, n: int) -> Reply:
        return Reply(chunks=(f"{n}:{request.method}:{request.path}:".encode(), request.body))

    with trio.fail_after(REAL_LIMIT):
        async with open_loopback_provider(script) as p, httpx.AsyncClient() as client:
            first = await client.post(f"{p.url}/a", content=b"A")
            second = await client.get(f"{p.url}/b")
    assert first.content == b"0:POST:/a:A"
    assert second.content == b"1:GET:/b:"


async def test_set_script_replaces_the_script_and_starts_it_from_its_first_reply() -> None:
    with trio.fail_after(REAL_LIMIT):
        async with (
            open_loopback_provider([Reply(chunks=(b"old",))]) as p,
            httpx.AsyncClient() as client,
        ):
            before = [(await client.get(p.url)).content for _ in range(2)]
            p.set_script(lambda request, n: Reply(chunks=(str(n).encode(),)))
            after = [(await client.get(p.url)).content for _ in range(2)]
            p.set_script([Reply(chunks=(b"a",)), Reply(chunks=(b"b",))])
            last = (await client.get(p.url)).content
    assert (before, after, last) == ([b"old", b"old"], [b"0", b"1"], b"a")
    with pytest.raises(ValueError, match="at least one"):
        p.set_script([])


async def test_headers_delay_and_chunk_delay_are_kept_in_virtual_time(
    virtual_clock: trio.testing.MockClock,
) -> None:
    reply = Reply(chunks=(b"a", b"b", b"c"), headers_delay=2.0, chunk_delay=0.5)
    with trio.fail_after(VIRTUAL_LIMIT):
        async with (
            open_loopback_provider([reply]) as provider,
            httpx.AsyncClient(timeout=None) as client,
        ):
            start = trio.current_time()
            async with client.stream("GET", provider.url) as response:
                headers_at = trio.current_time()
                chunks = await timed_chunks(response)
    assert headers_at - start == pytest.approx(2.0, abs=1e-6)
    assert [data for _, data in chunks] == [b"a", b"b", b"c"]
    assert [at - start for at, _ in chunks] == pytest.approx([2.5, 3.0, 3.5], abs=1e-6)


async def test_stall_after_leaves_the_client_waiting_until_it_leaves(
    virtual_clock: trio.testing.MockClock,
) -> None:
    reply = Reply(chunks=(b"a", b"b", b"c"), stall_after=2)
    with trio.fail_after(VIRTUAL_LIMIT):
        async with (
            open_loopback_provider([reply]) as provider,
            httpx.AsyncClient(timeout=None) as client,
        ):
            async with client.stream("GET", provider.url) as response:
                got, cut = await read_until_cancelled(response, 60.0)
            assert provider.open_connections == 1  # the stall holds the connection open
            await provider.wait_connections_closed()  # and ends once the client has gone
    assert cut
    assert b"".join(data for _, data in got) == b"ab"
    assert len(provider.requests) == 1


async def test_ping_every_sends_comments_while_stalled(
    virtual_clock: trio.testing.MockClock,
) -> None:
    reply = Reply(chunks=(b"data: 1\n\n",), stall_after=1, ping_every=10.0)
    with trio.fail_after(VIRTUAL_LIMIT):
        async with (
            open_loopback_provider([reply]) as provider,
            httpx.AsyncClient(timeout=None) as client,
        ):
            start = trio.current_time()
            async with client.stream("GET", provider.url) as response:
                got, cut = await read_until_cancelled(response, 35.0)
    assert cut
    assert [data for _, data in got] == [b"data: 1\n\n", PING, PING, PING]
    assert [at - start for at, _ in got[1:]] == pytest.approx([10.0, 20.0, 30.0], abs=1e-6)


async def test_stall_headers_hangs_before_the_status_line(
    virtual_clock: trio.testing.MockClock,
) -> None:
    with trio.fail_after(VIRTUAL_LIMIT):
        async with (
            open_loopback_provider([Reply(chunks=(b"never",), stall_headers=True)]) as provider,
            httpx.AsyncClient(timeout=None) as client,
        ):
            start = trio.current_time()
            with trio.move_on_after(100.0) as scope:
                await client.post(provider.url, content=b"held")
            assert scope.cancelled_caught
            assert trio.current_time() - start == pytest.approx(100.0, abs=1e-6)
            await provider.wait_connections_closed()
    assert [r.body for r in provider.requests] == [b"held"]


async def test_wait_for_requests_returns_when_the_provider_holds_the_request() -> None:
    with trio.fail_after(REAL_LIMIT):
        async with (
            open_loopback_provider([Reply(stall_headers=True)]) as provider,
            httpx.AsyncClient() as client,
            trio.open_nursery() as nursery,
        ):
            nursery.start_soon(client.get, provider.url)
            await provider.wait_for_requests(1)
            assert len(provider.requests) == 1
            nursery.cancel_scope.cancel()


@pytest.mark.parametrize("reset", [False, True])
async def test_drop_after_bytes_cuts_the_body_and_fails_the_client_read(reset: bool) -> None:
    drop = Reply(chunks=(b"a" * 10, b"b" * 10), drop_after_bytes=15, drop_with_reset=reset)
    got = bytearray()
    with trio.fail_after(REAL_LIMIT):
        async with (
            open_loopback_provider([drop, Reply(chunks=(b"ok",))]) as p,
            httpx.AsyncClient() as client,
        ):
            async with client.stream("GET", p.url) as response:
                with pytest.raises(httpx.ReadError if reset else FAULTS):
                    await drain(response, got)
            after = await client.get(p.url)
    assert response.status_code == 200
    assert got == b"a" * 10 + b"b" * 5
    assert after.content == b"ok"
    assert [r.connection for r in p.requests] == [0, 1]  # the dropped connection is gone


async def test_drop_after_the_whole_body_withholds_only_the_terminating_chunk() -> None:
    reply = Reply(chunks=(b"abc",), drop_after_bytes=3)
    got = bytearray()
    with trio.fail_after(REAL_LIMIT):
        async with (
            open_loopback_provider([reply]) as p,
            httpx.AsyncClient() as client,
            client.stream("GET", p.url) as response,
        ):
            with pytest.raises(FAULTS):
                await drain(response, got)
    assert got == b"abc"


async def test_a_client_leaving_mid_body_is_not_an_error_and_serving_goes_on(
    virtual_clock: trio.testing.MockClock,
) -> None:
    long = Reply(chunks=(b"x" * 4096,) * 50, chunk_delay=1.0)
    with trio.fail_after(VIRTUAL_LIMIT):
        async with (
            open_loopback_provider([long, Reply(chunks=(b"ok",))]) as provider,
            httpx.AsyncClient(timeout=None) as client,
        ):
            async with client.stream("GET", provider.url) as response:
                assert response.status_code == 200  # then leave, with the body still coming
            await provider.wait_connections_closed()  # the server's writes failed, quietly
            after = await client.get(provider.url)
    assert trio.current_time() < 50.0  # the long reply was abandoned, not played out
    assert after.content == b"ok"
    assert provider.connections == 2


async def test_status_reply_sends_its_status_headers_and_body() -> None:
    script = [
        status_reply(429, retry_after=2, retry_after_ms=1500, should_retry=False),
        status_reply(503, body={"error": {"type": "overloaded"}}, retry_after="soon"),
    ]
    with trio.fail_after(REAL_LIMIT):
        async with open_loopback_provider(script) as p, httpx.AsyncClient() as client:
            limited = await client.post(p.url, json={})
            unavailable = await client.post(p.url, json={})
    assert limited.status_code == 429
    assert limited.reason_phrase == "Too Many Requests"
    assert limited.headers["retry-after"] == "2"
    assert limited.headers["retry-after-ms"] == "1500"
    assert limited.headers["x-should-retry"] == "false"
    assert limited.headers["content-type"] == "application/json"
    assert limited.json()["error"]["message"] == "Too Many Requests"
    assert unavailable.status_code == 503
    assert unavailable.headers["retry-after"] == "soon"
    assert "x-should-retry" not in unavailable.headers
    assert unavailable.json() == {"error": {"type": "overloaded"}}


async def test_leaving_the_context_while_a_reply_streams_returns_promptly() -> None:
    reply = Reply(chunks=(b"x",) * 1000, chunk_delay=0.2)
    with trio.fail_after(REAL_LIMIT):
        async with httpx.AsyncClient() as client:
            async with open_loopback_provider([reply]) as provider:
                response = await client.send(client.build_request("GET", provider.url), stream=True)
                body: AsyncIterator[bytes] = response.aiter_raw()
                assert await anext(body) == b"x"
                leaving = trio.current_time()
            assert trio.current_time() - leaving < 0.1  # a chunk is due only after 0.2 s
            assert provider.open_connections == 0
            with pytest.raises(FAULTS):
                await anext(body)
            await response.aclose()
            with pytest.raises(httpx.ConnectError):
                await client.get(provider.url)  # the listener is closed too


async def test_an_error_in_the_block_comes_out_unwrapped_after_the_server_stops() -> None:
    providers: list[LoopbackProvider] = []

    async def failing_block() -> None:
        async with open_loopback_provider([Reply(stall_headers=True)]) as provider:
            providers.append(provider)
            async with httpx.AsyncClient() as client, trio.open_nursery() as nursery:
                nursery.start_soon(client.get, provider.url)
                await provider.wait_for_requests(1)
                nursery.cancel_scope.cancel()
            raise KeyError("boom")

    with trio.fail_after(REAL_LIMIT), pytest.raises(KeyError, match="boom"):
        await failing_block()
    assert providers[0].open_connections == 0


async def test_a_body_over_the_limit_is_answered_413_without_using_the_script() -> None:
    async def chunked() -> AsyncIterator[bytes]:
        for _ in range(4):
            yield b"y" * 300

    with trio.fail_after(REAL_LIMIT):
        async with (
            open_loopback_provider([Reply(chunks=(b"ok",))], max_body=1000) as p,
            httpx.AsyncClient() as client,
        ):
            sized = await client.post(p.url, content=b"x" * 1001)
            streamed = await client.post(p.url, content=chunked())
            fits = await client.post(p.url, content=b"x" * 1000)
    assert (sized.status_code, streamed.status_code) == (413, 413)
    assert sized.json()["error"]["message"] == "Request Entity Too Large"
    assert (fits.status_code, fits.content) == (200, b"ok")
    assert [len(r.body) for r in p.requests] == [0, 0, 1000]


async def test_broken_http_is_answered_400_and_the_server_keeps_serving() -> None:
    with trio.fail_after(REAL_LIMIT):
        async with (
            open_loopback_provider([Reply(chunks=(b"ok",))]) as provider,
            httpx.AsyncClient() as client,
        ):
            port = int(provider.url.rsplit(":", 1)[1])
            async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
                await stream.send_all(b"NOT HTTP\x00\r\n\r\n")
                answer = b""
                while data := await stream.receive_some():
                    answer += data
            later = await client.get(provider.url)
    assert answer.startswith(b"HTTP/1.1 400 ")
    assert later.content == b"ok"
    assert provider.requests[0].connection == 1


async def test_refused_url_gives_a_connect_error() -> None:
    with trio.fail_after(REAL_LIMIT):
        async with httpx.AsyncClient() as client:
            with pytest.raises(httpx.ConnectError):
                await client.get(refused_url())


def test_sse_frames_strings_and_mappings() -> None:
    assert sse("a", {"b": "ü"}) == 'data: a\n\ndata: {"b":"ü"}\n\n'.encode()
    assert sse("x\ny", event="error") == b"event: error\ndata: x\ndata: y\n\n"


def test_split_cuts_into_fixed_size_chunks() -> None:
    assert split(b"abcdefg", 3) == (b"abc", b"def", b"g")
    assert split(b"", 3) == ()
    with pytest.raises(ValueError, match="positive"):
        split(b"abc", 0)


def test_openai_text_stream_is_a_complete_chat_completions_stream() -> None:
    decoder = SSEDecoder()
    events = decoder.feed(openai_text_stream(["Hel", "lo ", "👋"])) + decoder.close()
    assert events[-1].data == "[DONE]"
    chunks = [json.loads(event.data) for event in events[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == "Hello 👋"
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"]["completion_tokens"] == 3
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)


def test_openai_text_stream_can_leave_out_usage_and_done() -> None:
    decoder = SSEDecoder()
    events = decoder.feed(openai_text_stream(["a"], usage=False, done=False))
    chunks = [json.loads(event.data) for event in events]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert all("usage" not in c for c in chunks)


def test_openai_text_body_is_the_matching_completion() -> None:
    body = json.loads(openai_text_body("Hello there"))
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"] == {
        "role": "assistant",
        "content": "Hello there",
        "refusal": None,
        "annotations": [],
    }
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["usage"]["total_tokens"] == body["usage"]["prompt_tokens"] + 2


def test_reply_rejects_negative_timings() -> None:
    with pytest.raises(ValueError, match="headers_delay"):
        Reply(headers_delay=-1.0)
    with pytest.raises(ValueError, match="ping_every"):
        Reply(ping_every=0.0)


def test_url_is_refused_before_serving() -> None:
    with pytest.raises(RuntimeError, match="not serving"):
        _ = LoopbackProvider([Reply()]).url


def test_a_reply_takes_headers_as_a_mapping_and_a_body_as_one_bytes_value() -> None:
    reply = Reply(headers={"retry-after": "2"}, chunks=b"data: x\n\n")
    assert reply.headers == (("retry-after", "2"),)
    assert reply.chunks == (b"data: x\n\n",)


@pytest.mark.parametrize(
    "fields",
    [{"headers": [("retry-after",)]}, {"headers": {"retry-after": 2}}, {"chunks": ["text"]}],
    ids=["not-a-pair", "not-a-string", "not-bytes"],
)
def test_a_reply_of_the_wrong_shape_is_a_type_error_naming_it(fields: dict[str, Any]) -> None:
    with pytest.raises(TypeError, match="must be"):
        Reply(**fields)
