"""Security and bad input (RELIABILITY.md S01-S05), each as a test that fails if the behaviour
breaks.

S02-S05 run against every dialect's frame decoder through `WireDecoder` (framing, dialect,
grammar): a recorded fixture of each dialect with one frame mutated to carry a lone surrogate, a
100,000-deep nesting, a 5,000-digit integer, `NaN` / `Infinity` or a duplicate key. The bad frame
must end the attempt with a typed frame error (never another exception, never a hang) while
everything before it still comes out; a duplicate key is not an error: the last one wins. The
non-streaming bodies (the rescue's) get the same treatment. Where the answer is a whole turn
(retried, Failed), the turn runs on the virtual-time harness of `handler_support`. The server's
scenarios (S06-S16) are `test_reliability_server_security`.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import attrs
import msgspec
import pytest
import trio
from rillet import (
    FrameError,
    FrameTooLarge,
    InvalidRequestError,
    MalformedFrameError,
    ProviderError,
    RilletError,
    ToolCallArgumentParseError,
    encode_json,
)
from rillet._core._arguments import MAX_ARGUMENT_DEPTH
from rillet._core._dialect import Dialect, Provider
from rillet._core._events import (
    EmbeddingDone,
    TextDelta,
    ThinkingDelta,
    ToolCallDone,
    UniEvent,
    delta_event,
)
from rillet._core._policy import Outcome
from rillet._core._request import TurnRequest, user
from rillet.lowlevel import WireDecoder
from rillet.providers._anthropic._dialect import AnthropicDialect
from rillet.providers._embeddings import OpenAIEmbeddingsDialect
from rillet.providers._gemini._dialect import GeminiDialect
from rillet.providers._mmsp import MMSPDialect
from rillet.providers._ollama import OllamaDialect
from rillet.providers._openai_chat._dialect import OpenAIChatDialect
from rillet.providers._openai_responses._dialect import OpenAIResponsesDialect

from ..handler_support import (
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
from ..wire_cases import FIXTURES

if TYPE_CHECKING:
    from collections.abc import Sequence

    import trio.testing


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
        saw=expect("start", "end(error, invalid_request)"),
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
        outcome=Outcome.RESCUED,
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
        saw=expect("start", "end(error, invalid_request)"),
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
