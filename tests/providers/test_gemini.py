"""The Gemini dialect: request building and error typing (its streams: `test_gemini_stream`)."""

from __future__ import annotations

import base64
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
from rillet.lowlevel import Accumulator, WireDecoder
from rillet.providers import Provider
from rillet.providers._gemini._dialect import GeminiDialect

from ..gemini_support import (
    BASE,
    KEY,
    SIG,
    SIG2,
    body,
    chunk,
    provider,
    sse,
)
from ..wire_cases import FIXTURES

# --- build_request ------------------------------------------------------------------------------


def test_streaming_request_url_and_key_header() -> None:
    request = GeminiDialect().build_request(TurnRequest(messages=[user("hi")]), provider())
    assert request.method == "POST"
    assert request.url == f"{BASE}/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse"
    assert request.headers["x-goog-api-key"] == KEY
    assert request.headers["content-type"] == "application/json"


def test_non_streaming_request_uses_generate_content() -> None:
    request = GeminiDialect().build_request(
        TurnRequest(messages=[user("hi")]), provider(), stream=False
    )
    assert request.url == f"{BASE}/v1beta/models/gemini-2.5-flash:generateContent"
    assert "stream" not in request.json()


def test_key_never_in_url_body_or_repr() -> None:
    request = GeminiDialect().build_request(TurnRequest(messages=[user("hi")]), provider())
    assert KEY not in request.url
    assert KEY.encode() not in request.body
    assert KEY not in repr(request)
    assert KEY not in repr(provider())


def test_no_key_header_without_a_key() -> None:
    bare = Provider(GeminiDialect(), BASE, "gemini-2.5-flash")
    request = GeminiDialect().build_request(TurnRequest(messages=[user("hi")]), bare)
    assert "x-goog-api-key" not in request.headers


def test_model_prefix_is_not_doubled() -> None:
    bare = Provider(GeminiDialect(), BASE, "models/gemini-2.5-pro")
    request = GeminiDialect().build_request(TurnRequest(messages=[user("hi")]), bare)
    assert request.url == f"{BASE}/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse"


def test_contents_roles_system_and_generation_config() -> None:
    request = TurnRequest(
        messages=[
            user("Hello"),
            UniMessage(role="assistant", content_items=[TextDone(text="Hi!")]),
            user("Again"),
        ],
        system_prompt="Be brief.",
        max_tokens=256,
        temperature=0.2,
    )
    got = body(request)
    assert got["contents"] == [
        {"role": "user", "parts": [{"text": "Hello"}]},
        {"role": "model", "parts": [{"text": "Hi!"}]},
        {"role": "user", "parts": [{"text": "Again"}]},
    ]
    assert got["systemInstruction"] == {"parts": [{"text": "Be brief."}]}
    assert got["generationConfig"] == {"maxOutputTokens": 256, "temperature": 0.2}


def test_user_images_as_inline_data_and_file_data() -> None:
    png = base64.b64encode(b"\x89PNG").decode()
    request = TurnRequest(
        messages=[
            user(
                ImageUrlDone(image_url=f"data:image/png;base64,{png}"),
                ImageUrlDone(image_url="https://example.com/cat.jpg"),
            )
        ]
    )
    assert body(request)["contents"][0]["parts"] == [
        {"inlineData": {"mimeType": "image/png", "data": png}},
        {"fileData": {"fileUri": "https://example.com/cat.jpg", "mimeType": "image/jpeg"}},
    ]


def test_tools_and_tool_choice() -> None:
    schema = {"type": "object", "properties": {"city": {"type": "string"}}}
    tools = [ToolSpec(name="get_weather", description="Weather now.", parameters=schema)]
    tools.append(ToolSpec(name="now"))
    got = body(TurnRequest(messages=[user("hi")], tools=tools, tool_choice="auto"))
    assert got["tools"] == [
        {
            "functionDeclarations": [
                {
                    "name": "get_weather",
                    "description": "Weather now.",
                    "parametersJsonSchema": schema,
                },
                {"name": "now"},
            ]
        }
    ]
    assert got["toolConfig"] == {"functionCallingConfig": {"mode": "AUTO"}}
    modes = {
        "required": {"mode": "ANY"},
        "none": {"mode": "NONE"},
    }
    for choice, config in modes.items():
        got = body(TurnRequest(messages=[user("hi")], tools=tools, tool_choice=choice))  # type: ignore[arg-type]
        assert got["toolConfig"] == {"functionCallingConfig": config}
    got = body(TurnRequest(messages=[user("hi")], tools=tools, tool_choice=["get_weather"]))
    assert got["toolConfig"] == {
        "functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["get_weather"]}
    }
    assert "toolConfig" not in body(TurnRequest(messages=[user("hi")], tools=tools))


