"""The server against a misbehaving client (RELIABILITY.md S06-S16), on 127.0.0.1 with the
loopback provider behind it (the harness of `fault_support`): the misbehaving client gets its
refusal, and a well-behaved subscriber of the same run still sees every event once, the run
completing with one request.
"""

from __future__ import annotations

import base64
import logging
import os
import struct
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import msgspec
import pytest
import trio
import trio.testing
import trio_websocket
from rillet import SSEEncodeError
from rillet._core._dialect import Provider, Secret
from rillet._core._runevents import AnswerDelta, RunDone
from rillet.frames import SSEDecoder, encode_sse
from rillet.providers._openai_chat._dialect import OpenAIChatDialect
from rillet.transports.server import Limits, ServerConfig, ServerConfigError, serve
from rillet.transports.testing import Reply, openai_text_stream, status_reply

from ..fault_support import (
    LIMIT,
    Read,
    RunRef,
    Site,
    check_reads,
    check_site,
    next_frame,
    read_sse,
    read_ws,
    site,
    text_reply,
    ws_connect,
)
from ..handler_support import (
    END_OK,
    OK,
    expect,
    tool_stream,
)

if TYPE_CHECKING:
    from collections.abc import Sequence


# --- S06-S16: the server --------------------------------------------------------------------------

ONE_REQUEST = (0.0,)
HELLO = ["Hel", "lo, ", "world"]
HELLO_SEEN = expect("start", "D*3", "usage", "done", END_OK)


def late_reply(fragments: Sequence[str] = HELLO, delay: float = 1.0) -> Reply:
    """A whole reply whose headers come after `delay` s: clients connect before its events."""
    return text_reply(fragments, headers_delay=delay)


async def watch(run: RunRef, reads: list[Read]) -> None:
    """A well-behaved subscriber of the same run: reads it to its end."""
    reads.append(await read_ws(run.ws_url))


def check_unaffected(served: Site, run: RunRef, reads: Sequence[Read]) -> None:
    """The run completed with one request, and the well-behaved subscribers got every event
    once, the text exactly once."""
    check_site(served, run, at=ONE_REQUEST, saw=HELLO_SEEN, text="".join(HELLO))
    for read in reads:
        check_reads(served, run, [read])
        assert (read.code, read.reason) == (1000, "done")


async def misbehave(run: RunRef, *messages: str | bytes) -> Read:
    """A WebSocket client that sends `messages`, then reads what the server says."""
    read = Read(101)
    async with ws_connect(run.ws_url) as ws:
        try:
            for message in messages:
                await ws.send_message(message)
            while True:
                read.data.append(str(await ws.get_message()).encode())
        except trio_websocket.ConnectionClosed as closed:
            if closed.reason is not None:
                read.code, read.reason = closed.reason.code, closed.reason.reason
    return read


@pytest.mark.parametrize(
    ("messages", "code", "reason"),
    [
        ((b"\x00\x01",), 1003, None),
        (("hello?",), 1008, "not_json"),
        (('{"type": "ping"}', "{"), 1008, "not_json"),
    ],
    ids=["binary-1003", "not-json-1008", "json-then-not-json-1008"],
)
async def test_s06_a_websocket_client_sending_what_it_may_not_is_closed(
    loop_clock: trio.testing.MockClock,
    messages: tuple[str | bytes, ...],
    code: int,
    reason: str | None,
) -> None:
    with trio.fail_after(LIMIT):
        async with site([late_reply()]) as served:
            run = await served.start()
            reads: list[Read] = []
            async with trio.open_nursery() as nursery:
                nursery.start_soon(watch, run, reads)
                bad = await misbehave(run, *messages)
    assert bad.code == code
    if reason is not None:
        assert bad.reason == reason
    assert bad.data == served.log(run.run_id)[: len(bad.data)]  # what it had, in order...
    assert len(bad.data) <= 1  # ...run.started at most: the run's reply had not begun
    check_unaffected(served, run, reads)


async def test_s06_invalid_utf8_in_a_text_message_closes_1007(
    loop_clock: trio.testing.MockClock,
) -> None:
    with trio.fail_after(LIMIT):
        async with site([late_reply()]) as served:
            run = await served.start()
            reads: list[Read] = []
            async with trio.open_nursery() as nursery:
                nursery.start_soon(watch, run, reads)
                code = await raw_text_frame(run.ws_url, b'"\xff\xfe"')
    assert code == 1007
    check_unaffected(served, run, reads)


