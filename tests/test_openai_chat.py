"""The Chat Completions dialect: request building, wire cases no fixture covers, error typing."""

from __future__ import annotations

import base64
import json
from typing import Any

import httpx
import pytest
import trio
import trio.testing
from rillet import (
    AuthenticationError,
    ImageUrlDone,
    InlineDataDone,
    InvalidRequestError,
    MalformedFrameError,
    OverloadedError,
    ProviderError,
    RateLimitError,
    ServerError,
    TextDone,
    ThinkingDone,
    ToolCallDone,
    ToolResultDone,
    ToolSpec,
    TurnRequest,
    UniEvent,
    UniMessage,
    WireDecoder,
    user,
)
from rillet._policy import Outcome, Policy
from rillet._ratelimit import RateLimiter
from rillet._turn import run_turn
from rillet.providers import Provider, Secret
from rillet.providers._openai_chat import OpenAIChatDialect, sniff_audio
from rillet.transports.testing import Reply, open_loopback_provider

from .wire_cases import run, turn_over_loopback


@pytest.fixture
def loop_clock() -> trio.testing.MockClock:
    """Virtual time for whole turns over loopback sockets (jumps only when all is idle)."""
    return trio.testing.MockClock(autojump_threshold=0.02)


KEY = "sk-test-0000000000000000000000secretkey"
BASE = "https://api.openai.com/v1"
USAGE = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
USAGE_JSON = {
    "cached_tokens": None,
    "prompt_tokens": 10,
    "thoughts_tokens": None,
    "response_tokens": 5,
}
TOOLS = [
    ToolSpec(
        name="get_weather",
        description="Weather for a city",
        parameters={"type": "object", "properties": {"city": {"type": "string"}}},
    ),
    ToolSpec(name="get_time"),
]


def provider(dialect: OpenAIChatDialect | None = None, **kwargs: Any) -> Provider:
    options: dict[str, Any] = {"api_key": Secret(KEY), **kwargs}
    return Provider(dialect or OpenAIChatDialect(), BASE, "gpt-4o", **options)


def body(request: TurnRequest, dialect: OpenAIChatDialect | None = None, **kwargs: Any) -> Any:
    dialect = dialect or OpenAIChatDialect()
    return dialect.build_request(request, provider(dialect), **kwargs).json()


def hello() -> TurnRequest:
    return TurnRequest(messages=[user("hi")])


def sse(*chunks: dict[str, Any] | str) -> bytes:
    frames = (c if isinstance(c, str) else json.dumps(c, ensure_ascii=False) for c in chunks)
    return "".join(f"data: {f}\n\n" for f in frames).encode("utf-8")


def chunk(
    delta: dict[str, Any] | None = None,
    *,
    finish: str | None = None,
    usage: dict[str, Any] | None = None,
    index: int = 0,
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "model": "gpt-4o",
        "choices": [{"index": index, "delta": delta or {}, "finish_reason": finish}],
    }
    if usage is not None:
        out["usage"] = usage
    return out


def usage_chunk(usage: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"id": "chatcmpl-1", "choices": [], "usage": usage or USAGE}


def decode(data: bytes) -> list[dict[str, Any]]:
    return [json.loads(entry) for entry in run(OpenAIChatDialect(), [data])]


def decode_body(data: dict[str, Any]) -> list[dict[str, Any]]:
    raw = json.dumps(data).encode("utf-8")
    return [json.loads(entry) for entry in run(OpenAIChatDialect(), [raw], stream=False)]


# --- build_request ------------------------------------------------------------------------------


def test_streaming_request_asks_for_usage() -> None:
    request = OpenAIChatDialect().build_request(hello(), provider())
    assert request.method == "POST"
    assert request.url == "https://api.openai.com/v1/chat/completions"
    data = request.json()
    assert data["model"] == "gpt-4o"
    assert data["stream"] is True
    assert data["stream_options"] == {"include_usage": True}


def test_stream_options_can_be_turned_off_for_servers_that_reject_it() -> None:
    data = body(hello(), OpenAIChatDialect(stream_options=False))
    assert data["stream"] is True
    assert "stream_options" not in data


