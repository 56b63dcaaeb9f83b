"""Security and bad input (RELIABILITY.md S01-S16), each as a test that fails if the behaviour
breaks.

S02-S05 run against every dialect's frame decoder through `WireDecoder` (framing, dialect,
grammar): a recorded fixture of each dialect with one frame mutated to carry a lone surrogate, a
100,000-deep nesting, a 5,000-digit integer, `NaN` / `Infinity` or a duplicate key. The bad frame
must end the attempt with a typed frame error (never another exception, never a hang) while
everything before it still comes out; a duplicate key is not an error: the last one wins. The
non-streaming bodies (the rescue's) get the same treatment. Where the answer is a whole turn
(retried, Failed), the turn runs on the virtual-time harness of `handler_support`.

S06-S16 run against the real server on 127.0.0.1 with the loopback provider behind it (the
harness of `fault_support`): the misbehaving client gets its refusal, and a
well-behaved subscriber of the same run still sees every event once, the run completing with
one request.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import struct
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import attrs
import msgspec
import pytest
import trio
import trio.testing
import trio_websocket
from rillet import (
    FrameError,
    FrameTooLarge,
    InvalidRequestError,
    MalformedFrameError,
    ProviderError,
    RilletError,
    SSEEncodeError,
    ToolCallArgumentParseError,
    WireDecoder,
    encode_json,
)
from rillet._arguments import MAX_ARGUMENT_DEPTH
from rillet._events import (
    EmbeddingDone,
    TextDelta,
    ThinkingDelta,
    ToolCallDone,
    UniEvent,
    delta_event,
)
from rillet._policy import Outcome
from rillet._request import TurnRequest, user
from rillet._runevents import AnswerDelta, RunDone
from rillet.frames import SSEDecoder, encode_sse
from rillet.providers._anthropic import AnthropicDialect
from rillet.providers._base import Dialect, Provider, Secret
from rillet.providers._embeddings import OpenAIEmbeddingsDialect
from rillet.providers._gemini import GeminiDialect
from rillet.providers._mmsp import MMSPDialect
from rillet.providers._ollama import OllamaDialect
from rillet.providers._openai_chat import OpenAIChatDialect
from rillet.providers._openai_responses import OpenAIResponsesDialect
from rillet.transports.server import Limits, ServerConfig, ServerConfigError, serve
from rillet.transports.testing import Reply, openai_text_stream, status_reply

from .fault_support import (
    LIMIT,
    Read,
    RunRef,
    Site,
    check_reads,
    check_site,
    next_frame,
    read_sse,
    read_ws,
    site,
    text_reply,
    ws_connect,
)
from .handler_support import (
    END_OK,
    OK,
    RESCUE_TEXT,
    ROLE,
    Answer,
    check,
    expect,
    play,
    rescue_ok,
    tool_stream,
)
from .wire_cases import FIXTURES

if TYPE_CHECKING:
    from collections.abc import Sequence


@pytest.fixture
def loop_clock() -> trio.testing.MockClock:
    """Virtual time that jumps only after 20 ms of real idleness (bytes in flight on loopback
    are not silence)."""
    return trio.testing.MockClock(autojump_threshold=0.02)


# --- the dialects and where their frames carry what ---------------------------------------------


def _frames(data: bytes, separator: bytes) -> list[bytes]:
    return [part + separator for part in data.split(separator) if part.strip()]


def _mmsp_stream() -> list[bytes]:
    """An MMSP server's stream of the OpenAI fixture: its UniEvents as SSE, then `[DONE]`."""
    decoder = WireDecoder(OpenAIChatDialect(), clock=lambda: 0)
    data = (FIXTURES / "openai-chat" / "usage_final_chunk.sse").read_bytes()
    events = decoder.feed(data)
    events += decoder.close()
    return [b"data: " + encode_json(e) + b"\n\n" for e in events] + [b"data: [DONE]\n\n"]


@attrs.frozen
class WireCase:
    """One dialect's recorded stream and the literals a mutation replaces.

    Attributes:
        name: the dialect.
        dialect: makes the dialect.
        frames: the stream, frame by frame (each with its separator).
        text: `"key": "word`, the start of the first text fragment (a field the dialect reads).
        number: a `"key": n` literal of an integer field the dialect reads.
        stream: False for one JSON body (a non-streaming reply).
    """

    name: str
    dialect: Callable[[], Dialect]
    frames: tuple[bytes, ...]
    text: bytes
    number: bytes
    stream: bool = True

    def __str__(self) -> str:
        return self.name


def _fixture(folder: str, name: str, separator: bytes = b"\n\n") -> tuple[bytes, ...]:
    return tuple(_frames((FIXTURES / folder / name).read_bytes(), separator))


def _body(folder: str, name: str) -> tuple[bytes, ...]:
    return ((FIXTURES / folder / name).read_bytes(),)


STREAMS = [
    WireCase(
        "openai-chat",
        OpenAIChatDialect,
        _fixture("openai-chat", "usage_final_chunk.sse"),
        b'"content":"The capital',
        b'"index":0',
    ),
    WireCase(
        "openai-responses",
        OpenAIResponsesDialect,
        _fixture("openai-responses", "text.sse"),
        b'"delta":"Sure',
        b'"output_index":0',
    ),
    WireCase(
        "anthropic",
        AnthropicDialect,
        _fixture("anthropic-messages", "text.sse"),
        b'"text":"Hello',
        b'"index":0',
    ),
    WireCase(
        "gemini",
        GeminiDialect,
        _fixture("gemini", "text.sse"),
        b'"text": "Hello',
        b'"promptTokenCount": 9',
    ),
    WireCase(
        "ollama",
        OllamaDialect,
        _fixture("ollama-chat", "text.ndjson", b"\n"),
        b'"content":"Hello',
        b'"eval_count":17',
    ),
    WireCase("mmsp", MMSPDialect, tuple(_mmsp_stream()), b'"text":"The capital', b'"created_at":0'),
]

