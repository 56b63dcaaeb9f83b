"""The Responses dialect: request building, wire cases no fixture covers, error typing."""

from __future__ import annotations

import json
from typing import Any

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
    UniMessage,
    WireDecoder,
    user,
)
from rillet._failures import error_shape
from rillet._policy import Outcome, Shape
from rillet.providers import Provider, Secret
from rillet.providers._openai_responses import OpenAIResponsesDialect

from .wire_cases import run, turn_over_loopback


@pytest.fixture
def loop_clock() -> trio.testing.MockClock:
    """Virtual time for whole turns over loopback sockets (jumps only when all is idle)."""
    return trio.testing.MockClock(autojump_threshold=0.02)


KEY = "sk-test-1111111111111111111111secretkey"
BASE = "https://api.openai.com/v1"
USAGE = {
    "input_tokens": 20,
    "input_tokens_details": {"cached_tokens": 5},
    "output_tokens": 30,
    "output_tokens_details": {"reasoning_tokens": 12},
    "total_tokens": 50,
}
USAGE_METADATA = {
    "cached_tokens": 5,
    "prompt_tokens": 15,
    "thoughts_tokens": 12,
    "response_tokens": 18,
}
TOOLS = [
    ToolSpec(
        name="get_weather",
        description="Weather for a city",
        parameters={"type": "object", "properties": {"city": {"type": "string"}}},
    ),
    ToolSpec(name="get_time"),
]


def provider(dialect: OpenAIResponsesDialect | None = None, **kwargs: Any) -> Provider:
    options: dict[str, Any] = {"api_key": Secret(KEY), **kwargs}
    return Provider(dialect or OpenAIResponsesDialect(), BASE, "gpt-5", **options)


def body(request: TurnRequest, dialect: OpenAIResponsesDialect | None = None, **kwargs: Any) -> Any:
    dialect = dialect or OpenAIResponsesDialect()
    return dialect.build_request(request, provider(dialect), **kwargs).json()


def hello() -> TurnRequest:
    return TurnRequest(messages=[user("hi")])


def sse(*events: dict[str, Any] | tuple[str, str]) -> bytes:
    """Events as the API frames them: `event: <type>` then the data (a tuple gives both raw)."""
    frames = []
    for event in events:
        if isinstance(event, tuple):
            name, data = event
        else:
            name, data = event["type"], json.dumps(event, ensure_ascii=False)
        frames.append(f"event: {name}\ndata: {data}\n\n")
    return "".join(frames).encode("utf-8")


def added(index: int, item: dict[str, Any]) -> dict[str, Any]:
    return {"type": "response.output_item.added", "output_index": index, "item": item}


def done(index: int, item: dict[str, Any]) -> dict[str, Any]:
    return {"type": "response.output_item.done", "output_index": index, "item": item}


def text_delta(index: int, delta: str) -> dict[str, Any]:
    return {
        "type": "response.output_text.delta",
        "item_id": "msg_1",
        "output_index": index,
        "content_index": 0,
        "delta": delta,
    }


def summary_delta(index: int, delta: str, part: int = 0) -> dict[str, Any]:
    return {
        "type": "response.reasoning_summary_text.delta",
        "item_id": "rs_1",
        "output_index": index,
        "summary_index": part,
        "delta": delta,
    }


def message(text: str = "", **extra: Any) -> dict[str, Any]:
    content = [{"type": "output_text", "annotations": [], "text": text}] if text else []
    return {"id": "msg_1", "type": "message", "role": "assistant", "content": content, **extra}


def response(status: str = "completed", output: list[Any] | None = None, **extra: Any) -> Any:
    return {
        "id": "resp_1",
        "object": "response",
        "model": "gpt-5",
        "status": status,
        "output": output or [],
        "usage": USAGE,
        **extra,
    }


def completed(output: list[Any] | None = None) -> dict[str, Any]:
    return {"type": "response.completed", "response": response("completed", output)}


def decode(data: bytes) -> list[dict[str, Any]]:
    return [json.loads(entry) for entry in run(OpenAIResponsesDialect(), [data])]


def decode_body(data: dict[str, Any]) -> list[dict[str, Any]]:
    raw = json.dumps(data).encode("utf-8")
    return [json.loads(entry) for entry in run(OpenAIResponsesDialect(), [raw], stream=False)]


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


# --- wire cases no fixture covers ---------------------------------------------------------------