def test_non_streaming_request_says_stream_false() -> None:
    data = body(hello(), stream=False)
    assert data["stream"] is False
    assert "stream_options" not in data


def test_key_is_a_bearer_header_and_never_in_the_repr() -> None:
    request = OpenAIChatDialect().build_request(hello(), provider())
    assert request.headers["authorization"] == f"Bearer {KEY}"
    assert request.headers["content-type"] == "application/json"
    assert KEY not in repr(request)
    assert KEY not in str(request)


def test_no_key_no_authorization_header() -> None:
    request = OpenAIChatDialect().build_request(hello(), provider(api_key=None))
    assert "authorization" not in request.headers


def test_extra_headers_are_sent() -> None:
    dialect = OpenAIChatDialect()
    request = dialect.build_request(hello(), provider(dialect, headers={"x-title": "rillet"}))
    assert request.headers["x-title"] == "rillet"


def test_system_prompt_is_the_first_message_and_user_text_a_string() -> None:
    data = body(TurnRequest(messages=[user("hi")], system_prompt="Be brief."))
    assert data["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
    ]


def test_user_images_are_image_url_parts() -> None:
    png = InlineDataDone(data=b"\x89PNG", mime_type="image/png")
    message = user("what is this?", ImageUrlDone(image_url="https://x.test/a.png"), png)
    data = body(TurnRequest(messages=[message]))
    assert data["messages"] == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "what is this?"},
                {"type": "image_url", "image_url": {"url": "https://x.test/a.png"}},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw=="}},
            ],
        }
    ]


def test_tools_are_functions_with_a_default_schema() -> None:
    data = body(TurnRequest(messages=[user("hi")], tools=TOOLS))
    assert data["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Weather for a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            },
        },
        {
            "type": "function",
            "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}},
        },
    ]
    assert "tool_choice" not in data


@pytest.mark.parametrize("choice", ["auto", "required", "none"])
def test_tool_choice_words_pass_through(choice: Any) -> None:
    data = body(TurnRequest(messages=[user("hi")], tools=TOOLS, tool_choice=choice))
    assert data["tool_choice"] == choice
    assert len(data["tools"]) == 2


def test_tool_choice_one_name_forces_that_function() -> None:
    data = body(TurnRequest(messages=[user("hi")], tools=TOOLS, tool_choice=["get_time"]))
    assert data["tool_choice"] == {"type": "function", "function": {"name": "get_time"}}
    assert len(data["tools"]) == 2


def test_tool_choice_several_names_offers_only_those_and_requires_one() -> None:
    tools = [*TOOLS, ToolSpec(name="search")]
    request = TurnRequest(messages=[user("hi")], tools=tools, tool_choice=["get_time", "search"])
    data = body(request)
    assert data["tool_choice"] == "required"
    assert [t["function"]["name"] for t in data["tools"]] == ["get_time", "search"]


def test_tool_choice_without_tools_is_not_sent() -> None:
    assert "tool_choice" not in body(TurnRequest(messages=[user("hi")], tool_choice="none"))


def test_max_tokens_uses_the_current_field_name_by_default() -> None:
    data = body(TurnRequest(messages=[user("hi")], max_tokens=64, temperature=0.2))
    assert data["max_completion_tokens"] == 64
    assert "max_tokens" not in data
    assert data["temperature"] == 0.2


def test_max_tokens_field_is_configurable() -> None:
    data = body(
        TurnRequest(messages=[user("hi")], max_tokens=64),
        OpenAIChatDialect(max_tokens_field="max_tokens"),
    )
    assert data["max_tokens"] == 64
    assert "max_completion_tokens" not in data


@pytest.mark.parametrize(
    ("level", "effort"),
    [("low", "low"), ("medium", "medium"), ("high", "high"), ("xhigh", "xhigh"), ("max", "xhigh")],
)
def test_thinking_level_is_reasoning_effort(level: Any, effort: str) -> None:
    assert body(TurnRequest(messages=[user("hi")], thinking_level=level))["reasoning_effort"] == (
        effort
    )


