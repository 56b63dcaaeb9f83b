"""The Responses dialect: request building and error typing (its streams:
`test_openai_responses_stream`)."""

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
    TurnRequest,
    UniMessage,
    user,
)
from rillet.providers._openai_responses._dialect import OpenAIResponsesDialect

from ..openai_responses_support import (
    KEY,
    TOOLS,
    body,
    hello,
    provider,
)

# --- build_request ------------------------------------------------------------------------------


def test_streaming_request_is_stateless() -> None:
    request = OpenAIResponsesDialect().build_request(hello(), provider())
    assert request.method == "POST"
    assert request.url == "https://api.openai.com/v1/responses"
    data = request.json()
    assert data["model"] == "gpt-5"
    assert data["stream"] is True
    assert data["store"] is False
    assert data["input"] == [{"role": "user", "content": "hi"}]


def test_non_streaming_request_says_stream_false() -> None:
    assert body(hello(), stream=False)["stream"] is False


def test_encrypted_reasoning_is_asked_for_when_the_turn_reasons() -> None:
    data = body(TurnRequest(messages=[user("hi")], thinking_level="low"))
    assert data["include"] == ["reasoning.encrypted_content"]
    assert data["store"] is False


@pytest.mark.parametrize("level", [None, "none"])
def test_encrypted_reasoning_is_not_asked_for_a_turn_without_reasoning(level: Any) -> None:
    data = body(TurnRequest(messages=[user("hi")], thinking_level=level))
    assert "include" not in data
    assert data["store"] is False


def test_encrypted_reasoning_can_be_forced_on_or_off() -> None:
    always = body(hello(), OpenAIResponsesDialect(encrypted_reasoning=True))
    assert always["include"] == ["reasoning.encrypted_content"]
    never = body(
        TurnRequest(messages=[user("hi")], thinking_level="high"),
        OpenAIResponsesDialect(encrypted_reasoning=False),
    )
    assert "include" not in never


def test_key_is_a_bearer_header_and_never_in_the_repr() -> None:
    request = OpenAIResponsesDialect().build_request(hello(), provider())
    assert request.headers["authorization"] == f"Bearer {KEY}"
    assert KEY not in repr(request)
    assert KEY not in str(request)


def test_no_key_no_authorization_header() -> None:
    request = OpenAIResponsesDialect().build_request(hello(), provider(api_key=None))
    assert "authorization" not in request.headers


def test_system_prompt_is_instructions() -> None:
    data = body(TurnRequest(messages=[user("hi")], system_prompt="Be brief."))
    assert data["instructions"] == "Be brief."
    assert data["input"] == [{"role": "user", "content": "hi"}]


def test_user_media_are_input_parts() -> None:
    wav = InlineDataDone(data=b"RIFF", mime_type="audio/wav")
    pdf = InlineDataDone(data=b"%PDF", mime_type="application/pdf")
    message = user("look", ImageUrlDone(image_url="https://x.test/a.png"), wav, pdf)
    (item,) = body(TurnRequest(messages=[message]))["input"]
    assert item == {
        "role": "user",
        "content": [
            {"type": "input_text", "text": "look"},
            {"type": "input_image", "image_url": "https://x.test/a.png", "detail": "auto"},
            {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}},
            {
                "type": "input_file",
                "filename": "attachment.pdf",
                "file_data": "data:application/pdf;base64,JVBERg==",
            },
        ],
    }


def test_tools_are_responses_functions() -> None:
    data = body(TurnRequest(messages=[user("hi")], tools=TOOLS))
    assert data["tools"] == [
        {
            "type": "function",
            "name": "get_weather",
            "description": "Weather for a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            "strict": False,
        },
        {
            "type": "function",
            "name": "get_time",
            "parameters": {"type": "object", "properties": {}},
            "strict": False,
        },
    ]


@pytest.mark.parametrize(
    ("choice", "wire"),
    [
        ("auto", "auto"),
        ("required", "required"),
        ("none", "none"),
        (["get_time"], {"type": "function", "name": "get_time"}),
        (
            ["get_time", "get_weather"],
            {
                "type": "allowed_tools",
                "mode": "required",
                "tools": [
                    {"type": "function", "name": "get_time"},
                    {"type": "function", "name": "get_weather"},
                ],
            },
        ),
    ],
)
def test_tool_choice(choice: Any, wire: Any) -> None:
    data = body(TurnRequest(messages=[user("hi")], tools=TOOLS, tool_choice=choice))
    assert data["tool_choice"] == wire
    assert len(data["tools"]) == 2


