"""S31: a WebSocket subscriber that ends its side early gets what RFC 6455 owes it, as an SSE
subscriber that half-closes gets its whole stream (S25).

- A TCP half-close (`shutdown(SHUT_WR)`) without a close frame: the client still reads. It
  gets every event up to the run's end, then a close frame (1000 `done`), then the server
  closes the connection (§7.1.1: the server closes TCP first).
- A close frame sent early: the client asks to end the session. The server answers with its
  own close frame at once (§5.5.1: "as soon as practical"), echoing the code, and closes.
- A client that closed its connection outright is let go at once (the unsolicited pong that
  probes its end of stream is answered by a reset), not at the next heartbeat.

Each peer is a raw socket speaking the frames by hand, or trio-websocket, against a real server
on 127.0.0.1.
"""

from __future__ import annotations

import struct

import msgspec
import pytest
import trio
import trio_websocket
from rillet.transports.server import Limits

from ..server_support import Served, serving, text_reply
from .test_reliability_websocket import frame
from .test_server_ws import raw_handshake, server_frames, ws_url

WORDS = [f"w{n} " for n in range(30)]
CLOSE, PONG, TEXT = 0x8, 0xA, 0x1


async def read_to_the_end(stream: trio.SocketStream, rest: bytearray) -> list[tuple[int, bytes]]:
    """Every frame the server sends until it closes the connection."""
    frames = []
    try:
        while True:
            frames.append(await server_frames(stream, rest))
    except (EOFError, trio.BrokenResourceError):
        pass
    return frames


async def session(served: Served, run: dict[str, str]) -> tuple[trio.SocketStream, bytearray]:
    """A raw WebSocket session on the run: the stream and what followed the answer's head."""
    path = ws_url(served, run).removeprefix(served.ws_base)
    stream, answer = await raw_handshake(served, path)
    assert answer.startswith(b"HTTP/1.1 101 "), answer
    return stream, bytearray(answer.split(b"\r\n\r\n", 1)[1])


async def subscribers(served: Served) -> int:
    count: int = (await served.client.get("/metrics.json")).json()["subscribers"]
    return count


@pytest.mark.parametrize("live", [True, False], ids=["live-run", "finished-run"])
async def test_s31_a_websocket_client_that_half_closes_gets_every_event_and_a_close(
    live: bool,
) -> None:
    script = [text_reply(WORDS, chunk_delay=0.01)]
    with trio.fail_after(20):
        async with serving(script) as served:
            run = await served.start()
            if not live:
                await served.wait_for(run["run_id"])
            stream, rest = await session(served, run)
            async with stream:
                await stream.send_eof()  # shutdown(SHUT_WR): no close frame, still reading
                frames = await read_to_the_end(stream, rest)
            log = served.log(run["run_id"])
    texts = [payload for opcode, payload in frames if opcode == TEXT]
    assert texts == log  # every event, in order, once: up to run.done
    assert msgspec.json.decode(texts[-1])["type"] == "run.done"
    assert {opcode for opcode, _ in frames} <= {TEXT, PONG, CLOSE}  # pongs probe and beat
    opcode, payload = frames[-1]
    assert opcode == CLOSE
    assert (struct.unpack("!H", payload[:2])[0], payload[2:]) == (1000, b"done")


async def test_s31_a_websocket_client_that_sends_its_close_early_gets_a_prompt_close() -> None:
    """A raw client sends its close frame right after the handshake; the server answers it
    while the run still streams (the run is silent after its first words and never ends)."""
    script = [text_reply(WORDS, stall_after=3)]
    with trio.fail_after(10):
        async with serving(script, limits=Limits(heartbeat=3600)) as served:
            run = await served.start()
            stream, rest = await session(served, run)
            async with stream:
                await stream.send_all(frame(CLOSE, struct.pack("!H", 1000)))
                frames = await read_to_the_end(stream, rest)
            assert await subscribers(served) == 0
            done = [e for e in served.log(run["run_id"]) if b'"run.done"' in e]
    assert done == []  # the run was still going: the close came at once, not at its end
    opcode, payload = frames[-1]
    assert opcode == CLOSE
    assert struct.unpack("!H", payload[:2])[0] == 1000  # the client's code, echoed
    assert all(opcode == TEXT for opcode, _ in frames[:-1])


async def test_s31_a_trio_websocket_client_that_closes_early_gets_the_close_handshake() -> None:
    script = [text_reply(WORDS, stall_after=3)]
    with trio.fail_after(10):
        async with serving(script, limits=Limits(heartbeat=3600)) as served:
            run = await served.start()
            async with trio_websocket.open_websocket_url(ws_url(served, run)) as ws:
                first = await ws.get_message()
                await ws.aclose(1000, "enough")  # waits for the server's close frame
                closed = ws.closed
            while await subscribers(served):  # noqa: ASYNC110 (no event says a subscriber went)
                await trio.sleep(0.01)
    assert msgspec.json.decode(first)["type"] == "run.started"
    assert closed is not None
    assert closed.code == 1000


async def test_s31_a_websocket_client_that_closes_without_a_close_frame_is_let_go_at_once() -> None:
    """Its end of stream could be a half-close; the reset its kernel sends back to the
    server's probe pong says it closed: the subscriber goes with no heartbeat due for an hour
    and the run silent."""
    script = [text_reply(WORDS, stall_after=3)]
    with trio.fail_after(10):
        async with serving(script, limits=Limits(heartbeat=3600)) as served:
            run = await served.start()
            stream, rest = await session(served, run)
            assert (await server_frames(stream, rest))[0] == TEXT  # the session is under way
            await stream.aclose()
            while await subscribers(served):  # noqa: ASYNC110 (no event says a subscriber went)
                await trio.sleep(0.01)
            done = [e for e in served.log(run["run_id"]) if b'"run.done"' in e]
    assert done == []  # let go while the run was still silent, long before any heartbeat
