"""Deterministic failures are never retried (RELIABILITY.md rules 1, 4 and 6; F26, F54).

A failure that is the same every time (a frame over the cap, valid JSON of the wrong shape)
costs one streamed request: the same request would only get the same answer, paid and shown
again. Each scenario runs a whole turn through the handler, on `httpx.MockTransport` in exact
virtual time (`autojump_clock`) or on the loopback provider, and asserts what the turn cost (the
requests the provider received, their times, `TurnResult.requests` and the `run.done` field)
besides the outcome, the events and the text. Spent quotas and the waits a body hints:
`test_reliability_quota`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec
import pytest
import trio
from rillet import (
    FrameTooLarge,
    MalformedFrameError,
    ProviderError,
    RescueFailed,
)
from rillet._core._policy import Outcome
from rillet.frames import DEFAULT_MAX_FRAME
from rillet.providers._anthropic._dialect import AnthropicDialect
from rillet.providers._gemini._dialect import GeminiDialect
from rillet.providers._ollama import OllamaDialect
from rillet.providers._openai_chat._dialect import OpenAIChatDialect
from rillet.transports.testing import Reply, openai_text_stream, sse

from ..deterministic_support import (
    RESCUE_SEEN,
    chunks_of,
)
from ..fault_support import check_loop, loop_turn, rescue_after
from ..handler_support import (
    END_OK,
    FRAGMENTS,
    NDJSON_TYPE,
    OK,
    OK_SEEN,
    RESCUE_TEXT,
    ROLE,
    TEXT,
    Answer,
    anthropic_events,
    check,
    end_error,
    events_of,
    expect,
    gemini_events,
    ok,
    ollama_lines,
    play,
    policy,
    rescue_ok,
    run_done,
    status,
)

if TYPE_CHECKING:
    import trio.testing
    from rillet._core._dialect import Dialect

# --- F26: a frame over the incoming cap -----------------------------------------------------------


async def test_f26_a_frame_over_the_default_32_mib_cap_is_permanent_and_the_rest_unread(
    autojump_clock: trio.testing.MockClock,
) -> None:
    line = b"data: " + b"x" * (DEFAULT_MAX_FRAME + 100_000) + b"\n\n"
    body = chunks_of(line)
    run = await play([Answer(body=[ROLE, OK[1], *body]), ok()], rescue=rescue_ok())
    check(
        run,
        at=[0.0],  # no retry, no rescue: the same frame would come back
        outcome=Outcome.FAILED,
        saw=expect("start", "D", end_error("protocol_error")),
        text=FRAGMENTS[0],
    )
    error = run.result.error
    assert isinstance(error, FrameTooLarge)
    assert error.limit == DEFAULT_MAX_FRAME == 32 * 1024 * 1024
    assert DEFAULT_MAX_FRAME < error.size <= DEFAULT_MAX_FRAME + 4096  # the cap + a read
    pulled = run.fake.bodies[0].pulled
    assert pulled == 2 + DEFAULT_MAX_FRAME // 4096 + 1  # the first read past the cap, no more
    assert pulled < 2 + len(body)
    assert run_done(run).requests == 1


async def test_f26_events_decoded_before_it_in_the_same_read_are_still_delivered(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # one read holds two whole deltas and the start of a frame already past the cap
    oversized = b"data: " + b"x" * 70_000
    read = OK[2] + OK[3] + oversized
    run = await play(
        [Answer(body=[ROLE, OK[1], read, b"x" * 100 + b"\n\n", *OK[4:]]), ok()],
        pol=policy(max_frame=64 * 1024),
    )
    check(
        run,
        at=[0.0],
        outcome=Outcome.FAILED,
        saw=expect("start", "D*3", end_error("protocol_error")),
        text="".join(FRAGMENTS[:3]),
    )
    assert isinstance(run.result.error, FrameTooLarge)


async def test_f26_ndjson_lines_before_it_in_the_same_read_are_still_delivered(
    autojump_clock: trio.testing.MockClock,
) -> None:
    lines = ollama_lines()
    read = lines[1] + lines[2] + b'{"message":{"content":"' + b"x" * 70_000
    run = await play(
        [Answer(body=[lines[0], read, *lines[3:]], content_type=NDJSON_TYPE)],
        dialect=OllamaDialect(),
        pol=policy(max_frame=64 * 1024),
    )
    check(
        run,
        at=[0.0],
        outcome=Outcome.FAILED,
        saw=expect("start", "D*3", end_error("protocol_error")),
        text="".join(FRAGMENTS[:3]),
    )
    assert isinstance(run.result.error, FrameTooLarge)


@pytest.mark.parametrize("size", [100_000, 5 * 1024 * 1024], ids=["100KB", "5MB"])
async def test_f26_a_100_kb_or_5_mb_frame_is_normal_and_passes(
    autojump_clock: trio.testing.MockClock, size: int
) -> None:
    # a Responses `response.completed` repeating a long answer, a Gemini inline image
    big = "y" * size
    events = events_of(openai_text_stream([FRAGMENTS[0], big, *FRAGMENTS[1:]]))
    body = [events[0], events[1], *chunks_of(events[2]), *events[3:]]
    run = await play([Answer(body=body)])
    check(
        run,
        at=[0.0],
        outcome=Outcome.COMPLETED,
        saw=expect("start", "D*6", "usage", "done", END_OK),
        text=FRAGMENTS[0] + big + "".join(FRAGMENTS[1:]),
    )


@pytest.mark.parametrize("size", [100_000, 5 * 1024 * 1024], ids=["100KB", "5MB"])
async def test_f26_a_100_kb_or_5_mb_ndjson_line_passes(
    autojump_clock: trio.testing.MockClock, size: int
) -> None:
    big = "y" * size
    lines = ollama_lines([FRAGMENTS[0], big, *FRAGMENTS[1:]])
    body = [lines[0], *chunks_of(lines[1]), *lines[2:]]
    run = await play([Answer(body=body, content_type=NDJSON_TYPE)], dialect=OllamaDialect())
    check(
        run,
        at=[0.0],
        outcome=Outcome.COMPLETED,
        saw=expect("start", "D*6", "usage", "done", END_OK),
        text=FRAGMENTS[0] + big + "".join(FRAGMENTS[1:]),
    )


async def test_f26_an_oversized_frame_over_loopback_costs_one_request(
    loop_clock: trio.testing.MockClock,
) -> None:
    line = b"data: " + b"x" * 70_000 + b"\n\n"
    oversized = Reply(chunks=(OK[0], OK[1], *chunks_of(line), *OK[2:]))
    run = await loop_turn(rescue_after(oversized), pol=policy(max_frame=64 * 1024))
    check_loop(
        run,
        at=[0.0],
        outcome=Outcome.FAILED,
        saw=expect("start", "D", end_error("protocol_error")),
        text=FRAGMENTS[0],
    )
    assert isinstance(run.result.error, FrameTooLarge)
    assert run.result.requests == 1
    assert run_done(run).requests == 1


# --- F54: valid JSON of the wrong shape -----------------------------------------------------------

WRONG = {
    "openai": b'data: {"id": "c1", "choices": 5}\n\n',
    "anthropic": sse(
        {"type": "content_block_delta", "index": "zero", "delta": {"type": "text_delta"}},
        event="content_block_delta",
    ),
    "gemini": sse({"candidates": {"content": 5}}),
}


def wrong_shape_stream(dialect: str) -> tuple[Dialect, Answer]:
    """A stream of `dialect`: the first delta, then a known event of the wrong shape."""
    if dialect == "openai":
        return OpenAIChatDialect(), Answer(body=[ROLE, OK[1], WRONG["openai"], *OK[2:]])
    if dialect == "anthropic":
        events = anthropic_events()
        return AnthropicDialect(), Answer(body=[*events[:3], WRONG["anthropic"], *events[3:]])
    events = gemini_events()
    return GeminiDialect(), Answer(body=[events[0], WRONG["gemini"], *events[1:]])


def rescue_for(dialect: Dialect) -> Answer:
    """A non-streaming reply the dialect decodes, with RESCUE_TEXT."""
    if isinstance(dialect, AnthropicDialect):
        body: dict[str, Any] = {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": "claude-test",
            "content": [{"type": "text", "text": RESCUE_TEXT}],
            "stop_reason": "end_turn",
            "usage": {"input_tokens": 3, "output_tokens": 4},
        }
    elif isinstance(dialect, GeminiDialect):
        body = {
            "candidates": [
                {
                    "content": {"parts": [{"text": RESCUE_TEXT}], "role": "model"},
                    "finishReason": "STOP",
                }
            ],
            "usageMetadata": {"promptTokenCount": 3, "candidatesTokenCount": 4},
        }
    else:
        return rescue_ok()
    return Answer(body=[msgspec.json.encode(body)], content_type="application/json")


@pytest.mark.parametrize("dialect", ["openai", "anthropic", "gemini"])
async def test_f54_the_wrong_shape_gets_one_streamed_request_then_the_rescue(
    autojump_clock: trio.testing.MockClock, dialect: str
) -> None:
    speaks, broken = wrong_shape_stream(dialect)
    run = await play([broken, Answer(body=OK)], rescue=rescue_for(speaks), dialect=speaks)
    check(
        run,
        at=[0.0, 0.0],  # the rescue at once, no backoff: never a 2nd streamed attempt
        outcome=Outcome.RESCUED,
        saw=expect("start", "D", "reset", *RESCUE_SEEN, END_OK),
        text=RESCUE_TEXT,
    )
    assert [s.stream for s in run.fake.sent] == [True, False]
    assert run_done(run).requests == 2


@pytest.mark.parametrize("dialect", ["openai", "anthropic", "gemini"])
async def test_f54_without_the_rescue_the_wrong_shape_costs_one_request(
    autojump_clock: trio.testing.MockClock, dialect: str
) -> None:
    speaks, broken = wrong_shape_stream(dialect)
    run = await play([broken, Answer(body=OK)], dialect=speaks, pol=policy(rescue=False))
    check(
        run,
        at=[0.0],
        outcome=Outcome.FAILED,
        saw=expect("start", "D", end_error("protocol_error")),
        text=FRAGMENTS[0],
    )
    error = run.result.error
    assert isinstance(error, MalformedFrameError)
    assert not error.not_json
    assert error.provider == speaks.name
    assert error.frame_index is not None
    assert speaks.name in str(error)


async def test_f54_after_a_transport_retry_the_wrong_shape_still_goes_to_the_rescue(
    autojump_clock: trio.testing.MockClock,
) -> None:
    _, broken = wrong_shape_stream("openai")
    run = await play([status(500), broken, ok()], rescue=rescue_ok())
    check(
        run,
        at=[0.0, 0.1, 0.1],  # a 500 is retried; the wrong shape is not
        outcome=Outcome.RESCUED,
        saw=expect("start", "D", "reset", *RESCUE_SEEN, END_OK),
        text=RESCUE_TEXT,
    )
    assert [s.stream for s in run.fake.sent] == [True, True, False]


async def test_f54_a_failed_rescue_after_the_wrong_shape_keeps_both_errors(
    autojump_clock: trio.testing.MockClock,
) -> None:
    _, broken = wrong_shape_stream("openai")
    run = await play([broken], rescue=status(500))
    check(
        run,
        at=[0.0, 0.0],
        outcome=Outcome.FAILED,
        saw=expect("start", "D", end_error("protocol_error")),
        text=FRAGMENTS[0],
    )
    error = run.result.error
    assert isinstance(error, RescueFailed)
    assert isinstance(error.stream_error, MalformedFrameError)
    assert isinstance(error.rescue_error, ProviderError)


async def test_f54_an_ndjson_line_of_the_wrong_shape_costs_one_streamed_request(
    autojump_clock: trio.testing.MockClock,
) -> None:
    lines = ollama_lines()
    wrong = b'{"model": "llama-test", "message": 5, "done": false}\n'
    run = await play(
        [Answer(body=[lines[0], wrong, *lines[1:]], content_type=NDJSON_TYPE)],
        dialect=OllamaDialect(),
        pol=policy(rescue=False),
    )
    check(
        run,
        at=[0.0],
        outcome=Outcome.FAILED,
        saw=expect("start", "D", end_error("protocol_error")),
        text=FRAGMENTS[0],
    )
    assert isinstance(run.result.error, MalformedFrameError)


async def test_f54_a_frame_that_is_not_json_is_still_retried(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # the contrast: bytes cut short or corrupted on the way may well arrive whole next time
    cut = b'data: {"id": "c1", "choices": [\n\n'
    run = await play([Answer(body=[ROLE, OK[1], cut, *OK[2:]]), ok()])
    check(
        run,
        at=[0.0, 0.1],
        outcome=Outcome.COMPLETED,
        saw=expect("start", "D", "reset", *OK_SEEN, END_OK),
        text=TEXT,
    )


async def test_f54_the_wrong_shape_over_loopback_never_streams_twice(
    loop_clock: trio.testing.MockClock,
) -> None:
    _, broken = wrong_shape_stream("openai")
    reply = Reply(chunks=tuple(b for b in broken.body if isinstance(b, bytes)))
    run = await loop_turn(rescue_after(reply))
    check_loop(
        run,
        at=[0.0, 0.0],
        outcome=Outcome.RESCUED,
        saw=expect("start", "D", "reset", *RESCUE_SEEN, END_OK),
        text=RESCUE_TEXT,
    )
    streamed = [b'"stream":true' in r.body for r in run.server.requests]
    assert streamed == [True, False]
    assert run.result.requests == 2