@pytest.mark.parametrize("level", [None, "none"])
def test_no_thinking_or_none_sends_no_reasoning_effort(level: Any) -> None:
    assert "reasoning_effort" not in body(TurnRequest(messages=[user("hi")], thinking_level=level))


def test_assistant_tool_calls_and_tool_results_are_replayed() -> None:
    assistant = UniMessage(
        role="assistant",
        content_items=[
            TextDone(text="Checking."),
            ToolCallDone(name="get_weather", arguments={"city": "Zürich"}, tool_call_id="call_1"),
        ],
    )
    results = user(
        ToolResultDone(text="12 °C", tool_call_id="call_1", images=["https://x.test/map.png"]),
        "thanks",
    )
    data = body(TurnRequest(messages=[user("weather?"), assistant, results]))
    assert data["messages"][1:] == [
        {
            "role": "assistant",
            "content": "Checking.",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Zürich"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "12 °C"},
        {
            "role": "user",
            "content": [{"type": "image_url", "image_url": {"url": "https://x.test/map.png"}}],
        },
        {"role": "user", "content": "thanks"},
    ]


def test_assistant_with_only_tool_calls_has_no_content() -> None:
    assistant = UniMessage(
        role="assistant",
        content_items=[ToolCallDone(name="get_time", arguments={}, tool_call_id="c")],
    )
    (message,) = body(TurnRequest(messages=[assistant]))["messages"]
    assert "content" not in message
    assert message["tool_calls"][0]["function"]["arguments"] == "{}"


def test_reasoning_is_replayed_in_the_field_its_fidelity_names() -> None:
    assistant = UniMessage(
        role="assistant",
        content_items=[
            ThinkingDone(thinking="3 × 7 = 21", fidelity={"reasoning_field": "reasoning_content"}),
            TextDone(text="21"),
        ],
    )
    (message,) = body(TurnRequest(messages=[assistant]))["messages"]
    assert message == {"role": "assistant", "content": "21", "reasoning_content": "3 × 7 = 21"}


def test_signed_and_encrypted_reasoning_is_replayed_as_reasoning_details() -> None:
    assistant = UniMessage(
        role="assistant",
        content_items=[
            ThinkingDone(thinking="Let me see.", fidelity={"signature": "SIG=="}),
            ThinkingDone(
                thinking="",
                fidelity={
                    "encrypted_content": "ENC",
                    "format": "anthropic-claude-v1",
                    "reasoning_id": "rs_1",
                },
            ),
            ThinkingDone(thinking="no fidelity, not sent back"),
            TextDone(text="Done."),
        ],
    )
    (message,) = body(TurnRequest(messages=[assistant]))["messages"]
    assert message["reasoning_details"] == [
        {"type": "reasoning.text", "text": "Let me see.", "signature": "SIG==", "index": 0},
        {
            "type": "reasoning.encrypted",
            "data": "ENC",
            "format": "anthropic-claude-v1",
            "id": "rs_1",
            "index": 1,
        },
    ]
    assert "not sent back" not in json.dumps(message)


def test_audio_is_replayed_by_its_id() -> None:
    assistant = UniMessage(
        role="assistant",
        content_items=[
            InlineDataDone(data=b"\0\0", mime_type="audio/pcm", fidelity={"audio_id": "audio_1"})
        ],
    )
    (message,) = body(TurnRequest(messages=[assistant]))["messages"]
    assert message == {"role": "assistant", "audio": {"id": "audio_1"}}


def test_extra_body_is_merged_last() -> None:
    request = TurnRequest(
        messages=[user("hi")],
        extra_body={"openai-chat": {"stream_options": {"include_usage": False}, "seed": 7}},
    )
    data = body(request)
    assert data["stream_options"] == {"include_usage": False}
    assert data["seed"] == 7


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


# --- Mistral's content chunks -----------------------------------------------------------------


def thinking_chunk(*texts: str) -> dict[str, Any]:
    return {"type": "thinking", "thinking": [{"type": "text", "text": t} for t in texts]}


def test_f57_mistral_content_list_gives_thinking_then_text() -> None:
    data = sse(
        chunk({"role": "assistant", "content": [thinking_chunk("Let me ")]}),
        chunk({"content": [thinking_chunk("think.")]}),
        chunk({"content": [{"type": "text", "text": "The answer"}]}),
        chunk({"content": " is 4."}),
        chunk(finish="stop", usage=USAGE),
        "[DONE]",
    )
    fid = {"reasoning_field": "content"}
    assert decode(data) == [
        {"type": "thinking.delta", "thinking": "Let me ", "fidelity": fid},
        {"type": "thinking.delta", "thinking": "think."},
        {"type": "thinking.done", "thinking": "Let me think.", "fidelity": fid},
        {"type": "text.delta", "text": "The answer"},
        {"type": "text.delta", "text": " is 4."},
        {"type": "text.done", "text": "The answer is 4."},
        {"type": "stop", "finish_reason": "stop", "usage_metadata": USAGE_JSON},
    ]


def test_mistral_mixed_chunks_in_one_delta_keep_their_order_and_skip_unknown_types() -> None:
    content = [
        thinking_chunk("a", "b"),
        {"type": "reference", "reference_ids": [1, 2], "text": {"odd": True}},
        {"type": "text", "text": "x"},
        {"type": "text", "text": ""},
        {"type": "text", "text": "y"},
    ]
    data = sse(chunk({"content": content}), chunk(finish="stop", usage=USAGE), "[DONE]")
    assert [e.get("thinking", e.get("text")) for e in decode(data)[:-1]] == [
        "a",
        "b",
        "ab",
        "x",
        "y",
        "xy",
    ]


@pytest.mark.parametrize(
    "content",
    [
        [{"type": "text", "text": 5}],
        [{"type": "thinking", "thinking": 5}],
        [{"type": "thinking", "thinking": [{"type": "text", "text": None}]}],
        [{"type": "thinking", "thinking": ["x"]}],
        5,
    ],
)
def test_a_known_content_chunk_of_the_wrong_shape_is_malformed(content: Any) -> None:
    decoder = WireDecoder(OpenAIChatDialect(), clock=lambda: 0)
    with pytest.raises(MalformedFrameError) as info:
        decoder.feed(sse(chunk({"content": "Hi"}), chunk({"content": content})))
    assert info.value.provider == "openai-chat"
    assert info.value.frame_index == 1


def test_mistral_thinking_goes_back_as_content_chunks() -> None:
    message = UniMessage(
        role="assistant",
        content_items=[
            ThinkingDone(thinking="hmm", fidelity={"reasoning_field": "content"}),
            TextDone(text="4"),
        ],
    )
    sent = body(TurnRequest(messages=[user("2+2?"), message, user("sure?")]))
    assert sent["messages"][1] == {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": [{"type": "text", "text": "hmm"}]},
            {"type": "text", "text": "4"},
        ],
    }


