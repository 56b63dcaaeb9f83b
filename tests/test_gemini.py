"""The Gemini dialect: request building, wire cases no fixture covers, and error typing."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from rillet import (
    Accumulator,
    AuthenticationError,
    FrameEncodingError,
    ImageUrlDone,
    InlineDataDone,
    InvalidRequestError,
    MalformedFrameError,
    MessageStop,
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
    WireDecoder,
    user,
)
from rillet.frames import SSEEvent
from rillet.providers import Provider, Secret
from rillet.providers._gemini import GeminiDialect

from .wire_cases import FIXTURES, run

KEY = "AIzaSyTESTKEY0000000000000000000secret"
BASE = "https://generativelanguage.googleapis.com"
SIG = "CiQBmFzaWduYXR1cmUtb25l"
SIG2 = "CiQBdHdvLXNpZ25hdHVyZQ=="
USAGE = {"promptTokenCount": 10, "candidatesTokenCount": 5, "totalTokenCount": 15}


def provider(**kwargs: Any) -> Provider:
    options: dict[str, Any] = {"api_key": Secret(KEY), **kwargs}
    return Provider(GeminiDialect(), BASE, "gemini-2.5-flash", **options)


def body(request: TurnRequest, **kwargs: Any) -> Any:
    return GeminiDialect().build_request(request, provider(), **kwargs).json()


def sse(*chunks: dict[str, Any], crlf: bool = False) -> bytes:
    text = "".join(f"data: {json.dumps(c, ensure_ascii=False)}\n\n" for c in chunks)
    return (text.replace("\n", "\r\n") if crlf else text).encode("utf-8")


def chunk(
    *parts: dict[str, Any], finish: str | None = None, usage: dict[str, Any] | None = None
) -> dict[str, Any]:
    candidate: dict[str, Any] = {"content": {"parts": list(parts), "role": "model"}, "index": 0}
    if finish is not None:
        candidate["finishReason"] = finish
    return {"candidates": [candidate], "usageMetadata": usage or USAGE}


def decode(data: bytes) -> list[dict[str, Any]]:
    return [json.loads(entry) for entry in run(GeminiDialect(), [data])]


def stop(entries: list[dict[str, Any]]) -> dict[str, Any]:
    assert entries[-1]["type"] == "stop", entries[-1]
    return entries[-1]


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


# --- the stream ---------------------------------------------------------------------------------


def test_safety_finish_keeps_text_and_is_unknown() -> None:
    entries = decode(sse(chunk({"text": "Once upon"}), chunk({"text": " a"}, finish="SAFETY")))
    assert entries[:-1] == [
        {"type": "text.delta", "text": "Once upon"},
        {"type": "text.delta", "text": " a"},
        {"type": "text.done", "text": "Once upon a"},
    ]
    assert stop(entries)["finish_reason"] == "unknown"


def test_blocked_candidate_without_content_is_an_empty_reply() -> None:
    blocked: dict[str, Any] = {
        "candidates": [{"finishReason": "PROHIBITED_CONTENT", "index": 0}],
        "usageMetadata": {"promptTokenCount": 7, "totalTokenCount": 7},
    }
    assert decode(sse(blocked)) == [{"type": "error", "error": "EmptyResponseError"}]


def test_blocked_prompt_is_an_empty_reply_not_a_cut_off() -> None:
    blocked = {"promptFeedback": {"blockReason": "SAFETY"}, "usageMetadata": USAGE}
    assert decode(sse(blocked)) == [{"type": "error", "error": "EmptyResponseError"}]


def test_executable_code_parts_are_skipped() -> None:
    code = {"executableCode": {"language": "PYTHON", "code": "print(1)"}}
    result = {"codeExecutionResult": {"outcome": "OUTCOME_OK", "output": "1\n"}}
    entries = decode(sse(chunk({"text": "Ran"}, code, result, {"text": " it."}, finish="STOP")))
    assert entries[:-1] == [
        {"type": "text.delta", "text": "Ran"},
        {"type": "text.delta", "text": " it."},
        {"type": "text.done", "text": "Ran it."},
    ]
    assert stop(entries)["finish_reason"] == "stop"


def test_two_function_calls_in_one_chunk_get_distinct_ids() -> None:
    entries = decode(
        sse(
            chunk(
                {"functionCall": {"name": "ping", "args": {"host": "a"}}},
                {"functionCall": {"name": "ping", "args": {"host": "b"}}},
                finish="STOP",
            )
        )
    )
    done = [e for e in entries if e["type"] == "tool_call.done"]
    assert [(d["tool_call_id"], d["arguments"]) for d in done] == [
        ("ping", {"host": "a"}),
        ("ping#2", {"host": "b"}),
    ]
    assert stop(entries)["finish_reason"] == "tool_call"


def test_function_call_id_is_used_when_present() -> None:
    entries = decode(sse(chunk({"functionCall": {"name": "now", "id": "fc-1"}}, finish="STOP")))
    assert entries[0] == {
        "type": "tool_call.delta",
        "name": "now",
        "arguments": "{}",
        "tool_call_id": "fc-1",
    }
    assert entries[1]["arguments"] == {}


def test_change_of_kind_starts_a_new_group() -> None:
    entries = decode(
        sse(
            chunk({"text": "a", "thought": True}, {"text": "b"}),
            chunk({"text": "c", "thought": True}, {"text": "d"}, finish="STOP"),
        )
    )
    assert [e["type"] for e in entries[:-1]] == [
        "thinking.delta",
        "thinking.done",
        "text.delta",
        "text.done",
        "thinking.delta",
        "thinking.done",
        "text.delta",
        "text.done",
    ]


def test_a_second_signature_starts_a_new_group() -> None:
    entries = decode(
        sse(
            chunk({"text": "one", "thoughtSignature": SIG}),
            chunk({"text": "two", "thoughtSignature": SIG2}, finish="STOP"),
        )
    )
    done = [e for e in entries if e["type"] == "text.done"]
    assert done == [
        {"type": "text.done", "text": "one", "fidelity": {"signature": SIG}},
        {"type": "text.done", "text": "two", "fidelity": {"signature": SIG2}},
    ]


def test_empty_part_without_signature_does_not_split_a_group() -> None:
    entries = decode(
        sse(chunk({"text": "a"}), chunk({"text": ""}), chunk({"text": "b"}, finish="STOP"))
    )
    assert [e for e in entries if e["type"] == "text.done"] == [{"type": "text.done", "text": "ab"}]


def test_each_image_is_its_own_item_and_thought_images_are_inline_thinking() -> None:
    one = base64.b64encode(b"one").decode()
    two = base64.b64encode(b"two").decode()
    entries = decode(
        sse(
            chunk(
                {"inlineData": {"mimeType": "image/png", "data": one}, "thought": True},
                {"inlineData": {"mimeType": "image/png", "data": one}},
                {"inlineData": {"mimeType": "image/jpeg", "data": two}},
                finish="STOP",
            )
        )
    )
    assert [(e["type"], e["data"], e["mime_type"]) for e in entries if "done" in e["type"]] == [
        ("inline_thinking.done", one, "image/png"),
        ("inline_data.done", one, "image/png"),
        ("inline_data.done", two, "image/jpeg"),
    ]


def test_usage_subtracts_cached_tokens_and_keeps_missing_counts_null() -> None:
    usage = {"promptTokenCount": 100, "cachedContentTokenCount": 60, "candidatesTokenCount": 3}
    entries = decode(sse(chunk({"text": "ok"}, finish="STOP", usage=usage)))
    assert stop(entries)["usage_metadata"] == {
        "cached_tokens": 60,
        "prompt_tokens": 40,
        "thoughts_tokens": None,
        "response_tokens": 3,
    }


def test_stream_without_a_finish_reason_is_incomplete_even_with_crlf() -> None:
    data = sse(chunk({"text": "cut"}), crlf=True)
    assert decode(data)[-1] == {"type": "error", "error": "IncompleteStreamError"}
    assert GeminiDialect().stream_decoder().close() == []


def test_finish_reason_makes_end_of_input_a_stop() -> None:
    decoder = GeminiDialect().stream_decoder()
    decoder.feed(SSEEvent(json.dumps(chunk({"text": "x"}, finish="MAX_TOKENS"))))
    assert decoder.close() == [MessageStop()]


@pytest.mark.parametrize(
    ("status", "error"),
    [
        ("RESOURCE_EXHAUSTED", "RateLimitError"),
        ("INTERNAL", "ServerError"),
        ("UNAVAILABLE", "OverloadedError"),
    ],
)
def test_error_chunk_after_text_is_typed(status: str, error: str) -> None:
    failure = {"error": {"code": 500, "message": "boom", "status": status}}
    entries = decode(sse(chunk({"text": "partial"}), failure))
    assert entries == [
        {"type": "text.delta", "text": "partial"},
        {"type": "error", "error": error},
    ]


def test_error_chunk_with_code_503_only_is_overloaded() -> None:
    failure = {"error": {"code": 503, "message": "The model is overloaded."}}
    assert decode(sse(failure)) == [{"type": "error", "error": "OverloadedError"}]


def test_non_json_frame_is_malformed_with_provider_and_frame_index() -> None:
    data = sse(chunk({"text": "ok"})) + b"data: {not json\n\n"
    decoder = WireDecoder(GeminiDialect(), clock=lambda: 0)
    with pytest.raises(MalformedFrameError) as info:
        decoder.feed(data)
    assert info.value.provider == "gemini"
    assert info.value.frame_index == 1
    assert "{not json" in info.value.frame_preview


def test_frame_of_the_wrong_shape_is_malformed() -> None:
    assert decode(b"data: [1, 2]\n\n") == [{"type": "error", "error": "MalformedFrameError"}]
    bad_image = chunk({"inlineData": {"mimeType": "image/png", "data": "!!"}})
    assert decode(sse(bad_image)) == [{"type": "error", "error": "MalformedFrameError"}]


# --- non-streaming bodies -----------------------------------------------------------------------


def test_non_streaming_body_ends_in_message_delta_and_stop() -> None:
    body_bytes = json.dumps(chunk({"text": "All done."}, finish="STOP")).encode()
    events = GeminiDialect().decode_response(body_bytes)
    assert type(events[-1]) is MessageStop
    assert type(events[-2]).__name__ == "MessageDelta"
    entries = [json.loads(e) for e in run(GeminiDialect(), [body_bytes], stream=False)]
    assert entries[:-1] == [
        {"type": "text.delta", "text": "All done."},
        {"type": "text.done", "text": "All done."},
    ]


def test_non_streaming_body_that_is_not_utf8_is_an_encoding_error() -> None:
    with pytest.raises(FrameEncodingError):
        GeminiDialect().decode_response(
            b'{"candidates": [{"content": {"parts": [{"text": "\xff"}]}}]}'
        )
    with pytest.raises(MalformedFrameError):
        GeminiDialect().decode_response(b"<html>502</html>")


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


# --- usage is merged field by field -----------------------------------------------------------


def test_a_last_chunk_without_candidates_count_keeps_the_earlier_count() -> None:
    data = sse(
        chunk({"text": "Hi"}, usage={"promptTokenCount": 10, "candidatesTokenCount": 5}),
        chunk(
            {"text": "!"}, finish="STOP", usage={"promptTokenCount": 10, "thoughtsTokenCount": 3}
        ),
    )
    assert stop(decode(data))["usage_metadata"] == {
        "cached_tokens": None,
        "prompt_tokens": 10,
        "thoughts_tokens": 3,
        "response_tokens": 5,
    }


def test_usage_after_the_finish_reason_is_merged_too() -> None:
    data = sse(
        chunk({"text": "Hi"}, finish="STOP", usage={"promptTokenCount": 10}),
        {"candidates": [], "usageMetadata": {"candidatesTokenCount": 7}},
    )
    assert stop(decode(data))["usage_metadata"]["response_tokens"] == 7
    assert stop(decode(data))["usage_metadata"]["prompt_tokens"] == 10


# --- streamed function-call arguments (Gemini 3, Vertex AI) -------------------------------------


def call_part(**call: Any) -> dict[str, Any]:
    return {"functionCall": call}


def partial(path: str, will_continue: bool = False, **value: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"jsonPath": path, **value}
    if will_continue:
        out["willContinue"] = True
    return out


def streamed_weather() -> bytes:
    return sse(
        chunk({"text": "Checking."}),
        chunk(call_part(name="set_light", willContinue=True) | {"thoughtSignature": SIG}),
        chunk(
            call_part(
                partialArgs=[partial("$.location", True, stringValue="Bos")], willContinue=True
            )
        ),
        chunk(
            call_part(partialArgs=[partial("$.location", stringValue="ton, MA")], willContinue=True)
        ),
        chunk(
            call_part(
                partialArgs=[
                    partial("$.brightness", numberValue=50),
                    partial("$.on", boolValue=True),
                    partial("$.scene", nullValue="NULL_VALUE"),
                    partial("$.stops[1].name", stringValue="b"),
                    partial("$.stops[0]['odd key']", stringValue="a"),
                ],
                willContinue=True,
            )
        ),
        chunk(call_part()),
        chunk(finish="STOP"),
    )


def test_streamed_function_call_arguments_become_one_whole_tool_call() -> None:
    entries = decode(streamed_weather())
    arguments = {
        "location": "Boston, MA",
        "brightness": 50,
        "on": True,
        "scene": None,
        "stops": [{"odd key": "a"}, {"name": "b"}],
    }
    assert entries[2:] == [
        {
            "type": "tool_call.delta",
            "name": "set_light",
            "arguments": json.dumps(arguments, ensure_ascii=False),
            "tool_call_id": "set_light",
            "fidelity": {"signature": SIG},
        },
        {
            "type": "tool_call.done",
            "name": "set_light",
            "arguments": arguments,
            "tool_call_id": "set_light",
            "fidelity": {"signature": SIG},
        },
        {
            "type": "stop",
            "finish_reason": "tool_call",
            "usage_metadata": {
                "cached_tokens": None,
                "prompt_tokens": 10,
                "thoughts_tokens": None,
                "response_tokens": 5,
            },
        },
    ]


def test_a_streamed_call_is_complete_at_the_next_call_or_the_finish_reason() -> None:
    data = sse(
        chunk(call_part(name="f", id="c1", willContinue=True)),
        chunk(call_part(partialArgs=[partial("$.a", numberValue=1)], willContinue=True)),
        chunk(call_part(name="g", args={"b": 2})),
        chunk(
            call_part(name="f", willContinue=True, partialArgs=[partial("$.x", stringValue="y")])
        ),
        chunk(finish="STOP"),
    )
    dones = [e for e in decode(data) if e["type"] == "tool_call.done"]
    assert [(d["name"], d["tool_call_id"], d["arguments"]) for d in dones] == [
        ("f", "c1", {"a": 1}),
        ("g", "g", {"b": 2}),
        ("f", "f", {"x": "y"}),
    ]


def test_a_streamed_call_cut_off_before_its_end_is_incomplete() -> None:
    data = sse(chunk(call_part(name="f", willContinue=True)))
    assert decode(data)[-1] == {"type": "error", "error": "IncompleteStreamError"}


@pytest.mark.parametrize(
    "part",
    [
        call_part(args={"a": 1}),  # no name, no call streaming
        call_part(name="f", partialArgs=[partial("location", stringValue="x")]),
        call_part(name="f", partialArgs=[partial("$.a[x]", stringValue="x")]),
        call_part(name="f", partialArgs=[partial("$.a", stringValue=5)]),
        call_part(name="f", partialArgs=[{"stringValue": "x"}]),
        call_part(
            name="f", partialArgs=[partial("$.a", numberValue=1), partial("$.a.b", numberValue=2)]
        ),
        call_part(name="f", partialArgs=[partial("$[0]", numberValue=1)]),
        call_part(name="f", partialArgs=[partial("$.a[99999999]", numberValue=1)]),
    ],
)
def test_a_function_call_of_the_wrong_shape_is_malformed(part: dict[str, Any]) -> None:
    decoder = WireDecoder(GeminiDialect(), clock=lambda: 0)
    with pytest.raises(MalformedFrameError) as info:
        decoder.feed(sse(chunk({"text": "Hi"}), chunk(part)))
    assert info.value.provider == "gemini"
    assert info.value.frame_index == 1
