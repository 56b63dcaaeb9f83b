"""A streaming request answered with one whole JSON reply (RELIABILITY.md rules 4 and 6).

A server that ignores `"stream": true` (or a proxy that buffers and relabels) answers every
streaming request with the same non-streaming JSON body. That answer is deterministic: asking
again, or asking for the rescue, only pays for it again. An SSE dialect's reply labelled JSON
is read as the whole reply when its first byte says JSON, and as the stream it is otherwise
(a server that mislabels its stream); a Content-Type that is neither (an HTML page, F21) is
still a frame error. Every case runs on the loopback provider on 127.0.0.1 and counts the
requests it received.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec
import pytest
from rillet import (
    AuthenticationError,
    InvalidRequestError,
    ProviderError,
    RescueFailed,
    ServerError,
)
from rillet._core._policy import Outcome
from rillet.providers._anthropic._dialect import AnthropicDialect
from rillet.providers._gemini._dialect import GeminiDialect
from rillet.providers._openai_responses._dialect import OpenAIResponsesDialect
from rillet.transports.testing import Reply, openai_text_body, openai_text_stream, split, sse

from ..fault_support import check_loop, loop_turn, rescue_after
from ..handler_support import END_OK, RESCUE_TEXT, end_error, expect

if TYPE_CHECKING:
    import trio.testing

JSON = "application/json"
ANSWER = "A whole answer, read at once."
WHOLE = ("D", "usage", "done")  # what a reply read whole releases after `start`


def always(reply: Reply) -> Any:
    """A script that answers every request, streaming or not, with `reply`."""
    return lambda request, n: reply


def _json(value: Any, chunk_size: int = 64, content_type: str = JSON) -> Reply:
    return Reply(chunks=split(msgspec.json.encode(value), chunk_size), content_type=content_type)


def anthropic_message(text: str) -> dict[str, Any]:
    """A non-streaming Anthropic Message."""
    return {
        "id": "msg_01",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5",
        "content": [{"type": "text", "text": text}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 12, "output_tokens": 7},
    }


def responses_object(text: str) -> dict[str, Any]:
    """A non-streaming Responses object."""
    message = {
        "id": "msg_1",
        "type": "message",
        "status": "completed",
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }
    return {
        "id": "resp_1",
        "object": "response",
        "status": "completed",
        "model": "gpt-4.1",
        "output": [message],
        "usage": {"input_tokens": 12, "output_tokens": 7, "total_tokens": 19},
    }


def gemini_chunk(text: str, finish: str | None = None) -> dict[str, Any]:
    """One `GenerateContentResponse`."""
    candidate: dict[str, Any] = {"content": {"parts": [{"text": text}], "role": "model"}}
    if finish is not None:
        candidate["finishReason"] = finish
    return {
        "candidates": [candidate],
        "usageMetadata": {"promptTokenCount": 12, "candidatesTokenCount": 7},
        "modelVersion": "gemini-2.5-flash",
        "responseId": "r1",
    }


@pytest.mark.parametrize("chunk_size", [1, 7, 64, 100_000], ids=lambda n: f"reads-of-{n}")
async def test_a_chat_completion_to_a_streaming_request_is_the_reply_in_one_request(
    loop_clock: trio.testing.MockClock, chunk_size: int
) -> None:
    whole = Reply(chunks=split(openai_text_body(ANSWER), chunk_size), content_type=JSON)
    run = await loop_turn(always(whole))
    check_loop(
        run, at=[0.0], outcome=Outcome.COMPLETED, saw=expect("start", *WHOLE, END_OK), text=ANSWER
    )
    assert b'"stream":true' in run.server.requests[0].body
    assert run.result.requests == 1
    assert (usage := run.result.message.usage_metadata) is not None
    assert usage.prompt_tokens == 12


@pytest.mark.parametrize(
    ("dialect", "body"),
    [
        (AnthropicDialect(), anthropic_message(ANSWER)),
        (OpenAIResponsesDialect(), responses_object(ANSWER)),
        (GeminiDialect(), gemini_chunk(ANSWER, "STOP")),
    ],
    ids=["anthropic", "openai-responses", "gemini"],
)
async def test_every_sse_dialect_reads_its_own_whole_reply_in_one_request(
    loop_clock: trio.testing.MockClock, dialect: Any, body: dict[str, Any]
) -> None:
    run = await loop_turn(always(_json(body)), dialect=dialect)
    assert run.result.outcome is Outcome.COMPLETED
    assert run.result.text == ANSWER
    assert run.result.requests == len(run.server.requests) == 1


async def test_gemini_stream_as_a_json_array_is_read_as_that_stream(
    loop_clock: trio.testing.MockClock,
) -> None:
    # `streamGenerateContent` without `alt=sse` answers a JSON array of chunks
    parts = ["A whole ", "answer, ", "read at once."]
    chunks = [gemini_chunk(p) for p in parts[:-1]] + [gemini_chunk(parts[-1], "STOP")]
    run = await loop_turn(always(_json(chunks, 50)), dialect=GeminiDialect())
    assert run.result.outcome is Outcome.COMPLETED
    assert run.result.text == "".join(parts)
    assert run.result.requests == 1
    assert (usage := run.result.message.usage_metadata) is not None
    assert usage.response_tokens == 7


@pytest.mark.parametrize("content_type", [JSON, "application/json; charset=utf-8"])
async def test_a_stream_mislabelled_json_is_read_as_the_stream(
    loop_clock: trio.testing.MockClock, content_type: str
) -> None:
    words = ["one ", "two ", "three"]
    body = b"\n" + openai_text_stream(words)  # a blank line first: nothing told yet
    run = await loop_turn(always(Reply(chunks=split(body, 1), content_type=content_type)))
    check_loop(
        run,
        at=[0.0],
        outcome=Outcome.COMPLETED,
        saw=expect("start", "D", "D", "D", "usage", "done", END_OK),
        text="".join(words),
    )


async def test_a_json_error_with_status_200_is_that_error_asked_once(
    loop_clock: trio.testing.MockClock,
) -> None:
    error = {"error": {"message": "model 'x' is not served here", "type": "invalid_request_error"}}
    run = await loop_turn(always(_json(error)))
    # as the same error first in a stream would be
    check_loop(
        run,
        at=[0.0],
        outcome=Outcome.FAILED,
        saw=expect("start", end_error("invalid_request")),
        text="",
    )
    assert isinstance(run.result.error, InvalidRequestError)
    assert "not served here" in str(run.result.error)


async def test_json_of_the_wrong_shape_goes_once_to_the_rescue(
    loop_clock: trio.testing.MockClock,
) -> None:
    # a JSON body that is no completion: the same request would get it again (rule 4)
    wrong = _json({"choices": "not a list"})
    run = await loop_turn(rescue_after(wrong))
    check_loop(
        run,
        at=[0.0, 0.0],
        outcome=Outcome.RESCUED,
        saw=expect("start", *WHOLE, END_OK),
        text=RESCUE_TEXT,
    )


async def test_an_html_page_to_a_streaming_request_is_still_a_frame_error(
    loop_clock: trio.testing.MockClock,
) -> None:
    page = Reply(chunks=(b"<html><body>Gateway</body></html>",), content_type="text/html")
    run = await loop_turn(rescue_after(page))
    assert run.result.outcome is Outcome.RESCUED
    assert len(run.server.requests) == 5  # F21: as a stream cut short (F07), then the rescue


# --- MiniMax answers errors with status 200 and a `base_resp` -------------------------------------


def minimax_error(code: int, message: str) -> dict[str, Any]:
    """MiniMax's error answer: HTTP 200, no choices, `base_resp` naming the failure."""
    return {
        "id": "",
        "choices": None,
        "created": 0,
        "model": "",
        "object": "",
        "usage": None,
        "base_resp": {"status_code": code, "status_msg": message},
    }