def test_non_json_frame_is_malformed_with_provider_and_position() -> None:
    data = sse(chunk({"content": "Hi"}), "{not json")
    decoder = WireDecoder(OpenAIChatDialect(), clock=lambda: 0)
    with pytest.raises(MalformedFrameError) as info:
        decoder.feed(data)
    assert info.value.provider == "openai-chat"
    assert info.value.frame_index == 1
    assert "{not json" in info.value.frame_preview


def test_a_chunk_of_the_wrong_shape_is_malformed() -> None:
    data = sse({"choices": [{"index": 0, "delta": {"content": 5}}]})
    assert decode(data) == [{"type": "error", "error": "MalformedFrameError"}]


def test_stop_after_a_tool_call_finishes_tool_call() -> None:
    call = {"index": 0, "id": "call_1", "function": {"name": "get_time", "arguments": "{}"}}
    data = sse(chunk({"tool_calls": [call]}), chunk(finish="stop", usage=USAGE), "[DONE]")
    assert decode(data)[-1]["finish_reason"] == "tool_call"


def test_whole_calls_at_one_index_with_new_ids_are_separate_calls() -> None:
    first = {"index": 0, "id": "AAAAAAAAA", "function": {"name": "f", "arguments": '{"a": 1}'}}
    second = {"index": 0, "id": "BBBBBBBBB", "function": {"name": "f", "arguments": '{"a": 2}'}}
    data = sse(
        chunk({"tool_calls": [first]}),
        chunk({"tool_calls": [second]}, finish="tool_calls", usage=USAGE),
        "[DONE]",
    )
    done = [e for e in decode(data) if e["type"] == "tool_call.done"]
    assert done == [
        {"type": "tool_call.done", "name": "f", "arguments": {"a": 1}, "tool_call_id": "AAAAAAAAA"},
        {"type": "tool_call.done", "name": "f", "arguments": {"a": 2}, "tool_call_id": "BBBBBBBBB"},
    ]


