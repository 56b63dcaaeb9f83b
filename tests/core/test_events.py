"""The UniEvent model writes MMSP's JSON exactly: keys, key order, nulls, omitted fidelity and
base64 bytes; every item type and both message shapes round-trip."""

from __future__ import annotations

import base64
import json
from typing import Any

import msgspec
import pytest
from rillet import (
    EmbeddingDelta,
    EmbeddingDone,
    ImageUrlDone,
    InlineDataDelta,
    InlineDataDone,
    InlineThinkingDelta,
    InlineThinkingDone,
    TextDelta,
    TextDone,
    ThinkingDelta,
    ThinkingDone,
    ToolCallDelta,
    ToolCallDone,
    ToolResultDone,
    UniEvent,
    UniMessage,
    UsageMetadata,
    decode_uni_event,
    decode_uni_message,
    encode_json,
)
from rillet._core._events import delta_event, stop_event

DELTA_EXAMPLE = (
    '{"role": "assistant", "event_type": "delta", "content_items": [{"type": "text.delta", '
    '"text": "Hel"}], "usage_metadata": null, "finish_reason": null, "created_at": 1694502400000}'
)
STOP_EXAMPLE = (
    '{"role": "assistant", "event_type": "stop", "content_items": [], "usage_metadata": '
    '{"cached_tokens": 0, "prompt_tokens": 10, "thoughts_tokens": null, "response_tokens": 5}, '
    '"finish_reason": "stop", "created_at": 1694502400100}'
)

PNG = b"\x89PNG\r\n\x1a\n\x00\xff"
B64 = base64.b64encode(PNG).decode("ascii")
FIDELITY = {"signature": "c2lnbmF0dXJl", "nested": {"a": [1, 2]}}

# One JSON object per item type, each in MMSP's key order.
ITEMS: list[dict[str, Any]] = [
    {"type": "text.delta", "text": "Hel"},
    {"type": "text.delta", "text": "", "fidelity": {"phase": "final_answer"}},
    {"type": "text.done", "text": "Hello"},
    {"type": "text.done", "text": "Hello", "fidelity": {"phase": "final_answer"}},
    {"type": "thinking.delta", "thinking": "Let me"},
    {"type": "thinking.delta", "thinking": "", "fidelity": FIDELITY},
    {"type": "thinking.done", "thinking": "Let me check", "fidelity": FIDELITY},
    {"type": "thinking.done", "thinking": "Let me check"},
    {"type": "tool_call.delta", "name": "get_weather", "arguments": "", "tool_call_id": "t1"},
    {"type": "tool_call.delta", "name": "", "arguments": '{"a": ', "tool_call_id": ""},
    {
        "type": "tool_call.delta",
        "name": "f",
        "arguments": "{}",
        "tool_call_id": "t2",
        "fidelity": FIDELITY,
    },
    {
        "type": "tool_call.done",
        "name": "get_weather",
        "arguments": {"location": "Paris", "days": [1, 2], "unit": None},
        "tool_call_id": "t1",
    },
    {
        "type": "tool_call.done",
        "name": "f",
        "arguments": {},
        "tool_call_id": "t2",
        "fidelity": FIDELITY,
    },
    {"type": "inline_data.delta", "data": B64, "mime_type": "image/png"},
    {"type": "inline_data.delta", "data": B64, "mime_type": "audio/pcm", "fidelity": FIDELITY},
    {"type": "inline_data.done", "data": B64, "mime_type": "image/png"},
    {"type": "inline_data.done", "data": B64, "mime_type": "image/png", "fidelity": FIDELITY},
    {"type": "inline_thinking.delta", "data": B64, "mime_type": "application/octet-stream"},
    {"type": "inline_thinking.delta", "data": "", "mime_type": "x/y", "fidelity": FIDELITY},
    {"type": "inline_thinking.done", "data": B64, "mime_type": "application/octet-stream"},
    {"type": "inline_thinking.done", "data": B64, "mime_type": "x/y", "fidelity": FIDELITY},
    {"type": "embedding.delta", "embedding": [0.25, -1.5, 3.0]},
    {"type": "embedding.delta", "embedding": []},
    {"type": "embedding.done", "embedding": [0.25, -1.5, 3.0]},
    {"type": "image_url.done", "image_url": "https://example.com/cat.png"},
    {"type": "image_url.done", "image_url": f"data:image/png;base64,{B64}"},
    {"type": "tool_result.done", "text": "18 °C, sunny", "tool_call_id": "t1"},
    {
        "type": "tool_result.done",
        "text": "see the chart",
        "images": ["https://example.com/chart.png", f"data:image/png;base64,{B64}"],
        "tool_call_id": "t1",
    },
]

