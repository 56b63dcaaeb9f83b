"""Call to first request byte: from calling `run_turn` (or entering `open_turn`) to the first
byte of its request arriving at a real server on 127.0.0.1, against trio alone doing the same
job (`trio.open_tcp_stream` and `send_all` of the very same request bytes).

- cold: a new connection. rillet's turn is given a new `httpx.AsyncClient` (made before the
  clock starts: what is timed is the turn, not the client) whose pool is empty; trio alone opens
  a TCP stream and sends.
- warm: the second turn on the same client, whose pool holds the connection the first turn
  left; trio alone sends on the stream it already has open.
- cold, own client (diagnostic, no target): `run_turn` given no client, so it makes (and
  closes) its own.

The server (raw trio sockets) runs in a process of its own and answers every request with a
short OpenAI Chat stream, keeping the connection alive. Where a request's first byte arrives is
the kernel's receive timestamp of that first segment (`SO_TIMESTAMPNS`, which on loopback is
stamped inside the sender's `send`): the figure does not depend on when the server gets a CPU.
That stamp is CLOCK_REALTIME, the clock of `time.time_ns()`, one clock for every process; the
contestants start theirs from it too. Where the kernel gives no timestamp, the server's
`time.time_ns()` right after its read is used instead (an upper bound) and the section says so.

Each round runs every contestant once, in an order that alternates round by round: cold, then
warm on the same connection. Medians over the rounds; each ratio divides medians of the same
run. Wall time, as it is a latency.
"""

from __future__ import annotations

import functools
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import trio
from rillet import open_turn, run_turn
from rillet.providers import OpenAIChatDialect, Provider, Secret

from .contestants import request
from .fanout_load import SO_TIMESTAMPNS, kernel_arrival
from .latency import Samples
from .wire import first_delta_stream

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

__all__ = [
    "FIRSTBYTE_CASES",
    "FIRSTBYTE_CONTESTANTS",
    "FirstByteResult",
    "FirstByteServer",
    "ratios",
    "reply_bytes",
    "request_end",
    "run_firstbyte",
]

FIRSTBYTE_CONTESTANTS = ("trio", "run_turn", "open_turn")
FIRSTBYTE_CASES = ("cold", "warm")
_WARMUP = 10


def reply_bytes() -> bytes:
    """The server's answer to every request: a short OpenAI Chat stream, keep-alive."""
    body = b"".join(first_delta_stream("openai-chat", 3).chunks)
    head = (
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
        b"content-length: %d\r\n\r\n" % len(body)
    )
    return head + body


def request_end(data: bytes) -> int:
    """Where the first whole request in `data` ends (head and `content-length` body), or -1."""
    end = data.find(b"\r\n\r\n")
    if end < 0:
        return -1
    length = 0
    for line in data[:end].split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    total = end + 4 + length
    return total if len(data) >= total else -1


class FirstByteServer:
    """A loopback HTTP/1.1 server in a process of its own that notes when each request's first
    byte arrives and what the request was (`take`).

    Its own process, so that it never holds this interpreter while a contestant runs: a server
    thread here would take the interpreter whenever the contestant's thread released it for a
    system call (`socket`, `connect`), and the contestant would then wait for it to give it
    back. The arrival is the kernel's receive timestamp (CLOCK_REALTIME, one clock for every
    process), read against `time.time_ns()` on this side."""

    def __init__(self) -> None:
        self.port = 0
        self.kernel_stamps = True
        self._proc: subprocess.Popen[str] | None = None

    def __enter__(self) -> FirstByteServer:
        root = Path(__file__).resolve().parent.parent
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "bench.firstbyte", "--serve"],
            cwd=root,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self._proc.stdout is not None
        self.port = int(self._proc.stdout.readline())
        return self

    def __exit__(self, *exc: object) -> None:
        if self._proc is not None:
            assert self._proc.stdin is not None
            self._proc.stdin.close()  # the server ends when its stdin does
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            if self._proc.stdout is not None:
                self._proc.stdout.close()

    def take(self) -> tuple[int, int, bytes]:
        """The next request the server received: when its first byte arrived
        (`time.time_ns()` scale), the number of the connection it came on, and its bytes. The
        server notes it before it answers, so once a contestant has its answer the note is
        there."""
        assert self._proc is not None
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline()
        if not line:
            raise RuntimeError("the first-byte server has stopped")
        kind, stamp, connection, data = line.split()
        if kind != "kernel":
            self.kernel_stamps = False
        return int(stamp), int(connection), bytes.fromhex(data)