@pytest.mark.parametrize("head_index", [{}, {"index": 0}], ids=["no index", "index 0"])
def test_fragments_without_an_index_that_repeat_their_call_id_continue_that_call(
    head_index: dict[str, Any],
) -> None:
    head = {**head_index, "id": "call_1", "function": {"name": "f", "arguments": ""}}
    parts = [{"id": "call_1", "function": {"arguments": a}} for a in ('{"a":', " 1}")]
    data = sse(
        chunk({"tool_calls": [head]}),
        *(chunk({"tool_calls": [part]}) for part in parts),
        chunk(finish="tool_calls", usage=USAGE),
        "[DONE]",
    )
    done = [e for e in decode(data) if e["type"] == "tool_call.done"]
    assert done == [
        {"type": "tool_call.done", "name": "f", "arguments": {"a": 1}, "tool_call_id": "call_1"}
    ]


ARGS = {"city": "Paris", "days": [1, 2], "units": {"temp": "°C"}}


@pytest.mark.parametrize("split_head", [False, True], ids=["whole", "name-first"])
def test_arguments_sent_as_the_json_object_itself_are_those_arguments(split_head: bool) -> None:
    # llama.cpp's server (some releases), TGI and others send the object, not its JSON text
    def call(arguments: Any) -> dict[str, Any]:
        function = {"name": "weather", "arguments": arguments}
        return {"index": 0, "id": "call_1", "type": "function", "function": function}

    if split_head:
        rest = {"index": 0, "function": {"arguments": ARGS}}
        calls = [chunk({"tool_calls": [call("")]}), chunk({"tool_calls": [rest]})]
    else:
        calls = [chunk({"tool_calls": [call(ARGS)]})]
    data = sse(*calls, chunk(finish="tool_calls", usage=USAGE), "[DONE]")
    done = [e for e in decode(data) if e["type"] == "tool_call.done"]
    assert done == [
        {"type": "tool_call.done", "name": "weather", "arguments": ARGS, "tool_call_id": "call_1"}
    ]


def test_a_whole_completion_with_object_arguments_is_read() -> None:
    call = {"id": "0", "type": "function", "function": {"name": "weather", "arguments": ARGS}}
    message = {"role": "assistant", "content": None, "tool_calls": [call]}
    completion = {
        "id": "chatcmpl-1",
        "model": "tgi",
        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}],
    }
    done = [e for e in decode_body(completion) if e["type"] == "tool_call.done"]
    assert done == [
        {"type": "tool_call.done", "name": "weather", "arguments": ARGS, "tool_call_id": "0"}
    ]


def test_arguments_of_another_json_type_are_still_the_wrong_shape() -> None:
    call = {"index": 0, "id": "c", "function": {"name": "f", "arguments": [1, 2]}}
    assert decode(sse(chunk({"tool_calls": [call]}))) == [
        {"type": "error", "error": "MalformedFrameError"}
    ]


