"""The stream handler, F21-F27: what the bytes say (a non-stream Content-Type, frames that are
not JSON or of the wrong shape, UTF-8 cut anywhere, frames over the cap; the harness:
`handler_support`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec
import pytest
import trio
from rillet import (
    FrameError,
    FrameTooLarge,
    MalformedFrameError,
    RescueFailed,
)
from rillet._core._events import UniEvent
from rillet._core._policy import Outcome
from rillet._core._runevents import AnswerDelta
from rillet.providers._ollama import OllamaDialect
from rillet.transports.testing import openai_text_stream, sse

from ..handler_support import (
    END_OK,
    FRAGMENTS,
    MULTIBYTE,
    NDJSON_TYPE,
    NOT_JSON,
    OK,
    OK_SEEN,
    RESCUE_TEXT,
    ROLE,
    TEXT,
    WRONG_SHAPE,
    Answer,
    Item,
    Run,
    check,
    end_error,
    events_of,
    expect,
    ok,
    ollama_lines,
    play,
    policy,
    rescue_ok,
    seen,
    status,
)

pytestmark = pytest.mark.usefixtures("graph")  # every turn here runs under both graphs

if TYPE_CHECKING:
    from collections.abc import Sequence

    import trio.testing

# --- F21-F27: what the bytes say ------------------------------------------------------------------

HTML = Answer(body=[b"<html><body>Gateway</body></html>"], content_type="text/html")


async def test_f21_html_to_a_streaming_request_is_a_frame_error_then_rescued(
    autojump_clock: trio.testing.MockClock,
) -> None:
    run = await play([HTML], rescue=rescue_ok())
    check(
        run,
        at=[0.0, 0.1, 0.3, 0.7, 0.7],
        outcome=Outcome.RESCUED,
        saw=expect("start", "D", "usage", "done", END_OK),
        text=RESCUE_TEXT,
    )
    assert all(body.pulled == 0 for body in run.fake.bodies[:4])


async def test_f21_html_always_without_rescue_is_init_failed_with_a_frame_error(
    autojump_clock: trio.testing.MockClock,
) -> None:
    run = await play([HTML], pol=policy(rescue=False))
    check(
        run,
        at=[0.0, 0.1, 0.3, 0.7],
        outcome=Outcome.INIT_FAILED,
        saw=expect("start", end_error("protocol_error")),
        text="",
    )
    assert isinstance(run.result.error, FrameError)
    assert "text/html" in str(run.result.error)


PROTOCOL = end_error("protocol_error")


async def test_f22_a_frame_of_the_wrong_shape_is_never_skipped_nor_streamed_again(
    autojump_clock: trio.testing.MockClock,
) -> None:
    broken = Answer(body=[ROLE, OK[1], WRONG_SHAPE + OK[2], *OK[3:]])
    run = await play([broken, ok()], rescue=rescue_ok())
    check(
        run,
        at=[0.0, 0.0],  # the rescue, at once: a second streamed request would get it again
        outcome=Outcome.RESCUED,
        saw=expect("start", "D", "reset", "D", "usage", "done", END_OK),
        text=RESCUE_TEXT,
    )
    assert [s.stream for s in run.fake.sent] == [True, False]


@pytest.mark.parametrize(
    ("bad", "at", "saw"),
    [
        (NOT_JSON, [0.0, 0.1, 0.3, 0.7], ["start", *["D", "reset"] * 3, "D", PROTOCOL]),
        (WRONG_SHAPE, [0.0], ["start", "D", PROTOCOL]),
    ],
    ids=["not-json", "wrong-shape"],
)
async def test_f22_the_frame_error_names_the_provider_and_the_frame(
    autojump_clock: trio.testing.MockClock, bad: bytes, at: list[float], saw: list[str]
) -> None:
    broken = Answer(body=[ROLE, OK[1], bad + OK[2], *OK[3:]])
    run = await play([broken], pol=policy(rescue=False))
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
        saw=expect("start", "D", end_error("protocol_error")),
        text=FRAGMENTS[0],
    )
    first = run.fake.bodies[0]
    assert first.pulled == 2 + 17  # 17 x 4 KiB is the first past 64 KiB; the 18th is unread


async def test_f26_the_frame_error_is_bounded_and_typed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    run = await play([oversized_sse()], pol=policy(rescue=False, max_frame=CAP))
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
        saw=expect("start", "D", end_error("protocol_error")),
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
        saw=expect("start", end_error("provider_unavailable")),
        text="",
    )
    error = run.result.error
    assert isinstance(error, RescueFailed)
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
