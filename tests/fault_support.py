"""The harness of the fault scenarios over real sockets (RELIABILITY.md F01-F49), shared with
the deterministic-failure, security and fuzz tests, the load tier and the soak.

Loopback tier (`loop_turn`, `check_loop`): the fault-injecting provider
(`rillet.transports.testing`) on 127.0.0.1, httpx's own transport, the same scripts as the
virtual-time tests. The clock is a `MockClock` that jumps only after 20 ms of real idleness, so
bytes in flight on loopback are not mistaken for silence; the scripted delays stay off the
client's deadlines, and each test runs under `trio.fail_after`.

Fan-out (`site`, `read_sse`, `read_ws`, `check_site`): `rillet.transports.server.serve` on
127.0.0.1 port 0 in front of the loopback provider, with real clients (httpx for SSE,
trio-websocket for WebSocket).
"""

from __future__ import annotations

import base64
import contextlib
import functools
import hashlib
import os
import socket
import ssl
import struct
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import attrs
import httpx
import pytest
import trio
import trio.testing
import trio_websocket
from rillet._core._dialect import Dialect, Provider, Secret
from rillet._core._markers import AttemptReset
from rillet._core._runevents import (
    AnswerDone,
    AttemptResetEvent,
    RunDone,
    RunEvent,
    decode_run_event,
)
from rillet._hub._hub import Hub
from rillet._turn._api import run_turn
from rillet._turn._ratelimit import RateLimiter
from rillet._turn._turn import Turn, TurnResult
from rillet.frames import SSEDecoder
from rillet.providers._openai_chat._dialect import OpenAIChatDialect
from rillet.transports.server import Limits, ServerConfig, serve
from rillet.transports.testing import (
    LoopbackProvider,
    RecordedRequest,
    Reply,
    Script,
    open_loopback_provider,
    openai_text_body,
    openai_text_stream,
)

