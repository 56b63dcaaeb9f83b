"""The fan-out benchmark's other two processes (bench/fanout.py runs them): the subscribers
(`python -m bench.fanout --client`: plain sockets and epoll, no trio, so their own overhead
stays small), and the provider (`--provider`: an OpenAI Chat stream on a fixed schedule, so its
pace does not depend on the server's load)."""

from __future__ import annotations

import base64
import contextlib
import functools
import math
import os
import re
import resource
import select
import socket
import struct
import sys
import time
from array import array
from typing import Any

import trio
from rillet.transports.testing import openai_text_stream

__all__ = [
    "SO_TIMESTAMPNS",
    "SPARE_FDS",
    "cpu_seconds",
    "kernel_arrival",
    "provide",
    "raise_fd_limit",
    "subscribe",
]

SPARE_FDS = 64  # besides one per subscriber: listeners, the provider, files, the child


def raise_fd_limit(wanted: int) -> int:
    """Raise this process's soft fd limit towards `wanted` (as far as the hard limit allows);
    the limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if target > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = target
    return soft


SO_TIMESTAMPNS: int | None = getattr(
    socket, "SO_TIMESTAMPNS", 35 if sys.platform == "linux" else None
)
"""The socket option that has the kernel stamp each read's arrival (None where it is unknown)."""
_TIMESPEC = struct.Struct("qq")  # struct timespec


def kernel_arrival(ancillary: list[tuple[int, int, bytes]]) -> int:
    """The kernel's receive timestamp (ns, CLOCK_REALTIME, `time.time_ns()`'s clock) of a read
    made with `recvmsg` on a socket with `SO_TIMESTAMPNS` set, or 0. On loopback the kernel
    stamps a segment inside the sender's `send`; for a read of several, the last one's."""
    for level, kind, value in ancillary:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS:
            seconds, nanos = _TIMESPEC.unpack(value[: _TIMESPEC.size])
            return int(seconds) * 1_000_000_000 + int(nanos)
    return 0


