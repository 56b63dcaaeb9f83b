"""S06-S08 at the frame level: a WebSocket client that sends frames, not messages.

trio-websocket answers every ping, keeps each fragment of a message until it ends, and waits for
a frame's whole declared length; the server counts what it does not (`ClientFrames`). Each test
speaks the frames by hand on a raw socket to a real server on 127.0.0.1, while a well-behaved
subscriber of the same run reads it to its end.
"""

from __future__ import annotations

import logging
import os
import struct
from typing import TYPE_CHECKING, cast

import pytest
import trio
import trio.lowlevel
from rillet.transports.server._ws_frames import MAX_FRAGMENTS, ClientFrames, TokenBucket

from ..server_support import Served, serving, text_reply
from .test_server_ws import STALLED, follow, raw_handshake, server_frames, ws_url

if TYPE_CHECKING:
    from rillet.transports.server._http11 import ConnectionStream

    from .test_server_ws import Received


def frame(opcode: int, payload: bytes = b"", *, fin: bool = True, size: int | None = None) -> bytes:
    """One masked client frame; `size` declares another payload length than the payload's."""
    length = len(payload) if size is None else size
    first = (0x80 if fin else 0) | opcode
    if length < 126:
        head = bytes([first, 0x80 | length])
    elif length < 65536:
        head = bytes([first, 0x80 | 126]) + struct.pack("!H", length)
    else:
        head = bytes([first, 0x80 | 127]) + struct.pack("!Q", length)
    mask = os.urandom(4)
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


async def close_of(served: Served, run: dict[str, str], frames: bytes) -> tuple[int, bytes]:
    """Open the run's WebSocket by hand, send `frames` in one write, and read to the server's
    close frame: its code and reason."""
    path = ws_url(served, run).removeprefix(served.ws_base)
    stream, answer = await raw_handshake(served, path)
    async with stream:
        assert answer.startswith(b"HTTP/1.1 101 "), answer
        rest = bytearray(answer.split(b"\r\n\r\n", 1)[1])
        await stream.send_all(frames)
        opcode, payload = await server_frames(stream, rest)
        while opcode != 0x8:
            opcode, payload = await server_frames(stream, rest)
    return struct.unpack("!H", payload[:2])[0], payload[2:]


async def attacked(frames: bytes) -> tuple[tuple[int, bytes], Received, list[bytes]]:
    """The close the attacker got, what a calm subscriber of the same run read meanwhile, and
    the run's log."""
    calm: list[Received] = []
    async with serving([text_reply(headers_delay=0.3)]) as served:
        run = await served.start()

        async def read_calm() -> None:
            calm.append(await follow(ws_url(served, run)))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(read_calm)
            closed = await close_of(served, run, frames)
        log = served.log(run["run_id"])
    return closed, calm[0], log


def unaffected(calm: Received, log: list[bytes]) -> None:
    assert [m.encode() for m in calm.messages] == log
    assert calm.code == 1000


@pytest.mark.parametrize("opcode", [0x9, 0xA], ids=["ping", "pong"])
async def test_s07_pings_and_pongs_count_against_the_rate(
    opcode: int, caplog: pytest.LogCaptureFixture
) -> None:
    # one write of 2,000 empty pings (or pongs): the burst of 40 passes, the 41st is refused;
    # the pings after it are never answered, and a ping trio-websocket read after the close was
    # sent is no error of the server's
    with trio.fail_after(10):
        closed, calm, log = await attacked(frame(opcode) * 2000)
    assert closed == (1008, b"rate_limited")
    unaffected(calm, log)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def test_s07_messages_and_pings_share_one_rate() -> None:
    with trio.fail_after(10):
        closed, calm, log = await attacked(frame(0x1, b"{}") * 30 + frame(0x9) * 30)
    assert closed == (1008, b"rate_limited")
    unaffected(calm, log)


async def test_s08_a_message_that_never_ends_in_empty_fragments_is_closed() -> None:
    # empty continuation frames never make the message bigger: without a count, one message
    # could go on for ever, each fragment kept until its end
    flood = frame(0x1, b'"', fin=False) + frame(0x0, fin=False) * 20_000
    with trio.fail_after(10):
        closed, calm, log = await attacked(flood)
    assert closed == (1008, b"too_many_fragments")
    unaffected(calm, log)