def test_reasoning_with_encrypted_content_only_is_a_fidelity_only_group() -> None:
    reasoning = {"id": "rs_1", "type": "reasoning", "summary": [], "encrypted_content": "OLD"}
    data = sse(
        added(0, reasoning),
        done(0, reasoning | {"encrypted_content": "FINAL"}),
        added(1, message()),
        text_delta(1, "Yes."),
        done(1, message("Yes.")),
        completed(),
    )
    assert decode(data) == [
        {"type": "thinking.delta", "thinking": "", "fidelity": {"encrypted_content": "FINAL"}},
        {"type": "thinking.done", "thinking": "", "fidelity": {"encrypted_content": "FINAL"}},
        {"type": "text.delta", "text": "Yes."},
        {"type": "text.done", "text": "Yes."},
        {"type": "stop", "finish_reason": "stop", "usage_metadata": USAGE_METADATA},
    ]


def test_summary_parts_form_one_group_joined_as_they_come() -> None:
    reasoning = {"id": "rs_1", "type": "reasoning", "summary": []}
    final = reasoning | {
        "summary": [{"type": "summary_text", "text": "A"}, {"type": "summary_text", "text": "B"}]
    }
    data = sse(
        added(0, reasoning),
        summary_delta(0, "A"),
        summary_delta(0, "B", part=1),
        done(0, final),
        added(1, message()),
        text_delta(1, "ok"),
        done(1, message("ok")),
        completed(),
    )
    entries = decode(data)
    # nothing that is not on the wire is inserted between the parts (MMSP does the same)
    assert entries[:4] == [
        {"type": "thinking.delta", "thinking": "A"},
        {"type": "thinking.delta", "thinking": "B"},
        {"type": "thinking.delta", "thinking": "", "fidelity": {"channel": "summary"}},
        {"type": "thinking.done", "thinking": "AB", "fidelity": {"channel": "summary"}},
    ]


def test_summary_parts_of_a_whole_reasoning_item_are_joined_as_they_are() -> None:
    parts = [{"type": "summary_text", "text": "A."}, {"type": "summary_text", "text": "B."}]
    body = response(output=[{"id": "rs_1", "type": "reasoning", "summary": parts}, message("ok")])
    assert decode_body(body)[:2] == [
        {"type": "thinking.delta", "thinking": "A.B."},
        {"type": "thinking.delta", "thinking": "", "fidelity": {"channel": "summary"}},
    ]


def test_raw_reasoning_text_is_thinking() -> None:
    reasoning = {"id": "rs_1", "type": "reasoning", "summary": []}
    data = sse(
        added(0, reasoning),
        {"type": "response.reasoning_text.delta", "output_index": 0, "delta": "think"},
        {"type": "response.reasoning_text.done", "output_index": 0, "text": "think"},
        done(0, reasoning | {"content": [{"type": "reasoning_text", "text": "think"}]}),
        added(1, message()),
        text_delta(1, "ok"),
        done(1, message("ok")),
        completed(),
    )
    assert decode(data)[:2] == [
        {"type": "thinking.delta", "thinking": "think"},
        {"type": "thinking.done", "thinking": "think"},
    ]


def test_message_phase_rides_first_as_fidelity() -> None:
    data = sse(
        added(0, message(phase="final_answer")),
        text_delta(0, "Hi"),
        done(0, message("Hi", phase="final_answer")),
        completed(),
    )
    fidelity = {"phase": "final_answer"}
    assert decode(data)[:3] == [
        {"type": "text.delta", "text": "", "fidelity": fidelity},
        {"type": "text.delta", "text": "Hi"},
        {"type": "text.done", "text": "Hi", "fidelity": fidelity},
    ]


def test_items_without_deltas_are_whole_at_their_done() -> None:
    call = {
        "id": "fc_1",
        "type": "function_call",
        "call_id": "call_1",
        "name": "get_time",
        "arguments": "",
    }
    data = sse(
        added(0, message()),
        done(0, message("Whole text")),
        added(1, call),
        done(1, call | {"arguments": '{"zone": "UTC"}'}),
        completed(),
    )
    assert decode(data) == [
        {"type": "text.delta", "text": "Whole text"},
        {"type": "text.done", "text": "Whole text"},
        {"type": "tool_call.delta", "name": "get_time", "arguments": "", "tool_call_id": "call_1"},
        {"type": "tool_call.delta", "name": "", "arguments": '{"zone": "UTC"}', "tool_call_id": ""},
        {
            "type": "tool_call.done",
            "name": "get_time",
            "arguments": {"zone": "UTC"},
            "tool_call_id": "call_1",
        },
        {"type": "stop", "finish_reason": "tool_call", "usage_metadata": USAGE_METADATA},
    ]