from .handler_support import (
    KEY,
    REQUEST,
    RESCUE_TEXT,
    check_envelope,
    check_uni,
    policy,
    rebuild,
    seen,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

    from rillet._core._policy import Outcome, Policy
    from rillet._core._request import TurnRequest

LIMIT = 3600.0  # virtual seconds: beyond every scripted wait, never reached by a passing test


# --- the loopback tier ----------------------------------------------------------------------------


@attrs.frozen
class LoopTurn:
    """A finished turn over loopback, and what it left behind."""

    server: LoopbackProvider
    turn: Turn
    result: TurnResult
    events: list[RunEvent]
    uni: list[Any]
    ended: float


async def loop_turn(
    script: Script,
    *,
    pol: Policy | None = None,
    dialect: Dialect | None = None,
    base_url: str | None = None,
    limiter: RateLimiter | None = None,
    drained: float = 0.0,
    cancel_at: Callable[[LoopbackProvider, Turn], Awaitable[None]] | None = None,
    request: TurnRequest = REQUEST,
) -> LoopTurn:
    """One turn against a loopback provider playing `script` (a consumer reads it live); the
    limiter's bucket for the provider emptied at `drained` requests a minute first, if given;
    the caller's scope is cancelled at `cancel_at` if given. Returns once both ends are
    closed."""
    limiter = limiter or RateLimiter()
    with trio.fail_after(LIMIT):
        async with open_loopback_provider(script) as server:
            url = base_url or f"{server.url}/v1"
            for _ in range(int(drained)):
                await limiter.acquire(url, drained, 30.0)
            provider = Provider(
                dialect=dialect or OpenAIChatDialect(),
                base_url=url,
                model="test-model",
                api_key=Secret(KEY),
            )
            async with httpx.AsyncClient(verify=tls()) as client:
                with trio.CancelScope() as scope:
                    async with trio.open_nursery() as nursery:
                        turn: Turn = await nursery.start(
                            functools.partial(
                                run_turn,
                                request,
                                provider,
                                client=client,
                                policy=pol or policy(),
                                limiter=limiter,
                            )
                        )
                        live: list[RunEvent] = []

                        async def consume() -> None:
                            async for event in turn.run_events():
                                live.append(event)

                        nursery.start_soon(consume)
                        if cancel_at is not None:
                            await cancel_at(server, turn)
                            scope.cancel()
                ended = trio.current_time()
                result = await turn.result()
            while server.open_connections:  # noqa: ASYNC110 - the provider offers no event
                await trio.sleep(0.01)
    events = [event async for event in turn.run_events()]
    assert events[: len(live)] == live
    uni = [item async for item in turn.uni_events()]
    return LoopTurn(server, turn, result, events, uni, ended)


def check_loop(
    run: LoopTurn,
    *,
    at: Sequence[float],
    outcome: Outcome,
    saw: Sequence[str],
    text: str,
    ended: float | None = None,
) -> None:
    """Request times (virtual), attempts, outcome, the events in order, the text exactly once,
    the MMSP stream restarted after each reset, nothing left open."""
    assert [r.at for r in run.server.requests] == pytest.approx(at, abs=1e-3)
    assert run.result.outcome is outcome
    assert run.result.attempts == len(at)
    assert seen(run.events) == list(saw)
    check_envelope(run.events, run.turn.run_id)
    assert rebuild(run.events) == text
    assert run.result.text == text
    resets = [e.attempt for e in run.events if isinstance(e, AttemptResetEvent)]
    assert resets == [e.attempt for e in run.uni if isinstance(e, AttemptReset)]
    check_uni(run.uni)
    done = [e for e in run.events if isinstance(e, AnswerDone)]
    if done:
        assert done[0].sha256 == hashlib.sha256(text.encode()).hexdigest()
    end = run.events[-1]
    assert isinstance(end, RunDone)
    assert end.attempts == len(at)
    if ended is not None:
        assert run.ended == pytest.approx(ended, abs=1e-3)
    assert run.server.open_connections == 0


def rescue_after(
    stream_reply: Reply | Sequence[Reply], rescue: Reply | None = None
) -> Callable[[RecordedRequest, int], Reply]:
    """`stream_reply` (or the n-th of several, the last repeating) to streaming requests; the
    rescue (no `"stream": true`) gets a completion, or `rescue`."""
    replies = [stream_reply] if isinstance(stream_reply, Reply) else list(stream_reply)
    answer = rescue or Reply(
        chunks=(openai_text_body(RESCUE_TEXT),), content_type="application/json"
    )
    count = 0

    def script(request: RecordedRequest, n: int) -> Reply:
        nonlocal count
        if b'"stream":true' not in request.body:
            return answer
        count += 1
        return replies[min(count, len(replies)) - 1]

    return script


# --- the fan-out tier: the server in front of the loopback provider -------------------------------


def text_reply(fragments: Sequence[str], *, per_chunk: int = 1, **fields: Any) -> Reply:
    """A complete Chat Completions stream of `fragments`, `per_chunk` SSE events per chunk."""
    frames = [f + b"\n\n" for f in openai_text_stream(list(fragments)).split(b"\n\n") if f]
    chunks = tuple(b"".join(frames[i : i + per_chunk]) for i in range(0, len(frames), per_chunk))
    return Reply(chunks=chunks, **fields)


def words(count: int, prefix: str = "w") -> list[str]:
    """`count` distinct text fragments."""
    return [f"{prefix}{i} " for i in range(count)]


@attrs.frozen
class RunRef:
    """A run the server started: its id, its token, where to read it, and when it started."""

    run_id: str
    token: str
    events_url: str
    ws_url: str
    started: float


@attrs.define
class Site:
    """The server, the loopback provider behind it, the hub, and an HTTP client."""

    url: str
    loopback: LoopbackProvider
    hub: Hub
    client: httpx.AsyncClient

    async def start(self, prompt: str = "Hi") -> RunRef:
        """Start a run (`POST /v1/runs`)."""
        started = trio.current_time()
        reply = await self.client.post("/v1/runs", json={"prompt": prompt})
        assert reply.status_code == 201, reply.text
        answer = reply.json()
        return RunRef(
            answer["run_id"], answer["token"], answer["events_url"], answer["ws_url"], started
        )

    def log(self, run_id: str) -> list[bytes]:
        """Every logged event's JSON, as the hub keeps it."""
        return [entry.data for entry in self.hub.log.get(run_id).entries]

    def events(self, run_id: str) -> list[RunEvent]:
        return [entry.event for entry in self.hub.log.get(run_id).entries]

    async def wait_for(self, run_id: str, seq: int | None = None) -> None:
        """Until the run's log holds `seq` (None: its `run.done`)."""
        while True:
            run = self.hub.log.get(run_id)
            if (seq is None and run.done) or (seq is not None and run.last_seq >= seq):
                return
            await run.wait()

    async def metrics(self) -> dict[str, Any]:
        """`GET /metrics.json` (once more if the server had just closed the idle connection)."""
        try:
            reply = await self.client.get("/metrics.json")
        except (httpx.RemoteProtocolError, httpx.ReadError):
            reply = await self.client.get("/metrics.json")
        assert reply.status_code == 200
        metrics: dict[str, Any] = reply.json()
        return metrics


@attrs.define(eq=False)
class GatedProvider(LoopbackProvider):
    """A loopback provider that holds every reply until `gate` is set (many subscribers can
    join a run before its first event)."""

    gate: trio.Event = attrs.field(factory=trio.Event)

    async def _respond(
        self, stream: trio.SocketStream, conn: Any, reply: Reply, method: str
    ) -> bool:
        await self.gate.wait()
        return await super()._respond(stream, conn, reply, method)


@asynccontextmanager
async def _provider(script: Script, gate: trio.Event | None) -> AsyncIterator[LoopbackProvider]:
    if gate is None:
        async with open_loopback_provider(script) as loopback:
            yield loopback
        return
    gated = GatedProvider(script, gate=gate)
    async with trio.open_nursery() as nursery:
        await nursery.start(gated.serve)
        yield gated
        nursery.cancel_scope.cancel()


@asynccontextmanager
async def site(
    script: Script,
    *,
    hub: Hub | None = None,
    pol: Policy | None = None,
    limits: Limits | None = None,
    provider_key: str = KEY,
    gate: trio.Event | None = None,
    **config: Any,
) -> AsyncIterator[Site]:
    """The loopback provider playing `script` (holding its replies until `gate` is set, if
    given) and the server in front of it, for the block."""
    hub = hub or Hub()
    async with _provider(script, gate) as loopback:
        provider = Provider(
            dialect=OpenAIChatDialect(),
            base_url=f"{loopback.url}/v1",
            model="test-model",
            api_key=Secret(provider_key),
        )
        settings = ServerConfig(
            provider=provider,
            port=0,
            policy=pol or policy(),
            limits=limits or Limits(max_subscribers_per_client=2000),
            **config,
        )
        async with trio.open_nursery() as nursery:
            url: str = await nursery.start(functools.partial(serve, settings, hub=hub))
            async with httpx.AsyncClient(base_url=url, timeout=None, verify=tls()) as client:
                yield Site(url, loopback, hub, client)
            nursery.cancel_scope.cancel()


@attrs.define
class Read:
    """What one subscription gave a client.

    Attributes:
        status: the HTTP status (101 for a WebSocket).
        data: each event's JSON, as received.
        ids: the SSE ids (empty for a WebSocket).
        comments: when each SSE comment arrived (virtual seconds).
        code, reason: the WebSocket close (None for SSE).
        body: the HTTP body of a refusal.
        clean: the stream ended properly (SSE: the chunked body ended; WS: a close frame).
    """

    status: int
    data: list[bytes] = attrs.field(factory=list)
    ids: list[str] = attrs.field(factory=list)
    comments: list[float] = attrs.field(factory=list)
    code: int | None = None
    reason: str | None = None
    body: bytes = b""
    clean: bool = False

    @property
    def events(self) -> list[RunEvent]:
        return [decode_run_event(d) for d in self.data]

    @property
    def seqs(self) -> list[int]:
        return [e.seq for e in self.events]

    @property
    def finished(self) -> bool:
        """Whether it got the run's `run.done`."""
        return bool(self.data) and isinstance(self.events[-1], RunDone)


@attrs.frozen
class Pace:
    """A slow reader: after `every` events it sleeps `seconds`, until `until` is set (then it
    reads at full speed)."""

    every: int
    seconds: float
    until: trio.Event | None = None

    async def after(self, events: int) -> None:
        if self.until is None or not self.until.is_set():
            await trio.sleep(self.seconds * events / self.every)


@functools.cache
def tls() -> ssl.SSLContext:
    """One TLS context for every client here (httpx builds one per client otherwise, ~50 ms
    each; the URLs are plain http anyway)."""
    return ssl.create_default_context()


def _rcvbuf(size: int) -> list[tuple[int, int, int]]:
    return [(socket.SOL_SOCKET, socket.SO_RCVBUF, size)]


async def read_sse(
    url: str,
    *,
    last_event_id: str | None = None,
    limit: int | None = None,
    pace: Pace | None = None,
    rcvbuf: int | None = None,
    never_read: trio.Event | None = None,
) -> Read:
    """One SSE subscription, on its own connection: read to its end, or stop after `limit`
    events; `pace` makes a slow reader; with `never_read`, read nothing, and leave once it is
    set."""
    transport = httpx.AsyncHTTPTransport(
        verify=tls(), socket_options=_rcvbuf(rcvbuf) if rcvbuf else None
    )
    headers = {"last-event-id": last_event_id} if last_event_id is not None else {}
    decoder = SSEDecoder()
    client = httpx.AsyncClient(transport=transport, timeout=None)
    async with client, client.stream("GET", url, headers=headers) as response:
        read = Read(response.status_code)
        if response.status_code != 200:
            read.body = await response.aread()
            read.clean = True
            return read
        if never_read is not None:
            await never_read.wait()
            return read  # it leaves without having read a byte
        pending = 0
        with trio.CancelScope() as cut:
            try:
                async for chunk in response.aiter_raw():
                    before = decoder.comments
                    events = decoder.feed(chunk)
                    read.comments += [trio.current_time()] * (decoder.comments - before)
                    for event in events:
                        read.data.append(event.data.encode())
                        read.ids.append(event.id)
                        if limit is not None and len(read.data) >= limit:
                            cut.cancel()
                            break
                    pending += len(events)
                    if pace is not None and pending >= pace.every:
                        await pace.after(pending)
                        pending = 0
                read.clean = True
            except (httpx.RemoteProtocolError, httpx.ReadError):
                pass
    return read


@asynccontextmanager
async def ws_connect(
    url: str, *, rcvbuf: int | None = None
) -> AsyncIterator[trio_websocket.WebSocketConnection]:
    """A trio-websocket client on a socket this test opens and closes itself."""
    parts = urlsplit(url)
    assert parts.hostname is not None
    assert parts.port is not None
    sock = trio.socket.socket()
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    await sock.connect((parts.hostname, parts.port))
    resource = parts.path + (f"?{parts.query}" if parts.query else "")
    async with trio.SocketStream(sock) as stream, trio.open_nursery() as nursery:
        ws = await trio_websocket.wrap_client_stream(nursery, stream, parts.hostname, resource)
        try:
            yield ws
        finally:
            with trio.move_on_after(0.5):  # a server that dropped us may never answer
                await ws.aclose()
            nursery.cancel_scope.cancel()


async def read_ws(
    url: str,
    *,
    limit: int | None = None,
    pace: Pace | None = None,
    rcvbuf: int | None = None,
    never_read: trio.Event | None = None,
) -> Read:
    """One WebSocket subscription: read until the server closes, or stop after `limit` (or
    read nothing, and leave once `never_read` is set)."""
    read = Read(101)
    async with ws_connect(url, rcvbuf=rcvbuf) as ws:
        if never_read is not None:
            await never_read.wait()
            return read  # it leaves without having read a frame
        try:
            while limit is None or len(read.data) < limit:
                message = await ws.get_message()
                assert isinstance(message, str)
                read.data.append(message.encode())
                if pace is not None and len(read.data) % pace.every == 0:
                    await pace.after(pace.every)
        except trio_websocket.ConnectionClosed as closed:
            if closed.reason is not None:
                read.code, read.reason = closed.reason.code, closed.reason.reason
                read.clean = read.code != 1006
    return read


async def read_ws_raw(url: str) -> Read:
    """A WebSocket subscription read by a minimal client on a raw socket (for many subscribers
    at once: a fraction of trio-websocket's cost): the handshake, then every frame to the
    close, which it answers."""
    parts = urlsplit(url)
    assert parts.hostname is not None
    assert parts.port is not None
    key = base64.b64encode(os.urandom(16)).decode()
    head = (
        f"GET {parts.path}?{parts.query} HTTP/1.1\r\nHost: {parts.netloc}\r\n"
        "Upgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    read = Read(0)
    async with await trio.open_tcp_stream(parts.hostname, parts.port) as stream:
        await stream.send_all(head.encode())
        buffer = bytearray()
        while b"\r\n\r\n" not in buffer:
            data = await stream.receive_some(65536)
            if not data:
                return read
            buffer += data
        answer, _, rest = bytes(buffer).partition(b"\r\n\r\n")
        read.status = int(answer.split(b" ", 2)[1])
        if read.status != 101:
            read.body = rest
            return read
        buffer = bytearray(rest)
        while True:
            frame = next_frame(buffer)
            if frame is None:
                data = await stream.receive_some(65536)
                if not data:
                    return read  # no close frame: an abnormal end
                buffer += data
                continue
            opcode, payload = frame
            if opcode == 0x1:
                read.data.append(payload)
            elif opcode == 0x8:
                read.code = struct.unpack("!H", payload[:2])[0] if len(payload) >= 2 else 1005
                read.reason = payload[2:].decode()
                read.clean = True
                mask = os.urandom(4)
                masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload[:2]))
                with contextlib.suppress(trio.BrokenResourceError):
                    await stream.send_all(bytes([0x88, 0x80 | len(masked)]) + mask + masked)
                return read