ITEM_CLASSES: dict[str, type[Any]] = {
    "text.delta": TextDelta,
    "text.done": TextDone,
    "thinking.delta": ThinkingDelta,
    "thinking.done": ThinkingDone,
    "tool_call.delta": ToolCallDelta,
    "tool_call.done": ToolCallDone,
    "inline_data.delta": InlineDataDelta,
    "inline_data.done": InlineDataDone,
    "inline_thinking.delta": InlineThinkingDelta,
    "inline_thinking.done": InlineThinkingDone,
    "embedding.delta": EmbeddingDelta,
    "embedding.done": EmbeddingDone,
    "image_url.done": ImageUrlDone,
    "tool_result.done": ToolResultDone,
}


def canonical(raw: str | bytes) -> str:
    """JSON text in a form where equal values with equal key order compare equal."""
    return json.dumps(json.loads(raw), ensure_ascii=False)


def envelope(item: dict[str, Any]) -> str:
    return json.dumps(
        {
            "role": "assistant",
            "event_type": "delta",
            "content_items": [item],
            "usage_metadata": None,
            "finish_reason": None,
            "created_at": 1,
        }
    )


@pytest.mark.parametrize("raw", [DELTA_EXAMPLE, STOP_EXAMPLE], ids=["delta", "stop"])
def test_mmsp_examples_decode_and_reencode_to_the_same_json(raw: str) -> None:
    event = decode_uni_event(raw)
    assert canonical(encode_json(event)) == canonical(raw)


def test_delta_example_decodes_to_the_expected_values() -> None:
    event = decode_uni_event(DELTA_EXAMPLE)
    assert event == UniEvent(
        event_type="delta", content_items=[TextDelta(text="Hel")], created_at=1694502400000
    )


def test_stop_example_decodes_to_the_expected_values() -> None:
    event = decode_uni_event(STOP_EXAMPLE)
    assert event.event_type == "stop"
    assert event.finish_reason == "stop"
    assert event.usage_metadata == UsageMetadata(
        cached_tokens=0, prompt_tokens=10, thoughts_tokens=None, response_tokens=5
    )


def test_delta_event_writes_null_usage_and_finish_reason() -> None:
    wire = json.loads(encode_json(delta_event(TextDelta(text="x"), 7)))
    assert list(wire) == [
        "role",
        "event_type",
        "content_items",
        "usage_metadata",
        "finish_reason",
        "created_at",
    ]
    assert wire["usage_metadata"] is None
    assert wire["finish_reason"] is None
    assert wire["role"] == "assistant"


def test_stop_event_writes_every_usage_field_null_included() -> None:
    usage = UsageMetadata(cached_tokens=None, prompt_tokens=3, response_tokens=4)
    wire = json.loads(encode_json(stop_event(usage, "length", 9)))
    assert wire == json.loads(
        '{"role": "assistant", "event_type": "stop", "content_items": [], "usage_metadata": '
        '{"cached_tokens": null, "prompt_tokens": 3, "thoughts_tokens": null, '
        '"response_tokens": 4}, "finish_reason": "length", "created_at": 9}'
    )
    assert list(wire["usage_metadata"]) == [
        "cached_tokens",
        "prompt_tokens",
        "thoughts_tokens",
        "response_tokens",
    ]


@pytest.mark.parametrize("item", ITEMS, ids=[f"{i}-{x['type']}" for i, x in enumerate(ITEMS)])
def test_every_item_type_round_trips_with_its_key_order(item: dict[str, Any]) -> None:
    raw = envelope(item)
    event = decode_uni_event(raw)
    (decoded,) = event.content_items
    assert type(decoded) is ITEM_CLASSES[item["type"]]
    assert canonical(encode_json(event)) == canonical(raw)
    # the item alone, too
    assert canonical(encode_json(decoded)) == json.dumps(item, ensure_ascii=False)


def test_fidelity_is_omitted_when_absent() -> None:
    for item in (
        TextDelta(text="a"),
        ThinkingDone(thinking="b"),
        ToolCallDelta(name="", arguments="", tool_call_id=""),
        InlineDataDone(data=b"", mime_type="image/png"),
        InlineThinkingDelta(data=b"x", mime_type="x/y"),
    ):
        assert "fidelity" not in json.loads(encode_json(item))


def test_fidelity_is_written_last_when_present() -> None:
    wire = json.loads(
        encode_json(ToolCallDone(name="f", arguments={}, tool_call_id="c", fidelity={"k": 1}))
    )
    assert list(wire) == ["type", "name", "arguments", "tool_call_id", "fidelity"]
    assert wire["fidelity"] == {"k": 1}


def test_tool_result_without_images_omits_the_key() -> None:
    wire = json.loads(encode_json(ToolResultDone(text="ok", tool_call_id="c")))
    assert list(wire) == ["type", "text", "tool_call_id"]


def test_bytes_are_base64_text_and_decode_back_to_bytes() -> None:
    for cls in (InlineDataDelta, InlineDataDone, InlineThinkingDelta, InlineThinkingDone):
        wire = json.loads(encode_json(cls(data=PNG, mime_type="image/png")))
        assert wire["data"] == B64
        event = decode_uni_event(envelope(wire))
        (item,) = event.content_items
        assert isinstance(item, cls)
        assert item.data == PNG


