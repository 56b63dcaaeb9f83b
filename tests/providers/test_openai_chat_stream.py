"""The Chat Completions stream: wire cases no fixture covers, and anything after `[DONE]`."""

from __future__ import annotations

import base64
from typing import Any

import httpx
import pytest
import trio
import trio.testing
from rillet import RateLimitError, UniEvent
from rillet._core._policy import Outcome, Policy
from rillet._turn._api import run_turn
from rillet._turn._ratelimit import RateLimiter
from rillet.lowlevel import WireDecoder
from rillet.providers import Provider, Secret
from rillet.providers._openai_chat._dialect import OpenAIChatDialect, sniff_audio
from rillet.transports.testing import Reply, open_loopback_provider

from ..openai_chat_support import (
    KEY,
    USAGE,
    USAGE_JSON,
    chunk,
    decode,
    hello,
    sse,
    usage_chunk,
)
from ..wire_cases import turn_over_loopback

# --- wire cases no fixture covers ---------------------------------------------------------------


def test_audio_delta_is_an_inline_data_lane_then_its_transcript() -> None:
    pcm1, pcm2 = b"\x01\x00\x02\x00", b"\x03\x00"
    data = sse(
        chunk({"role": "assistant", "content": None, "audio": {"id": "audio_1", "transcript": ""}}),
        chunk({"audio": {"transcript": "Hel"}}),
        chunk({"audio": {"data": base64.b64encode(pcm1).decode()}}),
        chunk({"audio": {"transcript": "lo"}}),
        chunk({"audio": {"data": base64.b64encode(pcm2).decode()}}),
        chunk(finish="stop"),
        usage_chunk(),
        "[DONE]",
    )
    b64 = base64.b64encode
    assert decode(data) == [
        {"type": "inline_data.delta", "data": "", "mime_type": "audio/pcm"}
        | {"fidelity": {"audio_id": "audio_1"}},
        {"type": "inline_data.delta", "data": b64(pcm1).decode(), "mime_type": "audio/pcm"},
        {"type": "inline_data.delta", "data": b64(pcm2).decode(), "mime_type": "audio/pcm"},
        {
            "type": "inline_data.done",
            "data": b64(pcm1 + pcm2).decode(),
            "mime_type": "audio/pcm",
            "fidelity": {"audio_id": "audio_1"},
        },
        {"type": "text.delta", "text": "Hel"},
        {"type": "text.delta", "text": "lo"},
        {"type": "text.done", "text": "Hello"},
        {
            "type": "stop",
            "finish_reason": "stop",
            "usage_metadata": {
                "cached_tokens": None,
                "prompt_tokens": 10,
                "thoughts_tokens": None,
                "response_tokens": 5,
            },
        },
    ]


def test_audio_data_that_is_not_base64_is_a_malformed_frame() -> None:
    data = sse(chunk({"audio": {"data": "not base64!"}}))
    assert decode(data)[-1] == {"type": "error", "error": "MalformedFrameError"}


def test_sniff_audio_recognises_headers_and_falls_back_to_pcm() -> None:
    assert sniff_audio(b"RIFF\0\0\0\0WAVEfmt ") == "audio/wav"
    assert sniff_audio(b"ID3\x04") == "audio/mpeg"
    assert sniff_audio(b"\xff\xfb\x90") == "audio/mpeg"
    assert sniff_audio(b"fLaC") == "audio/flac"
    assert sniff_audio(b"OggS") == "audio/ogg"
    assert sniff_audio(b"\x01\x00\x02\x00") == "audio/pcm"


def test_vllm_error_object_ends_the_stream_with_the_typed_error() -> None:
    data = sse(
        chunk({"content": "Hi"}),
        {
            "object": "error",
            "message": "max_tokens too large",
            "type": "BadRequestError",
            "code": 400,
        },
    )
    assert decode(data) == [
        {"type": "text.delta", "text": "Hi"},
        {"type": "error", "error": "InvalidRequestError"},
    ]


def test_openrouter_error_chunk_reports_the_error_not_a_finish() -> None:
    error_chunk = chunk({"content": ""}, finish="error")
    error_chunk["error"] = {"code": 502, "message": "Upstream provider went away"}
    data = sse(chunk({"content": "Partial"}), error_chunk)
    assert decode(data) == [
        {"type": "text.delta", "text": "Partial"},
        {"type": "error", "error": "ServerError"},
    ]


def test_in_stream_error_carries_the_provider_facts() -> None:
    data = sse(
        {"error": {"message": "Slow down", "type": "requests", "code": "rate_limit_exceeded"}}
    )
    decoder = WireDecoder(OpenAIChatDialect(), clock=lambda: 0)
    with pytest.raises(RateLimitError) as info:
        decoder.feed(data)
    assert info.value.in_stream is True
    assert info.value.provider == "openai-chat"
    assert info.value.provider_message == "Slow down"


