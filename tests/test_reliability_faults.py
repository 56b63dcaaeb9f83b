"""Faults (RELIABILITY.md F01-F49) that `test_handler` does not already run: the scripts again
over real sockets (the loopback tier), and the fan-out scenarios F32-F38, F47-F49 through the
real server.

Loopback tier: the fault-injecting provider (`rillet.transports.testing`) on 127.0.0.1, httpx's own
transport, the same scripts as the virtual-time tests. The clock is a `MockClock` that jumps only
after 20 ms of real idleness, so bytes in flight on loopback are not mistaken for silence; the
scripted delays stay off the client's deadlines, and each test runs under `trio.fail_after`.

Fan-out: `rillet.transports.server.serve` on 127.0.0.1 port 0 in front of the loopback provider,
with real clients (httpx for SSE, trio-websocket for WebSocket). Each scenario checks the provider's
request times, how the run ended (`run.done` status, code, attempts), the exact events of the run in
the catalogue's notation, that every reader got each event exactly once and in order (seq 1..n, one
`run.done`, last), and that the text rebuilt honouring `attempt.reset` is the provider's, exactly
once. F32 and F33 also run on the hub alone, in exact virtual time.

The harness here (`site`, `read_sse`, `read_ws`, `check_site`) is shared with the security
tests, the load tier and the soak.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import gc
import hashlib
import io
import os
import socket
import ssl
import struct
from collections.abc import Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import attrs
import httpx
import msgspec
import pytest
import trio
import trio.testing
import trio_websocket
from rillet._hub import Hub, MemoryRunLog, SubscriberDropped
from rillet._markers import AttemptReset
from rillet._policy import Outcome, Policy
from rillet._ratelimit import RateLimiter
from rillet._runevents import AnswerDone, RunDone, RunEvent, StatusEvent, decode_run_event
from rillet._turn import Sink, Turn, TurnResult, run_turn
from rillet.frames import SSEDecoder
from rillet.providers._base import Dialect, Provider, Secret
from rillet.providers._ollama import OllamaDialect
from rillet.providers._openai_chat import OpenAIChatDialect
from rillet.transports.server import Limits, ServerConfig, serve
from rillet.transports.sinks import JSONLSink
from rillet.transports.testing import (
    LoopbackProvider,
    RecordedRequest,
    Reply,
    Script,
    open_loopback_provider,
    openai_text_body,
    openai_text_stream,
    refused_url,
    split,
    status_reply,
)

from .handler_support import (
    END_CANCELLED,
    END_OK,
    END_PROVIDER,
    END_RATE,
    END_TIMEOUT,
    FRAGMENTS,
    HANG,
    KEY,
    MULTIBYTE,
    OK,
    OK_SEEN,
    REQUEST,
    RESCUE_TEXT,
    ROLE,
    TEXT,
    Answer,
    FakeProvider,
    check_envelope,
    check_uni,
    expect,
    ollama_lines,
    openai_error,
    openai_events,
    partial,
    policy,
    provider_for,
    rebuild,
    seen,
)

pytestmark = pytest.mark.usefixtures("graph")  # every turn here runs under both graphs

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

LIMIT = 3600.0  # virtual seconds: beyond every scripted wait, never reached by a passing test


@pytest.fixture
def no_gc() -> Iterator[None]:
    """The cyclic garbage collector off for the test: with thousands of connections alive, its
    passes over the whole test session's heap double a test's time. Collected afterwards."""
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.collect()


@pytest.fixture
def loop_clock() -> trio.testing.MockClock:
    """Virtual time that jumps only after 20 ms of real idleness (bytes in flight on loopback
    are not silence)."""
    return trio.testing.MockClock(autojump_threshold=0.02)


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
                                REQUEST,
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


OK_REPLY = Reply(chunks=tuple(OK))
NDJSON = "application/x-ndjson"


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


def ollama_reply(lines: Sequence[bytes], **fields: Any) -> Reply:
    return Reply(chunks=tuple(lines), content_type=NDJSON, **fields)


BAD_FRAME = b'data: {"delta": "x"\n\n'
SILENT_REPLY = Reply(chunks=tuple(OK), stall_after=0)  # headers, then nothing
WITHHELD = Reply(stall_headers=True)  # not even the headers
RESCUE_SEEN = ("D", "usage", "done")


@attrs.frozen
class LoopCase:
    """One catalogue script over loopback, with what it must give."""

    id: str
    script: Script
    at: tuple[float, ...]
    outcome: Outcome
    saw: Sequence[str]
    text: str
    ended: float | None = None
    pol: dict[str, Any] = attrs.field(factory=dict)
    dialect: str = "openai"

    def __str__(self) -> str:
        return self.id


def _loop_cases() -> list[LoopCase]:
    lines = ollama_lines()
    bad_line = lines[1].replace(b"quick", b"qu\xffck")
    multibyte = openai_text_stream(list(MULTIBYTE))
    emoji = multibyte.index("👋".encode())  # cut 1/1/1/1; everything else in 5-byte chunks
    one_byte = (
        *split(multibyte[:emoji], 5),
        *split(multibyte[emoji : emoji + 4], 1),
        *split(multibyte[emoji + 4 :], 5),
    )
    cr_split = (
        ROLE,
        b'data: {"id":"c1","choices":[{"index":0,"delta":{"content":"The "}}],\r',
        b'\ndata: "model":"m"}\r\n\r\n',
        *OK[2:],
    )
    limited = status_reply(429, retry_after="1")
    return [
        LoopCase(
            "F02-ndjson-last-line-without-lf",
            [ollama_reply([*lines[:-1], lines[-1].rstrip(b"\n")])],
            (0.0,),
            Outcome.COMPLETED,
            expect("start", *OK_SEEN, END_OK),
            TEXT,
            dialect="ollama",
        ),
        LoopCase(
            "F02-ndjson-last-line-cut",
            [ollama_reply([*lines[:-1], lines[-1][:25]]), ollama_reply(lines)],
            (0.0, 0.1),
            Outcome.COMPLETED,
            expect("start", "D*5", "reset", *OK_SEEN, END_OK),
            TEXT,
            dialect="ollama",
        ),
        LoopCase(
            "F03-silence-then-rescue",
            rescue_after(SILENT_REPLY),
            (0.0, 120.1, 240.1),
            Outcome.FALLBACK_TO_NON_STREAMING,
            expect("start", *RESCUE_SEEN, END_OK),
            RESCUE_TEXT,
            ended=240.1,
        ),
        LoopCase(
            "F03-headers-withheld-then-rescue",
            rescue_after(WITHHELD),
            (0.0, 120.1, 240.1),
            Outcome.FALLBACK_TO_NON_STREAMING,
            expect("start", *RESCUE_SEEN, END_OK),
            RESCUE_TEXT,
            ended=240.1,
        ),
        LoopCase(
            "F03-rescue-hangs",
            rescue_after(SILENT_REPLY, WITHHELD),
            (0.0, 120.1, 240.1),
            Outcome.EVENT_TIMEOUT,
            expect("start", END_TIMEOUT),
            "",
            ended=300.0,
        ),
        LoopCase(
            "F03-without-rescue",
            [SILENT_REPLY],
            (0.0, 120.1),
            Outcome.EVENT_TIMEOUT,
            expect("start", END_TIMEOUT),
            "",
            ended=240.1,
            pol={"fallback": False},
        ),
        LoopCase(
            "F05-pings-are-no-events",
            rescue_after(Reply(chunks=tuple(OK), stall_after=0, ping_every=10.0)),
            (0.0, 120.1, 240.1),
            Outcome.FALLBACK_TO_NON_STREAMING,
            expect("start", *RESCUE_SEEN, END_OK),
            RESCUE_TEXT,
        ),
        LoopCase(
            "F05-pings-after-an-event",
            [Reply(chunks=tuple(OK), stall_after=2, ping_every=10.0), OK_REPLY],
            (0.0, 180.1),
            Outcome.COMPLETED,
            expect("start", "D", "reset", *OK_SEEN, END_OK),
            TEXT,
        ),
        LoopCase(
            "F06-total-deadline-then-rescue",
            rescue_after(
                Reply(chunks=(ROLE + OK[1], *OK[2:6]), chunk_delay=59.0, stall_after=5),
                Reply(
                    chunks=(openai_text_body(RESCUE_TEXT),),
                    content_type="application/json",
                    headers_delay=10.0,
                ),
            ),
            (0.0, 300.0),
            Outcome.FALLBACK_TO_NON_STREAMING,
            expect("start", "D*5", "reset", *RESCUE_SEEN, END_OK),
            RESCUE_TEXT,
            ended=310.0,
        ),
        LoopCase(
            "F08-eof-before-any-event",
            [Reply(), OK_REPLY],
            (0.0, 0.1),
            Outcome.COMPLETED,
            expect("start", *OK_SEEN, END_OK),
            TEXT,
        ),
        LoopCase(
            "F11-503-three-times",
            [status_reply(503)] * 3 + [OK_REPLY],
            (0.0, 5.0, 10.0, 15.0),
            Outcome.COMPLETED,
            expect("start", *OK_SEEN, END_OK),
            TEXT,
        ),
        LoopCase(
            "F12-always-503",
            rescue_after(status_reply(503)),
            (0.0, 5.0, 10.0, 15.0, 20.0, 25.0),
            Outcome.RATE_LIMITED,
            expect("start", END_RATE),
            "",
            ended=25.0,
        ),
        LoopCase(
            "F14-retry-after-3600",
            rescue_after(status_reply(429, retry_after="3600")),
            (0.0,),
            Outcome.RATE_LIMITED,
            expect("start", END_RATE),
            "",
            ended=0.0,
        ),
        LoopCase(
            "F15-unusable-retry-after",
            [status_reply(429, retry_after="soon"), OK_REPLY],
            (0.0, 5.0),
            Outcome.COMPLETED,
            expect("start", *OK_SEEN, END_OK),
            TEXT,
        ),
        LoopCase(
            "F16-529-retry-after-1",
            [status_reply(529, retry_after="1")] * 2 + [OK_REPLY],
            (0.0, 1.0, 2.0),
            Outcome.COMPLETED,
            expect("start", *OK_SEEN, END_OK),
            TEXT,
        ),
        LoopCase(
            "F17-in-stream-server-error",
            [Reply(chunks=(*OK[:2], openai_error("server_error"))), OK_REPLY],
            (0.0, 0.1),
            Outcome.COMPLETED,
            expect("start", "D", "reset", *OK_SEEN, END_OK),
            TEXT,
        ),
        LoopCase(
            "F17-in-stream-rate-limit",
            [Reply(chunks=(*OK[:2], openai_error("rate_limit_exceeded"))), OK_REPLY],
            (0.0, 5.0),
            Outcome.COMPLETED,
            expect("start", "D", "reset", *OK_SEEN, END_OK),
            TEXT,
        ),
        LoopCase(
            "F17-in-stream-invalid-request",
            rescue_after(Reply(chunks=(*OK[:2], openai_error("invalid_request_error")))),
            (0.0,),
            Outcome.FAILED,
            expect("start", "D", END_PROVIDER),
            FRAGMENTS[0],
        ),
        LoopCase(
            "F19-should-retry-false-on-500",
            rescue_after(status_reply(500, should_retry=False)),
            (0.0,),
            Outcome.INIT_FAILED,
            expect("start", END_PROVIDER),
            "",
        ),
        LoopCase(
            "F20-502-then-ok",
            [status_reply(502), OK_REPLY],
            (0.0, 0.1),
            Outcome.COMPLETED,
            expect("start", *OK_SEEN, END_OK),
            TEXT,
        ),
        LoopCase(
            "F22-malformed-frame",
            [Reply(chunks=(ROLE, OK[1], BAD_FRAME + OK[2], *OK[3:])), OK_REPLY],
            (0.0, 0.1),
            Outcome.COMPLETED,
            expect("start", "D", "reset", *OK_SEEN, END_OK),
            TEXT,
        ),
        LoopCase(
            "F23-characters-cut-across-chunks",
            [Reply(chunks=one_byte)],
            (0.0,),
            Outcome.COMPLETED,
            expect("start", "D*5", "usage", "done", END_OK),
            "".join(MULTIBYTE),
        ),
        LoopCase(
            "F24-invalid-utf8-in-ndjson",
            [ollama_reply([lines[0], bad_line, *lines[2:]]), ollama_reply(lines)],
            (0.0, 0.1),
            Outcome.COMPLETED,
            expect("start", "D", "reset", *OK_SEEN, END_OK),
            TEXT,
            dialect="ollama",
        ),
        LoopCase(
            "F25-crlf-split-across-chunks",
            [Reply(chunks=cr_split)],
            (0.0,),
            Outcome.COMPLETED,
            expect("start", *OK_SEEN, END_OK),
            TEXT,
        ),
        LoopCase(
            "F39-budgets-are-separate",
            [status_reply(500), limited, status_reply(500), limited, status_reply(500), OK_REPLY],
            (0.0, 0.1, 1.1, 1.3, 2.3, 2.7),
            Outcome.COMPLETED,
            expect("start", *OK_SEEN, END_OK),
            TEXT,
        ),
        LoopCase(
            "F40-rate-limit-wait-past-the-total-deadline",
            rescue_after(
                [
                    Reply(chunks=tuple(OK), stall_after=4),
                    status_reply(429, retry_after="60"),
                    status_reply(429, retry_after="60"),
                ]
            ),
            (0.0, 180.1, 240.1),
            Outcome.RATE_LIMITED,
            expect("start", "D*3", END_RATE),
            "The quick brown ",
            ended=240.1,
        ),
        LoopCase(
            "F42-total-deadline-cuts-the-backoff",
            rescue_after(
                [
                    Reply(chunks=tuple(OK), stall_after=2),
                    Reply(chunks=(ROLE, OK[1], b": bye\n\n"), chunk_delay=(299.95 - 180.1) / 3),
                ]
            ),
            (0.0, 180.1, 300.0),
            Outcome.FALLBACK_TO_NON_STREAMING,
            expect("start", "D", "reset", "D", "reset", *RESCUE_SEEN, END_OK),
            RESCUE_TEXT,
            ended=300.0,
        ),
        LoopCase(
            "F45-finish-length",
            [Reply(chunks=tuple(f.replace(b'"stop"', b'"length"') for f in OK)), OK_REPLY],
            (0.0,),
            Outcome.COMPLETED,
            expect("start", "D*5", "usage", "end(error, provider_length)"),
            TEXT,
        ),
    ]


LOOP_CASES = _loop_cases()


@pytest.mark.parametrize("case", LOOP_CASES, ids=str)
async def test_catalogue_script_over_loopback(
    loop_clock: trio.testing.MockClock, case: LoopCase
) -> None:
    # a fresh copy: some scripts count the requests they answered (each graph runs the case)
    case = next(c for c in _loop_cases() if str(c) == str(case))
    dialect = OllamaDialect() if case.dialect == "ollama" else None
    run = await loop_turn(case.script, pol=policy(**case.pol), dialect=dialect)
    check_loop(
        run, at=case.at, outcome=case.outcome, saw=case.saw, text=case.text, ended=case.ended
    )


async def test_f10_connection_refused_every_time_over_loopback(
    loop_clock: trio.testing.MockClock,
) -> None:
    # nobody listens: every request, the rescue too, fails to connect; the times are the
    # backoff the status events report
    run = await loop_turn([OK_REPLY], base_url=refused_url() + "/v1")
    assert run.result.outcome is Outcome.INIT_FAILED
    assert run.result.attempts == 5
    assert seen(run.events) == expect("start", END_PROVIDER)
    backoffs = [(e.elapsed_ms, e.delay_ms) for e in run.events if isinstance(e, StatusEvent)]
    assert backoffs[:3] == [(0, 100), (100, 200), (300, 400)]
    assert run.ended == pytest.approx(0.7, abs=1e-3)
    assert run.server.requests == []
    check_envelope(run.events, run.turn.run_id)


@pytest.mark.parametrize(
    ("script", "when"),
    [([status_reply(500)], 0.05), ([status_reply(429, retry_after=10)], 3.0)],
    ids=["backoff", "rate-limit-wait"],
)
async def test_f30_cancel_in_a_wait_over_loopback(
    loop_clock: trio.testing.MockClock, script: list[Reply], when: float
) -> None:
    async def at(server: LoopbackProvider, turn: Turn) -> None:
        await trio.sleep_until(when)

    run = await loop_turn(script, cancel_at=at)
    check_loop(
        run, at=[0.0], outcome=Outcome.CANCELLED, saw=expect("start", END_CANCELLED), text=""
    )
    assert run.ended == pytest.approx(when, abs=1e-3)


async def test_f31_cancel_during_a_hung_rescue_over_loopback(
    loop_clock: trio.testing.MockClock,
) -> None:
    async def rescue_held(server: LoopbackProvider, turn: Turn) -> None:
        await server.wait_for_requests(5)

    run = await loop_turn(rescue_after(status_reply(500), WITHHELD), cancel_at=rescue_held)
    check_loop(
        run,
        at=[0.0, 0.1, 0.3, 0.7, 0.7],
        outcome=Outcome.CANCELLED,
        saw=expect("start", END_CANCELLED),
        text="",
        ended=0.7,
    )
    assert b'"stream":true' not in run.server.requests[4].body
    await trio.sleep(3600)
    assert len(run.server.requests) == 5  # no 6th, ever


@pytest.mark.parametrize(("rpm", "first"), [(6, 10.0), (1, 30.0)], ids=["6rpm", "1rpm-capped"])
async def test_f46_a_drained_bucket_delays_the_request_over_loopback(
    loop_clock: trio.testing.MockClock, rpm: int, first: float
) -> None:
    run = await loop_turn([OK_REPLY], pol=policy(requests_per_minute=rpm), drained=rpm)
    check_loop(
        run,
        at=[first],
        outcome=Outcome.COMPLETED,
        saw=expect("start", *OK_SEEN, END_OK),
        text=TEXT,
        ended=first,
    )


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


# --- F32, F33 on the hub alone: exact virtual time ------------------------------------------------


@attrs.define
class HubReader:
    """A subscriber of the hub that resumes after every drop; `per_event` seconds per event
    (0: as fast as it can)."""

    hub: Hub
    run_id: str
    per_event: float = 0.0
    data: list[bytes] = attrs.field(factory=list)
    resumed_after: list[int] = attrs.field(factory=list)  # the seq each drop left it at
    done_at: float | None = None

    @property
    def drops(self) -> int:
        return len(self.resumed_after)

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        last = 0
        first = True
        while self.done_at is None:
            with self.hub.subscribe(self.run_id, last) as sub:
                if first:
                    task_status.started()
                    first = False
                try:
                    async for entry in sub:
                        self.data.append(entry.data)
                        last = entry.seq
                        if self.per_event:
                            await trio.sleep(self.per_event)
                        if isinstance(entry.event, RunDone):
                            self.done_at = trio.current_time()
                except SubscriberDropped as dropped:
                    self.resumed_after.append(dropped.last_seq)


def paced_answer(count: int, gap: float) -> Answer:
    """The `ok` stream with `count` deltas, one every `gap` seconds."""
    events = openai_events(words(count))
    body: list[Any] = [events[0]]
    for delta in events[1 : 1 + count]:
        body += [gap, delta]
    return Answer(body=[*body, *events[1 + count :]])


async def hub_run(
    answer: Answer, readers: Sequence[HubReader], hub: Hub, run_id: str
) -> tuple[TurnResult, float, FakeProvider]:
    """A turn on the virtual-time provider whose run events go to `hub`, with `readers`
    subscribed before its first event."""
    fake = FakeProvider([answer])
    async with (
        httpx.AsyncClient(transport=httpx.MockTransport(fake.handle)) as client,
        trio.open_nursery() as nursery,
    ):
        sink = hub.sink(run_id)
        for reader in readers:
            await nursery.start(reader.run)
        turn: Turn = await nursery.start(
            functools.partial(
                run_turn,
                REQUEST,
                provider_for(),
                client=client,
                policy=policy(),
                limiter=RateLimiter(),
                sinks=[sink],
                run_id=run_id,
            )
        )
        result = await turn.result()
        ended = trio.current_time()
    return result, ended, fake


async def test_f32_a_10x_slower_subscriber_is_dropped_resumes_and_slows_nobody(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # 1,000 deltas at 100 a second; the slow subscriber takes 0.1 s an event (10x slower)
    hub = Hub(buffer=64)
    fast = [HubReader(hub, "f32") for _ in range(3)]
    slow = HubReader(hub, "f32", per_event=0.1)
    base = Hub(buffer=64)
    control = [HubReader(base, "f32") for _ in range(3)]
    alone, alone_ended, _ = await hub_run(paced_answer(1000, 0.01), control, base, "f32")
    start = trio.current_time()
    result, ended, fake = await hub_run(paced_answer(1000, 0.01), [*fast, slow], hub, "f32")
    log = [entry.data for entry in hub.log.get("f32").entries]
    events = [entry.event for entry in hub.log.get("f32").entries]
    assert fake.times == [pytest.approx(start)]
    assert result.outcome is Outcome.COMPLETED
    assert seen(events) == expect("start", "D*1000", "usage", "done", END_OK)
    check_envelope(events, "f32")
    assert rebuild(events) == "".join(words(1000))
    assert ended - start == pytest.approx(alone_ended, abs=1e-9)  # the run was not slowed
    for reader, twin in zip(fast, control, strict=True):
        assert reader.data == log  # every event once, in order
        assert reader.drops == 0
        assert reader.done_at is not None
        assert twin.done_at is not None
        assert reader.done_at - start == pytest.approx(twin.done_at, abs=1e-9)
    assert slow.drops >= 1  # dropped at overflow...
    assert slow.data == log  # ...resumed, and got every event exactly once
    assert slow.resumed_after == sorted(set(slow.resumed_after))
    assert slow.done_at is not None
    assert slow.done_at - start > 10 * (ended - start) * 0.9
    assert alone.outcome is Outcome.COMPLETED


async def test_f33_a_subscriber_that_never_reads_is_dropped_when_full(
    autojump_clock: trio.testing.MockClock,
) -> None:
    base = Hub(buffer=64)
    _, alone_ended, _ = await hub_run(
        paced_answer(300, 0.01), [HubReader(base, "f33")], base, "f33"
    )
    hub = Hub(buffer=64)
    reader = HubReader(hub, "f33")
    start = trio.current_time()
    fake = FakeProvider([paced_answer(300, 0.01)])
    async with (
        httpx.AsyncClient(transport=httpx.MockTransport(fake.handle)) as client,
        trio.open_nursery() as nursery,
    ):
        sink = hub.sink("f33")
        stuck = hub.subscribe("f33")  # never read
        await nursery.start(reader.run)
        result = await run_turn(
            REQUEST,
            provider_for(),
            client=client,
            policy=policy(),
            limiter=RateLimiter(),
            sinks=[sink],
            run_id="f33",
        )
        ended = trio.current_time()
    assert result.outcome is Outcome.COMPLETED
    assert ended - start == pytest.approx(alone_ended, abs=1e-9)  # the turn ends as it would
    assert stuck.drop_reason == "fell_behind"
    assert stuck.cancel_scope.cancel_called
    assert stuck.cursor == 0
    with pytest.raises(SubscriberDropped):
        await stuck.next_batch()
    stuck.close()
    assert reader.data == [entry.data for entry in hub.log.get("f33").entries]
    assert hub.statistics()["subscribers"] == 0


# --- F32-F38, F47, F49 through the server ---------------------------------------------------------

SMALL = 4096  # socket buffers of a client that backs up quickly (and of the server, per client)
# Subscribers that stop reading fill the kernel's buffers, and TCP then waits on its own timers
# (zero-window probes) in real time, which a mock clock cannot drive: the tests with stuck
# readers run in real time, with short real delays. F32 and F33 also run on the hub alone in
# exact virtual time (above).
STUCK_LIMITS = Limits(send_buffer=SMALL, max_subscribers_per_client=2000)


def thousand(gap: float) -> Reply:
    """1,000 deltas, 25 to a chunk, a chunk every `gap` seconds (41 chunks)."""
    return text_reply(words(1000), per_chunk=25, chunk_delay=gap)


THOUSAND_SEEN = expect("start", "D*1000", "usage", "done", END_OK)


async def test_f32_slow_sse_and_websocket_subscribers_are_dropped_resume_and_slow_nobody() -> None:
    with trio.fail_after(20):
        async with site([thousand(0.03)], hub=Hub(buffer=256), limits=STUCK_LIMITS) as served:
            run = await served.start()
            reads: dict[str, list[Read]] = {}

            over = trio.Event()

            async def one(name: str, transport: str, pace: Pace | None) -> None:
                rcvbuf = SMALL if pace else None
                reads[name] = await follow(run, transport, pace=pace, rcvbuf=rcvbuf)
                if name == "fast-sse":
                    over.set()

            # 25 events per 0.3 s against the run's 25 per 0.03 s: ten times slower while the
            # run streams (after it, the slow readers catch up at full speed)
            slow = Pace(25, 0.3, over)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(one, "fast-sse", "sse", None)
                nursery.start_soon(one, "fast-ws", "ws", None)
                nursery.start_soon(one, "slow-sse", "sse", slow)
                nursery.start_soon(one, "slow-ws", "ws", slow)
            metrics = await served.metrics()
    events = check_site(
        served, run, at=[0.0], saw=THOUSAND_SEEN, text="".join(words(1000)), tolerance=0.5
    )
    # the run took the script's time (41 chunks, 30 ms apart): nobody slowed it
    assert 1230 <= events[-1].elapsed_ms < 1230 + 600
    for name, segments in reads.items():
        check_reads(served, run, segments)  # every event exactly once, in order
        if name.startswith("fast"):
            assert len(segments) == 1, name  # never dropped
    for name in ("slow-sse", "slow-ws"):
        assert len(reads[name]) >= 2, name  # dropped at overflow, then resumed
        assert not reads[name][0].finished
    assert (reads["slow-ws"][0].code, reads["slow-ws"][0].reason) == (1013, "fell_behind")
    assert (reads["fast-ws"][0].code, reads["fast-ws"][0].reason) == (1000, "done")
    assert metrics["subscribers_dropped"] >= 2


async def test_f33_subscribers_that_never_read_are_dropped_and_the_run_ends_on_time() -> None:
    with trio.fail_after(20):
        limits = attrs.evolve(STUCK_LIMITS, close_timeout=0.2)
        async with site([thousand(0.02)], hub=Hub(buffer=256), limits=limits) as served:
            run = await served.start()
            never = trio.Event()
            reads: dict[str, Read] = {}

            async def stuck(name: str) -> None:
                if name == "sse":
                    reads[name] = await read_sse(run.events_url, rcvbuf=SMALL, never_read=never)
                else:
                    reads[name] = await read_ws(run.ws_url, rcvbuf=SMALL, never_read=never)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(stuck, "sse")
                nursery.start_soon(stuck, "ws")
                fast = await read_sse(run.events_url)
                while (await served.metrics())["subscribers_dropped"] < 2:  # noqa: ASYNC110
                    await trio.sleep(0.05)  # the server offers a count, not an event
                never.set()
            metrics = await served.metrics()
    events = check_site(
        served, run, at=[0.0], saw=THOUSAND_SEEN, text="".join(words(1000)), tolerance=0.5
    )
    assert 820 <= events[-1].elapsed_ms < 820 + 600  # on the script's time: nobody waited
    check_reads(served, run, [fast])
    assert metrics["subscribers_dropped"] == 2
    assert metrics["subscribers"] == 0
    assert [read.data for read in reads.values()] == [[], []]


async def test_f34_dropped_after_seq_37_of_100_resumes_with_38_to_100_once(
    loop_clock: trio.testing.MockClock,
) -> None:
    # run.started, 96 deltas, usage, answer.done, run.done: 100 events, streamed over 1.2 s
    script = [text_reply(words(96), per_chunk=8, chunk_delay=0.1)]
    with trio.fail_after(LIMIT):
        async with site(script) as served:
            run = await served.start()
            first = await read_sse(run.events_url, limit=37)
            assert not served.hub.log.get(run.run_id).done  # cut while the run streams
            cursor = first.ids[-1]
            assert cursor == f"{run.run_id}:37"
            rests = [
                await read_sse(run.events_url, last_event_id=cursor),
                await read_sse(sse_url(run, "37")),
                await read_ws(ws_url(run, "37")),
                await read_ws(ws_url(run, cursor)),
            ]
    check_site(
        served,
        run,
        at=[0.0],
        saw=expect("start", "D*96", "usage", "done", END_OK),
        text="".join(words(96)),
    )
    log = served.log(run.run_id)
    assert len(log) == 100
    assert first.seqs == list(range(1, 38))
    for rest in rests:
        assert rest.seqs == list(range(38, 101))
        check_reads(served, run, [first, rest])
        assert rest.clean


async def test_f35_resume_after_run_done_replays_within_retention_then_404(
    loop_clock: trio.testing.MockClock,
) -> None:
    text = "".join(words(10))
    with trio.fail_after(LIMIT):
        async with site([text_reply(words(10))]) as served:
            run = await served.start()
            await served.wait_for(run.run_id)
            saw = expect("start", "D*10", "usage", "done", END_OK)
            check_site(served, run, at=[0.0], saw=saw, text=text)
            log = served.log(run.run_id)
            done_at = trio.current_time()
            await trio.sleep_until(done_at + 299.0)  # retention: 300 s after run.done
            replay_sse = await read_sse(sse_url(run, "5"))
            replay_ws = await read_ws(ws_url(run, "5"))
            await trio.sleep_until(done_at + 301.0)
            later_sse = await read_sse(sse_url(run, "5"))
            later_ws = await read_ws(ws_url(run, "5"))
            unknown = await read_sse(sse_url(attrs.evolve(run, run_id="ab" * 12)))
    assert replay_sse.data == log[5:]  # replay to run.done, then the stream ends
    assert replay_sse.finished
    assert replay_sse.clean
    assert replay_ws.data == log[5:]
    assert (replay_ws.code, replay_ws.reason) == (1000, "done")
    assert later_sse.status == 404
    assert later_sse.body == unknown.body  # the same bytes as a run that never was
    assert (later_ws.code, later_ws.reason) == (1008, "not_found")
    assert later_ws.data == []


@pytest.mark.parametrize("cursor", ["x", "-1", "1.5", "past", "other"])
async def test_f36_bad_cursors_are_refused_with_400_or_1008_and_no_event(
    loop_clock: trio.testing.MockClock, cursor: str
) -> None:
    with trio.fail_after(LIMIT):
        async with site([text_reply(words(5))]) as served:
            run, other = await served.start(), await served.start()
            await served.wait_for(run.run_id)
            await served.wait_for(other.run_id)
            last = len(served.log(run.run_id))
            value = {"past": str(last + 1), "other": f"{other.run_id}:2"}.get(cursor, cursor)
            by_header = await read_sse(run.events_url, last_event_id=value)
            by_query = await read_sse(sse_url(run, value))
            by_ws = await read_ws(ws_url(run, value))
    saw = expect("start", "D*5", "usage", "done", END_OK)
    check_site(served, run, at=[0.0, 0.0], saw=saw, text="".join(words(5)), attempts=1)
    for refused in (by_header, by_query):
        assert refused.status == 400
        assert refused.data == []
        assert msgspec.json.decode(refused.body)["error"]["type"] == "cursor_invalid"
    assert (by_ws.code, by_ws.reason, by_ws.data) == (1008, "cursor_invalid", [])


async def test_f36_an_unknown_run_gets_the_same_bytes_as_not_yours(
    loop_clock: trio.testing.MockClock,
) -> None:
    with trio.fail_after(LIMIT):
        async with site([text_reply(words(5))]) as served:
            mine, other = await served.start(), await served.start()
            wrong = attrs.evolve(mine, events_url=mine.events_url.replace(mine.token, other.token))
            unknown = attrs.evolve(
                other, events_url=other.events_url.replace(other.run_id, "ab" * 12)
            )
            answers = [await read_sse(r.events_url) for r in (wrong, unknown)]
            ws_wrong = await read_ws(mine.ws_url.replace(mine.token, other.token))
            ws_unknown = await read_ws(other.ws_url.replace(other.run_id, "ab" * 12))
    assert [a.status for a in answers] == [404, 404]
    assert answers[0].body == answers[1].body
    assert (ws_wrong.code, ws_wrong.reason) == (ws_unknown.code, ws_unknown.reason)
    assert (ws_wrong.code, ws_wrong.reason) == (1008, "not_found")
    assert ws_wrong.data == ws_unknown.data == []


async def test_f37_join_after_50_deltas_without_cursor_starts_at_seq_1_then_live(
    loop_clock: trio.testing.MockClock,
) -> None:
    # 50 deltas at once, then 10 more after 5 s
    stream = text_reply(words(60), per_chunk=100).chunks[0]
    frames = [f + b"\n\n" for f in stream.split(b"\n\n") if f]
    script = [Reply(chunks=(b"".join(frames[:51]), b"".join(frames[51:])), chunk_delay=2.5)]
    with trio.fail_after(LIMIT):
        async with site(script) as served:
            run = await served.start()
            await served.wait_for(run.run_id, 51)  # run.started and 50 deltas
            joined_at = trio.current_time()
            assert not served.hub.log.get(run.run_id).done
            async with trio.open_nursery() as nursery:
                reads: list[Read] = []

                async def sse() -> None:
                    reads.append(await read_sse(run.events_url))

                async def ws() -> None:
                    reads.append(await read_ws(run.ws_url))

                nursery.start_soon(sse)
                nursery.start_soon(ws)
    saw = expect("start", "D*60", "usage", "done", END_OK)
    events = check_site(served, run, at=[0.0], saw=saw, text="".join(words(60)))
    assert joined_at - run.started == pytest.approx(2.5, abs=1e-3)
    assert events[-1].elapsed_ms == 5000  # the rest came live, 2.5 s after the join
    for read in reads:
        assert read.seqs[0] == 1
        check_reads(served, run, [read])
        assert read.finished


async def test_f38_500_websocket_subscribers_each_see_the_reset_and_one_completed_end(
    loop_clock: trio.testing.MockClock, no_gc: None
) -> None:
    fragments = words(10)
    stream = openai_text_stream(fragments)
    frames = stream.split(b"\n\n")
    cut = len(b"\n\n".join(frames[:11])) + 2  # the role chunk and 10 deltas, then dropped
    script = [
        Reply(chunks=(stream,), drop_after_bytes=cut, headers_delay=1.0),
        text_reply(fragments, headers_delay=1.0),
    ]
    reads: list[Read] = []
    with trio.fail_after(LIMIT):
        async with site(script) as served:
            run = await served.start()

            async def one() -> None:
                reads.append(await read_ws_raw(run.ws_url))

            async with trio.open_nursery() as nursery:
                for _ in range(500):
                    nursery.start_soon(one)
    saw = expect("start", "D*10", "reset", "D*10", "usage", "done", END_OK)
    check_site(served, run, at=[0.0, 1.1], saw=saw, text="".join(fragments))
    assert len(reads) == 500
    for read in reads:
        check_reads(served, run, [read])  # each: D x10, reset, the retry's text, one end
        assert (read.code, read.reason) == (1000, "done")
        assert rebuild(read.events) == "".join(fragments)


async def test_f47_a_cursor_below_the_kept_log_is_410_or_1008_cursor_expired(
    loop_clock: trio.testing.MockClock,
) -> None:
    hub = Hub(log=MemoryRunLog(max_events=16))
    with trio.fail_after(LIMIT):
        async with site([text_reply(words(40))], hub=hub) as served:
            run = await served.start()
            await served.wait_for(run.run_id)
            first_kept = hub.log.get(run.run_id).base
            resumed = await read_sse(run.events_url, last_event_id=f"{run.run_id}:1")
            joined = await read_sse(run.events_url)  # from seq 1: a gap too
            ws_resumed = await read_ws(ws_url(run, "1"))
            ws_joined = await read_ws(run.ws_url)
            kept = await read_sse(sse_url(run, str(first_kept - 1)))
    assert first_kept > 2
    for refused in (resumed, joined):
        assert refused.status == 410
        assert refused.data == []
        error = msgspec.json.decode(refused.body)["error"]
        assert (error["type"], error["first_kept"]) == ("cursor_expired", first_kept)
    for refused in (ws_resumed, ws_joined):
        assert (refused.code, refused.reason, refused.data) == (1008, "cursor_expired", [])
    assert kept.seqs[0] == first_kept  # the oldest kept event is still reachable
    assert kept.finished


async def test_f48_every_reader_sees_the_same_reset_at_the_same_point(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # F04: 3 deltas, a stall cut at 180 s, then the whole reply
    fake = FakeProvider([partial(3, HANG), Answer(body=OK)])
    hub = Hub()
    run_jsonl, uni_jsonl = io.BytesIO(), io.BytesIO()
    got: dict[str, list[Any]] = {"run_events": [], "uni_events": [], "hub": []}
    async with (
        httpx.AsyncClient(transport=httpx.MockTransport(fake.handle)) as client,
        trio.open_nursery() as nursery,
    ):
        sinks: list[Sink] = [
            JSONLSink(run_jsonl),
            JSONLSink(uni_jsonl, kind="uni"),
            hub.sink("f48"),
        ]
        subscription = hub.subscribe("f48")
        turn: Turn = await nursery.start(
            functools.partial(
                run_turn,
                REQUEST,
                provider_for(),
                client=client,
                policy=policy(),
                limiter=RateLimiter(),
                sinks=sinks,
                run_id="f48",
            )
        )

        async def read_run() -> None:
            got["run_events"] = [event async for event in turn.run_events()]

        async def read_uni() -> None:
            got["uni_events"] = [item async for item in turn.uni_events()]

        async def read_hub() -> None:
            with subscription:
                got["hub"] = [entry.event async for entry in subscription]

        for reader in (read_run, read_uni, read_hub):
            nursery.start_soon(reader)
        result = await turn.result()
    assert fake.times == pytest.approx([0.0, 180.1])
    assert result.outcome is Outcome.COMPLETED
    runs = got["run_events"]
    assert seen(runs) == expect("start", "D*3", "reset", *OK_SEEN, END_OK)
    check_envelope(runs, "f48")
    assert rebuild(runs) == TEXT
    assert got["hub"] == runs
    assert [decode_run_event(line) for line in run_jsonl.getvalue().splitlines()] == runs
    # the MMSP views: the reset after the third delta, before the retry's first event
    uni_lines = uni_jsonl.getvalue().splitlines()
    uni = got["uni_events"]
    assert len(uni_lines) == len(uni)
    reset_at = [i for i, item in enumerate(uni) if isinstance(item, AttemptReset)]
    assert reset_at == [3]
    assert msgspec.json.decode(uni_lines[3]) == {"type": "attempt.reset", "attempt": 2}
    check_uni(uni)
    # and the run events put it at the same point: after three deltas (and the backoff's status),
    # before the retry's text
    reset_seq = [e.seq for e in runs if type(e).__name__ == "AttemptResetEvent"]
    assert reset_seq == [6]
    assert isinstance(runs[4], StatusEvent)


async def test_f49_a_silent_run_gets_sse_comments_at_15_and_30_s_without_id_or_seq(
    loop_clock: trio.testing.MockClock,
) -> None:
    stream = openai_text_stream(["Hel", "lo"])
    frames = [f + b"\n\n" for f in stream.split(b"\n\n") if f]
    script = [Reply(chunks=(b"".join(frames[:2]), b"", b"".join(frames[2:])), chunk_delay=20.0)]
    with trio.fail_after(LIMIT):
        async with site(script) as served:
            run = await served.start()
            read = await read_sse(run.events_url)
    saw = expect("start", "D*2", "usage", "done", END_OK)
    events = check_site(served, run, at=[0.0], saw=saw, text="Hello")
    check_reads(served, run, [read])
    # the role chunk and "Hel" at 20 s, then 40 s of silence, then the rest at 60 s
    assert [e.elapsed_ms for e in events] == [0, 20_000, 60_000, 60_000, 60_000, 60_000]
    comments = [t - run.started for t in read.comments]
    # 15 s after run.started, then 15 and 30 s into the 40 s of silence after "Hel"
    assert comments == pytest.approx([15.0, 35.0, 50.0], abs=0.05)
    assert read.ids == [f"{run.run_id}:{seq}" for seq in range(1, len(events) + 1)]
