"""The Ollama dialect: request building, wire cases no fixture covers, and error typing."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
import trio
import trio.testing
from rillet import (
    FrameEncodingError,
    ImageUrlDone,
    InvalidRequestError,
    MalformedFrameError,
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
    UnsupportedContentError,
    user,
)
from rillet._core._explain import explain
from rillet._core._failures import http_shape
from rillet._core._policy import FailureClass, Outcome
from rillet.lowlevel import MessageStop, WireDecoder
from rillet.providers import Provider, Secret
from rillet.providers._ollama import OllamaDialect

from ..wire_cases import run, turn_over_loopback


@pytest.fixture
def loop_clock() -> trio.testing.MockClock:
    """Virtual time for whole turns over loopback sockets (jumps only when all is idle)."""
    return trio.testing.MockClock(autojump_threshold=0.02)


BASE = "http://127.0.0.1:11434"
KEY = "ollama-proxy-key-0000secret"
DONE = {"done": True, "done_reason": "stop", "prompt_eval_count": 9, "eval_count": 4}


def provider(**kwargs: Any) -> Provider:
    return Provider(OllamaDialect(), BASE, "qwen3:8b", **kwargs)


def body(request: TurnRequest, **kwargs: Any) -> Any:
    return OllamaDialect().build_request(request, provider(), **kwargs).json()


def line(content: str = "", thinking: str = "", **extra: Any) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if thinking:
        message["thinking"] = thinking
    if "tool_calls" in extra:
        message["tool_calls"] = extra.pop("tool_calls")
    return {"model": "qwen3:8b", "message": message, "done": False, **extra}


def ndjson(*lines: dict[str, Any], newline_at_end: bool = True) -> bytes:
    text = "\n".join(json.dumps(x, ensure_ascii=False) for x in lines)
    return (text + ("\n" if newline_at_end else "")).encode("utf-8")


def decode(data: bytes) -> list[dict[str, Any]]:
    return [json.loads(entry) for entry in run(OllamaDialect(), [data])]


# --- build_request ------------------------------------------------------------------------------


def test_streaming_and_non_streaming_flags() -> None:
    request = OllamaDialect().build_request(TurnRequest(messages=[user("hi")]), provider())
    assert request.url == f"{BASE}/api/chat"
    assert request.json()["stream"] is True
    assert request.json()["model"] == "qwen3:8b"
    assert body(TurnRequest(messages=[user("hi")]), stream=False)["stream"] is False


def test_no_auth_header_without_a_key() -> None:
    request = OllamaDialect().build_request(TurnRequest(messages=[user("hi")]), provider())
    assert not any(k.lower() == "authorization" for k in request.headers)


def test_bearer_header_with_a_key_never_in_url_or_repr() -> None:
    keyed = provider(api_key=Secret(KEY))
    request = OllamaDialect().build_request(TurnRequest(messages=[user("hi")]), keyed)
    assert request.headers["authorization"] == f"Bearer {KEY}"
    assert KEY not in request.url
    assert KEY not in repr(request)
    assert KEY.encode() not in request.body


def test_system_prompt_options_and_images() -> None:
    png = base64.b64encode(b"\x89PNG").decode()
    request = TurnRequest(
        messages=[user("What is this?", ImageUrlDone(image_url=f"data:image/png;base64,{png}"))],
        system_prompt="Be brief.",
        max_tokens=128,
        temperature=0.5,
    )
    got = body(request)
    assert got["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is this?", "images": [png]},
    ]
    assert got["options"] == {"num_predict": 128, "temperature": 0.5}
    assert "options" not in body(TurnRequest(messages=[user("hi")]))


def test_image_url_that_is_not_a_data_url_is_refused() -> None:
    request = TurnRequest(messages=[user(ImageUrlDone(image_url="https://example.com/a.png"))])
    with pytest.raises(UnsupportedContentError, match="data: URL"):
        body(request)


def test_tools_and_tool_choice() -> None:
    schema = {"type": "object", "properties": {"city": {"type": "string"}}}
    tools = [
        ToolSpec(name="get_weather", description="Weather now.", parameters=schema),
        ToolSpec(name="get_time"),
    ]
    got = body(TurnRequest(messages=[user("hi")], tools=tools))
    assert got["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Weather now.",
                "parameters": schema,
            },
        },
        {
            "type": "function",
            "function": {
                "name": "get_time",
                "description": "",
                "parameters": {"type": "object", "properties": {}},
            },
        },
    ]
    assert "tools" not in body(TurnRequest(messages=[user("hi")], tools=tools, tool_choice="none"))
    only = body(TurnRequest(messages=[user("hi")], tools=tools, tool_choice=["get_time"]))
    assert [t["function"]["name"] for t in only["tools"]] == ["get_time"]


@pytest.mark.parametrize(
    ("level", "think"),
    [("none", False), ("low", "low"), ("medium", "medium"), ("high", "high"), ("max", True)],
)
def test_thinking_level_sets_think(level: str, think: object) -> None:
    got = body(TurnRequest(messages=[user("hi")], thinking_level=level))  # type: ignore[arg-type]
    assert got["think"] == think


def test_no_think_field_without_a_level() -> None:
    assert "think" not in body(TurnRequest(messages=[user("hi")]))


def test_assistant_replay_and_tool_results() -> None:
    assistant = UniMessage(
        role="assistant",
        content_items=[
            ThinkingDone(thinking="Two cities."),
            TextDone(text="Checking."),
            ToolCallDone(name="get_weather", arguments={"city": "Oslo"}, tool_call_id="call_a1"),
            ToolCallDone(
                name="get_weather", arguments={"city": "Bergen"}, tool_call_id="get_weather#2"
            ),
        ],
    )
    results = user(
        ToolResultDone(text="-3C", tool_call_id="call_a1"),
        ToolResultDone(text="4C", tool_call_id="get_weather#2"),
        "Thanks.",
    )
    messages = body(TurnRequest(messages=[user("weather?"), assistant, results]))["messages"]
    assert messages[1] == {
        "role": "assistant",
        "content": "Checking.",
        "thinking": "Two cities.",
        "tool_calls": [
            {"id": "call_a1", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}},
            {
                "id": "get_weather#2",
                "function": {"name": "get_weather", "arguments": {"city": "Bergen"}},
            },
        ],
    }
    assert messages[2:] == [
        {"role": "tool", "content": "-3C", "tool_name": "get_weather", "tool_call_id": "call_a1"},
        {
            "role": "tool",
            "content": "4C",
            "tool_name": "get_weather",
            "tool_call_id": "get_weather#2",
        },
        {"role": "user", "content": "Thanks."},
    ]


def test_tool_result_without_its_call_is_named_from_the_id() -> None:
    results = user(ToolResultDone(text="ok", tool_call_id="lookup#3"))
    (message,) = body(TurnRequest(messages=[results]))["messages"]
    assert message["tool_name"] == "lookup"


def test_extra_body_is_merged() -> None:
    request = TurnRequest(
        messages=[user("hi")], extra_body={"ollama": {"keep_alive": "5m", "format": "json"}}
    )
    got = body(request)
    assert got["keep_alive"] == "5m"
    assert got["format"] == "json"


# --- the stream ---------------------------------------------------------------------------------


def test_last_line_without_trailing_newline_is_complete() -> None:
    entries = decode(ndjson(line("Hi"), {**line(), **DONE}, newline_at_end=False))
    assert entries == [
        {"type": "text.delta", "text": "Hi"},
        {"type": "text.done", "text": "Hi"},
        {
            "type": "stop",
            "finish_reason": "stop",
            "usage_metadata": {
                "cached_tokens": None,
                "prompt_tokens": 9,
                "thoughts_tokens": None,
                "response_tokens": 4,
            },
        },
    ]


HI_ENTRIES = [
    {"type": "text.delta", "text": "Hi"},
    {"type": "text.done", "text": "Hi"},
    {
        "type": "stop",
        "finish_reason": "stop",
        "usage_metadata": {
            "cached_tokens": None,
            "prompt_tokens": 9,
            "thoughts_tokens": None,
            "response_tokens": 4,
        },
    },
]


@pytest.mark.parametrize(
    "after",
    [
        b'{"model": "qwen3:8b", "message": {"role": "assistant", "content": " more"}}\n',
        ndjson({**line(), **DONE, "done_reason": "length"}),
        b"not json\n",
        b'{"error": "late"}\n',
        b'{"message": {"content": "\xff"}}\n',  # not UTF-8: a frame error, were it read
        b'{"message": {"content": "\xff',  # the same, unfinished at the end of the body
    ],
    ids=["a-line", "a-second-done", "not-json", "an-error", "not-utf8", "not-utf8-unfinished"],
)
def test_lines_after_done_are_ignored(after: bytes) -> None:
    assert decode(ndjson(line("Hi"), {**line(), **DONE}) + after) == HI_ENTRIES


async def test_f52_lines_after_done_complete_in_one_request(
    loop_clock: trio.testing.MockClock,
) -> None:
    data = ndjson(line("Hi"), {**line(), **DONE}, line(" late"), {**line(), **DONE})
    result, requests = await turn_over_loopback(
        OllamaDialect(), data, content_type="application/x-ndjson"
    )
    assert (requests, result.outcome, result.text) == (1, Outcome.COMPLETED, "Hi")


def test_final_line_cut_mid_json_is_a_truncation() -> None:
    data = ndjson(line("Hi"), {**line(), **DONE}, newline_at_end=False)[:-12]
    assert decode(data) == [
        {"type": "text.delta", "text": "Hi"},
        {"type": "error", "error": "IncompleteStreamError"},
    ]


def test_invalid_utf8_in_a_line_is_an_encoding_error() -> None:
    data = ndjson(line("ok")) + b'{"message": {"content": "\xff\xfe"}, "done": false}\n'
    entries = decode(data)
    assert entries[-1] == {"type": "error", "error": "FrameEncodingError"}


def test_non_json_line_is_malformed_with_provider_and_frame_index() -> None:
    data = ndjson(line("ok")) + b"<html>proxy error</html>\n"
    decoder = WireDecoder(OllamaDialect(), clock=lambda: 0)
    with pytest.raises(MalformedFrameError) as info:
        decoder.feed(data)
    assert info.value.provider == "ollama"
    assert info.value.frame_index == 1


def test_line_of_the_wrong_shape_is_malformed() -> None:
    assert decode(b'["not", "an", "object"]\n') == [
        {"type": "error", "error": "MalformedFrameError"}
    ]


def test_calls_without_id_are_named_after_the_function() -> None:
    call = {"function": {"index": 0, "name": "ping", "arguments": {"host": "a"}}}
    call2 = {"function": {"index": 1, "name": "ping", "arguments": {"host": "b"}}}
    entries = decode(ndjson(line(tool_calls=[call, call2]), {**line(), **DONE}))
    done = [e for e in entries if e["type"] == "tool_call.done"]
    assert [(d["tool_call_id"], d["arguments"]) for d in done] == [
        ("ping", {"host": "a"}),
        ("ping#2", {"host": "b"}),
    ]
    assert entries[-1]["finish_reason"] == "tool_call"


def test_string_arguments_pass_through() -> None:
    call = {"id": "call_x", "function": {"name": "f", "arguments": '{"a": 1}'}}
    entries = decode(ndjson(line(tool_calls=[call]), {**line(), **DONE}))
    assert entries[0]["arguments"] == '{"a": 1}'
    assert entries[1]["arguments"] == {"a": 1}


def test_change_of_kind_starts_a_new_group() -> None:
    entries = decode(
        ndjson(line(thinking="a"), line("b"), line(thinking="c"), line("d"), {**line(), **DONE})
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


def test_other_done_reasons_are_unknown_and_a_missing_one_is_stop() -> None:
    unload = {**line(), **DONE, "done_reason": "unload"}
    assert decode(ndjson(line("x"), unload))[-1]["finish_reason"] == "unknown"
    bare = {k: v for k, v in {**line(), **DONE}.items() if k != "done_reason"}
    assert decode(ndjson(line("x"), bare))[-1]["finish_reason"] == "stop"


def test_error_line_is_a_provider_error_with_its_message() -> None:
    data = ndjson(line("partial"), {"error": "model runner has unexpectedly stopped"})
    decoder = WireDecoder(OllamaDialect(), clock=lambda: 0)
    with pytest.raises(ProviderError) as info:
        decoder.feed(data)
    assert type(info.value) is ProviderError
    assert info.value.in_stream
    assert info.value.provider_message == "model runner has unexpectedly stopped"
    assert decode(data)[0] == {"type": "text.delta", "text": "partial"}


def test_stream_decoder_owes_nothing_at_end_of_input() -> None:
    decoder = OllamaDialect().stream_decoder()
    decoder.feed(json.dumps(line("x")))
    assert decoder.close() == []


# --- non-streaming bodies -----------------------------------------------------------------------


def test_non_streaming_tool_call_body() -> None:
    call = {"function": {"name": "get_time", "arguments": {}}}
    raw = json.dumps({**line(tool_calls=[call]), **DONE}).encode()
    events = OllamaDialect().decode_response(raw)
    assert type(events[-1]) is MessageStop
    assert sum(type(e) is MessageStop for e in events) == 1
    entries = [json.loads(e) for e in run(OllamaDialect(), [raw], stream=False)]
    assert entries[:2] == [
        {
            "type": "tool_call.delta",
            "name": "get_time",
            "arguments": "{}",
            "tool_call_id": "get_time",
        },
        {"type": "tool_call.done", "name": "get_time", "arguments": {}, "tool_call_id": "get_time"},
    ]
    assert entries[-1]["finish_reason"] == "tool_call"


def test_non_streaming_body_that_is_not_utf8_is_an_encoding_error() -> None:
    with pytest.raises(FrameEncodingError):
        OllamaDialect().decode_response(b'{"message": {"content": "\xff"}, "done": true}')
    with pytest.raises(MalformedFrameError):
        OllamaDialect().decode_response(b"not json")


# --- HTTP errors --------------------------------------------------------------------------------


def test_http_errors_are_typed_by_status() -> None:
    dialect = OllamaDialect()
    not_found = dialect.error_from_response(404, {}, b'{"error":"model \\"llama9\\" not found"}')
    assert type(not_found) is InvalidRequestError
    assert not_found.status == 404
    assert not_found.provider_message == 'model "llama9" not found'
    cases: list[tuple[int, type[ProviderError]]] = [
        (400, InvalidRequestError),
        (429, RateLimitError),
        (500, ServerError),
        (502, ServerError),
    ]
    for status, cls in cases:
        error = dialect.error_from_response(status, {}, b'{"error":"failed"}')
        assert type(error) is cls
        assert error.provider_message == "failed"
        assert error.provider == "ollama"


def test_a_model_too_big_for_the_machine_is_refused_not_retried() -> None:
    """Ollama's 500 for a model that does not fit in memory: the same request fails the same
    way every time, so it is permanent, and the person is told to pick a smaller model."""
    body = b'{"error":"model requires more system memory (5.5 GiB) than is available (3.1 GiB)"}'
    error = OllamaDialect().error_from_response(500, {}, body)
    assert (error.status, error.error_type) == (500, "model_too_large")
    said = explain(error, Provider(OllamaDialect(), "http://127.0.0.1:11434", "llama3.2"))
    assert said.startswith("the model does not fit in the server's memory (500): model requires")
    assert said.endswith("— pick a smaller one (--model)")
    assert error.provider_message.startswith("model requires more system memory")
    assert http_shape(500, error) is FailureClass.PERMANENT
    other = OllamaDialect().error_from_response(500, {}, b'{"error":"llama runner crashed"}')
    assert http_shape(500, other) is FailureClass.TRANSPORT