BODIES = [
    WireCase(
        "openai-chat-body",
        OpenAIChatDialect,
        _body("openai-chat", "non_streaming.json"),
        b'"content": "Checking',
        b'"prompt_tokens": 77',
        stream=False,
    ),
    WireCase(
        "openai-responses-body",
        OpenAIResponsesDialect,
        _body("openai-responses", "non_streaming.json"),
        b'"text": "**Answering',
        b'"input_tokens": 15',
        stream=False,
    ),
    WireCase(
        "anthropic-body",
        AnthropicDialect,
        _body("anthropic-messages", "non_streaming.json"),
        b'"text": "Let me',
        b'"input_tokens": 410',
        stream=False,
    ),
    WireCase(
        "gemini-body",
        GeminiDialect,
        _body("gemini", "non_streaming.json"),
        b'"text": "Rechecking',
        b'"promptTokenCount": 70',
        stream=False,
    ),
    WireCase(
        "ollama-body",
        OllamaDialect,
        _body("ollama-chat", "non_streaming.json"),
        b'"content": "It is',
        b'"eval_count": 30',
        stream=False,
    ),
    WireCase(
        "openai-embeddings",
        OpenAIEmbeddingsDialect,
        _body("openai-embeddings", "float.json"),
        b'"object": "list"',
        b'"index": 0',
        stream=False,
    ),
]


@attrs.frozen
class Decoded:
    """What came out of a stream: the text (and thinking) fragments, and the error, if any."""

    events: list[UniEvent]
    error: BaseException | None
    seconds: float

    @property
    def text(self) -> str:
        parts = []
        for event in self.events:
            item = event.content_items[0] if event.content_items else None
            if isinstance(item, TextDelta):
                parts.append(item.text)
            elif isinstance(item, ThinkingDelta):
                parts.append(item.thinking)
        return "".join(parts)


def decode(
    case: WireCase, frames: Sequence[bytes], *, max_frame: int = 64 * 1024, bytewise: bool = False
) -> Decoded:
    """Feed the frames through the dialect's `WireDecoder`; any exception is kept, typed or not."""
    decoder = WireDecoder(case.dialect(), clock=lambda: 0, max_frame=max_frame, stream=case.stream)
    out: list[UniEvent] = []
    error: BaseException | None = None
    start = time.perf_counter()
    try:
        for frame in frames:
            if bytewise:
                for i in range(len(frame)):
                    decoder.feed(frame[i : i + 1], out)
            else:
                decoder.feed(frame, out)
        decoder.close(out)
    except Exception as exc:  # the test asserts what it was
        error = exc
    return Decoded(out, error, time.perf_counter() - start)


def mutate(frames: Sequence[bytes], marker: bytes, replacement: bytes) -> tuple[list[bytes], int]:
    """The frames with the first occurrence of `marker` replaced; and which frame it was in."""
    for index, frame in enumerate(frames):
        if marker in frame:
            changed = frame.replace(marker, replacement, 1)
            return [*frames[:index], changed, *frames[index + 1 :]], index
    raise AssertionError(f"{marker!r} is in no frame")


def key_of(literal: bytes) -> bytes:
    return literal.split(b":", 1)[0]


def word_of(literal: bytes) -> bytes:
    """The start of the text value, after its opening quote."""
    return literal.split(b":", 1)[1].strip()[1:]


def unknown_field(case: WireCase, value: bytes) -> tuple[list[bytes], int]:
    """A field no dialect reads, `"zz": value`, next to the text field."""
    return mutate(case.frames, case.text, b'"zz": ' + value + b", " + case.text)


def text_value(case: WireCase, value: bytes) -> tuple[list[bytes], int]:
    """The text field read by the dialect, given `value` (its JSON literal); the rest of the old
    text moves to a field nobody reads."""
    replacement = key_of(case.text) + b": " + value + b', "zz": "' + word_of(case.text)
    return mutate(case.frames, case.text, replacement)


def number_value(case: WireCase, value: bytes) -> tuple[list[bytes], int]:
    """The integer field read by the dialect, given `value`."""
    return mutate(case.frames, case.number, key_of(case.number) + b": " + value)


DEEP = b"[" * 100_000 + b"]" * 100_000
HUGE = b"9" * 5000
SURROGATE = rb'"\ud800"'
ALL = [*STREAMS, *BODIES]


def check_refused(
    case: WireCase,
    result: Decoded,
    index: int,
    kind: type[FrameError] = MalformedFrameError,
    *,
    good: Decoded | None = None,
) -> None:
    """A typed frame error naming the dialect and the frame, quickly; what the frames before the
    bad one released is still there (streams only)."""
    assert isinstance(result.error, kind), repr(result.error)
    assert result.error.provider
    assert result.seconds < 2.0  # no hang, no quadratic blow-up
    if case.stream:
        assert result.error.frame_index == index
        str(result.error).encode("utf-8")  # the message itself is safe to write anywhere
        if good is not None:
            assert good.text.startswith(result.text)


