"""What a WebSocket client sends, counted frame by frame before trio-websocket reads it.

trio-websocket answers every ping, keeps every fragment of a message until the message ends and
waits for a frame's whole declared length; it counts neither frames nor fragments. A client
could make the server answer pings without end, or send empty continuation frames without end
(each one a list entry on the server, a message that never ends and never grows past the size
limit). `ClientFrames` sits between the connection and trio-websocket and reads each frame's
header as the bytes pass:

- a message's first frame, a ping and a pong each take a token from the client's bucket (the
  same rate and burst as messages): past it, 1008 `rate_limited`;
- a message in more than `MAX_FRAGMENTS` frames: 1008 `too_many_fragments`;
- a frame declaring more bytes than the largest message could take: 1009 at once, before its
  payload is waited for.

Past a limit, what follows the offending frame's header is held back: at most
`_LINGER` bytes more reach trio-websocket (room for the client's close frame), then nothing, so
a flood costs no more work once it is refused. `breached` is set; the session closes with
`code` and `reason`.

The client's end of stream without a close frame is not passed on at once: it may be a
half-close (`shutdown(SHUT_WR)`) from a client that still reads. An unsolicited pong probes
it, as an SSE comment probes an event stream: a client that closed answers with a reset, and
trio-websocket then sees the end (1006, the client gone); one that half-closed reads the pong
as nothing, `half_closed` is set and trio-websocket sees a client that says nothing more, so
the session streams on to its end and closes with a close frame of its own. Once that frame
went out, trio-websocket is handed the end of stream: it stops waiting for an answer the client
can no longer send, and the connection closes (RFC 6455 §7.1.1: the server closes TCP first).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs
import trio
from rillet._core._encode import WS_PONG

if TYPE_CHECKING:
    from ._http11 import ConnectionStream

__all__ = ["MAX_FRAGMENTS", "ClientFrames", "TokenBucket"]

MAX_FRAGMENTS = 128  # frames one message may take (a 64 KiB message in 512-byte pieces)
_LINGER = 4096  # bytes passed on after a refused frame: the client's close frame fits
_MAX_UTF8 = 4  # bytes a character may take: a text message's limit is in characters
_OPCODES_MESSAGE = (0x1, 0x2)
_OPCODES_CONTROL_COUNTED = (0x9, 0xA)  # ping, pong (a close ends the session anyway)
_GONE = (trio.BrokenResourceError, trio.ClosedResourceError)
_CLOSE = 0x88  # the first byte of a whole close frame


def _header_size(head: bytearray) -> int:
    """How long a frame header is, as far as its first bytes tell (RFC 6455 §5.2)."""
    if len(head) < 2:
        return 2
    size = head[1] & 0x7F
    extended = 2 if size == 126 else 8 if size == 127 else 0
    masked = 4 if head[1] & 0x80 else 0
    return 2 + extended + masked


def _payload_size(head: bytearray) -> int:
    size = head[1] & 0x7F
    if size == 126:
        return int.from_bytes(head[2:4], "big")
    if size == 127:
        return int.from_bytes(head[2:10], "big")
    return size


class ClientFrames(trio.abc.Stream):
    """A WebSocket connection for trio-websocket: writes go straight to `stream`, reads are
    counted frame by frame (see the module's docstring).

    Attributes:
        breached: set once the client went past a limit.
        code, reason: the close that limit calls for.
        half_closed: the client ended its side without a close frame and still reads.
    """

    def __init__(self, stream: ConnectionStream, bucket: TokenBucket, *, max_message: int) -> None:
        self._stream = stream
        self._bucket = bucket
        self._max_frame = max_message * _MAX_UTF8
        self._unmetered = 0  # bytes still to pass before frames begin (the handshake)
        self._early = b""  # frames that came with the handshake, passed on after its answer
        self._answered = trio.Event()  # the handshake's answer went out
        self._head = bytearray()  # the header of the frame being read, so far
        self._skip = 0  # payload bytes of the current frame still to pass
        self._fragments = 0  # frames of the message under way
        self._held = b""  # what followed the refused frame, up to `_LINGER`
        self._linger = _LINGER
        self.breached = trio.Event()
        self.code = 1008
        self.reason = ""
        self.half_closed = False
        self._close_sent = trio.Event()  # trio-websocket wrote its close frame

    def handshake(self, size: int, early: bytes = b"") -> None:
        """The next `size` bytes read are the handshake's, not frames; `early` (what the client
        sent after its handshake without waiting for the answer: frames) is passed on once the
        answer went out. wsproto's server drops bytes that come before its answer, and frames
        dropped there would leave it and the counting here out of step for good."""
        self._unmetered = size
        self._early = early

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        """The next bytes for trio-websocket: up to the end of a refused frame's header, then
        at most `_LINGER` bytes, then none (it waits until cancelled)."""
        if self.breached.is_set():
            return await self._after_breach(max_bytes)
        if self._early and not self._unmetered:
            await self._answered.wait()
            size = max_bytes or len(self._early)
            data, self._early = self._early[:size], self._early[size:]
        else:
            data = await self._stream.receive_some(max_bytes)
            if not data and await self._still_reads():
                self.half_closed = True
                await self._close_sent.wait()  # until then: a client that says nothing more
        passed = self._meter(data)
        if passed < len(data):
            self._held = data[passed : passed + self._linger]
            return data[:passed]
        return data

    async def _still_reads(self) -> bool:
        """After the client's end of stream: whether it only half-closed (a pong sent to it
        brought no reset back)."""
        if self._unmetered or self._close_sent.is_set():
            return False  # the handshake was cut short, or the session is closing anyway
        await self._answered.wait()  # an end of stream right after the handshake: answer first
        try:
            await self._stream.send_all(WS_PONG)
        except _GONE:
            return False
        return not await self._stream.reset_after_probe()

    async def _after_breach(self, max_bytes: int | None) -> bytes:
        if not self._held and self._linger > 0:
            self._held = await self._stream.receive_some(min(max_bytes or _LINGER, self._linger))
            if not self._held:
                return b""  # the client closed: trio-websocket sees it go
        if not self._held:
            await trio.sleep_forever()
        data, self._held = self._held, b""
        self._linger -= len(data)
        return data

    def _meter(self, data: bytes) -> int:
        """Follow the frames in `data`; how many of its bytes may pass (all, unless a frame
        went past a limit: then up to the end of that frame's header)."""
        pos, end = 0, len(data)
        if self._unmetered:
            pos = min(self._unmetered, end)
            self._unmetered -= pos
        while pos < end:
            if self._skip:
                step = min(self._skip, end - pos)
                self._skip -= step
                pos += step
                continue
            need = _header_size(self._head)
            take = min(need - len(self._head), end - pos)
            self._head += data[pos : pos + take]
            pos += take
            if len(self._head) < _header_size(self._head):
                continue
            if not self._frame():
                return pos
        return end

    def _frame(self) -> bool:
        """Count the frame whose header was just read; False when it goes past a limit."""
        opcode, size = self._head[0] & 0x0F, _payload_size(self._head)
        self._head.clear()
        self._skip = size
        if opcode in _OPCODES_MESSAGE:
            self._fragments = 1
        elif opcode == 0x0:
            self._fragments += 1
            if self._fragments > MAX_FRAGMENTS:
                return self._refuse(1008, "too_many_fragments")
        if size > self._max_frame:
            return self._refuse(1009, "message_too_big")
        if (opcode in _OPCODES_MESSAGE or opcode in _OPCODES_CONTROL_COUNTED) and not (
            self._bucket.take()
        ):
            return self._refuse(1008, "rate_limited")
        return True

    def _refuse(self, code: int, reason: str) -> bool:
        self.code, self.reason = code, reason
        self.breached.set()
        return False

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        """Write to the connection (the first write is the handshake's answer)."""
        await self._stream.send_all(data)
        if self._answered.is_set() and data[:1] == bytes((_CLOSE,)):
            self._close_sent.set()  # trio-websocket writes each frame whole, in one call
        self._answered.set()

    async def wait_send_all_might_not_block(self) -> None:
        """Wait until the connection takes more bytes."""
        await self._stream.wait_send_all_might_not_block()

    async def aclose(self) -> None:
        """Mark the connection closed for trio-websocket (`ConnectionStream.aclose`)."""
        await self._stream.aclose()


@attrs.define
class TokenBucket:
    """`rate` tokens a second, at most `burst` saved: `take` spends one if there is one."""

    rate: float
    burst: float
    tokens: float = attrs.field()
    stamp: float = attrs.field(factory=trio.current_time)

    @tokens.default
    def _full(self) -> float:
        return self.burst

    def take(self) -> bool:
        """Spend a token; False when the client is over its rate."""
        now = trio.current_time()
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens < 1.0:
            return False
        self.tokens -= 1.0
        return True