def test_calls_without_ids_get_their_function_name() -> None:
    calls = [
        {"function": {"name": "f", "arguments": "{}"}},
        {"function": {"name": "f", "arguments": "{}"}},
    ]
    data = sse(chunk({"tool_calls": calls}, finish="tool_calls", usage=USAGE), "[DONE]")
    ids = [e["tool_call_id"] for e in decode(data) if e["type"] == "tool_call.done"]
    assert ids == ["f", "f#2"]


def test_a_first_tool_fragment_without_name_or_id_breaks_the_protocol() -> None:
    data = sse(chunk({"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}))
    assert decode(data) == [{"type": "error", "error": "StreamProtocolError"}]


def test_content_after_tool_calls_closes_them_first() -> None:
    call = {"index": 0, "id": "c1", "function": {"name": "f", "arguments": "{}"}}
    data = sse(
        chunk({"tool_calls": [call]}),
        chunk({"content": "and then"}),
        chunk(finish="stop", usage=USAGE),
        "[DONE]",
    )
    kinds = [e["type"] for e in decode(data)]
    assert kinds == ["tool_call.delta", "tool_call.done", "text.delta", "text.done", "stop"]


@pytest.mark.parametrize(
    "other",
    [{"content": "and then"}, {"reasoning_content": "hm"}],
    ids=["content", "reasoning"],
)
def test_a_delta_that_goes_on_with_an_open_call_and_starts_another_field(
    other: dict[str, Any],
) -> None:
    # the fragment is the open call's (its index says so), whatever order the fields come in:
    # the call takes it, then closes as the other field starts
    head = {"index": 0, "id": "c1", "function": {"name": "f", "arguments": '{"a":'}}
    data = sse(
        chunk({"tool_calls": [head]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": " 1}"}}], **other}),
        chunk(finish="stop", usage=USAGE),
        "[DONE]",
    )
    entries = decode(data)
    assert [e["type"] for e in entries] == [
        "tool_call.delta",
        "tool_call.delta",
        "tool_call.done",
        "text.delta" if "content" in other else "thinking.delta",
        "text.done" if "content" in other else "thinking.done",
        "stop",
    ]
    assert entries[2]["arguments"] == {"a": 1}


def test_vllm_sending_both_reasoning_fields_gives_one_group_without_fidelity() -> None:
    data = sse(
        chunk({"reasoning_content": "Hm", "reasoning": "Hm"}),
        chunk({"reasoning_content": "m.", "reasoning": "m."}),
        chunk({"content": "Yes."}, finish="stop", usage=USAGE),
        "[DONE]",
    )
    entries = decode(data)
    assert entries[:3] == [
        {"type": "thinking.delta", "thinking": "Hm"},
        {"type": "thinking.delta", "thinking": "m."},
        {"type": "thinking.done", "thinking": "Hmm."},
    ]


def test_reasoning_field_alone_is_remembered() -> None:
    data = sse(chunk({"reasoning": "Hm."}), chunk({"content": "Yes."}, finish="stop", usage=USAGE))
    assert decode(data + sse("[DONE]"))[0] == {
        "type": "thinking.delta",
        "thinking": "Hm.",
        "fidelity": {"reasoning_field": "reasoning"},
    }


def test_openrouter_encrypted_reasoning_becomes_fidelity() -> None:
    detail = {
        "type": "reasoning.encrypted",
        "data": "ENCRYPTED",
        "id": "rs_1",
        "format": "openai-responses-v1",
        "index": 0,
    }
    data = sse(
        chunk({"reasoning_details": [detail]}),
        chunk({"content": "Hi"}, finish="stop", usage=USAGE),
        "[DONE]",
    )
    fidelity = {
        "encrypted_content": "ENCRYPTED",
        "format": "openai-responses-v1",
        "reasoning_id": "rs_1",
    }
    assert decode(data)[:2] == [
        {"type": "thinking.delta", "thinking": "", "fidelity": fidelity},
        {"type": "thinking.done", "thinking": "", "fidelity": fidelity},
    ]


def test_reasoning_details_of_unknown_types_are_skipped_whatever_they_hold() -> None:
    odd = {"type": "reasoning.image", "data": {"png": [1, 2]}, "index": "zero", "text": 5}
    text = {"type": "reasoning.text", "text": "Hmm", "index": 0}
    data = sse(
        chunk({"reasoning_details": [odd, text]}),
        chunk({"content": "Hi"}),
        chunk(finish="stop", usage=USAGE),
        "[DONE]",
    )
    assert [e.get("thinking", e.get("text")) for e in decode(data)[:4]] == [
        "Hmm",
        "Hmm",
        "Hi",
        "Hi",
    ]


@pytest.mark.parametrize(
    "detail",
    [
        {"type": "reasoning.text", "text": 5},
        {"type": "reasoning.text", "text": "x", "signature": {"s": 1}},
        {"type": "reasoning.encrypted", "data": ["x"]},
        {"type": "reasoning.summary", "summary": "x", "index": "0"},
    ],
)
def test_a_known_reasoning_detail_of_the_wrong_shape_is_malformed(detail: dict[str, Any]) -> None:
    decoder = WireDecoder(OpenAIChatDialect(), clock=lambda: 0)
    with pytest.raises(MalformedFrameError) as info:
        decoder.feed(sse(chunk({"content": "Hi"}), chunk({"reasoning_details": [detail]})))
    assert info.value.frame_index == 1


def test_reasoning_details_of_another_index_start_another_group() -> None:
    data = sse(
        chunk({"reasoning_details": [{"type": "reasoning.text", "text": "One", "index": 0}]}),
        chunk({"reasoning_details": [{"type": "reasoning.summary", "summary": "Two", "index": 1}]}),
        chunk({"content": "Hi"}, finish="stop", usage=USAGE),
        "[DONE]",
    )
    done = [e["thinking"] for e in decode(data) if e["type"] == "thinking.done"]
    assert done == ["One", "Two"]


def test_only_choice_zero_is_read() -> None:
    data = sse(
        chunk({"content": "zero"}),
        chunk({"content": "one"}, index=1),
        chunk(finish="stop", usage=USAGE),
        "[DONE]",
    )
    assert [e.get("text") for e in decode(data) if e["type"] == "text.done"] == ["zero"]


def test_non_streaming_reasoning_and_text_each_in_one_piece() -> None:
    completion = {
        "id": "chatcmpl-1",
        "model": "deepseek-reasoner",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "21", "reasoning_content": "3×7"},
                "finish_reason": "stop",
            }
        ],
        "usage": USAGE,
    }
    fidelity = {"reasoning_field": "reasoning_content"}
    assert decode_body(completion)[:4] == [
        {"type": "thinking.delta", "thinking": "3×7", "fidelity": fidelity},
        {"type": "thinking.done", "thinking": "3×7", "fidelity": fidelity},
        {"type": "text.delta", "text": "21"},
        {"type": "text.done", "text": "21"},
    ]


def test_non_streaming_audio_mime_type_is_sniffed() -> None:
    wav = b"RIFF\x24\0\0\0WAVEfmt " + b"\0" * 8
    completion = {
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": None,
                    "audio": {"id": "audio_1", "data": base64.b64encode(wav).decode()},
                },
                "finish_reason": "stop",
            }
        ],
        "usage": USAGE,
    }
    done = next(e for e in decode_body(completion) if e["type"] == "inline_data.done")
    assert done["mime_type"] == "audio/wav"
    assert base64.b64decode(done["data"]) == wav