def _serve() -> None:
    """The server process: the port on stdout, then one line per request, until stdin ends."""
    trio.run(_server_main)


async def _server_main() -> None:
    listener = trio.socket.socket()
    kernel = False
    if SO_TIMESTAMPNS is not None:
        try:  # accepted sockets inherit it
            listener.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
            kernel = True
        except OSError:
            pass
    await listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    print(listener.getsockname()[1], flush=True)
    reply = reply_bytes()
    connections = 0
    async with trio.open_nursery() as nursery:

        async def stop_with_stdin() -> None:
            await trio.to_thread.run_sync(sys.stdin.read)
            nursery.cancel_scope.cancel()

        nursery.start_soon(stop_with_stdin)
        with listener:
            while True:
                conn, _ = await listener.accept()
                nursery.start_soon(_connection, conn, connections, reply, kernel)
                connections += 1


async def _connection(
    conn: trio.socket.SocketType, number: int, reply: bytes, kernel: bool
) -> None:
    with conn:
        data = b""
        stamp = 0
        while True:
            try:
                piece, ancillary, _, _ = await conn.recvmsg(65536, 64)
            except OSError:
                return
            if not piece:
                return
            if not data:
                stamp = kernel_arrival(ancillary) if kernel else 0
                if not stamp:
                    stamp = time.time_ns()
            data += piece
            while (end := request_end(data)) >= 0:
                kind = "kernel" if kernel and stamp else "read"
                print(kind, stamp, number, data[:end].hex(), flush=True)
                data = data[end:]
                try:
                    await _send_all(conn, reply)
                except OSError:
                    return