def test_documented_events_we_do_not_stream_are_skipped() -> None:
    data = sse(
        {"type": "response.queued", "response": response("queued")},
        {"type": "response.in_progress", "response": response("in_progress")},
        added(0, {"id": "ws_1", "type": "web_search_call", "status": "in_progress"}),
        {"type": "response.web_search_call.searching", "output_index": 0, "item_id": "ws_1"},
        done(0, {"id": "ws_1", "type": "web_search_call", "status": "completed"}),
        added(1, message()),
        {"type": "response.refusal.delta", "output_index": 1, "delta": "no"},
        text_delta(1, "Found it."),
        {"type": "response.output_text.annotation.added", "output_index": 1, "annotation": {}},
        done(1, message("Found it.")),
        completed(),
    )
    assert decode(data) == [
        {"type": "text.delta", "text": "Found it."},
        {"type": "text.done", "text": "Found it."},
        {"type": "stop", "finish_reason": "stop", "usage_metadata": USAGE_METADATA},
    ]


OK_ENTRIES = [
    {"type": "text.delta", "text": "Hi"},
    {"type": "text.done", "text": "Hi"},
    {"type": "stop", "finish_reason": "stop", "usage_metadata": USAGE_METADATA},
]


def hi(*extra: dict[str, Any] | tuple[str, str], after: tuple[Any, ...] = ()) -> bytes:
    """A reply saying "Hi", with `extra` events inside it and `after` events after its end."""
    return sse(
        added(0, message()), *extra, text_delta(0, "Hi"), done(0, message("Hi")), completed()
    ) + sse(*after)


def test_f53_unknown_event_types_are_skipped_named_or_not() -> None:
    data = (
        hi(
            ("response.telepathy.delta", '{"type": "response.telepathy.delta", "delta": 5}'),
            ("response.foo.delta", "not even json"),  # skipped by its name: its data is not read
        )
        + b""
    )
    assert decode(data) == OK_ENTRIES
    unnamed = b'data: {"type": "response.telepathy.delta", "output_index": "x"}\n\n'
    assert decode(unnamed + hi()) == OK_ENTRIES


@pytest.mark.parametrize(
    "item",
    [
        {"id": "ts_1", "type": "tool_search_call", "arguments": {}, "status": "completed"},
        {"id": "ws_1", "type": "web_search_call", "action": {"type": "search", "query": "q"}},
        {"id": "ci_1", "type": "code_interpreter_call", "code": "1+1", "outputs": [{"a": 1}]},
        {"id": "ig_1", "type": "image_generation_call", "result": "aGk=", "content": 7},
        {"id": "mcp_1", "type": "mcp_call", "arguments": {"x": 1}, "name": ["odd"]},
        {"id": "fs_1", "type": "file_search_call", "queries": ["q"], "summary": "text"},
    ],
    ids=lambda item: item["type"],
)
def test_hosted_tool_items_are_skipped_whole_whatever_their_fields(item: dict[str, Any]) -> None:
    data = sse(
        added(0, item),
        done(0, item),
        added(1, message()),
        text_delta(1, "Hi"),
        done(1, message("Hi")),
        completed([item, message("Hi")]),
    )
    assert decode(data) == OK_ENTRIES
    assert decode_body(response(output=[item, message("Hi")])) == OK_ENTRIES


@pytest.mark.parametrize(
    "call",
    [
        {"id": "fc_1", "type": "function_call", "call_id": "c", "name": "f", "arguments": {}},
        # long enough that its preview is cut (the item is read undecoded first)
        {"id": "f" * 200, "type": "function_call", "call_id": "c", "name": "f", "arguments": {}},
        {"id": "f" * 200, "type": 5},
    ],
)
def test_a_known_item_of_the_wrong_shape_is_still_malformed(call: dict[str, Any]) -> None:
    decoder = WireDecoder(OpenAIResponsesDialect(), clock=lambda: 0)
    with pytest.raises(MalformedFrameError) as info:
        decoder.feed(sse(added(0, message()), added(1, call)))
    assert info.value.provider == "openai-responses"
    assert info.value.frame_index == 1
    assert isinstance(info.value.frame_preview, str)
    assert len(info.value.frame_preview) < 200