def test_non_streaming_error_body_is_the_typed_error() -> None:
    error = {"error": {"message": "bad", "type": "invalid_request_error"}}
    assert decode_body(error) == [{"type": "error", "error": "InvalidRequestError"}]


# --- error_from_response ------------------------------------------------------------------------


def openai_error(message: str, type_: str | None, code: str | None = None) -> bytes:
    return json.dumps(
        {"error": {"message": message, "type": type_, "param": None, "code": code}}
    ).encode()


@pytest.mark.parametrize(
    ("status", "payload", "cls", "error_type"),
    [
        (
            400,
            openai_error("context too long", "invalid_request_error", "context_length_exceeded"),
            InvalidRequestError,
            "invalid_request_error",
        ),
        (
            401,
            openai_error("Incorrect API key provided", "invalid_request_error", "invalid_api_key"),
            AuthenticationError,
            "invalid_request_error",
        ),
        (
            429,
            openai_error("Rate limit reached", "requests", "rate_limit_exceeded"),
            RateLimitError,
            "rate_limit_exceeded",
        ),
        (
            429,
            openai_error(
                "You exceeded your current quota", "insufficient_quota", "insufficient_quota"
            ),
            ProviderError,  # no wait cures it: permanent, not a rate limit
            "insufficient_quota",
        ),
        (
            500,
            openai_error("The server had an error", "server_error"),
            ServerError,
            "server_error",
        ),
        (
            503,
            openai_error("The engine is currently overloaded", "server_error"),
            OverloadedError,
            "server_error",
        ),
        (503, b"<html>Service Unavailable</html>", OverloadedError, None),
        (418, b"", ProviderError, None),
    ],
)
def test_error_from_response_types_the_error(
    status: int, payload: bytes, cls: type[ProviderError], error_type: str | None
) -> None:
    error = OpenAIChatDialect().error_from_response(status, {}, payload)
    assert type(error) is cls
    assert error.status == status
    assert error.error_type == error_type
    assert error.provider == "openai-chat"
    assert error.in_stream is False