async def raw_text_frame(url: str, payload: bytes) -> int:
    """Send one (masked) text frame with this payload over a raw WebSocket; the close code."""
    parts = urlsplit(url)
    assert parts.hostname is not None
    assert parts.port is not None
    key = base64.b64encode(os.urandom(16)).decode()
    head = (
        f"GET {parts.path}?{parts.query} HTTP/1.1\r\nHost: {parts.netloc}\r\n"
        "Upgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    async with await trio.open_tcp_stream(parts.hostname, parts.port) as stream:
        await stream.send_all(head.encode())
        buffer = bytearray()
        while b"\r\n\r\n" not in buffer:
            buffer += await stream.receive_some(65536)
        buffer = bytearray(bytes(buffer).partition(b"\r\n\r\n")[2])
        mask = os.urandom(4)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        await stream.send_all(bytes([0x81, 0x80 | len(payload)]) + mask + masked)
        while True:
            frame = next_frame(buffer)
            if frame is None:
                data = await stream.receive_some(65536)
                assert data, "closed without a close frame"
                buffer += data
                continue
            if frame[0] == 0x8:
                code: int = struct.unpack("!H", frame[1][:2])[0]
                return code


async def test_s07_a_flood_past_20_a_second_is_closed_1008_and_others_are_unaffected(
    loop_clock: trio.testing.MockClock,
) -> None:
    with trio.fail_after(LIMIT):
        async with site([late_reply()]) as served:
            run = await served.start()
            reads: list[Read] = []
            clients: dict[int, Read] = {}

            async def send(count: int) -> None:
                clients[count] = await misbehave(run, *(["{}"] * count))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(watch, run, reads)
                # at one instant, before the run's reply: the burst of 40 passes; the 41st
                # message is one too many
                nursery.start_soon(send, 40)
                nursery.start_soon(send, 41)
            burst, flood = clients[40], clients[41]
    assert (flood.code, flood.reason) == (1008, "rate_limited")
    assert burst.code == 1000  # the burst alone was allowed: it read the run to its end
    check_reads(served, run, [burst])
    check_unaffected(served, run, reads)


async def test_s08_a_message_over_64_kib_is_closed_1009(
    loop_clock: trio.testing.MockClock,
) -> None:
    with trio.fail_after(LIMIT):
        async with site([late_reply()]) as served:
            run = await served.start()
            reads: list[Read] = []
            async with trio.open_nursery() as nursery:
                nursery.start_soon(watch, run, reads)
                big = await misbehave(run, '"' + "x" * (64 * 1024) + '"')
                fits = await misbehave(run, '"' + "x" * (64 * 1024 - 3) + '"')
    assert big.code == 1009
    assert fits.code == 1000  # a message at the limit is fine
    check_unaffected(served, run, reads)


async def test_s09_another_runs_token_and_no_such_run_look_the_same(
    loop_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    with trio.fail_after(LIMIT):
        async with site([late_reply()]) as served:
            mine, other = await served.start(), await served.start()
            targets = {
                "wrong-token": mine.events_url.replace(mine.token, other.token),
                "no-token": mine.events_url.split("?")[0],
                "unknown-run": other.events_url.replace(other.run_id, "ab" * 12),
                "malformed-run": other.events_url.replace(other.run_id, "NOT-A-RUN"),
            }
            answers = {}
            for name, target in targets.items():
                path = target.removeprefix(served.url)
                raw = await raw_request(served, f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n")
                answers[name] = raw
            ws = [
                await read_ws(mine.ws_url.replace(mine.token, other.token)),
                await read_ws(other.ws_url.replace(other.run_id, "ab" * 12)),
            ]
            deletes = [
                await served.client.delete(
                    f"/v1/runs/{run_id}", headers={"authorization": f"Bearer {token}"}
                )
                for run_id, token in ((mine.run_id, other.token), ("ab" * 12, other.token))
            ]
            reads = [await read_ws(mine.ws_url), await read_ws(other.ws_url)]
    first = answers["wrong-token"]
    assert first.startswith(b"HTTP/1.1 404 ")
    assert all(raw == first for raw in answers.values()), answers
    assert [(r.code, r.reason, r.data) for r in ws] == [(1008, "not_found", [])] * 2
    assert deletes[0].content == deletes[1].content
    assert deletes[0].status_code == deletes[1].status_code == 404
    assert mine.token not in caplog.text
    assert other.token not in caplog.text
    for read, run in zip(reads, (mine, other), strict=True):  # neither run was touched
        check_reads(served, run, [read])


async def raw_request(served: Site, head: str, body: bytes = b"") -> bytes:
    """One request (`Connection: close` added) on a raw socket; everything the server sent."""
    host, port = served.url.removeprefix("http://").rsplit(":", 1)
    async with await trio.open_tcp_stream(host, int(port)) as stream:
        await stream.send_all(head.encode() + b"Connection: close\r\n\r\n" + body)
        received = bytearray()
        while data := await stream.receive_some(65536):
            received += data
    return bytes(received)


def test_s10_cr_lf_and_nul_are_refused_in_sse_event_and_id() -> None:
    for bad in ("a\rb", "a\nb", "a\x00b", "x\n\nevent: admin"):
        with pytest.raises(SSEEncodeError):
            encode_sse("data", event=bad)
        with pytest.raises(SSEEncodeError):
            encode_sse("data", id=bad)
    decoded = SSEDecoder().feed(encode_sse("x\n\nevent: admin\r\nid: 7"))
    assert [(e.data, e.event, e.id) for e in decoded] == [
        ("x\n\nevent: admin\nid: 7", "message", "")
    ]


async def test_s10_text_that_looks_like_sse_fields_arrives_as_one_exact_delta(
    loop_clock: trio.testing.MockClock,
) -> None:
    sneaky = ["x\n\nevent: admin\ndata: {}\n\n", "id: 99\r\nretry: 1\r", "\x00:ok"]
    with trio.fail_after(LIMIT):
        async with site([text_reply(sneaky)]) as served:
            run = await served.start()
            sse = await read_sse(run.events_url)
            ws = await read_ws(run.ws_url)
    check_site(
        served,
        run,
        at=ONE_REQUEST,
        saw=expect("start", "D*3", "usage", "done", END_OK),
        text="".join(sneaky),
    )
    for read in (sse, ws):
        check_reads(served, run, [read])
        deltas = [e.delta for e in read.events if isinstance(e, AnswerDelta)]
        assert deltas == sneaky
    assert sse.ids == [f"{run.run_id}:{seq}" for seq in sse.seqs]


async def test_s11_provider_ids_never_become_sse_ids(loop_clock: trio.testing.MockClock) -> None:
    stream = openai_text_stream(HELLO, completion_id="chatcmpl-PROVIDER-ID")
    frames = [f for f in stream.split(b"\n\n") if f]
    tagged = b"".join(
        b"id: provider-%d\nevent: message\nretry: 5\n%s\n\n" % (i, f) for i, f in enumerate(frames)
    )
    with trio.fail_after(LIMIT):
        async with site([Reply(chunks=(tagged,))]) as served:
            run = await served.start()
            read = await read_sse(run.events_url)
            resumed = await read_sse(run.events_url, last_event_id="provider-3")
    check_site(served, run, at=ONE_REQUEST, saw=HELLO_SEEN, text="".join(HELLO))
    check_reads(served, run, [read])
    assert read.ids == [f"{run.run_id}:{seq}" for seq in range(1, len(read.data) + 1)]
    body = b"".join(read.data)
    assert b"provider-" not in body
    assert b"chatcmpl-PROVIDER-ID" not in body
    assert resumed.status == 400  # a provider's id is no cursor here


async def test_s12_a_request_head_or_body_never_finished_is_closed_after_10_s(
    loop_clock: trio.testing.MockClock,
) -> None:
    partial_heads = [
        b"",  # connects, sends nothing
        b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ",
        b"GET /v1/runs/x/ws HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n",
    ]
    body_cut = (
        b"POST /v1/runs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b'Content-Length: 100\r\n\r\n{"prompt": '
    )
    with trio.fail_after(LIMIT):
        async with site([late_reply()]) as served:
            host, port = served.url.removeprefix("http://").rsplit(":", 1)
            waited = []
            answers = []
            for sent in [*partial_heads, body_cut]:
                async with await trio.open_tcp_stream(host, int(port)) as stream:
                    start = trio.current_time()
                    await stream.send_all(sent)
                    received = bytearray()
                    while data := await stream.receive_some(65536):
                        received += data
                    waited.append(trio.current_time() - start)
                    answers.append(bytes(received))
            healthy = await served.client.get("/healthz")
            runs = served.hub.statistics()["runs"]
    assert waited == pytest.approx([10.0] * 4, abs=0.1)
    assert answers[:3] == [b"", b"", b""]  # closed, no answer
    assert answers[3].startswith(b"HTTP/1.1 408 ")
    assert healthy.status_code == 200
    assert runs == 0
    assert served.loopback.requests == []


PROVIDER_KEY = "sk-provider-secret-0123456789abcdef"
SERVER_KEY = "server-key-0123456789abcdef"
COOKIE = "session=cookie-secret-abcdef0123"


async def test_s13_keys_and_request_headers_never_reach_events_logs_or_errors(
    loop_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    leak = {"error": {"message": f"Incorrect API key provided: {PROVIDER_KEY}", "type": "x"}}
    secrets = (PROVIDER_KEY, SERVER_KEY, COOKIE, "Incorrect API key", "cookie-secret")
    headers = {
        "authorization": f"Bearer {SERVER_KEY}",
        "cookie": COOKIE,
        "x-api-key": PROVIDER_KEY,
    }
    with trio.fail_after(LIMIT):
        async with site(
            [status_reply(401, body=leak)], api_key=Secret(SERVER_KEY), provider_key=PROVIDER_KEY
        ) as served:
            started = await served.client.post("/v1/runs", json={"prompt": "Hi"}, headers=headers)
            answer = started.json()
            run = RunRef(
                answer["run_id"], answer["token"], answer["events_url"], answer["ws_url"], 0
            )
            sse = await read_sse(run.events_url)
            ws = await read_ws(run.ws_url)
            mmsp = await served.client.post(
                "/v1/stream",
                json={
                    "model": "test-model",
                    "messages": [
                        {"role": "user", "content_items": [{"type": "text.done", "text": "Hi"}]}
                    ],
                    "config": {},
                },
                headers=headers,
            )
            sent = [r.headers.get("authorization") for r in served.loopback.requests]
    assert sent == [f"Bearer {PROVIDER_KEY}"] * 2  # the key was used, twice...
    assert mmsp.status_code == 401
    outputs = [started.content, mmsp.content, *sse.data, *ws.data, caplog.text.encode()]
    for output in outputs:
        for secret in secrets:
            assert secret.encode() not in output  # ...and never came back, anywhere
    done = sse.events[-1]
    assert isinstance(done, RunDone)
    assert (done.status, done.code) == ("error", "authentication_failed")
    assert sse.data == ws.data


async def test_s14_without_the_server_key_401_and_no_run(
    loop_clock: trio.testing.MockClock,
) -> None:
    with trio.fail_after(LIMIT):
        async with site([late_reply()], api_key=Secret(SERVER_KEY)) as served:
            refused = [
                await served.client.post("/v1/runs", json={"prompt": "Hi"}, headers=h)
                for h in ({}, {"authorization": "Bearer nope"}, {"authorization": SERVER_KEY})
            ]
            stream = await served.client.post("/v1/stream", json={"model": "m", "messages": []})
            runs = served.hub.statistics()["runs"]
            requests = len(served.loopback.requests)
    assert [r.status_code for r in refused] == [401, 401, 401]
    assert all(r.headers["www-authenticate"] == "Bearer" for r in refused)
    assert stream.status_code == 401
    assert (runs, requests) == (0, 0)
    provider = Provider(dialect=OpenAIChatDialect(), base_url="http://127.0.0.1:9", model="m")
    with pytest.raises(ServerConfigError):
        await serve(ServerConfig(provider=provider, host="0.0.0.0", port=0))


async def test_s15_a_body_over_the_limit_is_413_and_subscribers_over_the_limits_429(
    loop_clock: trio.testing.MockClock,
) -> None:
    limits = Limits(max_body=1024, max_subscribers_per_run=2)
    big = msgspec.json.encode({"prompt": "x" * 2000})
    with trio.fail_after(LIMIT):
        async with site([late_reply(delay=5.0)], limits=limits) as served:
            declared = await served.client.post(
                "/v1/runs", content=big, headers={"content-type": "application/json"}
            )
            chunked = await raw_request(
                served,
                "POST /v1/runs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                "Transfer-Encoding: chunked\r\n",
                b"".join(b"%x\r\n%s\r\n" % (100, big[i : i + 100]) for i in range(0, 2000, 100)),
            )
            runs_before = served.hub.statistics()["runs"]
            run = await served.start()
            reads: list[Read] = []
            async with trio.open_nursery() as nursery:
                nursery.start_soon(watch, run, reads)
                nursery.start_soon(watch, run, reads)
                await served.wait_for(run.run_id, 1)
                while served.hub.statistics()["subscribers"] < 2:  # noqa: ASYNC110
                    await trio.sleep(0.01)  # the hub counts subscribers; it has no event
                third = await read_sse(run.events_url)
                third_ws = await read_ws(run.ws_url)
    assert declared.status_code == 413
    assert chunked.startswith(b"HTTP/1.1 413 ")
    assert runs_before == 0
    assert third.status == 429
    assert msgspec.json.decode(third.body)["error"]["type"] == "too_many_subscribers"
    assert (third_ws.code, third_ws.reason, third_ws.data) == (1008, "too_many_subscribers", [])
    check_unaffected(served, run, reads)


FAILURES = [
    ("status-401", [status_reply(401)], "authentication_failed"),
    ("always-500", [status_reply(500)], "provider_unavailable"),
    ("tool-arguments", "tool", "tool_arguments_invalid"),
    ("protocol", "protocol", "protocol_error"),
    ("thinking-only", "thinking", "empty_response"),
]


def failing_script(kind: str | list[Reply]) -> list[Reply]:
    if isinstance(kind, list):
        return kind
    chunk = OK[0]
    if kind == "tool":
        body = tool_stream(['{"city": "Par', "is\\u0000"]).body
        return [Reply(chunks=tuple(b for b in body if isinstance(b, bytes)))]
    if kind == "protocol":  # a tool call fragment for a call that never started
        orphan = b'{"index":3,"function":{"arguments":"x"}}'
        delta = b'data: {"id":"c","choices":[{"index":0,"delta":{"tool_calls":[%s]}}]}\n\n'
        return [Reply(chunks=(chunk, delta % orphan))]
    thinking = (
        b'data: {"id":"c","choices":[{"index":0,"delta":{"reasoning_content":"secret plan"}}]}\n\n'
        b'data: {"id":"c","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
        b'data: {"id":"c","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1}}\n\n'
        b"data: [DONE]\n\n"
    )
    return [Reply(chunks=(chunk, thinking))]


@pytest.mark.parametrize(("name", "kind", "code"), FAILURES, ids=[f[0] for f in FAILURES])
async def test_s16_run_done_and_errors_carry_codes_only(
    loop_clock: trio.testing.MockClock,
    caplog: pytest.LogCaptureFixture,
    name: str,
    kind: str | list[Reply],
    code: str,
) -> None:
    caplog.set_level(logging.DEBUG)
    with trio.fail_after(LIMIT):
        async with site(failing_script(kind)) as served:
            run = await served.start()
            read = await read_sse(run.events_url)
    done = read.events[-1]
    assert isinstance(done, RunDone)
    assert (done.status, done.code) == ("error", code)
    wire = msgspec.json.decode(read.data[-1])
    assert set(wire) <= {
        "type",
        "run_id",
        "seq",
        "elapsed_ms",
        "status",
        "code",
        "attempts",
        "requests",
        "retryable",
    }
    body = b"\n".join(read.data)
    for word in (b"Traceback", b'File "', b"Error", b"secret plan", b"Par", b"upstream"):
        assert word not in body, word
    assert "Traceback" not in caplog.text


@pytest.mark.parametrize("opted_in", [False, True], ids=["default", "opted-in"])
async def test_s16_reasoning_and_tool_arguments_only_when_opted_in(
    loop_clock: trio.testing.MockClock, opted_in: bool
) -> None:
    reasoning = (
        b'data: {"id":"c","choices":[{"index":0,"delta":{"reasoning_content":"secret plan"}}]}\n\n'
    )
    body = tool_stream(['{"city": ', '"Paris"}']).body
    chunks = [b for b in body if isinstance(b, bytes)]
    script = [Reply(chunks=(chunks[0], reasoning, *chunks[1:]))]
    with trio.fail_after(LIMIT):
        async with site(script, reasoning=opted_in, tool_arguments=opted_in) as served:
            run = await served.start()
            read = await read_sse(run.events_url)
    data = b"\n".join(read.data)
    assert (b"secret plan" in data) is opted_in
    assert (b"Paris" in data) is opted_in
    done = read.events[-1]
    assert isinstance(done, RunDone)
    assert done.code == "completed"
