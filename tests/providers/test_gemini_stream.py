"""The Gemini stream: wire cases no fixture covers, non-streaming bodies, usage merged field by
field, and function-call arguments streamed in pieces (Gemini 3, Vertex AI)."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from rillet import FrameEncodingError, MalformedFrameError
from rillet.frames import SSEEvent
from rillet.lowlevel import MessageStop, WireDecoder
from rillet.providers._gemini._dialect import GeminiDialect

from ..gemini_support import (
    SIG,
    SIG2,
    USAGE,
    chunk,
    decode,
    sse,
    stop,
)
from ..wire_cases import run

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