@pytest.mark.parametrize(
    ("code", "message", "error", "requests"),
    [
        (1004, "login fail: Please carry the API secret key", AuthenticationError, 1),
        (1008, "insufficient balance", ProviderError, 1),
        (2013, "invalid params, tools.0.function.name", InvalidRequestError, 1),
        (1026, "input new_sensitive", InvalidRequestError, 1),
    ],
    ids=["auth", "balance", "params", "sensitive"],
)
async def test_a_minimax_error_with_status_200_is_that_error_asked_once(
    loop_clock: trio.testing.MockClock,
    code: int,
    message: str,
    error: type[Exception],
    requests: int,
) -> None:
    for reply in (
        _json(minimax_error(code, message)),
        Reply(chunks=(sse(minimax_error(code, message)),)),
    ):
        run = await loop_turn(always(reply))
        failed = run.result.error
        assert type(failed) is error
        assert isinstance(failed, ProviderError)
        assert f"{message} ({code})" in str(failed)
        assert len(run.server.requests) == requests
        if code == 1008:  # a spent balance: no wait or retry cures it
            assert failed.error_type == "insufficient_quota"


def with_status_ok(stream: bytes) -> bytes:
    """A stream whose every chunk carries MiniMax's `base_resp` of success (code 0)."""
    frames = []
    for block in stream.split(b"\n\n"):
        data = block.removeprefix(b"data: ")
        if not block or data == b"[DONE]":
            continue
        frame = msgspec.json.decode(data)
        frames.append({**frame, "base_resp": {"status_code": 0, "status_msg": ""}})
    return sse(*frames, "[DONE]")