def test_thinking_level_sets_thinking_config() -> None:
    got = body(TurnRequest(messages=[user("hi")], thinking_level="high"))
    assert got["generationConfig"]["thinkingConfig"] == {
        "includeThoughts": True,
        "thinkingBudget": 16384,
    }
    got = body(TurnRequest(messages=[user("hi")], thinking_level="none"))
    assert got["generationConfig"]["thinkingConfig"] == {"thinkingBudget": 0}
    assert "generationConfig" not in body(TurnRequest(messages=[user("hi")]))


def test_assistant_replay_keeps_thought_parts_and_signatures() -> None:
    assistant = UniMessage(
        role="assistant",
        content_items=[
            ThinkingDone(thinking="Plan.", fidelity={"signature": SIG}),
            TextDone(text="Calling.", fidelity={"signature": SIG2}),
            ToolCallDone(
                name="get_weather",
                arguments={"city": "Paris"},
                tool_call_id="get_weather",
                fidelity={"signature": SIG},
            ),
            ToolCallDone(
                name="get_weather", arguments={"city": "Lyon"}, tool_call_id="get_weather#2"
            ),
            TextDone(text="", fidelity={"signature": SIG2}),
            TextDone(text=""),
        ],
    )
    parts = body(TurnRequest(messages=[user("hi"), assistant]))["contents"][1]["parts"]
    assert parts == [
        {"text": "Plan.", "thought": True, "thoughtSignature": SIG},
        {"text": "Calling.", "thoughtSignature": SIG2},
        {
            "functionCall": {"name": "get_weather", "args": {"city": "Paris"}},
            "thoughtSignature": SIG,
        },
        {"functionCall": {"name": "get_weather", "args": {"city": "Lyon"}}},
        {"text": "", "thoughtSignature": SIG2},
    ]


def test_replayed_inline_image_goes_back_as_inline_data() -> None:
    assistant = UniMessage(
        role="assistant",
        content_items=[InlineDataDone(data=b"\x89PNG", mime_type="image/png")],
    )
    parts = body(TurnRequest(messages=[user("draw"), assistant]))["contents"][1]["parts"]
    assert parts == [{"inlineData": {"mimeType": "image/png", "data": "iVBORw=="}}]


def test_tool_results_strip_the_call_suffix_and_send_no_made_up_id() -> None:
    assistant = UniMessage(
        role="assistant",
        content_items=[
            ToolCallDone(
                name="get_weather", arguments={"city": "Paris"}, tool_call_id="get_weather"
            ),
            ToolCallDone(
                name="get_weather", arguments={"city": "Lyon"}, tool_call_id="get_weather#2"
            ),
        ],
    )
    results = user(
        ToolResultDone(text="18C", tool_call_id="get_weather"),
        ToolResultDone(text="21C", tool_call_id="get_weather#2"),
    )
    got = body(TurnRequest(messages=[user("weather?"), assistant, results]))
    assert got["contents"][2] == {
        "role": "user",
        "parts": [
            {"functionResponse": {"name": "get_weather", "response": {"output": "18C"}}},
            {"functionResponse": {"name": "get_weather", "response": {"output": "21C"}}},
        ],
    }
    assert (
        b"#2"
        not in GeminiDialect()
        .build_request(TurnRequest(messages=[user("weather?"), assistant, results]), provider())
        .body
    )


def test_provider_call_ids_are_kept_on_call_and_response() -> None:
    assistant = UniMessage(
        role="assistant",
        content_items=[
            ToolCallDone(name="get_time", arguments={}, tool_call_id="fc-8d1e"),
        ],
    )
    results = user(ToolResultDone(text="noon", tool_call_id="fc-8d1e"))
    contents = body(TurnRequest(messages=[user("time?"), assistant, results]))["contents"]
    assert contents[1]["parts"] == [
        {"functionCall": {"name": "get_time", "args": {}, "id": "fc-8d1e"}}
    ]
    assert contents[2]["parts"] == [
        {"functionResponse": {"name": "get_time", "response": {"output": "noon"}, "id": "fc-8d1e"}}
    ]


def test_tool_result_without_its_call_is_named_from_the_id() -> None:
    results = user(ToolResultDone(text="ok", tool_call_id="lookup#3"))
    parts = body(TurnRequest(messages=[results]))["contents"][0]["parts"]
    assert parts == [{"functionResponse": {"name": "lookup", "response": {"output": "ok"}}}]


def test_tool_result_images_follow_the_response() -> None:
    png = base64.b64encode(b"img").decode()
    results = user(
        ToolResultDone(text="see", images=[f"data:image/png;base64,{png}"], tool_call_id="shot")
    )
    parts = body(TurnRequest(messages=[results]))["contents"][0]["parts"]
    assert parts[1] == {"inlineData": {"mimeType": "image/png", "data": png}}