@pytest.fixture(scope="module")
def controls() -> dict[str, Decoded]:
    """Each unmutated stream, decoded: the reference."""
    return {case.name: decode(case, case.frames) for case in ALL}


def test_every_unmutated_stream_decodes_cleanly(controls: dict[str, Decoded]) -> None:
    for case in ALL:
        assert controls[case.name].error is None, case.name
        assert controls[case.name].events, case.name


@pytest.mark.parametrize("case", ALL, ids=str)
def test_s02_a_lone_surrogate_in_json_is_a_frame_error(
    case: WireCase, controls: dict[str, Decoded]
) -> None:
    for frames, index in (text_value(case, SURROGATE), unknown_field(case, rb'"a\udc00b"')):
        check_refused(case, decode(case, frames), index, good=controls[case.name])


@pytest.mark.parametrize("case", STREAMS, ids=str)
def test_s02_a_lone_surrogate_fed_one_byte_at_a_time_is_the_same_frame_error(
    case: WireCase,
) -> None:
    frames, index = text_value(case, SURROGATE)
    check_refused(case, decode(case, frames, bytewise=True), index)


@pytest.mark.parametrize("case", ALL, ids=str)
def test_s03_nesting_100000_deep_is_a_frame_error_not_a_crash(
    case: WireCase, controls: dict[str, Decoded]
) -> None:
    frames, index = unknown_field(case, DEEP)
    # under the default 64 KiB cap the frame is refused for its size first...
    if case.stream:
        check_refused(case, decode(case, frames), index, FrameTooLarge)
    # ...and with the cap raised, the decoder's recursion is caught as a malformed frame
    deep = decode(case, frames, max_frame=1 << 20)
    check_refused(case, deep, index, good=controls[case.name])
    assert not isinstance(deep.error, RecursionError)
    # nesting that fits in 64 KiB (30,000 deep) needs no raised cap to be refused the same way
    frames, index = unknown_field(case, b"{" * 15_000 + b"}" * 15_000)
    check_refused(case, decode(case, frames), index)


@pytest.mark.parametrize("case", ALL, ids=str)
def test_s04_a_5000_digit_integer_in_a_field_read_is_a_frame_error(
    case: WireCase, controls: dict[str, Decoded]
) -> None:
    digits = sys.get_int_max_str_digits()
    frames, index = number_value(case, HUGE)
    check_refused(case, decode(case, frames), index, good=controls[case.name])
    frames, index = number_value(case, b"-" + HUGE)
    check_refused(case, decode(case, frames), index)
    assert sys.get_int_max_str_digits() == digits  # the interpreter's limit was not raised


@pytest.mark.parametrize("case", ALL, ids=str)
def test_s04_a_5000_digit_integer_in_a_field_ignored_is_skipped_unread(
    case: WireCase, controls: dict[str, Decoded]
) -> None:
    # unknown fields are skipped by msgspec without being converted (no big-int arithmetic, no
    # memory), like every other unknown field; docs/reliability.md records this choice
    frames, _ = unknown_field(case, HUGE)
    result = decode(case, frames)
    assert result.error is None
    assert result.text == controls[case.name].text
    assert result.seconds < 1.0


@pytest.mark.parametrize("literal", [b"NaN", b"Infinity", b"-Infinity", b"nan", b"inf"])
@pytest.mark.parametrize("case", ALL, ids=str)
def test_s05_nan_and_infinity_are_frame_errors(
    case: WireCase, literal: bytes, controls: dict[str, Decoded]
) -> None:
    for frames, index in (unknown_field(case, literal), number_value(case, literal)):
        check_refused(case, decode(case, frames), index, good=controls[case.name])


def test_s05_a_float_out_of_range_in_a_vector_is_a_frame_error() -> None:
    (case,) = [c for c in BODIES if c.name == "openai-embeddings"]
    frames, index = mutate(case.frames, b"0.5,", b"1e999,")
    check_refused(case, decode(case, frames), index)


@pytest.mark.parametrize("case", ALL, ids=str)
def test_s05_duplicate_keys_the_last_wins(case: WireCase, controls: dict[str, Decoded]) -> None:
    key = key_of(case.text)
    twice = key + b': "Q1st", ' + key + b': "Q2nd", "zz": "' + word_of(case.text)
    frames, _ = mutate(case.frames, case.text, twice)
    result = decode(case, frames)
    assert result.error is None
    assert "Q1st" not in result.text
    if case.name != "openai-embeddings":  # a vector has no text to show the winner
        assert "Q2nd" in result.text
        assert result.text.replace("Q2nd", "") in controls[case.name].text


def test_s05_our_json_has_no_nan() -> None:
    """Every JSON rillet writes parses under a strict parser: msgspec writes a non-finite float
    as `null`, in run events, UniEvents and requests alike."""

    def strict(data: bytes) -> Any:
        def refuse(name: str) -> Any:
            raise AssertionError(f"{name} in {data!r}")

        return json.loads(data, parse_constant=refuse)

    event = delta_event(EmbeddingDone(embedding=[float("nan"), float("inf"), 1.0]), 0)
    assert strict(encode_json(event))["content_items"][0]["embedding"] == [None, None, 1.0]
    request = TurnRequest(messages=[user("Hi")], temperature=float("nan"))
    for make in (OpenAIChatDialect, AnthropicDialect, GeminiDialect, OllamaDialect):
        dialect = make()
        provider = Provider(dialect=dialect, base_url="https://x.test/v1", model="m")
        strict(dialect.build_request(request, provider).body)