def test_thinking_level_asks_for_a_summary() -> None:
    data = body(TurnRequest(messages=[user("hi")], thinking_level="high"))
    assert data["reasoning"] == {"effort": "high", "summary": "auto"}


@pytest.mark.parametrize("level", [None, "none"])
def test_no_thinking_or_none_sends_no_reasoning(level: Any) -> None:
    assert "reasoning" not in body(TurnRequest(messages=[user("hi")], thinking_level=level))


def test_max_tokens_and_temperature() -> None:
    data = body(TurnRequest(messages=[user("hi")], max_tokens=100, temperature=0.5))
    assert data["max_output_tokens"] == 100
    assert data["temperature"] == 0.5


def test_assistant_turn_replays_reasoning_calls_and_results_as_items() -> None:
    assistant = UniMessage(
        role="assistant",
        content_items=[
            ThinkingDone(
                thinking="**Plan**", fidelity={"channel": "summary", "encrypted_content": "ENC1"}
            ),
            ThinkingDone(thinking="", fidelity={"encrypted_content": "ENC2"}),
            ThinkingDone(thinking="from elsewhere", fidelity={"signature": "S"}),
            TextDone(text="Checking.", fidelity={"phase": "commentary"}),
            ToolCallDone(name="get_weather", arguments={"city": "Oslo"}, tool_call_id="call_1"),
        ],
    )
    results = user(
        ToolResultDone(text="4 °C", tool_call_id="call_1"),
        ToolResultDone(text="map", tool_call_id="call_2", images=["https://x.test/m.png"]),
    )
    data = body(TurnRequest(messages=[user("weather?"), assistant, results]))
    assert data["input"] == [
        {"role": "user", "content": "weather?"},
        {
            "type": "reasoning",
            "summary": [{"type": "summary_text", "text": "**Plan**"}],
            "encrypted_content": "ENC1",
        },
        {"type": "reasoning", "summary": [], "encrypted_content": "ENC2"},
        {"role": "assistant", "content": "Checking.", "phase": "commentary"},
        {
            "type": "function_call",
            "call_id": "call_1",
            "name": "get_weather",
            "arguments": '{"city": "Oslo"}',
        },
        {"type": "function_call_output", "call_id": "call_1", "output": "4 °C"},
        {
            "type": "function_call_output",
            "call_id": "call_2",
            "output": [
                {"type": "input_text", "text": "map"},
                {"type": "input_image", "image_url": "https://x.test/m.png", "detail": "auto"},
            ],
        },
    ]


def test_extra_body_is_merged_last() -> None:
    request = TurnRequest(
        messages=[user("hi")],
        extra_body={"openai-responses": {"store": True, "text": {"verbosity": "low"}}},
    )
    data = body(request)
    assert data["store"] is True
    assert data["text"] == {"verbosity": "low"}


# --- error_from_response ------------------------------------------------------------------------


def openai_error(message: str, type_: str | None, code: str | None = None) -> bytes:
    return json.dumps(
        {"error": {"message": message, "type": type_, "param": None, "code": code}}
    ).encode()


@pytest.mark.parametrize(
    ("status", "payload", "cls"),
    [
        (400, openai_error("Unsupported parameter", "invalid_request_error"), InvalidRequestError),
        (
            401,
            openai_error("Incorrect API key", "invalid_request_error", "invalid_api_key"),
            AuthenticationError,
        ),
        (429, openai_error("Rate limit", "requests", "rate_limit_exceeded"), RateLimitError),
        (500, openai_error("The server had an error", "server_error"), ServerError),
        (503, openai_error("Overloaded", "server_error"), OverloadedError),
        (502, b"Bad Gateway", ServerError),
        (404, openai_error("No such model", "invalid_request_error"), InvalidRequestError),
        (418, b"", ProviderError),
    ],
)
def test_error_from_response_types_the_error(
    status: int, payload: bytes, cls: type[ProviderError]
) -> None:
    error = OpenAIResponsesDialect().error_from_response(status, {}, payload)
    assert type(error) is cls
    assert error.status == status
    assert error.provider == "openai-responses"
    assert error.in_stream is False


def test_error_from_response_reads_retry_after() -> None:
    payload = openai_error("Rate limit", "requests", "rate_limit_exceeded")
    error = OpenAIResponsesDialect().error_from_response(429, {"retry-after": "0.5"}, payload)
    assert error.retry_after == 0.5
    assert error.provider_message == "Rate limit"
