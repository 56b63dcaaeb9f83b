"""The Chat Completions dialect: request building and error typing (its streams:
`test_openai_chat_stream`, `test_openai_chat_chunks`)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from rillet import (
    AuthenticationError,
    ImageUrlDone,
    InlineDataDone,
    InvalidRequestError,
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
    UniMessage,
    user,
)
from rillet.lowlevel import WireDecoder
from rillet.providers._openai_chat._dialect import OpenAIChatDialect

from ..openai_chat_support import (
    KEY,
    TOOLS,
    body,
    chunk,
    decode,
    hello,
    provider,
    sse,
    usage_chunk,
)

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


def test_user_audio_is_input_audio_and_other_media_a_file() -> None:
    wav = InlineDataDone(data=b"RIFF", mime_type="audio/wav")
    pdf = InlineDataDone(data=b"%PDF", mime_type="application/pdf")
    request = OpenAIChatDialect().build_request(
        TurnRequest(messages=[user("listen", wav, pdf)]), provider()
    )
    assert request.body == (
        b'{"model":"gpt-4o","messages":[{"role":"user","content":['
        b'{"type":"text","text":"listen"},'
        b'{"type":"input_audio","input_audio":{"data":"UklGRg==","format":"wav"}},'
        b'{"type":"file","file":{"filename":"attachment.pdf",'
        b'"file_data":"data:application/pdf;base64,JVBERg=="}}]}],'
        b'"stream":true,"stream_options":{"include_usage":true}}'
    )


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