def test_error_from_response_keeps_the_message_and_reads_retry_headers() -> None:
    payload = openai_error("Rate limit reached", "requests", "rate_limit_exceeded")
    error = OpenAIChatDialect().error_from_response(429, {"Retry-After": "2"}, payload)
    assert error.provider_message == "Rate limit reached"
    assert error.retry_after == 2.0
    error = OpenAIChatDialect().error_from_response(
        429, {"retry-after-ms": "1500", "retry-after": "9"}, payload
    )
    assert error.retry_after == 1.5
    error = OpenAIChatDialect().error_from_response(
        429, {"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}, payload
    )
    assert error.retry_after is None


def test_error_message_never_contains_the_key() -> None:
    payload = openai_error("bad key", "invalid_request_error", "invalid_api_key")
    error = OpenAIChatDialect().error_from_response(401, {"authorization": KEY}, payload)
    assert KEY not in str(error)


@pytest.mark.parametrize(
    ("completion", "reasoning", "total", "answer"),
    [
        (14, 25, 374, 14),  # xAI: reasoning beside the completion (335 + 14 + 25 = 374)
        (39, 25, 374, 14),  # OpenAI: reasoning inside the completion (335 + 39 = 374)
        (10, 25, None, 0),  # no total to tell by: never negative
    ],
)
def test_reasoning_tokens_are_taken_out_of_the_completion_only_when_it_holds_them(
    completion: int, reasoning: int, total: int | None, answer: int
) -> None:
    usage: dict[str, Any] = {
        "prompt_tokens": 335,
        "completion_tokens": completion,
        "completion_tokens_details": {"reasoning_tokens": reasoning},
    }
    if total is not None:
        usage["total_tokens"] = total
    data = sse(chunk({"content": "Hi"}), chunk(finish="stop"), usage_chunk(usage), "[DONE]")
    got = decode(data)[-1]["usage_metadata"]
    assert got["response_tokens"] == answer
    assert got["thoughts_tokens"] == reasoning


def test_a_wire_decoder_takes_the_same_frames_a_turn_does() -> None:
    """Used directly, the wire decoder accepts frames as large as a turn does (32 MiB), not a
    smaller cap of its own."""
    from rillet.frames import DEFAULT_MAX_FRAME

    text = "x" * (1024 * 1024)
    chunk = '{"id":"c","model":"m","choices":[{"index":0,"delta":{"content":"' + text + '"}}]}'
    decoder = WireDecoder(OpenAIChatDialect(), clock=lambda: 0)
    events = decoder.feed(f"data: {chunk}\n\n".encode())
    assert DEFAULT_MAX_FRAME == 32 * 1024 * 1024
    assert "".join(e.content_items[0].text for e in events if e.content_items) == text