def test_finish_reason_error_without_an_error_object_is_a_provider_error() -> None:
    data = sse(chunk({"content": "x"}), chunk(finish="error", usage=USAGE))
    assert decode(data)[-1] == {"type": "error", "error": "ProviderError"}


def test_usage_on_the_finish_chunk_is_read() -> None:
    usage = {
        "prompt_tokens": 30,
        "completion_tokens": 12,
        "prompt_tokens_details": {"cached_tokens": 20},
        "completion_tokens_details": {"reasoning_tokens": 2},
    }
    data = sse(chunk({"content": "Hi"}), chunk(finish="stop", usage=usage), "[DONE]")
    assert decode(data)[-1] == {
        "type": "stop",
        "finish_reason": "stop",
        "usage_metadata": {
            "cached_tokens": 20,
            "prompt_tokens": 10,
            "thoughts_tokens": 2,
            "response_tokens": 10,
        },
    }


def test_deepseek_cache_hits_count_as_cached_without_prompt_details() -> None:
    usage = {"prompt_tokens": 50, "completion_tokens": 5, "prompt_cache_hit_tokens": 40}
    data = sse(chunk({"content": "Hi"}), chunk(finish="stop", usage=usage), "[DONE]")
    assert decode(data)[-1]["usage_metadata"] == {
        "cached_tokens": 40,
        "prompt_tokens": 10,
        "thoughts_tokens": None,
        "response_tokens": 5,
    }


NULL_USAGE = {
    "cached_tokens": None,
    "prompt_tokens": None,
    "thoughts_tokens": None,
    "response_tokens": None,
}


def test_done_without_usage_is_a_stop_with_null_usage() -> None:
    data = sse(chunk({"content": "Hi"}), chunk(finish="stop"), "[DONE]")
    assert decode(data)[-2:] == [
        {"type": "text.done", "text": "Hi"},
        {"type": "stop", "finish_reason": "stop", "usage_metadata": NULL_USAGE},
    ]


def test_done_without_a_finish_reason_finishes_unknown() -> None:
    data = sse(chunk({"content": "Hi"}), chunk(usage=USAGE), "[DONE]")
    assert decode(data)[-2:] == [
        {"type": "text.done", "text": "Hi"},
        {"type": "stop", "finish_reason": "unknown", "usage_metadata": USAGE_JSON},
    ]


def test_a_clean_end_after_the_finish_reason_and_the_usage_is_whole_without_done() -> None:
    # as a server that never sends `[DONE]` ends (Cerebras): the same bytes would come again
    data = sse(chunk({"content": "Hi"}), chunk(finish="stop", usage=USAGE))
    events = decode(data)
    assert events[-1]["type"] == "stop"
    assert events[-1]["usage_metadata"] == USAGE_JSON
    usage_after = sse(chunk({"content": "Hi"}), chunk(finish="length"), chunk(usage=USAGE))
    assert decode(usage_after)[-1]["finish_reason"] == "length"


@pytest.mark.parametrize(
    "last",
    [chunk(finish="stop"), chunk(usage=USAGE), chunk({"content": " there"})],
    ids=["finish only", "usage only", "content"],
)
def test_eof_before_done_without_both_the_finish_and_the_usage_is_incomplete(
    last: dict[str, Any],
) -> None:
    data = sse(chunk({"content": "Hi"}), last)
    assert decode(data)[-1] == {"type": "error", "error": "IncompleteStreamError"}


def test_groq_usage_is_read_from_x_groq() -> None:
    groq = {"id": "req_01", "usage": {**USAGE, "prompt_tokens_details": {"cached_tokens": 4}}}
    last = {**chunk(finish="stop"), "x_groq": groq}
    first = {**chunk({"role": "assistant", "content": ""}), "x_groq": {"id": "req_01"}}
    data = sse(first, chunk({"content": "Hi"}), last, "[DONE]")
    assert decode(data)[-1]["usage_metadata"] == {
        "cached_tokens": 4,
        "prompt_tokens": 6,
        "thoughts_tokens": None,
        "response_tokens": 5,
    }


def test_top_level_usage_wins_over_x_groq() -> None:
    last = {**chunk(finish="stop", usage=USAGE), "x_groq": {"usage": {"prompt_tokens": 99}}}
    assert decode(sse(chunk({"content": "Hi"}), last, "[DONE]"))[-1]["usage_metadata"] == (
        USAGE_JSON
    )


async def test_f51_done_without_usage_or_finish_reason_completes_in_one_request(
    loop_clock: trio.testing.MockClock,
) -> None:
    for data in (
        sse(chunk({"content": "Hi"}), chunk(finish="stop"), "[DONE]"),  # no usage chunk
        sse(chunk({"content": "Hi"}), "[DONE]"),  # no finish reason either
    ):
        result, requests = await turn_over_loopback(OpenAIChatDialect(), data)
        assert requests == 1
        assert result.outcome is Outcome.COMPLETED
        assert result.text == "Hi"
    groq = {**chunk(finish="stop"), "x_groq": {"usage": USAGE}}
    result, requests = await turn_over_loopback(
        OpenAIChatDialect(), sse(chunk({"content": "Hi"}), groq, "[DONE]")
    )
    assert (requests, result.outcome) == (1, Outcome.COMPLETED)
    assert result.message.usage_metadata is not None
    assert result.message.usage_metadata.response_tokens == 5


