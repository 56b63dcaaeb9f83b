"""The stream handler, scenario by scenario (RELIABILITY.md F01-F31, F39-F46), in virtual time.

Every test runs a whole turn (`run_turn`) against a scripted provider behind
`httpx.MockTransport`: the transport's handler logs each request's virtual time, headers and
body, and answers with a body that sleeps between chunks, hangs, raises `httpx.ReadError` or ends
early. pytest-trio's `autojump_clock` (a `MockClock` jumping at once) makes the turn start at 0
and every time exact. The policy's jitter source is 0 (backoff 0.1, 0.2, 0.4 s) and its wall
clock is pinned at 1696004797 (Fri, 29 Sep 2023 16:26:37 GMT); each test has its own limiter.

Each scenario checks the request times, the outcome, the run events a live consumer saw (types
in order, `status` left out as the catalogue's notation does; `usage` kept), that `seq` runs
1..n with one `run.done` last, that the MMSP stream restarts its groups after every reset, and
that the text rebuilt from `answer.delta` honouring `attempt.reset` is what the provider sent,
exactly once. The harness here is shared by the turn tests.
"""

from __future__ import annotations

import email.utils
import functools
import hashlib
import json
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol

import attrs
import httpx
import msgspec
import pytest
import trio
import trio.testing
from rillet import (
    EmptyResponseError,
    FallbackFailed,
    FrameError,
    FrameTooLarge,
    IncompleteStreamError,
    MalformedFrameError,
    ProviderError,
    StreamProtocolError,
    ToolCallArgumentParseError,
    TransportError,
    TurnTimeout,
)
from rillet._events import TextDelta, TextDone, UniEvent
from rillet._lanes import LaneEvent, MessageStart, PartDelta
from rillet._markers import AttemptReset
from rillet._policy import Outcome, Policy
from rillet._ratelimit import RateLimiter
from rillet._request import TurnRequest, user
from rillet._runevents import (
    AnswerDelta,
    AnswerDone,
    AttemptResetEvent,
    RunDone,
    RunEvent,
    StatusEvent,
)
from rillet._turn import Sink, SinkBatch, Turn, TurnResult, run_turn
from rillet.providers._anthropic import AnthropicDialect
from rillet.providers._base import Dialect, HttpRequest, Provider, Secret, StreamDecoder
from rillet.providers._gemini import GeminiDialect
from rillet.providers._ollama import OllamaDialect
from rillet.providers._openai_chat import OpenAIChatDialect
from rillet.transports.testing import openai_text_body, openai_text_stream, sse

pytestmark = pytest.mark.usefixtures("graph")  # every turn here runs under both graphs