def test_extra_body_is_merged() -> None:
    request = TurnRequest(
        messages=[user("hi")],
        max_tokens=10,
        extra_body={"gemini": {"safetySettings": [{"category": "X"}]}, "ollama": {"x": 1}},
    )
    got = body(request)
    assert got["safetySettings"] == [{"category": "X"}]
    assert "x" not in got


def test_streamed_reply_round_trips_into_the_next_request() -> None:
    data = (FIXTURES / "gemini" / "same_function_twice.sse").read_bytes()
    decoder = WireDecoder(GeminiDialect(), clock=lambda: 0)
    events = decoder.feed(data)
    events += decoder.close()
    acc = Accumulator()
    acc.feed_many(events)
    reply = acc.message()
    results = user(
        *[
            ToolResultDone(text="ok", tool_call_id=item.tool_call_id)
            for item in reply.content_items
            if isinstance(item, ToolCallDone)
        ]
    )
    contents = body(TurnRequest(messages=[user("go"), reply, results]))["contents"]
    names = [p["functionResponse"]["name"] for p in contents[2]["parts"]]
    assert names == ["get_weather", "get_weather", "get_time", "get_weather"]
    calls = [p for p in contents[1]["parts"] if "functionCall" in p]
    assert all("id" not in p["functionCall"] for p in calls)
    assert calls[0]["thoughtSignature"].startswith("CiQBB2NX")


# --- HTTP errors --------------------------------------------------------------------------------


def error_body(code: int, status: str, **extra: Any) -> bytes:
    return json.dumps(
        {"error": {"code": code, "message": "nope", "status": status, **extra}}
    ).encode()


def test_http_errors_are_typed_by_status_word() -> None:
    dialect = GeminiDialect()
    cases: list[tuple[int, bytes, type[ProviderError]]] = [
        (400, error_body(400, "INVALID_ARGUMENT"), InvalidRequestError),
        (403, error_body(403, "PERMISSION_DENIED"), AuthenticationError),
        (429, error_body(429, "RESOURCE_EXHAUSTED"), RateLimitError),
        (500, error_body(500, "INTERNAL"), ServerError),
        (503, error_body(503, "UNAVAILABLE"), OverloadedError),
        (502, b"<html>Bad Gateway</html>", ServerError),
    ]
    for status, raw, cls in cases:
        error = dialect.error_from_response(status, {}, raw)
        assert type(error) is cls, (status, error)
        assert error.status == status
        assert error.provider == "gemini"
        assert not error.in_stream
    assert dialect.error_from_response(400, {}, error_body(400, "INVALID_ARGUMENT")).error_type == (
        "INVALID_ARGUMENT"
    )


def test_rate_limit_carries_the_retry_delay() -> None:
    retry = {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "37s"}
    raw = error_body(429, "RESOURCE_EXHAUSTED", details=[{"@type": "x.QuotaFailure"}, retry])
    assert GeminiDialect().error_from_response(429, {}, raw).retry_after == 37.0
    header = GeminiDialect().error_from_response(429, {"Retry-After": "5"}, raw)
    assert header.retry_after == 5.0
    assert (
        GeminiDialect()
        .error_from_response(429, {}, error_body(429, "RESOURCE_EXHAUSTED"))
        .retry_after
        is None
    )


RETRY_INFO = {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "37s"}


def test_a_rate_limit_body_wrapped_in_an_array_carries_the_retry_delay() -> None:
    raw = b"[" + error_body(429, "RESOURCE_EXHAUSTED", details=[RETRY_INFO]) + b"]"
    error = GeminiDialect().error_from_response(429, {}, raw)
    assert isinstance(error, RateLimitError)
    assert error.retry_after == 37.0
    assert error.error_type == "RESOURCE_EXHAUSTED"
    assert error.provider_message


def test_an_in_stream_rate_limit_carries_the_retry_delay() -> None:
    error = {"code": 429, "message": "quota", "status": "RESOURCE_EXHAUSTED"}
    data = sse(chunk({"text": "Hi"}), {"error": error | {"details": [RETRY_INFO]}})
    decoder = WireDecoder(GeminiDialect(), clock=lambda: 0)
    with pytest.raises(RateLimitError) as info:
        decoder.feed(data)
    assert info.value.retry_after == 37.0
    assert info.value.in_stream
    plain = WireDecoder(GeminiDialect(), clock=lambda: 0)
    with pytest.raises(RateLimitError) as without:
        plain.feed(sse({"error": error}))
    assert without.value.retry_after is None
