"""Fan-out on the wire: a run's events encoded once (WebSocket text frames built here), written
straight to many connections without waiting (`ConnectionStream.try_send`), several writers on
one connection kept whole, and a write cut short by a full socket finished without waiting for
another event."""

from __future__ import annotations

import socket
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

import pytest
import trio
import trio.testing
from rillet._core._runevents import AnswerDelta, decode_run_event
from rillet.frames import SSEDecoder
from rillet.transports.server import Limits
from rillet.transports.server._http11 import ConnectionStream
from rillet.transports.server._ws import text_frame
from wsproto.frame_protocol import FrameProtocol

from ..server_support import Served, serving, text_reply
from .test_server_ws import connect, ws_url

if TYPE_CHECKING:
    from collections.abc import AsyncIterator


# --- the frame ------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [0, 1, 125, 126, 127, 65535, 65536, 70000])
def test_text_frame_is_the_frame_wsproto_sends_as_a_server(size: int) -> None:
    payload = ("é" * size).encode()[:size].decode("utf-8", "ignore").encode()
    expected = FrameProtocol(client=False, extensions=[]).send_data(payload.decode(), fin=True)
    assert text_frame(payload) == expected


# --- the stream -----------------------------------------------------------------------------


@asynccontextmanager
async def stream_pair(
    send_buffer: int | None = None,
) -> AsyncIterator[tuple[ConnectionStream, trio.SocketStream]]:
    """A server-side `ConnectionStream` and the client's end of a connected socket pair."""
    a, b = trio.socket.socketpair()
    if send_buffer is not None:
        a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, send_buffer)
        b.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, send_buffer)
    server, client = ConnectionStream(trio.SocketStream(a)), trio.SocketStream(b)
    try:
        yield server, client
    finally:
        await server.close_transport()
        await client.aclose()


async def read_exactly(stream: trio.SocketStream, n: int) -> bytes:
    data = bytearray()
    while len(data) < n:
        chunk = await stream.receive_some(65536)
        assert chunk, "the connection ended early"
        data += chunk
    return bytes(data)


def parked(stream: ConnectionStream) -> bool:
    return stream.parked


async def test_try_send_writes_at_once_and_refuses_while_bytes_are_parked() -> None:
    async with stream_pair(send_buffer=4096) as (server, client):
        assert server.try_send(b"hello")
        assert await client.receive_some(100) == b"hello"
        big = bytes(range(256)) * 4096  # 1 MiB: more than the socket takes at once
        assert server.try_send(big)  # part written, the rest parked
        assert parked(server)
        assert not server.try_send(b"after")  # nothing may overtake the parked bytes
        async with trio.open_nursery() as nursery:
            nursery.start_soon(server.flush)
            assert await read_exactly(client, len(big)) == big
        assert not parked(server)
        await server.aclose()
        assert not server.try_send(b"closed")


async def test_concurrent_writers_go_out_whole_once_and_in_order() -> None:
    first = b"a" * 300_000
    second = b"b" * 300_000
    third = b"c" * 1000
    async with stream_pair(send_buffer=4096) as (server, client), trio.open_nursery() as nursery:
        nursery.start_soon(server.send_all, first)  # blocks: nobody reads yet
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(server.send_all, second)  # another task (a pong, say) meanwhile
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(server.send_all, third)
        await trio.testing.wait_all_tasks_blocked()
        received = await read_exactly(client, len(first) + len(second) + len(third))
    assert received == first + second + third


# --- pushes cut short -----------------------------------------------------------------------

BIG = ["x" * 60_000]  # far more than the socket buffers hold, and the last event


async def wait_for_deltas(served: Served, run_id: str, n: int) -> None:
    def deltas() -> int:
        return sum(isinstance(decode_run_event(d), AnswerDelta) for d in served.log(run_id))

    while deltas() < n:  # noqa: ASYNC110 (the hub has no event for it)
        await trio.sleep(0.01)


async def test_a_websocket_push_cut_short_is_finished_though_no_event_follows() -> None:
    # the provider waits until the subscriber is on, then sends the big deltas in one chunk (one
    # append) and goes silent: the hub pushes them to the waiting subscriber, whose socket takes
    # only part, and no later event comes to carry the rest
    script = [text_reply(BIG, per_chunk=1 + len(BIG), headers_delay=0.3, stall_after=1)]
    # (two subscribers: the hub wakes one, the leader, which reads for itself, and pushes to
    # the other)
    got: list[list[str]] = [[], []]
    with trio.fail_after(10):
        async with serving(script, limits=Limits(send_buffer=4096)) as served:
            run = await served.start()
            async with (
                connect(ws_url(served, run), receive_buffer=4096) as one,
                connect(ws_url(served, run), receive_buffer=4096) as other,
            ):
                await wait_for_deltas(served, run["run_id"], len(BIG))
                await trio.sleep(0.1)  # everything is written or parked by now
                for ws, texts in zip((one, other), got, strict=True):
                    while len(texts) < len(BIG):
                        event = decode_run_event(await ws.get_message())
                        if isinstance(event, AnswerDelta):
                            texts.append(event.delta)
    assert got == [BIG, BIG]


async def test_an_sse_push_cut_short_is_finished_though_no_event_follows() -> None:
    script = [text_reply(BIG, per_chunk=1 + len(BIG), headers_delay=0.3, stall_after=1)]
    got: list[list[str]] = []
    with trio.fail_after(10):
        async with serving(script, limits=Limits(send_buffer=4096)) as served:
            run = await served.start()
            host, port = served.url.removeprefix("http://").rsplit(":", 1)
            path = run["events_url"].removeprefix(served.url)
            streams = []
            for _ in range(2):  # one leader, one pushed to
                sock = trio.socket.socket()
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                await sock.connect((host, int(port)))
                stream = trio.SocketStream(sock)
                streams.append(stream)
                request = f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n"
                await stream.send_all(request.encode())
            await wait_for_deltas(served, run["run_id"], len(BIG))
            await trio.sleep(0.1)
            for stream in streams:
                body = bytearray()
                texts: list[str] = []
                while len(texts) < len(BIG):
                    body += await stream.receive_some(65536)
                    head, _, chunked = bytes(body).partition(b"\r\n\r\n")
                    assert head.startswith(b"HTTP/1.1 200 ")
                    events = SSEDecoder().feed(dechunk(chunked))
                    deltas = [decode_run_event(e.data.encode()) for e in events]
                    texts = [d.delta for d in deltas if isinstance(d, AnswerDelta)]
                got.append(texts)
                await stream.aclose()
    assert got == [BIG, BIG]


def dechunk(data: bytes) -> bytes:
    """The body of a chunked transfer encoding (as far as it is complete)."""
    out = bytearray()
    while True:
        size_line, sep, rest = data.partition(b"\r\n")
        if not sep:
            return bytes(out)
        size = int(size_line, 16)
        if size == 0 or len(rest) < size + 2:
            return bytes(out)
        out += rest[:size]
        data = rest[size + 2 :]