def test_a_known_event_of_the_wrong_shape_is_still_malformed() -> None:
    decoder = WireDecoder(OpenAIResponsesDialect(), clock=lambda: 0)
    bad = {"type": "response.output_text.delta", "output_index": 0, "delta": 5}
    with pytest.raises(MalformedFrameError) as info:
        decoder.feed(sse(added(0, message()), bad))
    assert info.value.frame_index == 1
    unnamed = WireDecoder(OpenAIResponsesDialect(), clock=lambda: 0)
    with pytest.raises(MalformedFrameError):
        unnamed.feed(b"data: " + json.dumps(bad).encode() + b"\n\n")


@pytest.mark.parametrize(
    "after",
    [
        (("message", "[DONE]"),),  # OpenRouter
        (("message", "[DONE]"), ("message", "[DONE]")),
        (text_delta(0, " late"), completed()),
        (("response.output_text.delta", "{broken"),),
        ({"type": "error", "code": "server_error", "message": "late"},),
    ],
    ids=["done", "two-dones", "a-second-reply", "broken", "an-error"],
)
def test_anything_after_the_terminal_event_is_ignored(after: tuple[Any, ...]) -> None:
    assert decode(hi(after=after)) == OK_ENTRIES


async def test_f52_done_after_response_completed_completes_in_one_request(
    loop_clock: trio.testing.MockClock,
) -> None:
    data = hi(after=(("message", "[DONE]"),))
    result, requests = await turn_over_loopback(OpenAIResponsesDialect(), data)
    assert (requests, result.outcome, result.text) == (1, Outcome.COMPLETED, "Hi")


async def test_f53_unknown_events_and_hosted_tool_items_complete_in_one_request(
    loop_clock: trio.testing.MockClock,
) -> None:
    tool = {"id": "ts_1", "type": "tool_search_call", "arguments": {}}
    data = sse(
        ("response.foo.delta", '{"type": "response.foo.delta"}'),
        added(0, tool),
        done(0, tool),
        added(1, message()),
        text_delta(1, "Hi"),
        done(1, message("Hi")),
        completed([tool, message("Hi")]),
    )
    result, requests = await turn_over_loopback(OpenAIResponsesDialect(), data)
    assert (requests, result.outcome, result.text) == (1, Outcome.COMPLETED, "Hi")


def test_non_json_frame_is_malformed_with_provider_and_position() -> None:
    data = sse(added(0, message()), ("response.output_text.delta", "{oops"))
    decoder = WireDecoder(OpenAIResponsesDialect(), clock=lambda: 0)
    with pytest.raises(MalformedFrameError) as info:
        decoder.feed(data)
    assert info.value.provider == "openai-responses"
    assert info.value.frame_index == 1
    assert "{oops" in info.value.frame_preview


def test_a_delta_without_its_output_index_is_malformed() -> None:
    data = sse(added(0, message()), {"type": "response.output_text.delta", "delta": "x"})
    assert decode(data) == [{"type": "error", "error": "MalformedFrameError"}]


def test_a_delta_for_no_open_item_breaks_the_protocol() -> None:
    data = sse(text_delta(3, "stray"))
    assert decode(data) == [{"type": "error", "error": "StreamProtocolError"}]


def test_error_event_with_a_nested_error_object() -> None:
    error = {
        "type": "error",
        "error": {"type": "invalid_request_error", "code": None, "message": "bad"},
    }
    data = sse(added(0, message()), text_delta(0, "a"), error)
    assert decode(data) == [
        {"type": "text.delta", "text": "a"},
        {"type": "error", "error": "InvalidRequestError"},
    ]


def test_error_event_carries_the_provider_facts() -> None:
    data = sse({"type": "error", "code": "rate_limit_exceeded", "message": "Slow down"})
    decoder = WireDecoder(OpenAIResponsesDialect(), clock=lambda: 0)
    with pytest.raises(RateLimitError) as info:
        decoder.feed(data)
    assert info.value.in_stream is True
    assert info.value.provider_message == "Slow down"
    assert info.value.error_type == "rate_limit_exceeded"