# --- anything after `[DONE]` ----------------------------------------------------------------


@pytest.mark.parametrize(
    "after",
    [
        ["[DONE]"],
        [chunk({"content": " more"})],
        [chunk({"content": " more"}), chunk(finish="length", usage=USAGE), "[DONE]"],
        ["not json at all", "{"],
        [{"error": {"message": "late", "type": "server_error"}}],
    ],
    ids=["second-done", "a-chunk", "a-whole-reply", "not-json", "an-error"],
)
def test_anything_after_done_is_ignored(after: list[Any]) -> None:
    data = sse(chunk({"content": "Hi"}), chunk(finish="stop", usage=USAGE), "[DONE]", *after)
    assert decode(data) == [
        {"type": "text.delta", "text": "Hi"},
        {"type": "text.done", "text": "Hi"},
        {"type": "stop", "finish_reason": "stop", "usage_metadata": USAGE_JSON},
    ]


def test_a_frame_over_the_cap_after_done_in_the_same_read_is_not_read() -> None:
    # the framer defers its error past the read's events, to its close: the reply was over
    data = sse(chunk({"content": "Hi"}), chunk(finish="stop", usage=USAGE), "[DONE]")
    decoder = WireDecoder(OpenAIChatDialect(), max_frame=len(data), clock=lambda: 0)
    events: list[UniEvent] = []
    decoder.feed(data + b"data: " + b"x" * len(data), events)
    decoder.close(events)
    assert [e.event_type for e in events] == ["delta", "delta", "stop"]


async def test_f52_a_second_done_and_chunks_after_done_complete_in_one_request(
    loop_clock: trio.testing.MockClock,
) -> None:
    data = sse(
        chunk({"content": "Hi"}),
        chunk(finish="stop", usage=USAGE),
        "[DONE]",
        chunk({"content": " late"}),
        "[DONE]",
    )
    result, requests = await turn_over_loopback(OpenAIChatDialect(), data)
    assert (requests, result.outcome, result.text) == (1, Outcome.COMPLETED, "Hi")


async def test_f52_a_provider_that_keeps_the_body_open_after_done_is_not_waited_for(
    loop_clock: trio.testing.MockClock,
) -> None:
    # the body never ends after `[DONE]`: reading stops at the reply's end, no deadline is spent
    data = sse(chunk({"content": "Hi"}), chunk(finish="stop", usage=USAGE), "[DONE]")
    reply = Reply(chunks=(data,), stall_after=1)
    with trio.fail_after(60):
        async with open_loopback_provider([reply]) as server:
            provider = Provider(OpenAIChatDialect(), f"{server.url}/v1", "m", api_key=Secret(KEY))
            async with httpx.AsyncClient() as client:
                result = await run_turn(
                    hello(), provider, client=client, policy=Policy(), limiter=RateLimiter()
                )
            assert len(server.requests) == 1
    assert (result.outcome, result.text) == (Outcome.COMPLETED, "Hi")
    assert result.total_time < 1.0


def test_bytes_after_the_stop_are_not_even_framed() -> None:
    decoder = WireDecoder(OpenAIChatDialect(), max_frame=1024, clock=lambda: 0)
    events = decoder.feed(sse(chunk({"content": "Hi"}), chunk(finish="stop", usage=USAGE)))
    events += decoder.feed(b"data: [DONE]\n\n")
    assert events[-1].event_type == "stop"
    assert decoder.feed(b"data: " + b"x" * 4096) == []  # past the frame cap: never looked at
    assert decoder.close() == []


def test_f53_unknown_fields_at_every_level_are_ignored() -> None:
    plain = sse(
        chunk(
            {"content": "Hi", "tool_calls": [{"index": 0, "id": "c", "function": {"name": "f"}}]}
        ),
        chunk(finish="tool_calls", usage=USAGE),
        "[DONE]",
    )
    odd = {"nested": {"deep": [1, {"x": None}]}, "n": 5}
    call = {"index": 0, "id": "c", "type": "function", "zz": odd, "function": {"name": "f", "q": 1}}
    first = chunk({"content": "Hi", "tool_calls": [call], "new_field": odd})
    first |= {"obfuscation": "X9w9", "brand_new": odd}
    first["choices"][0] |= {"logprobs": None, "extra": odd}
    last = chunk(finish="tool_calls", usage={**USAGE, "cost": 0.1, "cost_details": odd})
    assert decode(sse(first, last, "[DONE]")) == decode(plain)
