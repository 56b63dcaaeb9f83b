"""The harness of the stream handler's scenarios (RELIABILITY.md F01-F31, F39-F46), in virtual
time, shared by the turn tests.

Every scenario runs a whole turn (`run_turn`) against a scripted provider behind
`httpx.MockTransport`: the transport's handler logs each request's virtual time, headers and
body, and answers with a body that sleeps between chunks, hangs, raises `httpx.ReadError` or ends
early. pytest-trio's `autojump_clock` (a `MockClock` jumping at once) makes the turn start at 0
and every time exact. The policy's jitter source is 0 (backoff 0.1, 0.2, 0.4 s) and its wall
clock is pinned at 1696004797 (Fri, 29 Sep 2023 16:26:37 GMT); each test has its own limiter.

Each scenario checks the request times, the outcome, the run events a live consumer saw (types
in order, `status` left out as the catalogue's notation does; `usage` kept), that `seq` runs
1..n with one `run.done` last, that the MMSP stream restarts its groups after every reset, and
that the text rebuilt from `answer.delta` honouring `attempt.reset` is what the provider sent,
exactly once (`check`).
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections import defaultdict
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any, Protocol

import attrs
import httpx
import msgspec
import pytest
import trio
import trio.testing
from rillet._core._dialect import Dialect, Provider, Secret
from rillet._core._events import TextDelta, TextDone, UniEvent
from rillet._core._markers import AttemptReset
from rillet._core._policy import Outcome, Policy
from rillet._core._request import TurnRequest, user
from rillet._core._runevents import (
    AnswerDelta,
    AnswerDone,
    AttemptResetEvent,
    RunDone,
    RunEvent,
    StatusEvent,
)
from rillet._turn._api import run_turn
from rillet._turn._ratelimit import RateLimiter
from rillet._turn._turn import Sink, SinkBatch, Turn, TurnResult
from rillet.providers._openai_chat._dialect import OpenAIChatDialect
from rillet.transports.testing import openai_text_body, openai_text_stream, sse

# --- the scripted provider --------------------------------------------------------------------

WALL = 1696004797.0  # Fri, 29 Sep 2023 16:26:37 GMT
BASE = "https://api.test/v1"
KEY = "sk-test-secret-0123456789"
REQUEST = TurnRequest(messages=[user("Say something")])
FRAGMENTS = ("The ", "quick ", "brown ", "fox ", "jumps.")
TEXT = "".join(FRAGMENTS)
RESCUE_TEXT = "Rescued in one piece."
SSE_TYPE = "text/event-stream"
NDJSON_TYPE = "application/x-ndjson"


class _Hang:
    """A body item: the provider goes silent for good (until the client leaves)."""

    def __repr__(self) -> str:
        return "HANG"


HANG = _Hang()


@attrs.frozen
class Raise:
    """A body item: the connection breaks (the client's read raises this)."""

    error: type[httpx.TransportError] = httpx.ReadError


@attrs.frozen
class Mark:
    """A body item: sets the provider's event of this name when reached (a stage a test waits
    for)."""

    name: str


Item = bytes | float | _Hang | Raise | Mark


@attrs.frozen
class Answer:
    """One scripted HTTP answer.

    Attributes:
        status: the status code.
        body: bytes chunks, sleeps (floats, seconds), `HANG`, `Raise(...)`, `Mark(...)`; the body
            ends (cleanly, for the client) after the last item.
        headers: extra response headers.
        content_type: the Content-Type; None for none.
        wait: seconds before the headers go out.
        hang: never answer at all (the provider holds the request).
        connect_error: the connection is refused (`httpx.ConnectError`).
    """

    status: int = 200
    body: Sequence[Item] = ()
    headers: Mapping[str, str] = attrs.field(factory=dict)
    content_type: str | None = SSE_TYPE
    wait: float = 0.0
    hang: bool = False
    connect_error: bool = False


@attrs.frozen
class Sent:
    """One request as the provider received it."""

    at: float
    url: str
    headers: Mapping[str, str]
    body: Any
    stream: bool


class Body(httpx.AsyncByteStream):
    """A response body played from its items, in virtual time; remembers what was read of it
    and whether the client closed it."""

    def __init__(self, items: Sequence[Item], fake: FakeProvider) -> None:
        self._items = items
        self._fake = fake
        self.pulled = 0  # chunks handed to the client
        self.closed = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for item in self._items:
            if isinstance(item, bytes):
                await trio.lowlevel.checkpoint()  # as every read from a socket does
                if self.closed:
                    return  # a closed stream hands over nothing more
                self.pulled += 1
                yield item
            elif isinstance(item, int | float):
                await trio.sleep(item)
            elif isinstance(item, Raise):
                raise item.error("connection reset by peer")
            elif isinstance(item, Mark):
                self._fake.event(item.name).set()
            else:
                await trio.sleep_forever()

    async def aclose(self) -> None:
        self.closed = True


@attrs.define(eq=False)
class FakeProvider:
    """The scripted provider behind `httpx.MockTransport`: answer n is `answers[n]` (the last
    repeats); a non-streaming request (the rescue) gets `rescue` when one is given."""

    answers: Sequence[Answer] | Callable[[Sent, int], Answer]
    rescue: Answer | None = None
    sent: list[Sent] = attrs.field(factory=list)
    bodies: list[Body] = attrs.field(factory=list)
    _events: defaultdict[str, trio.Event] = attrs.field(factory=lambda: defaultdict(trio.Event))

    def event(self, name: str) -> trio.Event:
        """The event of that name: `request <n>` is set when request n (1-based) arrives."""
        return self._events[name]

    @property
    def times(self) -> list[float]:
        """When each request arrived (virtual seconds)."""
        return [s.at for s in self.sent]

    async def handle(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        stream = bool(isinstance(body, dict) and body.get("stream")) or "stream" in request.url.path
        sent = Sent(trio.current_time(), str(request.url), dict(request.headers), body, stream)
        self.sent.append(sent)
        n = len(self.sent) - 1
        self.event(f"request {n + 1}").set()
        if not stream and self.rescue is not None:
            answer = self.rescue
        elif callable(self.answers):
            answer = self.answers(sent, n)
        else:
            answer = self.answers[min(n, len(self.answers) - 1)]
        if answer.connect_error:
            raise httpx.ConnectError("connection refused", request=request)
        if answer.hang:
            await trio.sleep_forever()
        if answer.wait:
            await trio.sleep(answer.wait)
        headers = dict(answer.headers)
        if answer.content_type is not None:
            headers.setdefault("content-type", answer.content_type)
        stream_body = Body(answer.body, self)
        self.bodies.append(stream_body)
        return httpx.Response(answer.status, headers=headers, stream=stream_body)


# --- streams ------------------------------------------------------------------------------------


def events_of(stream: bytes) -> list[bytes]:
    """An SSE stream cut into its events (each ending with its blank line)."""
    return [part + b"\n\n" for part in stream.split(b"\n\n") if part]


def openai_events(fragments: Sequence[str] = FRAGMENTS, **options: Any) -> list[bytes]:
    """The `ok` stream: role chunk, one chunk per fragment, finish, usage, `[DONE]`."""
    return events_of(openai_text_stream(list(fragments), **options))


OK = openai_events()  # ROLE, D x5, FINISH, USAGE, DONE
ROLE = OK[0]


def ok(**fields: Any) -> Answer:
    """The `ok` answer: 5 text deltas and the terminal event, one SSE event per chunk."""
    return Answer(body=OK, **fields)


def partial(count: int, *tail: Item) -> Answer:
    """The role chunk and `count` deltas of the `ok` stream, then `tail` (EOF if empty)."""
    return Answer(body=[*OK[: 1 + count], *tail])


def status(code: int, **headers: str) -> Answer:
    """An error status with an OpenAI error body and these headers (`_` for `-` in names)."""
    body = msgspec.json.encode(
        {"error": {"message": f"upstream said {code} for {KEY}", "type": None, "code": None}}
    )
    named = {name.replace("_", "-"): value for name, value in headers.items()}
    return Answer(status=code, body=[body], headers=named, content_type="application/json")


def rescue_ok(text: str = RESCUE_TEXT, **fields: Any) -> Answer:
    """The non-streaming completion the rescue gets."""
    return Answer(body=[openai_text_body(text)], content_type="application/json", **fields)


def anthropic_events(fragments: Sequence[str] = FRAGMENTS) -> list[bytes]:
    """An Anthropic Messages stream of one text block."""
    return [
        sse(
            {
                "type": "message_start",
                "message": {
                    "id": "msg_1",
                    "model": "claude-test",
                    "usage": {"input_tokens": 12, "output_tokens": 1},
                },
            },
            event="message_start",
        ),
        sse(
            {"type": "content_block_start", "index": 0, "content_block": {"type": "text"}},
            event="content_block_start",
        ),
        *(
            sse(
                {
                    "type": "content_block_delta",
                    "index": 0,
                    "delta": {"type": "text_delta", "text": fragment},
                },
                event="content_block_delta",
            )
            for fragment in fragments
        ),
        sse({"type": "content_block_stop", "index": 0}, event="content_block_stop"),
        sse(
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn"},
                "usage": {"output_tokens": 5},
            },
            event="message_delta",
        ),
        sse({"type": "message_stop"}, event="message_stop"),
    ]


def anthropic_error(error_type: str) -> bytes:
    """Anthropic's in-stream `event: error`."""
    return sse({"type": "error", "error": {"type": error_type, "message": "no"}}, event="error")


def gemini_events(fragments: Sequence[str] = FRAGMENTS) -> list[bytes]:
    """A Gemini stream: one whole response per fragment, the last with `finishReason`."""
    out = []
    for i, fragment in enumerate(fragments):
        candidate: dict[str, Any] = {
            "content": {"parts": [{"text": fragment}], "role": "model"},
            "index": 0,
        }
        if i == len(fragments) - 1:
            candidate["finishReason"] = "STOP"
        usage = {"promptTokenCount": 9, "candidatesTokenCount": i + 1, "totalTokenCount": 10 + i}
        out.append(
            sse(
                {
                    "candidates": [candidate],
                    "usageMetadata": usage,
                    "modelVersion": "gemini-test",
                    "responseId": "r1",
                }
            )
        )
    return out


def gemini_error(code: int, word: str) -> bytes:
    """Gemini's in-stream `{"error": {...}}` chunk."""
    return sse({"error": {"code": code, "message": "no", "status": word}})


def ollama_lines(fragments: Sequence[str] = FRAGMENTS, *, last_newline: bool = True) -> list[bytes]:
    """An Ollama NDJSON stream, one line per chunk; the `done` line without its LF if asked."""
    lines = [
        msgspec.json.encode(
            {
                "model": "llama-test",
                "message": {"role": "assistant", "content": fragment},
                "done": False,
            }
        )
        + b"\n"
        for fragment in fragments
    ]
    done = msgspec.json.encode(
        {
            "model": "llama-test",
            "message": {"role": "assistant", "content": ""},
            "done": True,
            "done_reason": "stop",
            "prompt_eval_count": 26,
            "eval_count": 5,
        }
    )
    return [*lines, done + (b"\n" if last_newline else b"")]


def ollama_error() -> bytes:
    """Ollama's in-stream `{"error": "..."}` line."""
    return b'{"error": "an error was encountered while running the model"}\n'


# --- running a turn -------------------------------------------------------------------------------


def policy(**overrides: Any) -> Policy:
    """The default policy with jitter 0 and the wall clock pinned."""
    fields: dict[str, Any] = {"random": lambda: 0.0, "wall_clock": lambda: WALL}
    fields.update(overrides)
    return Policy(**fields)


def provider_for(dialect: Dialect | None = None, base_url: str = BASE) -> Provider:
    """A provider speaking `dialect` (OpenAI Chat by default) with a secret key."""
    return Provider(
        dialect=dialect or OpenAIChatDialect(),
        base_url=base_url,
        model="test-model",
        api_key=Secret(KEY),
    )


@attrs.frozen
class Run:
    """A finished turn and what everyone saw of it."""

    fake: FakeProvider
    turn: Turn
    result: TurnResult
    live: list[RunEvent]  # what a consumer reading during the turn saw
    events: list[RunEvent]  # the log read after the end
    uni: list[UniEvent | AttemptReset]
    ended: float  # virtual time when the result was ready

    @property
    def times(self) -> list[float]:
        """The request times."""
        return self.fake.times


async def collect(turn: Turn, into: list[RunEvent]) -> None:
    """Read the turn's run events live, to the end."""
    async for event in turn.run_events():
        into.append(event)


async def play(
    answers: Sequence[Answer] | Callable[[Sent, int], Answer],
    *,
    rescue: Answer | None = None,
    dialect: Dialect | None = None,
    pol: Policy | None = None,
    limiter: RateLimiter | None = None,
    base_url: str = BASE,
    sinks: Sequence[Sink] = (),
    request: TurnRequest = REQUEST,
) -> Run:
    """Run one turn against the scripted provider, with a live consumer of its run events."""
    fake = FakeProvider(answers, rescue)
    client = httpx.AsyncClient(transport=httpx.MockTransport(fake.handle))
    async with client, trio.open_nursery() as nursery:
        turn: Turn = await nursery.start(
            functools.partial(
                run_turn,
                request,
                provider_for(dialect, base_url),
                client=client,
                policy=pol or policy(),
                limiter=limiter or RateLimiter(),
                sinks=sinks,
            )
        )
        live: list[RunEvent] = []
        nursery.start_soon(collect, turn, live)
        result = await turn.result()
        ended = trio.current_time()
    events = [event async for event in turn.run_events()]
    uni = [item async for item in turn.uni_events()]
    return Run(fake, turn, result, live, events, uni, ended)


# --- what a consumer saw --------------------------------------------------------------------------

_SHORT = {
    "run.started": "start",
    "answer.delta": "D",
    "attempt.reset": "reset",
    "answer.done": "done",
    "usage": "usage",
    "tool_call.started": "tool",
    "tool_call.done": "tool.done",
    "reasoning.delta": "R",
}


def seen(events: Sequence[RunEvent]) -> list[str]:
    """The catalogue's notation: `start`, `D`, `reset`, `done`, `usage`, `end(status, code)`;
    `status` events left out."""
    out = []
    for event in events:
        if isinstance(event, StatusEvent):
            continue
        if isinstance(event, RunDone):
            out.append(f"end({event.status}, {event.code})")
        else:
            out.append(_SHORT[str(type(event).__struct_config__.tag)])
    return out


def expect(*parts: str) -> list[str]:
    """Expected notation; `D*5` stands for five `D`."""
    out: list[str] = []
    for part in parts:
        name, star, count = part.partition("*")
        out.extend([name] * (int(count) if star else 1))
    return out


def rebuild(events: Sequence[RunEvent]) -> str:
    """The answer text as a consumer builds it: append each delta, clear on `attempt.reset`."""
    text: list[str] = []
    for event in events:
        if isinstance(event, AttemptResetEvent):
            text.clear()
        elif isinstance(event, AnswerDelta):
            text.append(event.delta)
    return "".join(text)


def check_envelope(events: Sequence[RunEvent], run_id: str) -> None:
    """`seq` 1..n without gaps, one `run.done`, last; monotonic `elapsed_ms`; one run id."""
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert [isinstance(e, RunDone) for e in events].count(True) == 1
    assert isinstance(events[-1], RunDone)
    assert all(e.run_id == run_id for e in events)
    elapsed = [e.elapsed_ms for e in events]
    assert elapsed == sorted(elapsed)


def check_uni(items: Sequence[UniEvent | AttemptReset]) -> None:
    """After every reset the groups start afresh: a `.done` joins only its own attempt's
    fragments, a voided group has no `.done`, a stop comes only last, resets count up."""
    group: list[str] = []
    last_reset = 0
    for i, item in enumerate(items):
        if isinstance(item, AttemptReset):
            assert item.attempt > last_reset
            last_reset = item.attempt
            group = []
            continue
        if item.event_type == "stop":
            assert i == len(items) - 1
            continue
        content = item.content_items[0]
        if isinstance(content, TextDelta):
            group.append(content.text)
        elif isinstance(content, TextDone):
            assert content.text == "".join(group)
            group = []


def check(
    run: Run,
    *,
    at: Sequence[float],
    outcome: Outcome,
    saw: Sequence[str],
    text: str,
    ended: float | None = None,
) -> None:
    """Everything every scenario asserts (see the module docstring)."""
    assert run.times == pytest.approx(at, abs=1e-6)
    assert run.result.outcome is outcome
    assert run.result.attempts == len(at)
    assert run.result.requests == len(at)  # what the turn cost, on the result and in run.done
    final = run.live[-1]
    assert isinstance(final, RunDone)
    assert (final.attempts, final.requests) == (len(at), len(at))
    assert seen(run.live) == list(saw)
    assert run.events == run.live
    check_envelope(run.events, run.turn.run_id)
    assert rebuild(run.events) == text
    assert run.result.text == text
    resets = [e for e in run.events if isinstance(e, AttemptResetEvent)]
    assert [e.attempt for e in resets] == [
        e.attempt for e in run.uni if isinstance(e, AttemptReset)
    ]
    check_uni(run.uni)
    done = [e for e in run.events if isinstance(e, AnswerDone)]
    if done:
        assert done[0].sha256 == hashlib.sha256(text.encode()).hexdigest()
        assert done[0].chars == len(text)
    if ended is not None:
        assert run.ended == pytest.approx(ended, abs=1e-6)
    assert all(body.closed for body in run.fake.bodies)
    end = run.events[-1]
    assert isinstance(end, RunDone)
    assert end.attempts == len(at)


END_OK = "end(completed, completed)"
END_TIMEOUT = "end(error, timeout)"
END_PROVIDER = "end(error, provider_error)"
END_RATE = "end(error, rate_limited)"


def end_error(code: str) -> str:
    """What `seen` shows for a run that ended `error` with `code`."""
    return f"end(error, {code})"


END_CANCELLED = "end(cancelled, cancelled)"
OK_SEEN = ("D*5", "usage", "done")


class Ran(Protocol):
    """A finished turn's record, here or over loopback: its run events, read after the end."""

    @property
    def events(self) -> list[RunEvent]: ...


def run_done(run: Ran) -> RunDone:
    """The run's `run.done`, which must be its last event."""
    end = run.events[-1]
    assert isinstance(end, RunDone)
    return end


def check_rate_limited_at_once(run: Run, wait: float, code: str = "rate_limited") -> None:
    """The turn ended RateLimited at once, with no wait and no rescue, surfacing `wait`; its
    `run.done` says `code` (`provider_unavailable` for a 503 or a 529)."""
    check(
        run,
        at=[0.0],
        outcome=Outcome.RATE_LIMITED,
        saw=expect("start", end_error(code)),
        text="",
        ended=0.0,
    )
    assert run.result.retry_after == pytest.approx(wait)
    assert run_done(run).retry_after_ms == int(wait * 1000)


# --- shared by the scenario modules ---------------------------------------------------------------


def statuses(run: Run) -> list[tuple[str, int, int | None]]:
    """The `status` events: (phase, elapsed_ms, delay_ms)."""
    return [(e.phase, e.elapsed_ms, e.delay_ms) for e in run.events if isinstance(e, StatusEvent)]


SILENT = Answer(body=[HANG])  # headers, then nothing


def openai_error(error_type: str) -> bytes:
    """An OpenAI `{"error": ...}` chunk inside the stream."""
    return sse({"error": {"message": "no", "type": error_type, "code": None}})


NOT_JSON = b'data: {"delta": "x"\n\n'  # cut short or corrupted on the way: transport-shaped
WRONG_SHAPE = b'data: {"choices": "x"}\n\n'  # the same request gets it again: no 2nd stream
BAD_FRAMES = [NOT_JSON, WRONG_SHAPE]


MULTIBYTE = ("héllo ", "wörld ", "世界 ", "👋", " 🇫🇷 done")


def openai_chunk(
    delta: Mapping[str, Any] | None = None,
    *,
    finish: str | None = None,
    usage: Mapping[str, Any] | None = None,
) -> bytes:
    """One Chat Completions chunk: a delta and/or a finish reason, or the usage chunk."""
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    chunk: dict[str, Any] = {"id": "c1", "model": "test-model", "choices": choices}
    if usage is not None:
        chunk["usage"] = usage
    return sse(chunk)


USAGE = openai_chunk(usage={"prompt_tokens": 12, "completion_tokens": 5})
DONE = sse("[DONE]")


def tool_stream(arguments: Sequence[str]) -> Answer:
    """A Chat Completions tool call whose arguments arrive in these fragments."""
    call = {"index": 0, "id": "call_1", "type": "function"}
    return Answer(
        body=[
            ROLE,
            openai_chunk(
                {"tool_calls": [{**call, "function": {"name": "get_weather", "arguments": ""}}]}
            ),
            *(
                openai_chunk({"tool_calls": [{"index": 0, "function": {"arguments": part}}]})
                for part in arguments
            ),
            openai_chunk({}, finish="tool_calls"),
            USAGE,
            DONE,
        ]
    )


@attrs.define(eq=False)
class SlowSink:
    """A sink that takes `seconds` over every batch."""

    seconds: float
    batches: list[SinkBatch] = attrs.field(factory=list)
    closed: int = 0

    async def deliver(self, batch: SinkBatch) -> None:
        await trio.sleep(self.seconds)
        self.batches.append(batch)

    async def close(self) -> None:
        self.closed += 1
