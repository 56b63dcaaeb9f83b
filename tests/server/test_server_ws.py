"""The delivery server over WebSocket: run events as text frames, resume with `?after=`, and the
close codes (1000 done, 1013 fell behind, 1008 policy, 1009 too big, 1003 binary, 1007 invalid
UTF-8).

trio-websocket is the client, as an application would use it, on a socket the test opens and
closes itself: trio-websocket 0.12's `open_websocket_url` leaves its socket open when the server
closes first, which every test here makes it do. Where a client must send what trio-websocket
will not (invalid UTF-8), a raw socket speaks the frames by hand.
"""

from __future__ import annotations

import base64
import contextlib
import logging
import os
import socket
import struct
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import attrs
import h11
import httpx
import msgspec
import pytest
import trio
import trio_websocket
from rillet._core._runevents import AnswerDelta, AttemptResetEvent, RunDone, decode_run_event
from rillet._hub._hub import Hub, MemoryRunLog
from rillet.transports.server import Limits
from rillet.transports.server._http11 import _request as http_request
from rillet.transports.server._ws import handshake_problem

from ..server_support import (
    Served,
    act,
    dropped_then_ok,
    raw_exchange,
    read_sse,
    serving,
    text_reply,
    texts,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from rillet._core._runevents import RunEvent

STALLED = [text_reply(["Hel", "lo"], stall_after=3)]  # a run that goes silent, never ends


@attrs.define
class Received:
    """What a WebSocket client got, and how the server closed."""

    messages: list[str]
    code: int | None
    reason: str | None

    @property
    def events(self) -> list[RunEvent]:
        return [decode_run_event(m) for m in self.messages]

    @property
    def seqs(self) -> list[int]:
        return [e.seq for e in self.events]


async def receive_all(ws: trio_websocket.WebSocketConnection) -> Received:
    """Every message until the server closes."""
    messages: list[str] = []
    try:
        while True:
            message = await ws.get_message()
            assert isinstance(message, str)
            messages.append(message)
    except trio_websocket.ConnectionClosed as closed:
        reason = closed.reason
    return Received(messages, reason.code if reason else None, reason.reason if reason else None)


@asynccontextmanager
async def connect(
    url: str, *, receive_buffer: int | None = None
) -> AsyncIterator[trio_websocket.WebSocketConnection]:
    """A trio-websocket client connection to `url`; `receive_buffer` sets the socket's
    `SO_RCVBUF` (a client that stops reading then backs up quickly)."""
    parts = urlsplit(url)
    assert parts.hostname is not None
    assert parts.port is not None
    sock = trio.socket.socket()
    if receive_buffer is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    await sock.connect((parts.hostname, parts.port))
    resource = parts.path + (f"?{parts.query}" if parts.query else "")
    async with trio.SocketStream(sock) as stream, trio.open_nursery() as nursery:
        ws = await trio_websocket.wrap_client_stream(nursery, stream, parts.hostname, resource)
        try:
            yield ws
        finally:
            with trio.move_on_after(1):
                await ws.aclose()
            nursery.cancel_scope.cancel()


async def follow(url: str) -> Received:
    """Connect, read until the server closes."""
    async with connect(url) as ws:
        return await receive_all(ws)


def ws_url(
    served: Served, run: dict[str, str], *, token: str | None = None, after: str = ""
) -> str:
    url = f"{served.ws_base}/v1/runs/{run['run_id']}/ws?token={token or run['token']}"
    return url + (f"&after={after}" if after else "")


# --- delivery -------------------------------------------------------------------------------------


async def test_events_arrive_in_order_and_run_done_closes_1000() -> None:
    with trio.fail_after(5):
        async with serving() as served:
            run = await served.start()
            got = await follow(ws_url(served, run))
            log = served.log(run["run_id"])
    assert [m.encode() for m in got.messages] == log  # the hub's JSON, one frame per event
    assert got.seqs == list(range(1, len(log) + 1))
    assert isinstance(got.events[-1], RunDone)
    assert (got.code, got.reason) == (1000, "done")


async def test_resume_with_after_at_every_point_gets_each_event_once() -> None:
    with trio.fail_after(10):
        async with serving() as served:
            run = await served.start()
            await served.wait_for(run["run_id"])
            log = served.log(run["run_id"])
            for k in range(len(log) + 1):
                after = str(k) if k % 2 else f"{run['run_id']}:{k}"  # both cursor spellings
                rest = await follow(ws_url(served, run, after=after))
                assert rest.code == 1000
                assert [m.encode() for m in rest.messages] == log[k:], k


async def test_client_json_messages_within_the_rate_are_accepted() -> None:
    with trio.fail_after(5):
        async with serving([text_reply(headers_delay=0.1)]) as served:
            run = await served.start()
            async with connect(ws_url(served, run)) as ws:
                for _ in range(5):
                    await ws.send_message('{"type": "ping"}')
                got = await receive_all(ws)
    assert got.code == 1000
    assert isinstance(got.events[-1], RunDone)


async def test_many_subscribers_each_see_the_reset_and_one_completed_end() -> None:
    words = [f"{n} " for n in range(10)]
    script = [*dropped_then_ok(words, 10)[:1], text_reply(words, headers_delay=0.05)]
    script[0] = attrs.evolve(script[0], headers_delay=0.3)
    with trio.fail_after(15):
        async with serving(script, limits=Limits(max_subscribers_per_client=1000)) as served:
            run = await served.start()
            results: list[Received] = []

            async def one() -> None:
                results.append(await follow(ws_url(served, run)))

            async with trio.open_nursery() as nursery:
                for _ in range(100):
                    nursery.start_soon(one)
    assert len(results) == 100
    for got in results:
        kinds = [type(e) for e in got.events]
        assert kinds.count(AttemptResetEvent) == 1
        assert kinds[:12].count(AnswerDelta) == 10  # the ten voided fragments, then the reset
        assert kinds.index(AttemptResetEvent) > 10
        assert texts(got.events) == "".join(words)
        assert kinds.count(RunDone) == 1
        done = got.events[-1]
        assert isinstance(done, RunDone)
        assert done.status == "completed"
        assert got.seqs == list(range(1, len(got.seqs) + 1))


async def test_a_subscriber_that_stops_reading_is_closed_1013_and_resumes() -> None:
    words = ["x" * 2000 for _ in range(250)]
    # paced, so a client that reads keeps up; the one that stops reading falls behind anyway
    script = [text_reply(words, per_chunk=4, chunk_delay=0.002, headers_delay=0.2)]
    with trio.fail_after(10):
        async with serving(script, hub=Hub(buffer=100)) as served:
            run = await served.start()
            fast_done = trio.Event()
            fast: list[Received] = []

            async def read_fast() -> None:
                fast.append(await follow(ws_url(served, run)))
                fast_done.set()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(read_fast)
                async with connect(ws_url(served, run), receive_buffer=16384) as slow_ws:
                    await fast_done.wait()  # read nothing until the run is over
                    slow = await receive_all(slow_ws)
            resumed = await follow(ws_url(served, run, after=str(slow.seqs[-1])))
            log = served.log(run["run_id"])
    assert (fast[0].code, len(fast[0].messages)) == (1000, len(log))
    assert [m.encode() for m in fast[0].messages] == log  # nobody else was slowed or cut
    assert (slow.code, slow.reason) == (1013, "fell_behind")
    assert slow.seqs == list(range(1, len(slow.seqs) + 1))
    assert [m.encode() for m in slow.messages + resumed.messages] == log
    assert resumed.code == 1000


# --- refusals -------------------------------------------------------------------------------------


async def test_unknown_run_and_wrong_token_close_1008_alike() -> None:
    with trio.fail_after(5):
        async with serving() as served:
            mine, other = await served.start(), await served.start()
            wrong = await follow(ws_url(served, mine, token=other["token"]))
            unknown = await follow(ws_url(served, {**mine, "run_id": "ab" * 12}))
    assert (wrong.code, wrong.reason) == (1008, "not_found")
    assert (unknown.code, unknown.reason) == (wrong.code, wrong.reason)
    assert wrong.messages == unknown.messages == []


@pytest.mark.parametrize(("after", "reason"), [("x", "cursor_invalid"), ("999", "cursor_invalid")])
async def test_a_bad_cursor_closes_1008_before_any_event(after: str, reason: str) -> None:
    with trio.fail_after(5):
        async with serving() as served:
            run = await served.start()
            await served.wait_for(run["run_id"])
            got = await follow(ws_url(served, run, after=after))
    assert (got.code, got.reason) == (1008, reason)
    assert got.messages == []


async def test_a_cursor_below_the_kept_log_closes_1008_cursor_expired() -> None:
    hub = Hub(log=MemoryRunLog(max_events=16))
    with trio.fail_after(5):
        async with serving([text_reply([f"{n} " for n in range(40)])], hub=hub) as served:
            run = await served.start()
            await served.wait_for(run["run_id"])
            got = await follow(ws_url(served, run, after="1"))
    assert (got.code, got.reason) == (1008, "cursor_expired")
    assert got.messages == []


async def test_subscribers_over_the_limit_close_1008() -> None:
    with trio.fail_after(5):
        async with serving(STALLED, limits=Limits(max_subscribers_per_run=1)) as served:
            run = await served.start()
            async with connect(ws_url(served, run)) as first:
                assert decode_run_event(await first.get_message()).seq == 1
                second = await follow(ws_url(served, run))
    assert (second.code, second.reason) == (1008, "too_many_subscribers")


async def test_a_message_over_64_kib_closes_1009() -> None:
    with trio.fail_after(5):
        async with serving(STALLED) as served:
            run = await served.start()
            async with connect(ws_url(served, run)) as ws:
                await ws.send_message('"' + "x" * (64 * 1024) + '"')
                got = await receive_all(ws)
    assert got.code == 1009


async def test_a_binary_message_closes_1003() -> None:
    with trio.fail_after(5):
        async with serving(STALLED) as served:
            run = await served.start()
            async with connect(ws_url(served, run)) as ws:
                await ws.send_message(b"\x00\x01")
                got = await receive_all(ws)
    assert got.code == 1003


async def test_text_that_is_not_json_closes_1008() -> None:
    with trio.fail_after(5):
        async with serving(STALLED) as served:
            run = await served.start()
            async with connect(ws_url(served, run)) as ws:
                await ws.send_message("hello?")
                got = await receive_all(ws)
    assert (got.code, got.reason) == (1008, "not_json")


async def test_a_flood_past_the_rate_closes_1008_and_others_are_unaffected() -> None:
    with trio.fail_after(5):
        async with serving([text_reply(headers_delay=0.3)]) as served:
            run = await served.start()
            calm: list[Received] = []

            async def read_calm() -> None:
                calm.append(await follow(ws_url(served, run)))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(read_calm)
                async with connect(ws_url(served, run)) as ws:
                    sent = 0
                    try:
                        for _ in range(200):
                            await ws.send_message("{}")
                            sent += 1
                    except trio_websocket.ConnectionClosed:
                        pass
                    flood = await receive_all(ws)
            log = served.log(run["run_id"])
    assert (flood.code, flood.reason) == (1008, "rate_limited")
    assert sent > 40  # the burst was allowed
    assert [m.encode() for m in calm[0].messages] == log
    assert calm[0].code == 1000


# --- invalid UTF-8 and the handshake, over a raw socket -------------------------------------------


def client_frame(opcode: int, payload: bytes) -> bytes:
    """One masked frame, as a client must send it (payloads under 126 bytes)."""
    mask = os.urandom(4)
    masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    return bytes([0x80 | opcode, 0x80 | len(payload)]) + mask + masked


async def server_frames(stream: trio.SocketStream, buffer: bytearray) -> tuple[int, bytes]:
    """The next frame from the server: its opcode and payload."""

    async def need(n: int) -> bytes:
        while len(buffer) < n:
            data = await stream.receive_some(65536)
            if not data:
                raise EOFError
            buffer.extend(data)
        chunk = bytes(buffer[:n])
        del buffer[:n]
        return chunk

    first, second = await need(2)
    size = second & 0x7F
    if size == 126:
        (size,) = struct.unpack("!H", await need(2))
    elif size == 127:
        (size,) = struct.unpack("!Q", await need(8))
    return first & 0x0F, await need(size)


async def raw_handshake(
    served: Served, path: str, then: bytes = b"", eof: bool = False, /, **headers: str
) -> tuple[trio.SocketStream, bytes]:
    """Send a WebSocket handshake, in the same write the bytes `then` (frames sent before the
    answer), and with `eof` the end of the client's side; the stream and what came back up to
    the end of the answer's head."""
    host, port = served.url.removeprefix("http://").rsplit(":", 1)
    stream = await trio.open_tcp_stream(host, int(port))
    fields = {
        "Host": f"{host}:{port}",
        "Upgrade": "websocket",
        "Connection": "Upgrade",
        "Sec-WebSocket-Key": base64.b64encode(os.urandom(16)).decode(),
        "Sec-WebSocket-Version": "13",
        **headers,
    }
    head = f"GET {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in fields.items())
    await stream.send_all(head.encode() + b"\r\n" + then)
    if eof:
        await stream.send_eof()
    answer = b""
    while b"\r\n\r\n" not in answer:
        data = await stream.receive_some(65536)
        if not data:
            break
        answer += data
    return stream, answer


async def test_invalid_utf8_in_a_text_message_closes_1007() -> None:
    with trio.fail_after(5):
        async with serving(STALLED) as served:
            run = await served.start()
            path = ws_url(served, run).removeprefix(served.ws_base)
            stream, answer = await raw_handshake(served, path)
            async with stream:
                assert answer.startswith(b"HTTP/1.1 101 ")
                rest = bytearray(answer.split(b"\r\n\r\n", 1)[1])
                await stream.send_all(client_frame(0x1, b'"\xff\xfe"'))
                opcode, payload = await server_frames(stream, rest)
                while opcode != 0x8:
                    opcode, payload = await server_frames(stream, rest)
    assert struct.unpack("!H", payload[:2])[0] == 1007


@pytest.mark.parametrize("eof", ["after-the-handshake", "with-the-request"])
@pytest.mark.parametrize("stalled", [True, False], ids=["live-run", "finished-run"])
async def test_a_client_that_ends_its_side_gets_no_close_code_reserved_for_no_close(
    stalled: bool, eof: str
) -> None:
    # the client ends its side of the connection without a close frame: trio-websocket calls
    # that 1006 (abnormal closure), a code RFC 6455 §7.4.1 forbids in a close frame; a client
    # that only half-closed reads on to the run's end (a live run is cancelled to end it)
    with trio.fail_after(5):
        async with serving(STALLED if stalled else None) as served:
            run = await served.start()
            if not stalled:
                await served.wait_for(run["run_id"])
            path = ws_url(served, run).removeprefix(served.ws_base)
            stream, answer = await raw_handshake(served, path, b"", eof == "with-the-request")
            async with stream:
                assert answer.startswith(b"HTTP/1.1 101 ")
                rest = bytearray(answer.split(b"\r\n\r\n", 1)[1])
                with contextlib.suppress(trio.ClosedResourceError):
                    await stream.send_eof()
                if stalled:
                    cancelled = await served.client.delete(
                        f"/v1/runs/{run['run_id']}", headers=act(run)
                    )
                    assert cancelled.status_code == 202
                codes = []
                with contextlib.suppress(EOFError, trio.BrokenResourceError):
                    while True:
                        opcode, payload = await server_frames(stream, rest)
                        if opcode == 0x8:
                            codes.append(struct.unpack("!H", payload[:2])[0] if payload else None)
    assert codes == [1000]


async def test_handshake_refusals_are_plain_http() -> None:
    with trio.fail_after(5):
        async with serving(STALLED) as served:
            run = await served.start()
            path = ws_url(served, run).removeprefix(served.ws_base)
            plain = await served.client.get(path)
            old, old_answer = await raw_handshake(served, path, **{"Sec-WebSocket-Version": "8"})
            await old.aclose()
            other, other_answer = await raw_handshake(served, path, Origin="https://evil.example")
            await other.aclose()
    assert plain.status_code == 426
    assert old_answer.startswith(b"HTTP/1.1 426 ")
    assert b"sec-websocket-version: 13" in old_answer.lower()
    assert other_answer.startswith(b"HTTP/1.1 403 ")


def _upgrade(served: Served, path: str, extra: bytes = b"") -> bytes:
    """A WebSocket handshake's bytes, with `extra` header lines."""
    host = served.url.removeprefix("http://").encode()
    key = base64.b64encode(os.urandom(16))
    return (
        b"GET %s HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\n%s\r\n"
    ) % (path.encode(), host, key, extra)


@pytest.mark.parametrize("extra", [b"Connection: close\r\n", b"Connection: keep-alive\r\n"])
async def test_a_handshake_with_a_header_repeated_is_refused_in_plain_http(
    extra: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    # wsproto reads the last Connection header only: it refused the handshake this server
    # accepted, with a bare 400 of its own, and the connection then waited out its head
    # deadline and failed with an error logged
    with trio.fail_after(5):
        async with serving(STALLED, limits=Limits(head_timeout=3.0)) as served:
            run = await served.start()
            path = ws_url(served, run).removeprefix(served.ws_base)
            started = trio.current_time()
            answer = await raw_exchange(served.url, _upgrade(served, path, extra))
            took = trio.current_time() - started
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 "), answer[:200]
    assert b"x-content-type-options: nosniff" in head
    assert msgspec.json.decode(body)["error"]["type"] == "bad_handshake"
    assert took < 1.0
    assert not [record for record in caplog.records if record.levelno >= logging.ERROR]


async def test_a_handshake_wsproto_refuses_ends_at_its_deadline_without_an_error(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # whatever wsproto refuses that the checks let through: trio-websocket then waits for ever,
    # and the deadline's TooSlowError, raised in a nursery, came wrapped in a group the route
    # did not catch
    monkeypatch.setattr("rillet.transports.server._fanout.handshake_problem", lambda _: None)
    with trio.fail_after(5):
        async with serving(STALLED, limits=Limits(head_timeout=0.3)) as served:
            run = await served.start()
            path = ws_url(served, run).removeprefix(served.ws_base)
            answer = await raw_exchange(
                served.url, _upgrade(served, path, b"Connection: close\r\n")
            )
    assert answer.startswith(b"HTTP/1.1 400 ")  # wsproto's own
    assert not [record for record in caplog.records if record.levelno >= logging.ERROR]


@pytest.mark.parametrize(
    ("host", "problem"),
    [(b"xn--a", "Host is not a host name"), (b"xn--zz:80", "Host is not a host name")],
)
def test_a_handshake_whose_host_wsproto_cannot_read_is_refused(host: bytes, problem: str) -> None:
    # wsproto decodes Host as IDNA: a punycode label that does not decode failed its reader task
    # (a server off loopback answers any Host)
    head = h11.Request(
        method="GET",
        target="/v1/runs/r/ws",
        headers=[
            (b"Host", host),
            (b"Upgrade", b"websocket"),
            (b"Connection", b"Upgrade"),
            (b"Sec-WebSocket-Key", base64.b64encode(os.urandom(16))),
            (b"Sec-WebSocket-Version", b"13"),
        ],
    )
    assert handshake_problem(http_request(head, "203.0.113.9")) == (400, problem)


async def test_sse_and_websocket_subscribers_share_one_run() -> None:
    with trio.fail_after(5):
        async with serving([text_reply(headers_delay=0.1)]) as served:
            run = await served.start()
            results: dict[str, list[bytes]] = {}

            async def by_ws() -> None:
                results["ws"] = [m.encode() for m in (await follow(ws_url(served, run))).messages]

            async def by_sse() -> None:
                async with httpx.AsyncClient(timeout=None) as client:
                    stream = await read_sse(client, run["events_url"])
                results["sse"] = [e.data.encode() for e in stream.events]

            async with trio.open_nursery() as nursery:
                nursery.start_soon(by_ws)
                nursery.start_soon(by_sse)
            log = served.log(run["run_id"])
    assert results["ws"] == results["sse"] == log