def test_an_unknown_item_type_is_refused() -> None:
    with pytest.raises(msgspec.ValidationError):
        decode_uni_event(envelope({"type": "video.delta", "data": ""}))


USER_MESSAGE = {
    "role": "user",
    "content_items": [
        {"type": "text.done", "text": "What is the weather? ☀"},
        {"type": "image_url.done", "image_url": "https://example.com/sky.jpg"},
        {"type": "tool_result.done", "text": "18 °C", "tool_call_id": "toolu_1"},
        {
            "type": "tool_result.done",
            "text": "chart",
            "images": ["https://example.com/c.png"],
            "tool_call_id": "toolu_2",
        },
    ],
}
ASSISTANT_MESSAGE = {
    "role": "assistant",
    "content_items": [
        {"type": "thinking.done", "thinking": "Let me check", "fidelity": {"signature": "s"}},
        {"type": "text.done", "text": "Checking."},
        {
            "type": "tool_call.done",
            "name": "get_weather",
            "arguments": {"location": "Paris"},
            "tool_call_id": "toolu_1",
        },
        {"type": "inline_data.done", "data": B64, "mime_type": "image/png"},
        {"type": "inline_thinking.done", "data": B64, "mime_type": "x/y"},
        {"type": "embedding.done", "embedding": [1.0, 2.5]},
    ],
    "usage_metadata": {
        "cached_tokens": 2,
        "prompt_tokens": 10,
        "thoughts_tokens": None,
        "response_tokens": 5,
    },
    "finish_reason": "tool_call",
    "created_at": 1694502400100,
}


@pytest.mark.parametrize("message", [USER_MESSAGE, ASSISTANT_MESSAGE], ids=["user", "assistant"])
def test_messages_round_trip(message: dict[str, Any]) -> None:
    raw = json.dumps(message)
    decoded = decode_uni_message(raw)
    assert decoded.role == message["role"]
    assert canonical(encode_json(decoded)) == canonical(raw)


def test_user_message_writes_only_role_and_items() -> None:
    wire = json.loads(encode_json(UniMessage(role="user", content_items=[TextDone(text="hi")])))
    assert wire == {"role": "user", "content_items": [{"type": "text.done", "text": "hi"}]}


def test_assistant_message_keeps_mmsp_key_order() -> None:
    message = UniMessage(
        role="assistant",
        content_items=[TextDone(text="x")],
        usage_metadata=UsageMetadata(prompt_tokens=1),
        finish_reason="stop",
        created_at=5,
    )
    assert list(json.loads(encode_json(message))) == [
        "role",
        "content_items",
        "usage_metadata",
        "finish_reason",
        "created_at",
    ]


def test_a_message_refuses_delta_items() -> None:
    raw = json.dumps({"role": "user", "content_items": [{"type": "text.delta", "text": "x"}]})
    with pytest.raises(msgspec.ValidationError):
        decode_uni_message(raw)


# --- cross-check against MMSP's own type definitions, where the package is installed ------------


def _mmsp_types() -> Any:
    return pytest.importorskip("mmsp.types")


MMSP_ITEM_TYPES = {
    "text.delta": "TextDeltaItem",
    "text.done": "TextDoneItem",
    "thinking.delta": "ThinkingDeltaItem",
    "thinking.done": "ThinkingDoneItem",
    "tool_call.delta": "ToolCallDeltaItem",
    "tool_call.done": "ToolCallDoneItem",
    "inline_data.delta": "InlineDataDeltaItem",
    "inline_data.done": "InlineDataDoneItem",
    "inline_thinking.delta": "InlineThinkingDeltaItem",
    "inline_thinking.done": "InlineThinkingDoneItem",
    "embedding.delta": "EmbeddingDeltaItem",
    "embedding.done": "EmbeddingDoneItem",
    "image_url.done": "ImageUrlDoneItem",
    "tool_result.done": "ToolResultDoneItem",
}


def test_item_keys_follow_mmsp_typeddict_order() -> None:
    types = _mmsp_types()
    seen = set()
    for item in ITEMS:
        keys = list(getattr(types, MMSP_ITEM_TYPES[item["type"]]).__annotations__)
        ours = list(json.loads(encode_json(decode_uni_event(envelope(item)).content_items[0])))
        # our keys are MMSP's, in MMSP's order (optional ones may be absent)
        assert ours == [k for k in keys if k in ours], item["type"]
        assert set(keys) - set(ours) <= {"fidelity", "images"}
        seen.add(item["type"])
    assert seen == set(MMSP_ITEM_TYPES)


def test_envelope_keys_follow_mmsp_typeddict_order() -> None:
    types = _mmsp_types()
    event = json.loads(encode_json(decode_uni_event(STOP_EXAMPLE)))
    assert list(event) == list(types.UniEvent.__annotations__)
    assert list(event["usage_metadata"]) == list(types.UsageMetadata.__annotations__)
    message = json.loads(encode_json(decode_uni_message(json.dumps(ASSISTANT_MESSAGE))))
    assert list(message) == list(types.UniMessage.__annotations__)
