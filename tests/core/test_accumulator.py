"""The accumulator: the assistant message (the `.done` items in order, the stop's usage and finish
reason), the answer text with its SHA-256 and length, and `reset()` voiding an attempt."""

from __future__ import annotations

import hashlib

from rillet import (
    EmbeddingDone,
    EventItem,
    InlineDataDelta,
    InlineDataDone,
    TextDelta,
    TextDone,
    ThinkingDelta,
    ThinkingDone,
    ToolCallDelta,
    ToolCallDone,
    UniEvent,
    UniMessage,
    UsageMetadata,
)
from rillet._core._events import delta_event, stop_event
from rillet.lowlevel import (
    Accumulator,
    Grammar,
    LaneEvent,
    MessageDelta,
    MessageStop,
    PartDelta,
    PartStart,
    PartStop,
    RawUsage,
)

USAGE = UsageMetadata(cached_tokens=1, prompt_tokens=2, thoughts_tokens=3, response_tokens=4)


def reply() -> list[UniEvent]:
    """A reply with thinking, non-ASCII text, a tool call and media, and its stop."""
    items: list[EventItem] = [
        ThinkingDelta(thinking="I think"),
        ThinkingDone(thinking="I think", fidelity={"signature": "s"}),
        TextDelta(text="Grüße, "),
        TextDelta(text="世界 😀"),
        TextDone(text="Grüße, 世界 😀"),
        ToolCallDelta(name="f", arguments="{}", tool_call_id="c"),
        ToolCallDone(name="f", arguments={}, tool_call_id="c"),
        InlineDataDelta(data=b"\x00", mime_type="image/png"),
        InlineDataDone(data=b"\x00", mime_type="image/png"),
        EmbeddingDone(embedding=[1.0]),
    ]
    return [delta_event(item, n) for n, item in enumerate(items)] + [
        stop_event(USAGE, "tool_call", 99)
    ]


def test_the_message_holds_the_done_items_in_order_and_the_stop() -> None:
    acc = Accumulator()
    acc.feed_many(reply())
    assert acc.stopped
    assert acc.message() == UniMessage(
        role="assistant",
        content_items=[
            ThinkingDone(thinking="I think", fidelity={"signature": "s"}),
            TextDone(text="Grüße, 世界 😀"),
            ToolCallDone(name="f", arguments={}, tool_call_id="c"),
            InlineDataDone(data=b"\x00", mime_type="image/png"),
            EmbeddingDone(embedding=[1.0]),
        ],
        usage_metadata=USAGE,
        finish_reason="tool_call",
    )
    assert acc.usage == USAGE
    assert acc.finish_reason == "tool_call"


def test_the_answer_text_is_the_text_deltas_only() -> None:
    acc = Accumulator()
    for event in reply():
        acc.feed(event)
    assert acc.text == "Grüße, 世界 😀"
    assert "think" not in acc.text


def test_the_answer_hash_and_length_are_of_its_utf8_text_in_code_points() -> None:
    acc = Accumulator()
    acc.feed_many(reply())
    text = "Grüße, 世界 😀"
    assert acc.sha256 == hashlib.sha256(text.encode("utf-8")).hexdigest()
    assert acc.chars == len(text) == 11
    assert acc.chars != len(text.encode("utf-8"))


def test_the_text_grows_as_fragments_arrive() -> None:
    acc = Accumulator()
    acc.feed(delta_event(TextDelta(text="a"), 0))
    assert acc.text == "a"
    acc.feed(delta_event(TextDelta(text="b"), 0))
    acc.feed(delta_event(TextDelta(text="c"), 0))
    assert acc.text == "abc"
    assert acc.chars == 3
    assert not acc.stopped
    assert acc.items == []


def test_an_empty_accumulator() -> None:
    acc = Accumulator()
    assert acc.text == ""
    assert acc.chars == 0
    assert acc.sha256 == hashlib.sha256(b"").hexdigest()
    assert acc.message() == UniMessage(role="assistant", content_items=[])
    assert acc.usage is None
    assert acc.finish_reason is None
    assert not acc.stopped


def test_reset_voids_everything() -> None:
    acc = Accumulator()
    acc.feed_many(reply())
    acc.reset()
    assert acc.text == ""
    assert acc.chars == 0
    assert acc.sha256 == hashlib.sha256(b"").hexdigest()
    assert acc.items == []
    assert acc.usage is None
    assert acc.finish_reason is None
    assert not acc.stopped
    assert acc.message() == UniMessage(role="assistant", content_items=[])
    # and it collects the next attempt from scratch
    acc.feed(delta_event(TextDelta(text="again"), 0))
    assert acc.text == "again"


def test_reset_after_the_text_was_read() -> None:
    acc = Accumulator()
    acc.feed(delta_event(TextDelta(text="x"), 0))
    acc.feed(delta_event(TextDelta(text="y"), 0))
    assert acc.text == "xy"
    acc.reset()
    acc.feed(delta_event(TextDelta(text="z"), 0))
    assert acc.text == "z"


def test_the_message_is_a_copy() -> None:
    acc = Accumulator()
    acc.feed_many(reply())
    message = acc.message()
    acc.reset()
    assert len(message.content_items) == 5


def test_it_collects_what_the_grammar_emits() -> None:
    lanes: list[LaneEvent] = [
        PartStart(index=0, kind="thinking"),
        PartDelta(0, "thinking", "hmm"),
        PartStop(0),
        PartStart(index=1, kind="text"),
        PartDelta(1, "text", "Ja, "),
        PartDelta(1, "text", "gern."),
        MessageDelta(finish_reason="end_turn", usage=RawUsage(prompt_tokens=5, response_tokens=2)),
        MessageStop(),
    ]
    grammar = Grammar("acme", clock=lambda: 0)
    acc = Accumulator()
    for lane in lanes:
        acc.feed_many(grammar.feed(lane))
    assert acc.text == "Ja, gern."
    assert acc.message().content_items == [ThinkingDone(thinking="hmm"), TextDone(text="Ja, gern.")]
    assert acc.message().finish_reason == "stop"
    assert acc.usage == UsageMetadata(prompt_tokens=5, response_tokens=2)