def next_frame(buffer: bytearray) -> tuple[int, bytes] | None:
    """The next whole (unmasked, unfragmented) server frame taken from `buffer`, if there is
    one."""
    if len(buffer) < 2:
        return None
    size, start = buffer[1] & 0x7F, 2
    if size == 126:
        if len(buffer) < 4:
            return None
        size, start = struct.unpack("!H", buffer[2:4])[0], 4
    elif size == 127:
        if len(buffer) < 10:
            return None
        size, start = struct.unpack("!Q", buffer[2:10])[0], 10
    if len(buffer) < start + size:
        return None
    opcode, payload = buffer[0] & 0x0F, bytes(buffer[start : start + size])
    del buffer[: start + size]
    return opcode, payload


def ws_url(run: RunRef, after: str | None = None) -> str:
    return run.ws_url + (f"&after={after}" if after is not None else "")


def sse_url(run: RunRef, after: str | None = None) -> str:
    return run.events_url + (f"&after={after}" if after is not None else "")


async def follow(
    run: RunRef, transport: str, *, pace: Pace | None = None, rcvbuf: int | None = None
) -> list[Read]:
    """Subscribe, and resume from the last event after every drop, until `run.done`: the
    segments read. `pace` and `rcvbuf` apply to the first subscription (a reader too slow for
    the run); it resumes at full speed."""
    segments: list[Read] = []
    last: str | None = None
    while not (segments and segments[-1].finished):
        if transport == "sse":
            read = await read_sse(run.events_url, last_event_id=last, pace=pace, rcvbuf=rcvbuf)
            if read.ids:
                last = read.ids[-1]
        else:
            after = str(_last_seq(segments)) if segments else None
            read = await read_ws(ws_url(run, after), pace=pace, rcvbuf=rcvbuf)
        assert read.status in (200, 101), read.body
        segments.append(read)
        pace = rcvbuf = None
        assert len(segments) < 100, "no progress"
    return segments