def test_failed_without_an_error_object_is_a_provider_error() -> None:
    data = sse({"type": "response.failed", "response": response("failed", error=None)})
    assert decode(data) == [{"type": "error", "error": "ProviderError"}]


@pytest.mark.parametrize(
    ("code", "typed"),
    [
        ("invalid_prompt", "InvalidRequestError"),
        ("context_length_exceeded", "InvalidRequestError"),
        ("image_too_large", "InvalidRequestError"),
        ("server_error", "ServerError"),
        ("vector_store_timeout", "ProviderError"),
    ],
)
def test_a_failed_response_whose_code_names_the_request_is_a_refused_request(
    code: str, typed: str
) -> None:
    """`response.failed` codes that say what is wrong with the request are never retried; the
    ones that may pass next time keep their transport shape."""
    error = {"code": code, "message": "no"}
    data = sse({"type": "response.failed", "response": response("failed", error=error)})
    assert decode(data) == [{"type": "error", "error": typed}]
    decoder = WireDecoder(OpenAIResponsesDialect(), clock=lambda: 0)
    with pytest.raises(ProviderError) as info:
        decoder.feed(data)
    permanent = error_shape(info.value) is Shape.PERMANENT
    assert permanent is (typed == "InvalidRequestError")


def test_incomplete_without_a_reason_is_unknown() -> None:
    data = sse(
        added(0, message()),
        text_delta(0, "cut"),
        {"type": "response.incomplete", "response": response("incomplete")},
    )
    assert decode(data)[-1]["finish_reason"] == "unknown"


def test_completed_with_a_call_in_its_output_finishes_tool_call() -> None:
    call = {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}
    data = sse(added(0, message()), text_delta(0, "x"), done(0, message("x")), completed([call]))
    assert decode(data)[-1]["finish_reason"] == "tool_call"


def test_non_streaming_function_call_is_a_header_then_its_arguments() -> None:
    call = {
        "id": "fc_1",
        "type": "function_call",
        "status": "completed",
        "call_id": "call_1",
        "name": "get_time",
        "arguments": '{"zone":"UTC"}',
    }
    assert decode_body(response("completed", [call])) == [
        {"type": "tool_call.delta", "name": "get_time", "arguments": "", "tool_call_id": "call_1"},
        {"type": "tool_call.delta", "name": "", "arguments": '{"zone":"UTC"}', "tool_call_id": ""},
        {
            "type": "tool_call.done",
            "name": "get_time",
            "arguments": {"zone": "UTC"},
            "tool_call_id": "call_1",
        },
        {"type": "stop", "finish_reason": "tool_call", "usage_metadata": USAGE_METADATA},
    ]


def test_non_streaming_failed_response_is_the_typed_error() -> None:
    failed = response("failed", error={"code": "server_error", "message": "boom"})
    assert decode_body(failed) == [{"type": "error", "error": "ServerError"}]


def test_non_streaming_incomplete_is_length() -> None:
    cut = response(
        "incomplete", [message("Once")], incomplete_details={"reason": "max_output_tokens"}
    )
    assert decode_body(cut)[-1]["finish_reason"] == "length"


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


# --- a stream of nothing but its ends -------------------------------------------------------------

CALL = {
    "type": "function_call",
    "id": "fc_1",
    "call_id": "call_1",
    "name": "weather",
    "arguments": '{"city": "Paris"}',
    "status": "completed",
}


def test_a_stream_of_nothing_but_its_ends_reads_the_final_output_whole() -> None:
    # a server or proxy that does not stream the output sends it whole in its last event
    created = {"type": "response.created", "response": response("in_progress")}
    entries = decode(sse(created, completed([message("Hello there."), CALL])))
    # as the same Response answered whole would read
    whole = decode_body(response("completed", [message("Hello there."), CALL]))
    assert entries == whole
    assert entries[1] == {"type": "text.done", "text": "Hello there."}
    assert entries[-2]["arguments"] == {"city": "Paris"}
    assert entries[-1]["finish_reason"] == "tool_call"


def test_a_streamed_output_is_not_read_again_from_the_final_event() -> None:
    created = {"type": "response.created", "response": response("in_progress")}
    data = sse(
        created,
        added(0, message()),
        text_delta(0, "Hello"),
        done(0, message("Hello")),
        completed([message("Hello")]),
    )
    texts = [e["text"] for e in decode(data) if e["type"] == "text.done"]
    assert texts == ["Hello"]  # once