# --- S02: upstream text never makes our encoders raise -------------------------------------------

LONE = rb'{"error": {"message": "bad \ud800 input \udfff", "type": "invalid_request_error"}}'


@pytest.mark.parametrize("case", [c for c in ALL if c.name != "mmsp"], ids=str)
def test_s02_an_error_body_with_lone_surrogates_gives_a_safe_typed_error(case: WireCase) -> None:
    error = case.dialect().error_from_response(400, {}, LONE)
    assert isinstance(error, InvalidRequestError)
    assert error.status == 400
    for text in (str(error), error.provider_message, repr(error)):
        text.encode("utf-8")  # never a UnicodeEncodeError
        msgspec.json.encode({"message": text})


def test_s02_an_mmsp_error_body_with_lone_surrogates_gives_a_safe_typed_error() -> None:
    body = rb'{"error": {"type": "InvalidRequestError", "message": "bad \ud800"}}'
    error = MMSPDialect().error_from_response(400, {}, body)
    assert isinstance(error, ProviderError)
    msgspec.json.encode({"message": str(error)})


async def test_s02_a_refusal_with_lone_surrogates_ends_the_turn_cleanly(
    autojump_clock: trio.testing.MockClock,
) -> None:
    refusal = Answer(status=400, body=[LONE], content_type="application/json")
    run = await play([refusal, Answer(body=OK)])
    check(
        run,
        at=[0.0],
        outcome=Outcome.INIT_FAILED,
        saw=expect("start", "end(error, provider_error)"),
        text="",
    )
    assert isinstance(run.result.error, InvalidRequestError)
    msgspec.json.encode(run.events)
    msgspec.json.encode(str(run.result.error))


# --- S03: deep nesting in a whole turn, and in tool arguments (F44) -----------------------------