if TYPE_CHECKING:
    from rillet.frames import SSEEvent

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
) -> Run:
    """Run one turn against the scripted provider, with a live consumer of its run events."""
    fake = FakeProvider(answers, rescue)
    client = httpx.AsyncClient(transport=httpx.MockTransport(fake.handle))
    async with client, trio.open_nursery() as nursery:
        turn: Turn = await nursery.start(
            functools.partial(
                run_turn,
                REQUEST,
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


def check_rate_limited_at_once(run: Run, wait: float) -> None:
    """The turn ended RateLimited at once, with no wait and no rescue, surfacing `wait`."""
    check(
        run,
        at=[0.0],
        outcome=Outcome.RATE_LIMITED,
        saw=expect("start", END_RATE),
        text="",
        ended=0.0,
    )
    assert run.result.retry_after == pytest.approx(wait)
    assert run_done(run).retry_after_ms == int(wait * 1000)


# --- F01-F09: streams that complete, stall, or end early ------------------------------------------


async def test_f01_ok_completes_with_one_request(autojump_clock: trio.testing.MockClock) -> None:
    run = await play([ok()])
    check(
        run,
        at=[0.0],
        outcome=Outcome.COMPLETED,
        saw=expect("start", *OK_SEEN, END_OK),
        text=TEXT,
        ended=0.0,
    )
    assert run.fake.sent[0].stream
    assert run.fake.sent[0].headers["authorization"] == f"Bearer {KEY}"
    assert run.result.error is None
    assert run.result.time_to_first_event == pytest.approx(0.0)


def statuses(run: Run) -> list[tuple[str, int, int | None]]:
    """The `status` events: (phase, elapsed_ms, delay_ms)."""
    return [(e.phase, e.elapsed_ms, e.delay_ms) for e in run.events if isinstance(e, StatusEvent)]


async def test_f02_ndjson_last_line_without_newline_completes(
    autojump_clock: trio.testing.MockClock,
) -> None:
    run = await play(
        [Answer(body=ollama_lines(last_newline=False), content_type=NDJSON_TYPE)],
        dialect=OllamaDialect(),
    )
    check(
        run, at=[0.0], outcome=Outcome.COMPLETED, saw=expect("start", *OK_SEEN, END_OK), text=TEXT
    )


async def test_f02_ndjson_last_line_cut_mid_json_is_a_truncation(
    autojump_clock: trio.testing.MockClock,
) -> None:
    lines = ollama_lines()
    cut = Answer(body=[*lines[:-1], lines[-1][:25]], content_type=NDJSON_TYPE)
    run = await play([cut, Answer(body=lines, content_type=NDJSON_TYPE)], dialect=OllamaDialect())
    check(
        run,
        at=[0.0, 0.1],
        outcome=Outcome.COMPLETED,
        saw=expect("start", "D*5", "reset", *OK_SEEN, END_OK),
        text=TEXT,
    )


SILENT = Answer(body=[HANG])  # headers, then nothing


@pytest.mark.parametrize("silent", [SILENT, Answer(hang=True)], ids=["headers", "no-headers"])
async def test_f03_silence_times_out_twice_then_the_rescue_answers(
    autojump_clock: trio.testing.MockClock, silent: Answer
) -> None:
    run = await play([silent], rescue=rescue_ok())
    check(
        run,
        at=[0.0, 120.1, 240.1],
        outcome=Outcome.FALLBACK_TO_NON_STREAMING,
        saw=expect("start", "D", "usage", "done", END_OK),
        text=RESCUE_TEXT,
        ended=240.1,
    )
    rescue = run.fake.sent[2]
    assert not rescue.stream
    assert rescue.body["stream"] is False
    assert [phase for phase, _, _ in statuses(run)] == ["backing_off", "rescuing"]
    assert statuses(run)[0] == ("backing_off", 120_000, 100)


async def test_f03_rescue_hangs_event_timeout_at_the_total_deadline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    run = await play([SILENT], rescue=Answer(hang=True))
    check(
        run,
        at=[0.0, 120.1, 240.1],
        outcome=Outcome.EVENT_TIMEOUT,
        saw=expect("start", END_TIMEOUT),
        text="",
        ended=300.0,
    )
    error = run.result.error
    assert isinstance(error, FallbackFailed)
    assert isinstance(error.stream_error, TurnTimeout)
    assert error.stream_error.deadline == "initial-event"
    assert isinstance(error.rescue_error, TurnTimeout)
    assert error.rescue_error.deadline == "rescue"


async def test_f03_without_rescue_event_timeout_at_the_second_cut(
    autojump_clock: trio.testing.MockClock,
) -> None:
    run = await play([SILENT], rescue=rescue_ok(), pol=policy(fallback=False))
    check(
        run,
        at=[0.0, 120.1],
        outcome=Outcome.EVENT_TIMEOUT,
        saw=expect("start", END_TIMEOUT),
        text="",
        ended=240.1,
    )
    assert isinstance(run.result.error, TurnTimeout)


async def test_f03_silence_then_ok_completes_without_reset(
    autojump_clock: trio.testing.MockClock,
) -> None:
    run = await play([SILENT, ok()])
    check(
        run,
        at=[0.0, 120.1],
        outcome=Outcome.COMPLETED,
        saw=expect("start", *OK_SEEN, END_OK),
        text=TEXT,
        ended=120.1,
    )


async def test_f04_stall_mid_stream_is_cut_at_180_and_retried(
    autojump_clock: trio.testing.MockClock,
) -> None:
    run = await play([partial(3, HANG), ok()])
    check(
        run,
        at=[0.0, 180.1],
        outcome=Outcome.COMPLETED,
        saw=expect("start", "D*3", "reset", *OK_SEEN, END_OK),
        text=TEXT,
        ended=180.1,
    )
    assert statuses(run) == [("backing_off", 180_000, 100)]
    assert not run.result.partial  # the answer completed: the voided attempt is not "partial"


PING = b": ping\n\n"
PINGS: list[Item] = [10.0, PING] * 40  # an SSE comment every 10 s for 400 s


async def test_f05_comments_are_no_events(autojump_clock: trio.testing.MockClock) -> None:
    pinging = Answer(body=[*PINGS, HANG])
    run = await play([pinging], rescue=rescue_ok())
    check(
        run,
        at=[0.0, 120.1, 240.1],
        outcome=Outcome.FALLBACK_TO_NON_STREAMING,
        saw=expect("start", "D", "usage", "done", END_OK),
        text=RESCUE_TEXT,
    )


async def test_f05_comments_after_an_event_do_not_extend_its_deadline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    run = await play([partial(1, *PINGS, HANG), ok()])
    check(
        run,
        at=[0.0, 180.1],
        outcome=Outcome.COMPLETED,
        saw=expect("start", "D", "reset", *OK_SEEN, END_OK),
        text=TEXT,
    )


def slow_drip() -> Answer:
    """A delta every 59 s (at 59, 118, 177, 236, 295), never the terminal event."""
    body: list[Item] = [59.0, ROLE, OK[1]]
    for chunk in OK[2:6]:
        body += [59.0, chunk]
    return Answer(body=[*body, HANG])


async def test_f06_total_deadline_then_the_rescue_answers(
    autojump_clock: trio.testing.MockClock,
) -> None:
    run = await play([slow_drip()], rescue=rescue_ok(wait=10.0))
    check(
        run,
        at=[0.0, 300.0],
        outcome=Outcome.FALLBACK_TO_NON_STREAMING,
        saw=expect("start", "D*5", "reset", "D", "usage", "done", END_OK),
        text=RESCUE_TEXT,
        ended=310.0,
    )
    deltas = [e.elapsed_ms for e in run.events if isinstance(e, AnswerDelta)]
    assert deltas == [59_000, 118_000, 177_000, 236_000, 295_000, 310_000]


async def test_f06_rescue_hangs_total_timeout_at_its_own_deadline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    run = await play([slow_drip()], rescue=Answer(hang=True))
    check(
        run,
        at=[0.0, 300.0],
        outcome=Outcome.TOTAL_TIMEOUT,
        saw=expect("start", "D*5", END_TIMEOUT),
        text=TEXT,
        ended=420.0,
    )
    assert run.result.partial


async def test_f06_without_rescue_total_timeout_keeps_the_partial_text(
    autojump_clock: trio.testing.MockClock,
) -> None:
    run = await play([slow_drip()], pol=policy(fallback=False))
    check(
        run,
        at=[0.0],
        outcome=Outcome.TOTAL_TIMEOUT,
        saw=expect("start", "D*5", END_TIMEOUT),
        text=TEXT,
        ended=300.0,
    )
    assert isinstance(run.result.error, TurnTimeout)
    assert run.result.error.deadline == "total"


async def test_f07_eof_without_terminal_event_is_retried(
    autojump_clock: trio.testing.MockClock,
) -> None:
    run = await play([partial(3), ok()])
    check(
        run,
        at=[0.0, 0.1],
        outcome=Outcome.COMPLETED,
        saw=expect("start", "D*3", "reset", *OK_SEEN, END_OK),
        text=TEXT,
    )


async def test_f07_always_truncated_spends_the_budget_then_rescues(
    autojump_clock: trio.testing.MockClock,
) -> None:
    run = await play([partial(3)], rescue=rescue_ok())
    check(
        run,
        at=[0.0, 0.1, 0.3, 0.7, 0.7],
        outcome=Outcome.FALLBACK_TO_NON_STREAMING,
        saw=expect("start", *["D*3", "reset"] * 4, "D", "usage", "done", END_OK),
        text=RESCUE_TEXT,
        ended=0.7,
    )
    assert [s.stream for s in run.fake.sent] == [True] * 4 + [False]


async def test_f07_backoff_jitter_stays_within_90_to_100_percent(
    autojump_clock: trio.testing.MockClock,
) -> None:
    u = 0.999
    run = await play([partial(3)], rescue=rescue_ok(), pol=policy(random=lambda: u))
    delays = [b - a for a, b in zip(run.times, run.times[1:4], strict=False)]
    nominal = [0.1, 0.2, 0.4]
    assert delays == pytest.approx([d * (1 - 0.1 * u) for d in nominal], abs=1e-9)
    assert all(0.9 * d <= got <= d for got, d in zip(delays, nominal, strict=True))
    assert run.result.outcome is Outcome.FALLBACK_TO_NON_STREAMING


async def test_f08_eof_before_any_event_is_retried_without_reset(
    autojump_clock: trio.testing.MockClock,
) -> None:
    run = await play([Answer(body=[]), ok()])
    check(
        run,
        at=[0.0, 0.1],
        outcome=Outcome.COMPLETED,
        saw=expect("start", *OK_SEEN, END_OK),
        text=TEXT,
    )


async def test_f09_read_error_mid_stream_is_retried(
    autojump_clock: trio.testing.MockClock,
) -> None:
    run = await play([partial(2, Raise()), ok()])
    check(
        run,
        at=[0.0, 0.1],
        outcome=Outcome.COMPLETED,
        saw=expect("start", "D*2", "reset", *OK_SEEN, END_OK),
        text=TEXT,
    )


# --- F10-F20: connection errors and statuses ------------------------------------------------------

REFUSED = Answer(connect_error=True)


async def test_f10_connect_errors_back_off_then_complete(
    autojump_clock: trio.testing.MockClock,
) -> None:
    run = await play([REFUSED, REFUSED, ok()])
    check(
        run,
        at=[0.0, 0.1, 0.3],
        outcome=Outcome.COMPLETED,
        saw=expect("start", *OK_SEEN, END_OK),
        text=TEXT,
    )


async def test_f10_always_refused_rescue_too_is_init_failed_with_both_errors(
    autojump_clock: trio.testing.MockClock,
) -> None:
    run = await play([REFUSED])
    check(
        run,
        at=[0.0, 0.1, 0.3, 0.7, 0.7],
        outcome=Outcome.INIT_FAILED,
        saw=expect("start", END_PROVIDER),
        text="",
    )
    error = run.result.error
    assert isinstance(error, FallbackFailed)
    assert isinstance(error.stream_error, TransportError)
    assert error.stream_error.kind == "ConnectError"
    assert isinstance(error.rescue_error, TransportError)
    assert not run.result.partial


async def test_f11_503_waits_the_default_5_s(autojump_clock: trio.testing.MockClock) -> None:
    run = await play([status(503)] * 3 + [ok()])
    check(
        run,
        at=[0.0, 5.0, 10.0, 15.0],
        outcome=Outcome.COMPLETED,
        saw=expect("start", *OK_SEEN, END_OK),
        text=TEXT,
    )
    assert statuses(run)[0] == ("waiting_rate_limit", 0, 5000)


async def test_f12_always_503_is_rate_limited_after_5_retries_never_rescued(
    autojump_clock: trio.testing.MockClock,
) -> None:
    run = await play([status(503)], rescue=rescue_ok())
    check(
        run,
        at=[0.0, 5.0, 10.0, 15.0, 20.0, 25.0],
        outcome=Outcome.RATE_LIMITED,
        saw=expect("start", END_RATE),
        text="",
        ended=25.0,
    )
    assert run.result.retry_after == 5.0
    assert run_done(run).retry_after_ms == 5000
    assert all(s.stream for s in run.fake.sent)


async def test_f12_always_500_rescues_with_a_non_streaming_request(
    autojump_clock: trio.testing.MockClock,
) -> None:
    run = await play([status(500)], rescue=rescue_ok())
    check(
        run,
        at=[0.0, 0.1, 0.3, 0.7, 0.7],
        outcome=Outcome.FALLBACK_TO_NON_STREAMING,
        saw=expect("start", "D", "usage", "done", END_OK),
        text=RESCUE_TEXT,
    )
    assert run.fake.sent[4].body.get("stream") is False


async def test_f12_always_500_rescue_fails_too_is_init_failed_with_both_errors(
    autojump_clock: trio.testing.MockClock,
) -> None:
    run = await play([status(500)])
    check(
        run,
        at=[0.0, 0.1, 0.3, 0.7, 0.7],
        outcome=Outcome.INIT_FAILED,
        saw=expect("start", END_PROVIDER),
        text="",
    )
    error = run.result.error
    assert isinstance(error, FallbackFailed)
    assert error.stream_outcome is Outcome.INIT_FAILED
    assert getattr(error.stream_error, "status", None) == 500
    assert getattr(error.rescue_error, "status", None) == 500


def http_date(at: float) -> str:
    """`at` (Unix time) as an HTTP-date."""
    return email.utils.formatdate(at, usegmt=True)


@pytest.mark.parametrize(
    ("headers", "second"),
    [
        ({"retry-after": "2"}, 2.0),
        ({"retry-after-ms": "1500", "retry-after": "9"}, 1.5),
        ({"retry-after": http_date(WALL + 20)}, 20.0),
        ({"retry-after": http_date(WALL - 20)}, 5.0),
    ],
    ids=["seconds", "ms-wins", "http-date", "past-date"],
)
async def test_f13_429_waits_as_the_server_says(
    autojump_clock: trio.testing.MockClock, headers: dict[str, str], second: float
) -> None:
    run = await play([status(429, **headers), ok()])
    check(
        run,
        at=[0.0, second],
        outcome=Outcome.COMPLETED,
        saw=expect("start", *OK_SEEN, END_OK),
        text=TEXT,
    )


HTTP_DATES = {  # WALL + 20 s in each form HTTP accepts, all of them GMT
    "imf-fixdate": "Fri, 29 Sep 2023 16:26:57 GMT",
    "rfc850": "Friday, 29-Sep-23 16:26:57 GMT",
    "asctime": "Fri Sep 29 16:26:57 2023",
    "numeric-zone": "Fri, 29 Sep 2023 16:26:57 -0000",
}


@pytest.mark.parametrize("date", HTTP_DATES.values(), ids=HTTP_DATES.keys())
async def test_f13_an_http_date_is_gmt_whatever_the_local_zone(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch, date: str
) -> None:
    monkeypatch.setenv("TZ", "JST-9")  # nine hours east of GMT: a date read as local is past
    time.tzset()
    try:
        run = await play([status(429, retry_after=date), ok()])
    finally:
        monkeypatch.undo()
        time.tzset()
    check(
        run,
        at=[0.0, 20.0],
        outcome=Outcome.COMPLETED,
        saw=expect("start", *OK_SEEN, END_OK),
        text=TEXT,
    )


@pytest.mark.parametrize(
    ("headers", "wait"),
    [
        ({"retry-after": "3600"}, 3600.0),
        ({"retry-after": "61"}, 61.0),
        ({"retry-after": "12345678901234567890"}, 12345678901234567890.0),
        ({"retry-after": http_date(WALL + 61)}, 61.0),
        ({"retry-after-ms": "60001"}, 60.001),
    ],
    ids=["3600", "61", "20-digits", "date-61s", "ms-60001"],
)
async def test_f14_a_wait_over_60_s_is_rate_limited_at_once(
    autojump_clock: trio.testing.MockClock, headers: dict[str, str], wait: float
) -> None:
    run = await play([status(429, **headers), ok()], rescue=rescue_ok())
    check_rate_limited_at_once(run, wait)
    msgspec.json.encode(run.events)  # every run event still serialises


async def test_f14_a_wait_of_exactly_60_s_is_waited(autojump_clock: trio.testing.MockClock) -> None:
    run = await play([status(429, retry_after="60"), ok()])
    check(
        run,
        at=[0.0, 60.0],
        outcome=Outcome.COMPLETED,
        saw=expect("start", *OK_SEEN, END_OK),
        text=TEXT,
    )


@pytest.mark.parametrize(
    "value", ["soon", "inf", "nan", "-10", "0", "", "Fri, 32 Sep 2023 99:99:99 GMT"]
)
async def test_f15_an_unusable_retry_after_counts_as_absent(
    autojump_clock: trio.testing.MockClock, value: str
) -> None:
    run = await play([status(429, retry_after=value), ok()])
    check(
        run,
        at=[0.0, 5.0],
        outcome=Outcome.COMPLETED,
        saw=expect("start", *OK_SEEN, END_OK),
        text=TEXT,
    )


async def test_f16_529_honours_retry_after(autojump_clock: trio.testing.MockClock) -> None:
    run = await play([status(529, retry_after="1")] * 2 + [ok()])
    check(
        run,
        at=[0.0, 1.0, 2.0],
        outcome=Outcome.COMPLETED,
        saw=expect("start", *OK_SEEN, END_OK),
        text=TEXT,
    )


def openai_error(error_type: str) -> bytes:
    """An OpenAI `{"error": ...}` chunk inside the stream."""
    return sse({"error": {"message": "no", "type": error_type, "code": None}})


def first_delta_then(dialect: str, error: bytes) -> tuple[Dialect, Answer, Answer]:
    """A stream of `dialect` that sends one delta then `error`, and its `ok` stream."""
    if dialect == "openai":
        return OpenAIChatDialect(), Answer(body=[*OK[:2], error]), ok()
    if dialect == "anthropic":
        events = anthropic_events()
        return AnthropicDialect(), Answer(body=[*events[:3], error]), Answer(body=events)
    if dialect == "gemini":
        events = gemini_events()
        return GeminiDialect(), Answer(body=[events[0], error]), Answer(body=events)
    lines = ollama_lines()
    return (
        OllamaDialect(),
        Answer(body=[lines[0], error], content_type=NDJSON_TYPE),
        Answer(body=lines, content_type=NDJSON_TYPE),
    )


SERVER_SIDE = [
    ("anthropic", anthropic_error("overloaded_error")),
    ("anthropic", anthropic_error("api_error")),
    ("openai", openai_error("server_error")),
    ("gemini", gemini_error(503, "UNAVAILABLE")),
    ("gemini", gemini_error(500, "INTERNAL")),
    ("ollama", ollama_error()),
]


@pytest.mark.parametrize(
    ("dialect", "error"), SERVER_SIDE, ids=[f"{d}-{i}" for i, (d, _) in enumerate(SERVER_SIDE)]
)
async def test_f17_in_stream_overloaded_or_server_error_resets_and_retries(
    autojump_clock: trio.testing.MockClock, dialect: str, error: bytes
) -> None:
    wire, failing, good = first_delta_then(dialect, error)
    run = await play([failing, good], dialect=wire)
    check(
        run,
        at=[0.0, 0.1],
        outcome=Outcome.COMPLETED,
        saw=expect("start", "D", "reset", *OK_SEEN, END_OK),
        text=TEXT,
    )
    # the retry names the provider's side: overloaded where it said so (Anthropic's type,
    # Gemini's UNAVAILABLE), a server error where it said that, and Ollama says no more
    said = [e.reason_code for e in run.events if isinstance(e, StatusEvent)]
    if b"overloaded" in error or b"UNAVAILABLE" in error:
        assert said == ["overloaded"]
    elif dialect == "ollama":
        assert said == ["provider_error"]
    else:
        assert said == ["server_error"]


RATE_IN_STREAM = [
    ("anthropic", anthropic_error("rate_limit_error")),
    ("openai", openai_error("rate_limit_exceeded")),
    ("gemini", gemini_error(429, "RESOURCE_EXHAUSTED")),
]


@pytest.mark.parametrize(("dialect", "error"), RATE_IN_STREAM, ids=[d for d, _ in RATE_IN_STREAM])
async def test_f17_in_stream_rate_limit_waits_5_s(
    autojump_clock: trio.testing.MockClock, dialect: str, error: bytes
) -> None:
    wire, failing, good = first_delta_then(dialect, error)
    run = await play([failing, good], dialect=wire)
    check(
        run,
        at=[0.0, 5.0],
        outcome=Outcome.COMPLETED,
        saw=expect("start", "D", "reset", *OK_SEEN, END_OK),
        text=TEXT,
    )


INVALID_IN_STREAM = [
    ("anthropic", anthropic_error("invalid_request_error")),
    ("openai", openai_error("invalid_request_error")),
    ("gemini", gemini_error(400, "INVALID_ARGUMENT")),
]


@pytest.mark.parametrize(
    ("dialect", "error"), INVALID_IN_STREAM, ids=[d for d, _ in INVALID_IN_STREAM]
)
async def test_f17_in_stream_invalid_request_fails_keeping_the_delta(
    autojump_clock: trio.testing.MockClock, dialect: str, error: bytes
) -> None:
    wire, failing, good = first_delta_then(dialect, error)
    run = await play([failing, good], rescue=rescue_ok(), dialect=wire)
    check(
        run,
        at=[0.0],
        outcome=Outcome.FAILED,
        saw=expect("start", "D", END_PROVIDER),
        text=FRAGMENTS[0],
    )
    assert run.result.partial


@pytest.mark.parametrize("code", [401, 400, 403, 404, 409, 422])
async def test_f18_permanent_statuses_fail_at_once_and_leak_nothing(
    autojump_clock: trio.testing.MockClock, code: int
) -> None:
    run = await play([status(code), ok()], rescue=rescue_ok())
    check(
        run,
        at=[0.0],
        outcome=Outcome.INIT_FAILED,
        saw=expect("start", END_PROVIDER),
        text="",
        ended=0.0,
    )
    wire = msgspec.json.encode(run.events)
    assert KEY.encode() not in wire
    assert b"upstream said" not in wire
    assert getattr(run.result.error, "status", None) == code


async def test_f19_should_retry_false_on_503_is_rate_limited_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    run = await play([status(503, x_should_retry="false"), ok()], rescue=rescue_ok())
    check(run, at=[0.0], outcome=Outcome.RATE_LIMITED, saw=expect("start", END_RATE), text="")


async def test_f19_should_retry_false_on_500_fails_without_rescue(
    autojump_clock: trio.testing.MockClock,
) -> None:
    run = await play([status(500, x_should_retry="false"), ok()], rescue=rescue_ok())
    check(run, at=[0.0], outcome=Outcome.INIT_FAILED, saw=expect("start", END_PROVIDER), text="")


async def test_f19_should_retry_true_on_401_takes_the_transport_ladder(
    autojump_clock: trio.testing.MockClock,
) -> None:
    run = await play([status(401, x_should_retry="true")])
    check(
        run,
        at=[0.0, 0.1, 0.3, 0.7, 0.7],
        outcome=Outcome.INIT_FAILED,
        saw=expect("start", END_PROVIDER),
        text="",
    )
    assert not run.fake.sent[4].stream


async def test_f19_should_retry_true_on_401_then_ok_completes(
    autojump_clock: trio.testing.MockClock,
) -> None:
    run = await play([status(401, x_should_retry="true"), ok()])
    check(
        run,
        at=[0.0, 0.1],
        outcome=Outcome.COMPLETED,
        saw=expect("start", *OK_SEEN, END_OK),
        text=TEXT,
    )


@pytest.mark.parametrize("code", [408, 500, 502, 504])
async def test_f20_transport_shaped_statuses_back_off_once(
    autojump_clock: trio.testing.MockClock, code: int
) -> None:
    run = await play([status(code), ok()])
    check(
        run,
        at=[0.0, 0.1],
        outcome=Outcome.COMPLETED,
        saw=expect("start", *OK_SEEN, END_OK),
        text=TEXT,
    )


# --- F21-F27: what the bytes say ------------------------------------------------------------------

HTML = Answer(body=[b"<html><body>Gateway</body></html>"], content_type="text/html")


async def test_f21_html_to_a_streaming_request_is_a_frame_error_then_rescued(
    autojump_clock: trio.testing.MockClock,
) -> None:
    run = await play([HTML], rescue=rescue_ok())
    check(
        run,
        at=[0.0, 0.1, 0.3, 0.7, 0.7],
        outcome=Outcome.FALLBACK_TO_NON_STREAMING,
        saw=expect("start", "D", "usage", "done", END_OK),
        text=RESCUE_TEXT,
    )
    assert all(body.pulled == 0 for body in run.fake.bodies[:4])


async def test_f21_html_then_ok_completes(autojump_clock: trio.testing.MockClock) -> None:
    run = await play([HTML, ok()])
    check(
        run,
        at=[0.0, 0.1],
        outcome=Outcome.COMPLETED,
        saw=expect("start", *OK_SEEN, END_OK),
        text=TEXT,
    )


async def test_f21_html_always_without_rescue_is_init_failed_with_a_frame_error(
    autojump_clock: trio.testing.MockClock,
) -> None:
    run = await play([HTML], pol=policy(fallback=False))
    check(
        run,
        at=[0.0, 0.1, 0.3, 0.7],
        outcome=Outcome.INIT_FAILED,
        saw=expect("start", END_PROVIDER),
        text="",
    )
    assert isinstance(run.result.error, FrameError)
    assert "text/html" in str(run.result.error)


NOT_JSON = b'data: {"delta": "x"\n\n'  # cut short or corrupted on the way: transport-shaped
WRONG_SHAPE = b'data: {"choices": "x"}\n\n'  # the same request gets it again: no 2nd stream
BAD_FRAMES = [NOT_JSON, WRONG_SHAPE]


async def test_f22_a_malformed_frame_is_never_skipped(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # the bad frame and the next delta come in one chunk: the delta must not get through
    broken = Answer(body=[ROLE, OK[1], NOT_JSON + OK[2], *OK[3:]])
    run = await play([broken, ok()])
    check(
        run,
        at=[0.0, 0.1],
        outcome=Outcome.COMPLETED,
        saw=expect("start", "D", "reset", *OK_SEEN, END_OK),
        text=TEXT,
    )


async def test_f22_a_frame_of_the_wrong_shape_is_never_skipped_nor_streamed_again(
    autojump_clock: trio.testing.MockClock,
) -> None:
    broken = Answer(body=[ROLE, OK[1], WRONG_SHAPE + OK[2], *OK[3:]])
    run = await play([broken, ok()], rescue=rescue_ok())
    check(
        run,
        at=[0.0, 0.0],  # the rescue, at once: a second streamed request would get it again
        outcome=Outcome.FALLBACK_TO_NON_STREAMING,
        saw=expect("start", "D", "reset", "D", "usage", "done", END_OK),
        text=RESCUE_TEXT,
    )
    assert [s.stream for s in run.fake.sent] == [True, False]


@pytest.mark.parametrize(
    ("bad", "at", "saw"),
    [
        (NOT_JSON, [0.0, 0.1, 0.3, 0.7], ["start", *["D", "reset"] * 3, "D", END_PROVIDER]),
        (WRONG_SHAPE, [0.0], ["start", "D", END_PROVIDER]),
    ],
    ids=["not-json", "wrong-shape"],
)
async def test_f22_the_frame_error_names_the_provider_and_the_frame(
    autojump_clock: trio.testing.MockClock, bad: bytes, at: list[float], saw: list[str]
) -> None:
    broken = Answer(body=[ROLE, OK[1], bad + OK[2], *OK[3:]])
    run = await play([broken], pol=policy(fallback=False))
    check(run, at=at, outcome=Outcome.FAILED, saw=saw, text=FRAGMENTS[0])
    error = run.result.error
    assert isinstance(error, MalformedFrameError)
    assert error.not_json is (bad is NOT_JSON)
    assert error.provider == "openai-chat"
    assert error.frame_index == 2
    assert "openai-chat" in str(error)


def one_byte_chunks(data: bytes) -> list[Item]:
    """`data` one byte per chunk."""
    return [data[i : i + 1] for i in range(len(data))]


MULTIBYTE = ("héllo ", "wörld ", "世界 ", "👋", " 🇫🇷 done")


async def test_f23_characters_split_across_chunks_arrive_whole(
    autojump_clock: trio.testing.MockClock,
) -> None:
    stream = openai_text_stream(list(MULTIBYTE))
    emoji = "👋".encode()
    assert len(emoji) == 4
    run = await play([Answer(body=one_byte_chunks(stream))])
    check(
        run,
        at=[0.0],
        outcome=Outcome.COMPLETED,
        saw=expect("start", "D*5", "usage", "done", END_OK),
        text="".join(MULTIBYTE),
    )
    assert "\ufffd" not in run.result.text


async def test_f23_ndjson_characters_split_across_chunks_arrive_whole(
    autojump_clock: trio.testing.MockClock,
) -> None:
    data = b"".join(ollama_lines(MULTIBYTE))
    run = await play(
        [Answer(body=one_byte_chunks(data), content_type=NDJSON_TYPE)], dialect=OllamaDialect()
    )
    check(
        run,
        at=[0.0],
        outcome=Outcome.COMPLETED,
        saw=expect("start", "D*5", "usage", "done", END_OK),
        text="".join(MULTIBYTE),
    )


async def test_f24_invalid_utf8_in_sse_is_replaced_and_the_stream_goes_on(
    autojump_clock: trio.testing.MockClock,
) -> None:
    bad = b'data: {"choices":[{"index":0,"delta":{"content":"a\xffb "}}]}\n\n'
    run = await play([Answer(body=[ROLE, bad, *OK[1:]])])
    check(
        run,
        at=[0.0],
        outcome=Outcome.COMPLETED,
        saw=expect("start", "D*6", "usage", "done", END_OK),
        text="a\ufffdb " + TEXT,
    )


async def test_f24_invalid_utf8_in_an_ndjson_line_is_a_frame_error(
    autojump_clock: trio.testing.MockClock,
) -> None:
    lines = ollama_lines()
    bad = lines[1].replace(b"quick", b"qu\xffck")
    run = await play(
        [
            Answer(body=[lines[0], bad, *lines[2:]], content_type=NDJSON_TYPE),
            Answer(body=lines, content_type=NDJSON_TYPE),
        ],
        dialect=OllamaDialect(),
    )
    check(
        run,
        at=[0.0, 0.1],
        outcome=Outcome.COMPLETED,
        saw=expect("start", "D", "reset", *OK_SEEN, END_OK),
        text=TEXT,
    )


async def test_f25_a_crlf_split_across_chunks_ends_one_line(
    autojump_clock: trio.testing.MockClock,
) -> None:
    first = b'data: {"id":"c1","choices":[{"index":0,"delta":{"content":"The "}}],\r'
    second = b'\ndata: "model":"m"}\r\n\r\n'
    run = await play([Answer(body=[ROLE, first, second, *OK[2:]])])
    check(
        run,
        at=[0.0],
        outcome=Outcome.COMPLETED,
        saw=expect("start", *OK_SEEN, END_OK),
        text=TEXT,
    )


async def test_f25_a_lone_cr_ends_its_line_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # the event ends with CR CR at the end of a chunk: it is dispatched then, not 10 s later
    first = OK[1].replace(b"\n\n", b"\r\r")
    run = await play([Answer(body=[ROLE, first, 10.0, b"\n", *OK[2:]])])
    check(
        run,
        at=[0.0],
        outcome=Outcome.COMPLETED,
        saw=expect("start", *OK_SEEN, END_OK),
        text=TEXT,
    )
    deltas = [e.elapsed_ms for e in run.events if isinstance(e, AnswerDelta)]
    assert deltas == [0, 10_000, 10_000, 10_000, 10_000]


CAP = 64 * 1024  # a small cap keeps these scenarios quick; the default (32 MiB) is tested too


def oversized_sse() -> Answer:
    """One delta, then a 70,000-byte line in 4 KiB chunks."""
    line = b"data: " + b"x" * 70_000 + b"\n\n"
    return Answer(body=[ROLE, OK[1], *[line[i : i + 4096] for i in range(0, len(line), 4096)]])


async def test_f26_an_oversized_line_is_permanent_and_the_rest_is_unread(
    autojump_clock: trio.testing.MockClock,
) -> None:
    run = await play([oversized_sse(), ok()], rescue=rescue_ok(), pol=policy(max_frame=CAP))
    check(
        run,
        at=[0.0],  # the same frame would come back: neither a retry nor the rescue
        outcome=Outcome.FAILED,
        saw=expect("start", "D", END_PROVIDER),
        text=FRAGMENTS[0],
    )
    first = run.fake.bodies[0]
    assert first.pulled == 2 + 17  # 17 x 4 KiB is the first past 64 KiB; the 18th is unread


async def test_f26_the_frame_error_is_bounded_and_typed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    run = await play([oversized_sse()], pol=policy(fallback=False, max_frame=CAP))
    assert run.result.outcome is Outcome.FAILED
    error = run.result.error
    assert isinstance(error, FrameTooLarge)
    assert error.limit == 65_536
    assert 65_536 < error.size <= 65_536 + 4096
    assert error.provider == "openai-chat"


async def test_f26_a_1_mib_ndjson_line_is_refused_after_the_cap(
    autojump_clock: trio.testing.MockClock,
) -> None:
    lines = ollama_lines()
    huge = b'{"model":"llama-test","message":{"content":"' + b"x" * (1 << 20) + b'"}}\n'
    chunks = [huge[i : i + 4096] for i in range(0, len(huge), 4096)]
    run = await play(
        [
            Answer(body=[lines[0], *chunks], content_type=NDJSON_TYPE),
            Answer(body=lines, content_type=NDJSON_TYPE),
        ],
        dialect=OllamaDialect(),
        pol=policy(max_frame=CAP),
    )
    check(
        run,
        at=[0.0],
        outcome=Outcome.FAILED,
        saw=expect("start", "D", END_PROVIDER),
        text=FRAGMENTS[0],
    )
    assert isinstance(run.result.error, FrameTooLarge)
    assert run.fake.bodies[0].pulled == 1 + 17
    assert len(chunks) > 250


async def test_f26_the_rescue_body_has_its_own_cap(
    autojump_clock: trio.testing.MockClock,
) -> None:
    run = await play([status(500)], rescue=rescue_ok("x" * 5000), pol=policy(max_body=4096))
    check(
        run,
        at=[0.0, 0.1, 0.3, 0.7, 0.7],
        outcome=Outcome.INIT_FAILED,
        saw=expect("start", END_PROVIDER),
        text="",
    )
    error = run.result.error
    assert isinstance(error, FallbackFailed)
    assert isinstance(error.rescue_error, FrameTooLarge)
    assert error.rescue_error.provider == "openai-chat"


def compact_openai_stream(fragments: Sequence[str]) -> bytes:
    """A Chat Completions stream with nothing but what the dialect reads (about 100 bytes an
    event for 25-character fragments)."""
    frames: list[dict[str, Any]] = [
        {"id": "c", "choices": [{"index": 0, "delta": {"content": fragment}}]}
        for fragment in fragments
    ]
    frames.append({"id": "c", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    frames.append({"id": "c", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 9}})
    return sse(*frames) + sse("[DONE]")


async def test_f27_one_byte_chunks_give_the_same_events_as_one_chunk(
    autojump_clock: trio.testing.MockClock,
) -> None:
    fragments = [f"word {i:02d} of the stream, and some more. " for i in range(97)]
    stream = compact_openai_stream(fragments)
    assert len(events_of(stream)) == 100
    whole = await play([Answer(body=[stream])])
    bytewise = await play([Answer(body=one_byte_chunks(stream))])
    assert bytewise.fake.bodies[0].pulled == len(stream) >= 10_000
    assert seen(bytewise.events) == seen(whole.events)

    def timeless(run: Run) -> list[UniEvent]:
        return [
            msgspec.structs.replace(item, created_at=0)
            for item in run.uni
            if isinstance(item, UniEvent)
        ]

    assert timeless(bytewise) == timeless(whole)
    check(
        bytewise,
        at=[0.0],
        outcome=Outcome.COMPLETED,
        saw=expect("start", "D*97", "usage", "done", END_OK),
        text="".join(fragments),
    )


# --- F28-F31 and every other stage: cancellation --------------------------------------------------

Stage = Callable[[FakeProvider, Turn], Awaitable[None]]


def at_time(when: float) -> Stage:
    """Cancel at that virtual time."""

    async def stage(fake: FakeProvider, turn: Turn) -> None:
        await trio.sleep_until(when)

    return stage


def on_request(n: int) -> Stage:
    """Cancel once the provider holds request n."""

    async def stage(fake: FakeProvider, turn: Turn) -> None:
        await fake.event(f"request {n}").wait()

    return stage


def after_deltas(n: int) -> Stage:
    """Cancel once a consumer has seen n answer deltas."""

    async def stage(fake: FakeProvider, turn: Turn) -> None:
        count = 0
        async for event in turn.run_events():
            count += isinstance(event, AnswerDelta)
            if count == n:
                return

    return stage


async def play_cancelled(
    answers: Sequence[Answer],
    stage: Stage,
    *,
    rescue: Answer | None = None,
    pol: Policy | None = None,
    limiter: RateLimiter | None = None,
) -> tuple[Run, float]:
    """Run a turn and cancel its caller's scope at `stage`; then wait a long (virtual) while to
    see that nothing more happens. Returns the run and when the cancel came."""
    fake = FakeProvider(answers, rescue)
    live: list[RunEvent] = []
    async with httpx.AsyncClient(transport=httpx.MockTransport(fake.handle)) as client:
        with trio.CancelScope() as scope:
            async with trio.open_nursery() as nursery:
                turn: Turn = await nursery.start(
                    functools.partial(
                        run_turn,
                        REQUEST,
                        provider_for(),
                        client=client,
                        policy=pol or policy(),
                        limiter=limiter or RateLimiter(),
                    )
                )
                nursery.start_soon(collect, turn, live)
                await stage(fake, turn)
                cancelled_at = trio.current_time()
                scope.cancel()
        assert scope.cancelled_caught
        ended = trio.current_time()
        result = await turn.result()
        made = len(fake.sent)
        await trio.sleep(3600)
        assert len(fake.sent) == made  # no request after the cancel, ever
    events = [event async for event in turn.run_events()]
    uni = [item async for item in turn.uni_events()]
    return Run(fake, turn, result, live, events, uni, ended), cancelled_at


def check_cancelled(
    run: Run, cancelled_at: float, *, at: Sequence[float], saw: Sequence[str], text: str
) -> None:
    """A cancelled turn: ended at once, `run.done{cancelled}` last, the log whole, every
    response closed, the text as delivered."""
    assert run.ended == pytest.approx(cancelled_at, abs=1e-9)
    assert run.times == pytest.approx(at, abs=1e-6)
    assert run.result.outcome is Outcome.CANCELLED
    assert run.result.attempts == len(at)
    assert seen(run.events) == list(saw)
    assert seen(run.events)[-1] == END_CANCELLED
    check_envelope(run.events, run.turn.run_id)
    assert run.events[: len(run.live)] == run.live
    assert rebuild(run.events) == text
    check_uni(run.uni)
    assert all(body.closed for body in run.fake.bodies)
    assert run_done(run).attempts == len(at)


async def test_cancel_while_waiting_for_the_limiter_makes_no_request(
    autojump_clock: trio.testing.MockClock,
) -> None:
    limiter = RateLimiter()
    for _ in range(6):
        await limiter.acquire(BASE, 6, 30)
    run, when = await play_cancelled(
        [ok()], at_time(5.0), pol=policy(requests_per_minute=6), limiter=limiter
    )
    check_cancelled(run, when, at=[], saw=expect("start", END_CANCELLED), text="")
    assert when == pytest.approx(5.0)
    assert limiter.statistics()[BASE] == pytest.approx(-1.0 + 1.0)  # the token went back


async def test_f28_cancel_while_the_provider_holds_the_request(
    autojump_clock: trio.testing.MockClock,
) -> None:
    run, when = await play_cancelled([Answer(hang=True)], on_request(1))
    check_cancelled(run, when, at=[0.0], saw=expect("start", END_CANCELLED), text="")
    assert when == 0.0


async def test_cancel_after_the_headers_before_the_first_event(
    autojump_clock: trio.testing.MockClock,
) -> None:
    run, when = await play_cancelled([SILENT], at_time(60.0))
    check_cancelled(run, when, at=[0.0], saw=expect("start", END_CANCELLED), text="")
    assert len(run.fake.bodies) == 1


async def test_f29_cancel_mid_stream_closes_the_response_and_keeps_the_text(
    autojump_clock: trio.testing.MockClock,
) -> None:
    run, when = await play_cancelled([partial(2, HANG)], after_deltas(2))
    check_cancelled(
        run, when, at=[0.0], saw=expect("start", "D*2", END_CANCELLED), text="The quick "
    )
    assert run.fake.bodies[0].closed
    assert run.result.partial


async def test_f30_cancel_in_backoff(autojump_clock: trio.testing.MockClock) -> None:
    run, when = await play_cancelled([status(500)], at_time(0.05))
    check_cancelled(run, when, at=[0.0], saw=expect("start", END_CANCELLED), text="")
    assert when == pytest.approx(0.05)


async def test_f30_cancel_in_backoff_after_a_partial_attempt_keeps_its_text(
    autojump_clock: trio.testing.MockClock,
) -> None:
    run, when = await play_cancelled([partial(3)], at_time(0.05))
    check_cancelled(
        run, when, at=[0.0], saw=expect("start", "D*3", END_CANCELLED), text="The quick brown "
    )


async def test_f30_cancel_in_a_rate_limit_wait(autojump_clock: trio.testing.MockClock) -> None:
    run, when = await play_cancelled([status(429, retry_after="10")], at_time(3.0))
    check_cancelled(run, when, at=[0.0], saw=expect("start", END_CANCELLED), text="")
    assert when == pytest.approx(3.0)


async def test_f31_cancel_during_a_hung_rescue(autojump_clock: trio.testing.MockClock) -> None:
    run, when = await play_cancelled([status(500)], on_request(5), rescue=Answer(hang=True))
    check_cancelled(
        run, when, at=[0.0, 0.1, 0.3, 0.7, 0.7], saw=expect("start", END_CANCELLED), text=""
    )
    assert not run.fake.sent[4].stream


async def test_cancel_while_the_rescue_is_answering(
    autojump_clock: trio.testing.MockClock,
) -> None:
    slow = Answer(body=[60.0, openai_text_body(RESCUE_TEXT)], content_type="application/json")
    run, when = await play_cancelled([partial(1)], at_time(30.0), rescue=slow)
    check_cancelled(
        run,
        when,
        at=[0.0, 0.1, 0.3, 0.7, 0.7],
        saw=expect("start", *["D", "reset"] * 3, "D", END_CANCELLED),
        text="The ",
    )


# --- F39-F42: ladders together --------------------------------------------------------------------


async def test_f39_transport_and_rate_limit_budgets_are_separate(
    autojump_clock: trio.testing.MockClock,
) -> None:
    limited = status(429, retry_after="1")
    run = await play([status(500), limited, status(500), limited, status(500), ok()])
    check(
        run,
        at=[0.0, 0.1, 1.1, 1.3, 2.3, 2.7],
        outcome=Outcome.COMPLETED,
        saw=expect("start", *OK_SEEN, END_OK),
        text=TEXT,
    )


async def test_f39_a_fourth_transport_failure_goes_to_the_rescue(
    autojump_clock: trio.testing.MockClock,
) -> None:
    limited = status(429, retry_after="1")
    run = await play(
        [status(500), limited, status(500), limited, status(500), status(500), ok()],
        rescue=rescue_ok(),
    )
    check(
        run,
        at=[0.0, 0.1, 1.1, 1.3, 2.3, 2.7, 2.7],
        outcome=Outcome.FALLBACK_TO_NON_STREAMING,
        saw=expect("start", "D", "usage", "done", END_OK),
        text=RESCUE_TEXT,
    )


async def test_f40_a_rate_limit_wait_past_the_total_deadline_is_not_waited(
    autojump_clock: trio.testing.MockClock,
) -> None:
    limited = status(429, retry_after="60")
    run = await play([partial(3, HANG), limited, limited, ok()], rescue=rescue_ok())
    check(
        run,
        at=[0.0, 180.1, 240.1],
        outcome=Outcome.RATE_LIMITED,
        saw=expect("start", "D*3", END_RATE),
        text="The quick brown ",
        ended=240.1,
    )
    assert run.result.retry_after == 60.0
    assert run_done(run).retry_after_ms == 60_000
    assert all(s.stream for s in run.fake.sent)


@pytest.mark.parametrize("code", [429, 503])
async def test_f40_a_wait_ending_at_the_total_deadline_is_not_waited(
    autojump_clock: trio.testing.MockClock, code: int
) -> None:
    # the wait must end before the total deadline: one ending on it leaves no time to stream,
    # and a rate limit never goes to the rescue
    run = await play(
        [status(code, retry_after="10"), ok()], rescue=rescue_ok(), pol=policy(total_timeout=10.0)
    )
    check_rate_limited_at_once(run, 10.0)


F41_TIMES = [0.0, 180.1, 300.3, 420.7, 541.5, 663.1, 786.3, 912.7, 1042.7, 1172.7]


@pytest.mark.parametrize("rescued", [True, False], ids=["rescue-answers", "rescue-hangs"])
async def test_f41_ten_consecutive_timeouts_end_streaming(
    autojump_clock: trio.testing.MockClock, rescued: bool
) -> None:
    run = await play(
        [partial(1, HANG), SILENT],
        rescue=rescue_ok() if rescued else Answer(hang=True),
        pol=policy(transport_retries=20, total_timeout=3600.0),
    )
    if rescued:
        check(
            run,
            at=[*F41_TIMES, 1292.7],
            outcome=Outcome.FALLBACK_TO_NON_STREAMING,
            saw=expect("start", "D", "reset", "D", "usage", "done", END_OK),
            text=RESCUE_TEXT,
            ended=1292.7,
        )
    else:
        check(
            run,
            at=[*F41_TIMES, 1292.7],
            outcome=Outcome.EVENT_TIMEOUT,
            saw=expect("start", "D", END_TIMEOUT),
            text="The ",
            ended=1412.7,  # the rescue's own deadline: 120 s
        )


def f42_answers() -> list[Answer]:
    """1 D then a stall; then 1 D and EOF (no terminal event) at 299.95."""
    return [partial(1, HANG), partial(1, 299.95 - 180.1)]


async def test_f42_the_total_deadline_cuts_a_backoff_short(
    autojump_clock: trio.testing.MockClock,
) -> None:
    run = await play(f42_answers(), rescue=rescue_ok())
    check(
        run,
        at=[0.0, 180.1, 300.0],
        outcome=Outcome.FALLBACK_TO_NON_STREAMING,
        saw=expect("start", "D", "reset", "D", "reset", "D", "usage", "done", END_OK),
        text=RESCUE_TEXT,
        ended=300.0,
    )
    phases = statuses(run)
    assert phases[1] == ("backing_off", 299_950, 200)


async def test_f42_rescue_hangs_total_timeout_at_420(
    autojump_clock: trio.testing.MockClock,
) -> None:
    run = await play(f42_answers(), rescue=Answer(hang=True))
    check(
        run,
        at=[0.0, 180.1, 300.0],
        outcome=Outcome.TOTAL_TIMEOUT,
        saw=expect("start", "D", "reset", "D", END_TIMEOUT),
        text="The ",
        ended=420.0,
    )
    error = run.result.error
    assert isinstance(error, FallbackFailed)
    assert isinstance(error.stream_error, TurnTimeout)
    assert error.stream_error.deadline == "total"


async def test_f42_without_rescue_total_timeout_at_300(
    autojump_clock: trio.testing.MockClock,
) -> None:
    run = await play(f42_answers(), pol=policy(fallback=False))
    check(
        run,
        at=[0.0, 180.1],
        outcome=Outcome.TOTAL_TIMEOUT,
        saw=expect("start", "D", "reset", "D", END_TIMEOUT),
        text="The ",
        ended=300.0,
    )


# --- F43-F45: what the grammar refuses ------------------------------------------------------------


class _WithExtraFrames:
    """A Chat Completions stream decoder that also understands two frames no real wire sends:
    `!orphan` (a delta for a lane never opened) and `!restart` (a second message start)."""

    def __init__(self, inner: StreamDecoder) -> None:
        self._inner = inner

    def feed(self, frame: SSEEvent) -> list[LaneEvent]:
        if frame.data == "!orphan":
            return [PartDelta(9, "text", "x")]
        if frame.data == "!restart":
            return [MessageStart("again", "test-model")]
        return self._inner.feed(frame)

    def close(self) -> list[LaneEvent]:
        return self._inner.close()


@attrs.frozen
class ExtraFramesDialect:
    """OpenAI Chat with `_WithExtraFrames`: lane events no real dialect can be made to emit."""

    inner: OpenAIChatDialect = attrs.field(factory=OpenAIChatDialect)
    name: str = "openai-chat"
    framing: Literal["sse"] = "sse"

    def build_request(
        self, request: TurnRequest, provider: Provider, *, stream: bool = True
    ) -> HttpRequest:
        return self.inner.build_request(request, provider, stream=stream)

    def stream_decoder(self) -> StreamDecoder:
        return _WithExtraFrames(self.inner.stream_decoder())

    def decode_response(self, body: bytes) -> list[LaneEvent]:
        return self.inner.decode_response(body)

    def error_from_response(
        self, status: int, headers: Mapping[str, str], body: bytes
    ) -> ProviderError:
        return self.inner.error_from_response(status, headers, body)


async def test_f43_a_delta_for_a_lane_never_opened_is_a_protocol_error(
    autojump_clock: trio.testing.MockClock,
) -> None:
    broken = Answer(body=[ROLE, OK[1], sse("!orphan"), *OK[2:]])
    run = await play([broken, ok()], rescue=rescue_ok(), dialect=ExtraFramesDialect())
    check(
        run,
        at=[0.0],
        outcome=Outcome.FAILED,
        saw=expect("start", "D", "end(error, protocol_error)"),
        text="The ",
    )
    assert isinstance(run.result.error, StreamProtocolError)


async def test_f43_a_second_message_start_is_a_protocol_error(
    autojump_clock: trio.testing.MockClock,
) -> None:
    broken = Answer(body=[ROLE, OK[1], sse("!restart"), *OK[2:]])
    run = await play([broken, ok()], rescue=rescue_ok(), dialect=ExtraFramesDialect())
    check(
        run,
        at=[0.0],
        outcome=Outcome.FAILED,
        saw=expect("start", "D", "end(error, protocol_error)"),
        text="The ",
    )


async def test_f43_anthropic_delta_for_a_block_never_started_is_a_protocol_error(
    autojump_clock: trio.testing.MockClock,
) -> None:
    events = anthropic_events()
    orphan = sse(
        {"type": "content_block_delta", "index": 7, "delta": {"type": "text_delta", "text": "x"}},
        event="content_block_delta",
    )
    broken = Answer(body=[*events[:3], orphan, *events[3:]])
    run = await play([broken, Answer(body=events)], dialect=AnthropicDialect())
    check(
        run,
        at=[0.0],
        outcome=Outcome.FAILED,
        saw=expect("start", "D", "end(error, protocol_error)"),
        text="The ",
    )


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


async def test_f44_tool_arguments_that_do_not_parse_fail_the_turn(
    autojump_clock: trio.testing.MockClock,
) -> None:
    run = await play([tool_stream(['{"city": ', '"Par']), ok()], rescue=rescue_ok())
    check(
        run,
        at=[0.0],
        outcome=Outcome.FAILED,
        saw=expect("start", "tool", "end(error, tool_arguments_invalid)"),
        text="",
    )
    error = run.result.error
    assert isinstance(error, ToolCallArgumentParseError)
    assert error.tool_name == "get_weather"
    kinds = [type(i.content_items[0]).__name__ for i in run.uni if isinstance(i, UniEvent)]
    assert kinds == ["ToolCallDelta", "ToolCallDelta", "ToolCallDelta"]  # no tool_call.done
    assert b"Par" not in msgspec.json.encode(run.events)


async def test_f44_whole_tool_arguments_complete_the_turn(
    autojump_clock: trio.testing.MockClock,
) -> None:
    run = await play([tool_stream(['{"city": ', '"Paris"}'])])
    check(
        run,
        at=[0.0],
        outcome=Outcome.COMPLETED,
        saw=expect("start", "tool", "tool.done", "usage", "done", END_OK),
        text="",
    )


async def test_f45_finish_length_keeps_the_text_without_done(
    autojump_clock: trio.testing.MockClock,
) -> None:
    run = await play([Answer(body=openai_events(finish_reason="length")), ok()])
    check(
        run,
        at=[0.0],
        outcome=Outcome.COMPLETED,
        saw=expect("start", "D*5", "usage", "end(error, provider_length)"),
        text=TEXT,
    )


async def test_f45_thinking_only_is_an_empty_response_not_retried(
    autojump_clock: trio.testing.MockClock,
) -> None:
    thinking = Answer(
        body=[
            ROLE,
            openai_chunk({"reasoning_content": "Let me think."}),
            openai_chunk({}, finish="stop"),
            USAGE,
            DONE,
        ]
    )
    run = await play([thinking, ok()], rescue=rescue_ok())
    check(
        run,
        at=[0.0],
        outcome=Outcome.FAILED,
        saw=expect("start", "end(error, empty_response)"),
        text="",
    )
    assert isinstance(run.result.error, EmptyResponseError)


# --- F46 and D4: the limiter, pings, where deadlines start ----------------------------------------


async def drained(rpm: int, key: str = BASE) -> RateLimiter:
    """A limiter whose bucket for `key` has no token left at `rpm`."""
    limiter = RateLimiter()
    for _ in range(rpm):
        assert await limiter.acquire(key, rpm, 30.0) == 0.0
    return limiter


@pytest.mark.parametrize(("rpm", "first"), [(6, 10.0), (1, 30.0)], ids=["6rpm", "1rpm-capped"])
async def test_f46_a_drained_bucket_delays_the_request(
    autojump_clock: trio.testing.MockClock, rpm: int, first: float
) -> None:
    run = await play([ok()], pol=policy(requests_per_minute=rpm), limiter=await drained(rpm))
    check(
        run,
        at=[first],
        outcome=Outcome.COMPLETED,
        saw=expect("start", *OK_SEEN, END_OK),
        text=TEXT,
    )
    assert statuses(run)[0] == ("waiting_rate_limit", int(first * 1000), int(first * 1000))


async def test_f46_another_base_url_is_not_delayed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    run = await play(
        [ok()],
        pol=policy(requests_per_minute=6),
        limiter=await drained(6),
        base_url="https://other.test/v1",
    )
    check(
        run, at=[0.0], outcome=Outcome.COMPLETED, saw=expect("start", *OK_SEEN, END_OK), text=TEXT
    )


async def test_d4_the_initial_event_deadline_starts_after_the_limiter_wait(
    autojump_clock: trio.testing.MockClock,
) -> None:
    run = await play(
        [SILENT],
        pol=policy(requests_per_minute=6, fallback=False),
        limiter=await drained(6),
    )
    # sent at 10.0 (after the wait), cut at 130.0; the bucket has refilled by the retry
    check(
        run,
        at=[10.0, 130.1],
        outcome=Outcome.EVENT_TIMEOUT,
        saw=expect("start", END_TIMEOUT),
        text="",
        ended=250.1,
    )


async def test_d4_provider_pings_count_as_events(autojump_clock: trio.testing.MockClock) -> None:
    events = anthropic_events()
    ping = sse({"type": "ping"}, event="ping")
    pinging = Answer(body=[events[0], 100.0, ping, 100.0, ping, 90.0, *events[1:]])
    run = await play([pinging], dialect=AnthropicDialect())
    check(
        run,
        at=[0.0],
        outcome=Outcome.COMPLETED,
        saw=expect("start", *OK_SEEN, END_OK),
        text=TEXT,
        ended=290.0,
    )


# --- backpressure ---------------------------------------------------------------------------------


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


async def test_a_slow_consumer_is_backpressure_not_a_stall(
    autojump_clock: trio.testing.MockClock,
) -> None:
    sink = SlowSink(200.0)
    run = await play([ok(), ok()], rescue=rescue_ok(), pol=policy(channel_size=1), sinks=[sink])
    check(
        run, at=[0.0], outcome=Outcome.COMPLETED, saw=expect("start", *OK_SEEN, END_OK), text=TEXT
    )
    assert run.ended >= 600.0  # twice the total deadline: the consumer took its time
    assert sink.closed == 1
    assert [e for b in sink.batches for e in b.run] == run.events


# --- D1, D2 and the reset rule, once more ---------------------------------------------------------


async def test_d1_a_stall_spends_a_transport_retry(autojump_clock: trio.testing.MockClock) -> None:
    run = await play(
        [partial(1, HANG)], rescue=rescue_ok(), pol=policy(total_timeout=3600.0, fallback=False)
    )
    # every attempt brings a delta, so the timeout limit is 10: the 3 retries run out first
    check(
        run,
        at=[0.0, 180.1, 360.3, 540.7],
        outcome=Outcome.EVENT_TIMEOUT,
        saw=expect("start", *["D", "reset"] * 3, "D", END_TIMEOUT),
        text="The ",
        ended=720.7,
    )


async def test_d2_a_spent_budget_without_rescue_fails_with_the_last_partial_text(
    autojump_clock: trio.testing.MockClock,
) -> None:
    run = await play([partial(3)], pol=policy(fallback=False))
    check(
        run,
        at=[0.0, 0.1, 0.3, 0.7],
        outcome=Outcome.FAILED,
        saw=expect("start", *["D*3", "reset"] * 3, "D*3", END_PROVIDER),
        text="The quick brown ",
        ended=0.7,
    )
    assert run.result.partial
    assert isinstance(run.result.error, IncompleteStreamError)


@pytest.mark.parametrize(
    ("first", "outcome", "saw", "text"),
    [
        (partial(2), Outcome.FAILED, ("start", "D*2", END_PROVIDER), "The quick "),
        (status(500), Outcome.INIT_FAILED, ("start", END_PROVIDER), ""),
    ],
    ids=["after-events", "before-any-event"],
)
async def test_d2_a_permanent_error_after_a_retry_is_failed_or_init_failed(
    autojump_clock: trio.testing.MockClock,
    first: Answer,
    outcome: Outcome,
    saw: tuple[str, ...],
    text: str,
) -> None:
    # Failed once any attempt produced an event, however many attempts ago; no rescue
    run = await play([first, status(401), ok()], rescue=rescue_ok())
    check(run, at=[0.0, 0.1], outcome=outcome, saw=expect(*saw), text=text)
    assert run.result.partial is (outcome is Outcome.FAILED)
    assert getattr(run.result.error, "status", None) == 401


async def test_one_reset_is_owed_across_an_attempt_that_emitted_nothing(
    autojump_clock: trio.testing.MockClock,
) -> None:
    run = await play([partial(2), status(500), ok()])
    check(
        run,
        at=[0.0, 0.1, 0.3],
        outcome=Outcome.COMPLETED,
        saw=expect("start", "D*2", "reset", *OK_SEEN, END_OK),
        text=TEXT,
    )
    resets = [item for item in run.uni if isinstance(item, AttemptReset)]
    assert resets == [AttemptReset(3)]  # the attempt whose events follow


async def test_f22_the_frame_error_names_the_byte_offset(
    autojump_clock: trio.testing.MockClock,
) -> None:
    broken = Answer(body=[ROLE, OK[1], BAD_FRAMES[0] + OK[2], *OK[3:]])
    run = await play([broken], pol=policy(fallback=False, transport_retries=0))
    error = run.result.error
    assert isinstance(error, MalformedFrameError)
    assert error.offset == len(ROLE) + len(OK[1])  # where the bad frame starts
