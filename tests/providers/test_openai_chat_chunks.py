"""The Chat Completions stream's chunks of other shapes: Mistral's content lists, tool calls
continued by id, arguments sent as the object itself."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from rillet import MalformedFrameError, TextDone, ThinkingDone, TurnRequest, UniMessage, user
from rillet._core._lanes import MessageDelta
from rillet.lowlevel import WireDecoder
from rillet.providers._openai_chat._dialect import OpenAIChatDialect
from rillet.providers._openai_chat._stream import ChatStreamDecoder

from ..openai_chat_support import (
    USAGE,
    USAGE_JSON,
    body,
    chunk,
    decode,
    decode_body,
    sse,
    usage_chunk,
)

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


# --- refusals ----------------------------------------------------------------------------------


def test_a_refusal_is_the_answers_text_and_ends_it_as_refused() -> None:
    # OpenAI's shape (gpt-4o declining a json_schema request): `refusal` fragments in place of
    # `content`, then `stop`; read as nothing, the turn failed as "no content"
    chunks = [
        chunk({"role": "assistant", "content": None, "refusal": ""}),
        chunk({"refusal": "I can't"}),
        chunk({"refusal": " help."}),
        chunk(finish="stop"),
        usage_chunk(),
    ]
    events = decode(sse(*chunks, "[DONE]"))
    assert [e["text"] for e in events if e["type"] == "text.done"] == ["I can't help."]
    # said to be a refusal, so a wire with a field for it can answer it and send it back so
    deltas = [e for e in events if e["type"] == "text.delta"]
    assert deltas[0]["fidelity"] == {"refusal": True}
    assert [e.get("fidelity") for e in events if e["type"] == "text.done"] == [{"refusal": True}]
    assert events[-1]["finish_reason"] == "unknown"  # the grammar's word for `refusal`
    decoder = ChatStreamDecoder()
    lanes = [e for c in chunks for e in decoder.feed(json.dumps(c).encode())]
    assert [e.finish_reason for e in lanes if isinstance(e, MessageDelta)] == ["refusal", None]


def test_a_whole_completion_that_refuses_is_its_refusal() -> None:
    message = {"role": "assistant", "content": None, "refusal": "No."}
    completion = {"choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}
    events = decode_body(completion)
    assert [e["text"] for e in events if e["type"] == "text.done"] == ["No."]
    assert events[-1]["finish_reason"] == "unknown"