async def test_s03_a_deeply_nested_frame_is_a_frame_error_never_streamed_again(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # valid JSON the decoder refuses every time: one streamed request, then the rescue
    deep = b'data: {"zz": ' + b"[" * 30_000 + b"]" * 30_000 + b', "choices": []}\n\n'
    run = await play(
        [Answer(body=[ROLE, OK[1], deep, *OK[2:]]), Answer(body=OK)], rescue=rescue_ok()
    )
    check(
        run,
        at=[0.0, 0.0],
        outcome=Outcome.FALLBACK_TO_NON_STREAMING,
        saw=expect("start", "D", "reset", "D", "usage", "done", END_OK),
        text=RESCUE_TEXT,
    )
    assert [s.stream for s in run.fake.sent] == [True, False]


async def test_s03_a_deeply_nested_error_body_is_typed_by_its_status(
    autojump_clock: trio.testing.MockClock,
) -> None:
    deep = Answer(status=400, body=[b"[" * 100_000], content_type="application/json")
    run = await play([deep, Answer(body=OK)])
    check(
        run,
        at=[0.0],
        outcome=Outcome.INIT_FAILED,
        saw=expect("start", "end(error, provider_error)"),
        text="",
    )
    assert isinstance(run.result.error, InvalidRequestError)


@pytest.mark.parametrize(
    "arguments",
    [
        ['{"a": ' + "[" * 25_000, "[" * 25_000, "[" * 25_000, "[" * 25_000],
        ['{"a": ' + "[" * (MAX_ARGUMENT_DEPTH + 1), "]" * (MAX_ARGUMENT_DEPTH + 1) + "}"],
    ],
    ids=["100000-deep", "past-the-depth-limit"],
)
async def test_s03_deeply_nested_tool_arguments_are_f44(
    autojump_clock: trio.testing.MockClock, arguments: list[str]
) -> None:
    run = await play([tool_stream(arguments), Answer(body=OK)])
    check(
        run,
        at=[0.0],
        outcome=Outcome.FAILED,
        saw=expect("start", "tool", "end(error, tool_arguments_invalid)"),
        text="",
    )
    error = run.result.error
    assert isinstance(error, ToolCallArgumentParseError)
    assert error.raw_arguments_length == sum(map(len, arguments))
    kinds = [type(i.content_items[0]) for i in run.uni if isinstance(i, UniEvent)]
    assert ToolCallDone not in kinds


async def test_s03_tool_arguments_at_the_depth_limit_complete_and_encode(
    autojump_clock: trio.testing.MockClock,
) -> None:
    depth = MAX_ARGUMENT_DEPTH - 1  # inside `{"a": ...}`: the limit exactly
    run = await play([tool_stream(['{"a": ' + "[" * depth, "]" * depth + "}"])])
    assert run.result.outcome is Outcome.COMPLETED
    (done,) = [
        item
        for event in run.uni
        if isinstance(event, UniEvent)
        for item in event.content_items
        if isinstance(item, ToolCallDone)
    ]
    for event in run.uni:
        if isinstance(event, UniEvent):
            encode_json(event)
    msgspec.json.encode(run.events)
    inner: Any = done.arguments["a"]
    for _ in range(depth - 1):
        inner = inner[0]
    assert inner == []


def test_s01_oversized_frames_are_bounded_and_typed_in_every_framing() -> None:
    for case in STREAMS:
        frames, index = mutate(
            case.frames, case.text, b'"zz": "' + b"x" * 70_000 + b'", ' + case.text
        )
        data = b"".join(frames)
        decoder = WireDecoder(case.dialect(), clock=lambda: 0, max_frame=65_536)
        error: RilletError | None = None
        fed = 0
        try:
            for i in range(0, len(data), 4096):
                decoder.feed(data[i : i + 4096])
                fed += 1
        except FrameTooLarge as exc:
            error = exc
        assert isinstance(error, FrameTooLarge), case.name
        assert error.limit == 65_536
        assert 65_536 < error.size <= 65_536 + 4096 + len(b"".join(frames[: index + 1]))
        assert fed * 4096 < len(data)  # the rest was never read


@pytest.mark.parametrize("case", [c for c in ALL if c.name not in ("mmsp",)], ids=str)
def test_s01_invalid_utf8_is_replaced_only_in_sse(
    case: WireCase, controls: dict[str, Decoded]
) -> None:
    frames, _ = mutate(case.frames, case.text, case.text + b"\xff\xfe")
    result = decode(case, frames)
    if case.stream and case.name != "ollama":  # SSE: U+FFFD, per the event-stream standard
        assert result.error is None
        assert "\ufffd" in result.text
    else:  # NDJSON lines and JSON bodies: a frame error, nothing replaced
        assert isinstance(result.error, FrameError), repr(result.error)
        assert "\ufffd" not in result.text


def test_s02_s05_logging_an_upstream_error_never_raises(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    error = OpenAIChatDialect().error_from_response(400, {}, LONE)
    logging.getLogger("rillet.test").error("upstream said: %s", error)
    assert "upstream said" in caplog.text


# --- S06-S16: the server --------------------------------------------------------------------------

ONE_REQUEST = (0.0,)
HELLO = ["Hel", "lo, ", "world"]
HELLO_SEEN = expect("start", "D*3", "usage", "done", END_OK)


def late_reply(fragments: Sequence[str] = HELLO, delay: float = 1.0) -> Reply:
    """A whole reply whose headers come after `delay` s: clients connect before its events."""
    return text_reply(fragments, headers_delay=delay)


async def watch(run: RunRef, reads: list[Read]) -> None:
    """A well-behaved subscriber of the same run: reads it to its end."""
    reads.append(await read_ws(run.ws_url))


def check_unaffected(served: Site, run: RunRef, reads: Sequence[Read]) -> None:
    """The run completed with one request, and the well-behaved subscribers got every event
    once, the text exactly once."""
    check_site(served, run, at=ONE_REQUEST, saw=HELLO_SEEN, text="".join(HELLO))
    for read in reads:
        check_reads(served, run, [read])
        assert (read.code, read.reason) == (1000, "done")


async def misbehave(run: RunRef, *messages: str | bytes) -> Read:
    """A WebSocket client that sends `messages`, then reads what the server says."""
    read = Read(101)
    async with ws_connect(run.ws_url) as ws:
        try:
            for message in messages:
                await ws.send_message(message)
            while True:
                read.data.append(str(await ws.get_message()).encode())
        except trio_websocket.ConnectionClosed as closed:
            if closed.reason is not None:
                read.code, read.reason = closed.reason.code, closed.reason.reason
    return read


@pytest.mark.parametrize(
    ("messages", "code", "reason"),
    [
        ((b"\x00\x01",), 1003, None),
        (("hello?",), 1008, "not_json"),
        (('{"type": "ping"}', "{"), 1008, "not_json"),
    ],
    ids=["binary-1003", "not-json-1008", "json-then-not-json-1008"],
)
async def test_s06_a_websocket_client_sending_what_it_may_not_is_closed(
    loop_clock: trio.testing.MockClock,
    messages: tuple[str | bytes, ...],
    code: int,
    reason: str | None,
) -> None:
    with trio.fail_after(LIMIT):
        async with site([late_reply()]) as served:
            run = await served.start()
            reads: list[Read] = []
            async with trio.open_nursery() as nursery:
                nursery.start_soon(watch, run, reads)
                bad = await misbehave(run, *messages)
    assert bad.code == code
    if reason is not None:
        assert bad.reason == reason
    assert bad.data == served.log(run.run_id)[: len(bad.data)]  # what it had, in order...
    assert len(bad.data) <= 1  # ...run.started at most: the run's reply had not begun
    check_unaffected(served, run, reads)


async def test_s06_invalid_utf8_in_a_text_message_closes_1007(
    loop_clock: trio.testing.MockClock,
) -> None:
    with trio.fail_after(LIMIT):
        async with site([late_reply()]) as served:
            run = await served.start()
            reads: list[Read] = []
            async with trio.open_nursery() as nursery:
                nursery.start_soon(watch, run, reads)
                code = await raw_text_frame(run.ws_url, b'"\xff\xfe"')
    assert code == 1007
    check_unaffected(served, run, reads)


async def raw_text_frame(url: str, payload: bytes) -> int:
    """Send one (masked) text frame with this payload over a raw WebSocket; the close code."""
    parts = urlsplit(url)
    assert parts.hostname is not None
    assert parts.port is not None
    key = base64.b64encode(os.urandom(16)).decode()
    head = (
        f"GET {parts.path}?{parts.query} HTTP/1.1\r\nHost: {parts.netloc}\r\n"
        "Upgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    async with await trio.open_tcp_stream(parts.hostname, parts.port) as stream:
        await stream.send_all(head.encode())
        buffer = bytearray()
        while b"\r\n\r\n" not in buffer:
            buffer += await stream.receive_some(65536)
        buffer = bytearray(bytes(buffer).partition(b"\r\n\r\n")[2])
        mask = os.urandom(4)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        await stream.send_all(bytes([0x81, 0x80 | len(payload)]) + mask + masked)
        while True:
            frame = next_frame(buffer)
            if frame is None:
                data = await stream.receive_some(65536)
                assert data, "closed without a close frame"
                buffer += data
                continue
            if frame[0] == 0x8:
                code: int = struct.unpack("!H", frame[1][:2])[0]
                return code


async def test_s07_a_flood_past_20_a_second_is_closed_1008_and_others_are_unaffected(
    loop_clock: trio.testing.MockClock,
) -> None:
    with trio.fail_after(LIMIT):
        async with site([late_reply()]) as served:
            run = await served.start()
            reads: list[Read] = []
            clients: dict[int, Read] = {}

            async def send(count: int) -> None:
                clients[count] = await misbehave(run, *(["{}"] * count))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(watch, run, reads)
                # at one instant, before the run's reply: the burst of 40 passes; the 41st
                # message is one too many
                nursery.start_soon(send, 40)
                nursery.start_soon(send, 41)
            burst, flood = clients[40], clients[41]
    assert (flood.code, flood.reason) == (1008, "rate_limited")
    assert burst.code == 1000  # the burst alone was allowed: it read the run to its end
    check_reads(served, run, [burst])
    check_unaffected(served, run, reads)


async def test_s08_a_message_over_64_kib_is_closed_1009(
    loop_clock: trio.testing.MockClock,
) -> None:
    with trio.fail_after(LIMIT):
        async with site([late_reply()]) as served:
            run = await served.start()
            reads: list[Read] = []
            async with trio.open_nursery() as nursery:
                nursery.start_soon(watch, run, reads)
                big = await misbehave(run, '"' + "x" * (64 * 1024) + '"')
                fits = await misbehave(run, '"' + "x" * (64 * 1024 - 3) + '"')
    assert big.code == 1009
    assert fits.code == 1000  # a message at the limit is fine
    check_unaffected(served, run, reads)


async def test_s09_another_runs_token_and_no_such_run_look_the_same(
    loop_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    with trio.fail_after(LIMIT):
        async with site([late_reply()]) as served:
            mine, other = await served.start(), await served.start()
            targets = {
                "wrong-token": mine.events_url.replace(mine.token, other.token),
                "no-token": mine.events_url.split("?")[0],
                "unknown-run": other.events_url.replace(other.run_id, "ab" * 12),
                "malformed-run": other.events_url.replace(other.run_id, "NOT-A-RUN"),
            }
            answers = {}
            for name, target in targets.items():
                path = target.removeprefix(served.url)
                raw = await raw_request(served, f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n")
                answers[name] = raw
            ws = [
                await read_ws(mine.ws_url.replace(mine.token, other.token)),
                await read_ws(other.ws_url.replace(other.run_id, "ab" * 12)),
            ]
            deletes = [
                await served.client.delete(
                    f"/v1/runs/{run_id}", headers={"authorization": f"Bearer {token}"}
                )
                for run_id, token in ((mine.run_id, other.token), ("ab" * 12, other.token))
            ]
            reads = [await read_ws(mine.ws_url), await read_ws(other.ws_url)]
    first = answers["wrong-token"]
    assert first.startswith(b"HTTP/1.1 404 ")
    assert all(raw == first for raw in answers.values()), answers
    assert [(r.code, r.reason, r.data) for r in ws] == [(1008, "not_found", [])] * 2
    assert deletes[0].content == deletes[1].content
    assert deletes[0].status_code == deletes[1].status_code == 404
    assert mine.token not in caplog.text
    assert other.token not in caplog.text
    for read, run in zip(reads, (mine, other), strict=True):  # neither run was touched
        check_reads(served, run, [read])


async def raw_request(served: Site, head: str, body: bytes = b"") -> bytes:
    """One request (`Connection: close` added) on a raw socket; everything the server sent."""
    host, port = served.url.removeprefix("http://").rsplit(":", 1)
    async with await trio.open_tcp_stream(host, int(port)) as stream:
        await stream.send_all(head.encode() + b"Connection: close\r\n\r\n" + body)
        received = bytearray()
        while data := await stream.receive_some(65536):
            received += data
    return bytes(received)


def test_s10_cr_lf_and_nul_are_refused_in_sse_event_and_id() -> None:
    for bad in ("a\rb", "a\nb", "a\x00b", "x\n\nevent: admin"):
        with pytest.raises(SSEEncodeError):
            encode_sse("data", event=bad)
        with pytest.raises(SSEEncodeError):
            encode_sse("data", id=bad)
    decoded = SSEDecoder().feed(encode_sse("x\n\nevent: admin\r\nid: 7"))
    assert [(e.data, e.event, e.id) for e in decoded] == [
        ("x\n\nevent: admin\nid: 7", "message", "")
    ]


async def test_s10_text_that_looks_like_sse_fields_arrives_as_one_exact_delta(
    loop_clock: trio.testing.MockClock,
) -> None:
    sneaky = ["x\n\nevent: admin\ndata: {}\n\n", "id: 99\r\nretry: 1\r", "\x00:ok"]
    with trio.fail_after(LIMIT):
        async with site([text_reply(sneaky)]) as served:
            run = await served.start()
            sse = await read_sse(run.events_url)
            ws = await read_ws(run.ws_url)
    check_site(
        served,
        run,
        at=ONE_REQUEST,
        saw=expect("start", "D*3", "usage", "done", END_OK),
        text="".join(sneaky),
    )
    for read in (sse, ws):
        check_reads(served, run, [read])
        deltas = [e.delta for e in read.events if isinstance(e, AnswerDelta)]
        assert deltas == sneaky
    assert sse.ids == [f"{run.run_id}:{seq}" for seq in sse.seqs]


async def test_s11_provider_ids_never_become_sse_ids(loop_clock: trio.testing.MockClock) -> None:
    stream = openai_text_stream(HELLO, completion_id="chatcmpl-PROVIDER-ID")
    frames = [f for f in stream.split(b"\n\n") if f]
    tagged = b"".join(
        b"id: provider-%d\nevent: message\nretry: 5\n%s\n\n" % (i, f) for i, f in enumerate(frames)
    )
    with trio.fail_after(LIMIT):
        async with site([Reply(chunks=(tagged,))]) as served:
            run = await served.start()
            read = await read_sse(run.events_url)
            resumed = await read_sse(run.events_url, last_event_id="provider-3")
    check_site(served, run, at=ONE_REQUEST, saw=HELLO_SEEN, text="".join(HELLO))
    check_reads(served, run, [read])
    assert read.ids == [f"{run.run_id}:{seq}" for seq in range(1, len(read.data) + 1)]
    body = b"".join(read.data)
    assert b"provider-" not in body
    assert b"chatcmpl-PROVIDER-ID" not in body
    assert resumed.status == 400  # a provider's id is no cursor here


async def test_s12_a_request_head_or_body_never_finished_is_closed_after_10_s(
    loop_clock: trio.testing.MockClock,
) -> None:
    partial_heads = [
        b"",  # connects, sends nothing
        b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ",
        b"GET /v1/runs/x/ws HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n",
    ]
    body_cut = (
        b"POST /v1/runs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b'Content-Length: 100\r\n\r\n{"prompt": '
    )
    with trio.fail_after(LIMIT):
        async with site([late_reply()]) as served:
            host, port = served.url.removeprefix("http://").rsplit(":", 1)
            waited = []
            answers = []
            for sent in [*partial_heads, body_cut]:
                async with await trio.open_tcp_stream(host, int(port)) as stream:
                    start = trio.current_time()
                    await stream.send_all(sent)
                    received = bytearray()
                    while data := await stream.receive_some(65536):
                        received += data
                    waited.append(trio.current_time() - start)
                    answers.append(bytes(received))
            healthy = await served.client.get("/healthz")
            runs = served.hub.statistics()["runs"]
    assert waited == pytest.approx([10.0] * 4, abs=0.1)
    assert answers[:3] == [b"", b"", b""]  # closed, no answer
    assert answers[3].startswith(b"HTTP/1.1 408 ")
    assert healthy.status_code == 200
    assert runs == 0
    assert served.loopback.requests == []


PROVIDER_KEY = "sk-provider-secret-0123456789abcdef"
SERVER_KEY = "server-key-0123456789abcdef"
COOKIE = "session=cookie-secret-abcdef0123"


async def test_s13_keys_and_request_headers_never_reach_events_logs_or_errors(
    loop_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    leak = {"error": {"message": f"Incorrect API key provided: {PROVIDER_KEY}", "type": "x"}}
    secrets = (PROVIDER_KEY, SERVER_KEY, COOKIE, "Incorrect API key", "cookie-secret")
    headers = {
        "authorization": f"Bearer {SERVER_KEY}",
        "cookie": COOKIE,
        "x-api-key": PROVIDER_KEY,
    }
    with trio.fail_after(LIMIT):
        async with site(
            [status_reply(401, body=leak)], api_key=Secret(SERVER_KEY), provider_key=PROVIDER_KEY
        ) as served:
            started = await served.client.post("/v1/runs", json={"prompt": "Hi"}, headers=headers)
            answer = started.json()
            run = RunRef(
                answer["run_id"], answer["token"], answer["events_url"], answer["ws_url"], 0
            )
            sse = await read_sse(run.events_url)
            ws = await read_ws(run.ws_url)
            mmsp = await served.client.post(
                "/v1/stream",
                json={
                    "model": "test-model",
                    "messages": [
                        {"role": "user", "content_items": [{"type": "text.done", "text": "Hi"}]}
                    ],
                    "config": {},
                },
                headers=headers,
            )
            sent = [r.headers.get("authorization") for r in served.loopback.requests]
    assert sent == [f"Bearer {PROVIDER_KEY}"] * 2  # the key was used, twice...
    assert mmsp.status_code == 401
    outputs = [started.content, mmsp.content, *sse.data, *ws.data, caplog.text.encode()]
    for output in outputs:
        for secret in secrets:
            assert secret.encode() not in output  # ...and never came back, anywhere
    done = sse.events[-1]
    assert isinstance(done, RunDone)
    assert (done.status, done.code) == ("error", "provider_error")
    assert sse.data == ws.data


async def test_s14_without_the_server_key_401_and_no_run(
    loop_clock: trio.testing.MockClock,
) -> None:
    with trio.fail_after(LIMIT):
        async with site([late_reply()], api_key=Secret(SERVER_KEY)) as served:
            refused = [
                await served.client.post("/v1/runs", json={"prompt": "Hi"}, headers=h)
                for h in ({}, {"authorization": "Bearer nope"}, {"authorization": SERVER_KEY})
            ]
            stream = await served.client.post("/v1/stream", json={"model": "m", "messages": []})
            runs = served.hub.statistics()["runs"]
            requests = len(served.loopback.requests)
    assert [r.status_code for r in refused] == [401, 401, 401]
    assert all(r.headers["www-authenticate"] == "Bearer" for r in refused)
    assert stream.status_code == 401
    assert (runs, requests) == (0, 0)
    provider = Provider(dialect=OpenAIChatDialect(), base_url="http://127.0.0.1:9", model="m")
    with pytest.raises(ServerConfigError):
        await serve(ServerConfig(provider=provider, host="0.0.0.0", port=0))


async def test_s15_a_body_over_the_limit_is_413_and_subscribers_over_the_limits_429(
    loop_clock: trio.testing.MockClock,
) -> None:
    limits = Limits(max_body=1024, max_subscribers_per_run=2)
    big = msgspec.json.encode({"prompt": "x" * 2000})
    with trio.fail_after(LIMIT):
        async with site([late_reply(delay=5.0)], limits=limits) as served:
            declared = await served.client.post(
                "/v1/runs", content=big, headers={"content-type": "application/json"}
            )
            chunked = await raw_request(
                served,
                "POST /v1/runs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                "Transfer-Encoding: chunked\r\n",
                b"".join(b"%x\r\n%s\r\n" % (100, big[i : i + 100]) for i in range(0, 2000, 100)),
            )
            runs_before = served.hub.statistics()["runs"]
            run = await served.start()
            reads: list[Read] = []
            async with trio.open_nursery() as nursery:
                nursery.start_soon(watch, run, reads)
                nursery.start_soon(watch, run, reads)
                await served.wait_for(run.run_id, 1)
                while served.hub.statistics()["subscribers"] < 2:  # noqa: ASYNC110
                    await trio.sleep(0.01)  # the hub counts subscribers; it has no event
                third = await read_sse(run.events_url)
                third_ws = await read_ws(run.ws_url)
    assert declared.status_code == 413
    assert chunked.startswith(b"HTTP/1.1 413 ")
    assert runs_before == 0
    assert third.status == 429
    assert msgspec.json.decode(third.body)["error"]["type"] == "too_many_subscribers"
    assert (third_ws.code, third_ws.reason, third_ws.data) == (1008, "too_many_subscribers", [])
    check_unaffected(served, run, reads)


FAILURES = [
    ("status-401", [status_reply(401)], "provider_error"),
    ("always-500", [status_reply(500)], "provider_error"),
    ("tool-arguments", "tool", "tool_arguments_invalid"),
    ("protocol", "protocol", "protocol_error"),
    ("thinking-only", "thinking", "empty_response"),
]


def failing_script(kind: str | list[Reply]) -> list[Reply]:
    if isinstance(kind, list):
        return kind
    chunk = OK[0]
    if kind == "tool":
        body = tool_stream(['{"city": "Par', "is\\u0000"]).body
        return [Reply(chunks=tuple(b for b in body if isinstance(b, bytes)))]
    if kind == "protocol":  # a tool call fragment for a call that never started
        orphan = b'{"index":3,"function":{"arguments":"x"}}'
        delta = b'data: {"id":"c","choices":[{"index":0,"delta":{"tool_calls":[%s]}}]}\n\n'
        return [Reply(chunks=(chunk, delta % orphan))]
    thinking = (
        b'data: {"id":"c","choices":[{"index":0,"delta":{"reasoning_content":"secret plan"}}]}\n\n'
        b'data: {"id":"c","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
        b'data: {"id":"c","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1}}\n\n'
        b"data: [DONE]\n\n"
    )
    return [Reply(chunks=(chunk, thinking))]


@pytest.mark.parametrize(("name", "kind", "code"), FAILURES, ids=[f[0] for f in FAILURES])
async def test_s16_run_done_and_errors_carry_codes_only(
    loop_clock: trio.testing.MockClock,
    caplog: pytest.LogCaptureFixture,
    name: str,
    kind: str | list[Reply],
    code: str,
) -> None:
    caplog.set_level(logging.DEBUG)
    with trio.fail_after(LIMIT):
        async with site(failing_script(kind)) as served:
            run = await served.start()
            read = await read_sse(run.events_url)
    done = read.events[-1]
    assert isinstance(done, RunDone)
    assert (done.status, done.code) == ("error", code)
    wire = msgspec.json.decode(read.data[-1])
    assert set(wire) <= {
        "type",
        "run_id",
        "seq",
        "elapsed_ms",
        "status",
        "code",
        "attempts",
        "requests",
    }
    body = b"\n".join(read.data)
    for word in (b"Traceback", b'File "', b"Error", b"secret plan", b"Par", b"upstream"):
        assert word not in body, word
    assert "Traceback" not in caplog.text


@pytest.mark.parametrize("opted_in", [False, True], ids=["default", "opted-in"])
async def test_s16_reasoning_and_tool_arguments_only_when_opted_in(
    loop_clock: trio.testing.MockClock, opted_in: bool
) -> None:
    reasoning = (
        b'data: {"id":"c","choices":[{"index":0,"delta":{"reasoning_content":"secret plan"}}]}\n\n'
    )
    body = tool_stream(['{"city": ', '"Paris"}']).body
    chunks = [b for b in body if isinstance(b, bytes)]
    script = [Reply(chunks=(chunks[0], reasoning, *chunks[1:]))]
    with trio.fail_after(LIMIT):
        async with site(script, reasoning=opted_in, tool_arguments=opted_in) as served:
            run = await served.start()
            read = await read_sse(run.events_url)
    data = b"\n".join(read.data)
    assert (b"secret plan" in data) is opted_in
    assert (b"Paris" in data) is opted_in
    done = read.events[-1]
    assert isinstance(done, RunDone)
    assert done.code == "completed"