def _last_seq(segments: Sequence[Read]) -> int:
    seqs = [s for read in segments for s in read.seqs]
    return seqs[-1] if seqs else 0


def check_site(
    site: Site,
    run: RunRef,
    *,
    at: Sequence[float],
    saw: Sequence[str],
    text: str,
    end: tuple[str, str] = ("completed", "completed"),
    tolerance: float = 1e-3,
    attempts: int | None = None,
) -> list[RunEvent]:
    """The run as the hub logged it: request times (from the run's start; `tolerance` for the
    tests in real time), the events in the catalogue's notation, gapless, one `run.done` last
    with this status and code and the attempts (`attempts`, when the site served other runs
    too), the text exactly once. Returns the events."""
    times = [r.at - run.started for r in site.loopback.requests]
    assert times == pytest.approx(at, abs=tolerance)
    events = site.events(run.run_id)
    assert seen(events) == list(saw)
    check_envelope(events, run.run_id)
    assert rebuild(events) == text
    done = events[-1]
    assert isinstance(done, RunDone)
    assert (done.status, done.code) == end
    assert done.attempts == (len(at) if attempts is None else attempts)
    for answer in (e for e in events if isinstance(e, AnswerDone)):
        assert answer.sha256 == hashlib.sha256(text.encode()).hexdigest()
    return events


def check_reads(site: Site, run: RunRef, segments: Sequence[Read]) -> None:
    """The segments of one subscriber, joined: every event of the log exactly once, in order,
    with run-scoped SSE ids."""
    log = site.log(run.run_id)
    assert [d for read in segments for d in read.data] == log
    for read in segments:
        if read.ids:
            assert read.ids == [f"{run.run_id}:{seq}" for seq in read.seqs]