async def test_s08_a_message_within_the_fragment_cap_is_accepted() -> None:
    pieces = [frame(0x1, b'"', fin=False)]
    pieces += [frame(0x0, b"x", fin=False)] * (MAX_FRAGMENTS - 2)
    pieces.append(frame(0x0, b'"'))
    with trio.fail_after(10):
        closed, calm, log = await attacked(b"".join(pieces))
    assert closed == (1000, b"done")  # read to the run's end, like the calm one
    unaffected(calm, log)


async def test_s08_a_frame_declaring_more_than_the_limit_is_closed_1009_at_once() -> None:
    # the header alone: the server does not wait for 2**62 bytes to refuse them
    with trio.fail_after(10):
        closed, calm, log = await attacked(frame(0x1, size=2**62)[:14])
    assert closed[0] == 1009
    unaffected(calm, log)


@pytest.mark.parametrize(
    ("frames", "closed"),
    [
        (frame(0x1, b"not json"), (1008, b"not_json")),
        (frame(0x2, b"\x00"), (1003, b"binary messages are not accepted")),
        (frame(0x1, b"{}") + frame(0x1, b"\xff\xfe"), (1007, None)),
        (frame(0x9) * 50, (1008, b"rate_limited")),
    ],
    ids=["not-json", "binary", "invalid-utf8", "ping-flood"],
)
async def test_frames_sent_with_the_handshake_are_read_and_counted(
    frames: bytes, closed: tuple[int, bytes | None]
) -> None:
    # a client need not wait for the 101 to send its first frames: they arrive with the
    # handshake, and are read (and counted) as any others; they used to be dropped, so the
    # server and the frame counter read the rest of the stream out of step
    with trio.fail_after(5):
        async with serving(STALLED) as served:
            run = await served.start()
            path = ws_url(served, run).removeprefix(served.ws_base)
            stream, answer = await raw_handshake(served, path, frames)
            async with stream:
                assert answer.startswith(b"HTTP/1.1 101 "), answer
                rest = bytearray(answer.split(b"\r\n\r\n", 1)[1])
                opcode, payload = await server_frames(stream, rest)
                while opcode != 0x8:
                    opcode, payload = await server_frames(stream, rest)
    code, reason = struct.unpack("!H", payload[:2])[0], payload[2:]
    assert code == closed[0]
    assert closed[1] is None or reason == closed[1]


async def test_s03_json_nested_too_deeply_in_a_message_closes_1008(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with trio.fail_after(10):
        closed, calm, log = await attacked(frame(0x1, b"[" * 30_000 + b"]" * 30_000))
    assert closed == (1008, b"nested_too_deeply")
    unaffected(calm, log)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


class _Feed:
    """A connection's reads, `size` bytes at a time (then nothing: the client waits)."""

    def __init__(self, data: bytes, size: int) -> None:
        self.data = data
        self.size = size

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        await trio.lowlevel.checkpoint()
        if not self.data:
            await trio.sleep_forever()
        piece, self.data = self.data[: self.size], self.data[self.size :]
        return piece


@pytest.mark.parametrize("size", [1, 7, 65536], ids=["1-byte", "7-bytes", "whole"])
async def test_s08_frames_are_counted_however_the_bytes_are_cut(size: int) -> None:
    # what passes to trio-websocket ends with the header of the one frame too many, and a few
    # bytes after it at most, wherever the reads cut the frames
    first = frame(0x1, b'"' + b"x" * 200, fin=False)  # a 16-bit length: a longer header
    flood = first + frame(0x0, fin=False) * 1000
    bucket = TokenBucket(20.0, 40)
    frames = ClientFrames(cast("ConnectionStream", _Feed(flood, size)), bucket, max_message=65536)
    passed = bytearray()
    with trio.fail_after(5):
        while not frames.breached.is_set():
            passed += await frames.receive_some(65536)
    allowed = len(first) + MAX_FRAGMENTS * 6  # then the 128th continuation's header (6 bytes)
    assert (frames.code, frames.reason) == (1008, "too_many_fragments")
    assert bytes(passed) == flood[:allowed]