def cpu_seconds() -> float:
    """User+system seconds of this process so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# --- the client side (a process of its own: plain sockets and epoll) -----------------------------

_SSE_ID = re.compile(rb"\nid: [0-9a-f]+:(\d+)\n")
_WS_SEQ = re.compile(rb'"seq":(\d+)')
_RUN_DONE = b'"type":"run.done"'


class _Subscriber:
    """One subscription: its socket, what it has read so far, and when each seq arrived."""

    kind = ""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.times = array("d", [math.nan]) * spec["seqs"]
        self.last = 0
        self.done = False
        self.resumes = 0
        self.duplicates = 0
        self.buf = b""
        self.sock: socket.socket | None = None
        self.lost = False  # the server ended the stream early: resume
        self.status = 0

    def _open(self, request: bytes, rcvbuf: int | None = None) -> bytes:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        sock.connect((self.spec["host"], self.spec["port"]))
        sock.sendall(request)
        head = b""
        while b"\r\n\r\n" not in head:
            data = sock.recv(65536)
            if not data:
                raise ConnectionError("the server closed the connection during the handshake")
            head += data
        head, rest = head.split(b"\r\n\r\n", 1)
        self.status = int(head.split(b" ", 2)[1])
        sock.setblocking(False)
        self.sock = sock
        return rest

    def record(self, seq: int, now: float) -> None:
        if seq < len(self.times):
            if math.isnan(self.times[seq]):
                self.times[seq] = now
            else:
                self.duplicates += 1
        self.last = max(self.last, seq)

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


class _Sse(_Subscriber):
    kind = "sse"

    def connect(self, rcvbuf: int | None = None) -> None:
        spec = self.spec
        resume = f"Last-Event-ID: {spec['run_id']}:{self.last}\r\n" if self.last else ""
        request = (
            f"GET /v1/runs/{spec['run_id']}/events?token={spec['token']} HTTP/1.1\r\n"
            f"Host: {spec['host']}:{spec['port']}\r\nAccept: text/event-stream\r\n{resume}\r\n"
        ).encode()
        rest = self._open(request, rcvbuf)
        if self.status == 204:
            self.done = True
        elif self.status != 200:
            raise ConnectionError(f"SSE subscription refused: {self.status}")
        self.buf = b"\n"  # frames are found by the newline before their `id:`
        self.feed(rest, time.monotonic())

    def feed(self, data: bytes, now: float) -> None:
        buf = self.buf + data
        end = buf.rfind(b"\n\n")
        if end < 0:
            self.buf = buf
            return
        block = buf[: end + 2]
        self.buf = buf[end + 1 :]
        for match in _SSE_ID.finditer(block):
            self.record(int(match.group(1)), now)
        if _RUN_DONE in block:
            self.done = True

    def eof(self) -> None:
        if not self.done:
            self.lost = True


class _Ws(_Subscriber):
    kind = "ws"

    def connect(self) -> None:
        spec = self.spec
        key = base64.b64encode(os.urandom(16)).decode()
        request = (
            f"GET /v1/runs/{spec['run_id']}/ws?token={spec['token']}&after={self.last} HTTP/1.1"
            f"\r\nHost: {spec['host']}:{spec['port']}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
        ).encode()
        rest = self._open(request)
        if self.status != 101:
            raise ConnectionError(f"WebSocket subscription refused: {self.status}")
        self.feed(rest, time.monotonic())

    def feed(self, data: bytes, now: float) -> None:
        buf = self.buf + data if self.buf else data
        i, n = 0, len(buf)
        while n - i >= 2:
            size, head = buf[i + 1] & 0x7F, 2
            if size == 126:
                if n - i < 4:
                    break
                size, head = int.from_bytes(buf[i + 2 : i + 4], "big"), 4
            elif size == 127:
                if n - i < 10:
                    break
                size, head = int.from_bytes(buf[i + 2 : i + 10], "big"), 10
            if n - i < head + size:
                break
            opcode = buf[i] & 0x0F
            payload = buf[i + head : i + head + size]
            i += head + size
            if opcode == 1:
                match = _WS_SEQ.search(payload)
                if match:
                    self.record(int(match.group(1)), now)
                if payload.startswith(b'{"type":"run.done"'):
                    self.done = True
            elif opcode == 8:
                code = int.from_bytes(payload[:2], "big") if len(payload) >= 2 else 1005
                self._send_close(code)
                if code == 1013 or not self.done:
                    self.lost = True
            elif opcode == 9:
                self._send(0xA, payload)
        self.buf = buf[i:]

    def _send(self, opcode: int, payload: bytes) -> None:
        mask = os.urandom(4)
        masked = bytes(b ^ mask[k % 4] for k, b in enumerate(payload))
        frame = bytes([0x80 | opcode, 0x80 | len(payload)]) + mask + masked
        if self.sock is not None:
            with contextlib.suppress(OSError):  # the server may have closed already
                self.sock.send(frame)

    def _send_close(self, code: int) -> None:
        self._send(0x8, code.to_bytes(2, "big"))

    def eof(self) -> None:
        if not self.done:
            self.lost = True


def subscribe(spec: dict[str, Any]) -> dict[str, Any]:
    """Subscribe, read every event to the end, and report (the times go to `spec["out"]`)."""
    raise_fd_limit(spec["n_ws"] + spec["n_sse"] + SPARE_FDS)
    subscribers: list[_Ws | _Sse] = [_Ws(spec) for _ in range(spec["n_ws"])]
    subscribers += [_Sse(spec) for _ in range(spec["n_sse"])]
    for sub in subscribers:
        sub.connect()
    slow: _Sse | None = None
    if spec["slow"]:
        slow = _Sse(spec)
        slow.connect(rcvbuf=4096)
    ready = time.monotonic()
    print("ready", flush=True)  # the provider is told to start streaming now
    cpu_start = cpu_seconds()
    poller = select.epoll()
    by_fd: dict[int, _Ws | _Sse] = {}

    def watch(sub: _Ws | _Sse) -> None:
        assert sub.sock is not None
        by_fd[sub.sock.fileno()] = sub
        poller.register(sub.sock.fileno(), select.EPOLLIN)

    for sub in subscribers:
        if not sub.done:
            watch(sub)
    active = len(by_fd)
    deadline = ready + spec["timeout"]
    period = 10 / spec["rate"]
    slow_next = ready + period
    slow_received = 0
    # one receive buffer for all: `recv(n)` would allocate n bytes a call (mmap'ed past 128 KiB)
    buffer = bytearray(262144)
    view = memoryview(buffer)
    while active and time.monotonic() < deadline:
        wait = 0.5 if slow is None else max(0.0, min(0.5, slow_next - time.monotonic()))
        for fd, _ in poller.poll(wait):
            sub = by_fd[fd]
            assert sub.sock is not None
            try:
                size = sub.sock.recv_into(buffer)
            except BlockingIOError:
                continue
            except OSError:
                size = 0
            data = bytes(view[:size])
            if data:
                sub.feed(data, time.monotonic())
            else:
                sub.eof()
            if sub.done or sub.lost:
                poller.unregister(fd)
                del by_fd[fd]
                sub.close()
                if sub.lost and not sub.done:
                    sub.lost = False
                    sub.resumes += 1
                    sub.buf = b""
                    sub.connect()
                    if not sub.done:
                        watch(sub)
                        continue
                active -= 1
        if slow is not None and time.monotonic() >= slow_next:
            slow_next += period
            slow_received += _read_one(slow)
    cpu = cpu_seconds() - cpu_start
    for sub in subscribers:
        sub.close()
    if slow is not None:
        slow.close()
    with open(spec["out"], "wb") as out:
        for sub in subscribers:
            sub.times.tofile(out)
    return {
        "ready": ready,
        "cpu": cpu,
        "slow_received": slow_received if slow is not None else None,
        "clients": [
            {"kind": s.kind, "done": s.done, "resumes": s.resumes, "duplicates": s.duplicates}
            for s in subscribers
        ],
    }


def _read_one(sub: _Sse) -> int:
    """Read just enough for one more SSE frame (the slow subscriber's pace); 1 if one came."""
    while True:
        end = sub.buf.find(b"\n\n", 1)
        if end >= 0:
            frame, sub.buf = sub.buf[: end + 1], sub.buf[end + 1 :]
            return 1 if _SSE_ID.search(frame + b"\n") else 0
        if sub.sock is None:
            return 0
        try:
            data = sub.sock.recv(512)
        except BlockingIOError:
            return 0
        if not data:
            sub.close()
            return 0
        sub.buf += data


# --- the provider (a process of its own, so its pace does not depend on the server's load) ------


async def provide(spec: dict[str, Any]) -> None:
    """Serve the run's reply on loopback (print the URL first): an OpenAI Chat stream that
    starts when a line arrives on stdin, one frame every 1/rate seconds on a fixed schedule."""
    fragments = [f"w{i % 1000:03d} " for i in range(spec["events"])]
    stream = openai_text_stream(fragments)
    frames = [frame + b"\n\n" for frame in stream.split(b"\n\n") if frame]
    go = trio.Event()

    async def wait_for_go() -> None:
        stdin = trio.lowlevel.FdStream(os.dup(sys.stdin.fileno()))
        await stdin.receive_some(16)
        go.set()

    async def reply(conn: trio.SocketStream) -> None:
        request = b""
        while b"\r\n\r\n" not in request:
            request += await conn.receive_some(65536)
        head, body = request.split(b"\r\n\r\n", 1)
        length = re.search(rb"(?i)\r\ncontent-length: *(\d+)", head)
        while length and len(body) < int(length.group(1)):
            body += await conn.receive_some(65536)
        await go.wait()
        await conn.send_all(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\nconnection: close\r\n\r\n"
        )
        start = trio.current_time()
        for index, frame in enumerate(frames):
            await trio.sleep_until(start + index / spec["rate"])
            await conn.send_all(b"%x\r\n%s\r\n" % (len(frame), frame))
        await conn.send_all(b"0\r\n\r\n")
        await conn.aclose()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(wait_for_go)
        listeners = await nursery.start(
            functools.partial(trio.serve_tcp, reply, 0, host="127.0.0.1")
        )
        print(f"http://127.0.0.1:{listeners[0].socket.getsockname()[1]}", flush=True)