async def test_a_minimax_rate_limit_is_waited_for_and_a_success_code_is_no_error(
    loop_clock: trio.testing.MockClock,
) -> None:
    limited = Reply(chunks=(sse(minimax_error(1002, "rate limit exceeded(RPM)")),))
    fine = Reply(chunks=(with_status_ok(openai_text_stream(["Fine", " then."])),))
    run = await loop_turn([limited, fine])
    assert run.result.outcome is Outcome.COMPLETED
    assert run.result.text == "Fine then."
    assert len(run.server.requests) == 2  # a rate limit: waited for, then asked again


async def test_a_minimax_failure_of_its_own_is_asked_again_as_it_says(
    loop_clock: trio.testing.MockClock,
) -> None:
    # 1000 "unknown error": "Please retry your requests later"
    run = await loop_turn(always(Reply(chunks=(sse(minimax_error(1000, "unknown error")),))))
    failed = run.result.error
    assert isinstance(failed, RescueFailed)
    assert isinstance(failed.stream_error, ServerError)
    assert len(run.server.requests) == 5  # the transport ladder, then the rescue


# --- an `event: error` frame in a Chat Completions stream -----------------------------------------


@pytest.mark.parametrize(
    ("data", "error", "requests"),
    [  # vLLM's shape: a status and its details; asked once
        (
            b'{"code": 400, "details": "Requested sample logprobs of 21, greater than 20"}',
            InvalidRequestError,
            1,
        ),
        (b"Internal server error", ProviderError, 4),  # words alone: of no known type, retried
    ],
    ids=["vllm-details", "words"],
)
async def test_an_error_event_in_a_chat_stream_is_that_error(
    loop_clock: trio.testing.MockClock, data: bytes, error: type[Exception], requests: int
) -> None:
    body = b"event: error\ndata: " + data + b"\n\ndata: [DONE]\n\n"
    run = await loop_turn(always(Reply(chunks=(body,))))
    failed = run.result.error
    if isinstance(failed, RescueFailed):
        failed = failed.stream_error
    assert type(failed) is error
    assert isinstance(failed, ProviderError)
    assert failed.in_stream
    assert failed.provider_message.split(",")[0] in data.decode()
    assert sum(b'"stream":true' in r.body for r in run.server.requests) == requests