async def _send_all(conn: trio.socket.SocketType, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[await conn.send(view) :]


class FirstByteResult(Samples):
    """One contestant in one case: the time to first request byte of each round, in µs."""

    def __init__(self, contestant: str, case: str) -> None:
        super().__init__()
        self.contestant = contestant
        self.case = case

    def as_dict(self) -> dict[str, Any]:
        """For results.json."""
        return {
            "contestant": self.contestant,
            "case": self.case,
            "n": len(self.samples_us),
            "median_us": self.median(),
            "p10_us": self.percentile(0.10),
            "p90_us": self.percentile(0.90),
            "error": self.error,
        }


def _provider(port: int) -> Provider:
    return Provider(
        dialect=OpenAIChatDialect(),
        base_url=f"http://127.0.0.1:{port}/v1",
        model="bench-model",
        api_key=Secret("sk-bench-0000000000000000"),
    )


@functools.cache
def _tls() -> ssl.SSLContext:
    return ssl.create_default_context()


def _client() -> httpx.AsyncClient:
    """A new client as an application makes one: no timeouts, one TLS context for all (making
    one costs milliseconds, and its garbage would land in the timed turn)."""
    return httpx.AsyncClient(timeout=httpx.Timeout(None), follow_redirects=False, verify=_tls())


async def _read_reply(stream: trio.SocketStream, size: int) -> None:
    got = 0
    while got < size:
        piece = await stream.receive_some(65536)
        if not piece:
            raise RuntimeError("the server closed the connection")
        got += len(piece)


class _Round:
    """One round's contestants, each a cold then a warm timing (µs)."""

    def __init__(self, server: FirstByteServer, payload: bytes) -> None:
        self.server = server
        self.provider = _provider(server.port)
        self.payload = payload
        self.reply_size = len(reply_bytes())

    def _since(self, start: int, connections: list[int]) -> float:
        """µs from `start` to the arrival of the request just made; notes its connection."""
        stamp, connection, _ = self.server.take()
        connections.append(connection)
        return (stamp - start) / 1e3

    @staticmethod
    def _pair(times: list[float], connections: list[int]) -> tuple[float, float]:
        """Cold and warm, once the warm request is known to have reused the cold one's
        connection (otherwise it was not warm)."""
        if connections[0] != connections[1]:
            raise RuntimeError("the second request did not reuse the first one's connection")
        return times[0], times[1]

    async def trio_alone(self) -> tuple[float, float]:
        times: list[float] = []
        connections: list[int] = []
        start = time.time_ns()
        stream = await trio.open_tcp_stream("127.0.0.1", self.server.port)
        await stream.send_all(self.payload)
        async with stream:
            await _read_reply(stream, self.reply_size)
            times.append(self._since(start, connections))
            start = time.time_ns()
            await stream.send_all(self.payload)
            await _read_reply(stream, self.reply_size)
            times.append(self._since(start, connections))
        return self._pair(times, connections)

    async def run_turn(self) -> tuple[float, float]:
        times: list[float] = []
        connections: list[int] = []
        async with _client() as client:
            for _ in FIRSTBYTE_CASES:
                asked = request()
                start = time.time_ns()
                result = await run_turn(asked, self.provider, client=client)
                _check(result.ok, result)
                times.append(self._since(start, connections))
        return self._pair(times, connections)

    async def open_turn(self) -> tuple[float, float]:
        times: list[float] = []
        connections: list[int] = []
        async with _client() as client:
            for _ in FIRSTBYTE_CASES:
                asked = request()
                start = time.time_ns()
                async with open_turn(asked, self.provider, client=client) as turn:
                    result = await turn.result()
                _check(result.ok, result)
                times.append(self._since(start, connections))
        return self._pair(times, connections)

    async def own_client(self) -> float:
        asked = request()
        start = time.time_ns()
        result = await run_turn(asked, self.provider)
        _check(result.ok, result)
        return self._since(start, [])


def _check(ok: bool, result: object) -> None:
    if not ok:
        raise RuntimeError(f"the turn failed: {result!r}"[:300])


async def _run(rounds: int, progress: Callable[[str], None]) -> dict[str, Any]:
    results = {
        (c, k): FirstByteResult(c, k) for c in FIRSTBYTE_CONTESTANTS for k in FIRSTBYTE_CASES
    }
    own = FirstByteResult("run_turn", "cold, own client")
    with FirstByteServer() as server:
        # the request bytes trio alone sends: rillet's own, as the server received them
        async with _client() as client:
            await run_turn(request(), _provider(server.port), client=client)
        one = _Round(server, server.take()[2])
        steps: dict[str, Callable[[], Awaitable[tuple[float, float]]]] = {
            "trio": one.trio_alone,
            "run_turn": one.run_turn,
            "open_turn": one.open_turn,
        }
        for i in range(_WARMUP + rounds):
            if i % 50 == 0:
                progress(f"firstbyte: round {i + 1}/{_WARMUP + rounds}")
            order = FIRSTBYTE_CONTESTANTS if i % 2 == 0 else FIRSTBYTE_CONTESTANTS[::-1]
            for contestant in order:
                cold_r, warm_r = results[(contestant, "cold")], results[(contestant, "warm")]
                if cold_r.error is not None:
                    continue
                try:
                    cold, warm = await steps[contestant]()
                except Exception as exc:
                    cold_r.error = warm_r.error = f"{type(exc).__name__}: {exc}"[:200]
                    continue
                if i >= _WARMUP:
                    cold_r.samples_us.append(cold)
                    warm_r.samples_us.append(warm)
            if own.error is None:
                try:
                    us = await one.own_client()
                except Exception as exc:
                    own.error = f"{type(exc).__name__}: {exc}"[:200]
                else:
                    if i >= _WARMUP:
                        own.samples_us.append(us)
        kernel = server.kernel_stamps
    rows = [r.as_dict() for r in (*results.values(), own)]
    return {
        "rounds": rounds,
        "kernel_stamps": kernel,
        "request_bytes": len(one.payload),
        "results": rows,
        "ratios": ratios(rows),
    }


def ratios(rows: list[dict[str, Any]]) -> dict[str, float]:
    """`contestant/case` → its median ÷ trio alone's in the same case (same run)."""
    by = {(r["contestant"], r["case"]): r for r in rows}
    out = {}
    for case in FIRSTBYTE_CASES:
        base = by.get(("trio", case))
        if base is None or base.get("error") or not base.get("n"):
            continue
        for contestant in FIRSTBYTE_CONTESTANTS[1:]:
            r = by.get((contestant, case))
            if r is not None and not r.get("error") and r.get("n"):
                out[f"{contestant}/{case}"] = r["median_us"] / base["median_us"]
    return out


def run_firstbyte(
    rounds: int = 300, progress: Callable[[str], None] = lambda _: None
) -> dict[str, Any]:
    """Measure every contestant, cold and warm, `rounds` interleaved rounds."""
    return trio.run(_run, rounds, progress)


if __name__ == "__main__":
    if sys.argv[1:] == ["--serve"]:
        _serve()
    else:
        import json

        rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 100
        print(json.dumps(run_firstbyte(rounds), indent=1))
