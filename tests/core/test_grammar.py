"""The grammar: lane events in, MMSP UniEvents out: MMSP's worked example reproduced, interleaved
lanes serialised, what goes out per fragment, the `.done` items and fidelity (its ends, its
refusals and any interleaving: `test_grammar_ends`)."""

from __future__ import annotations

import itertools
import json
import typing
from typing import Any

import pytest
import rillet._core._arguments as arguments_module
from rillet import StreamProtocolError, ToolCallArgumentParseError, UniEvent
from rillet.lowlevel import (
    Grammar,
    LaneEvent,
    LaneKind,
    MessageDelta,
    MessageStart,
    MessageStop,
    PartDelta,
    PartStart,
    PartStop,
)

from ..grammar_support import (
    END,
    SIG,
    USAGE,
    USAGE_JSON,
    feed_all,
    items,
    run,
    text_lane,
    tool_lane,
    wire,
)

# --- MMSP's worked example --------------------------------------------------------------------


def test_mmsp_worked_example_comes_out_exactly() -> None:
    events: list[LaneEvent] = [
        MessageStart(id="msg_1", model="claude"),
        PartStart(index=0, kind="thinking"),
        PartDelta(0, "thinking", "Let me"),
        PartDelta(0, "thinking", " check"),
        PartDelta(0, "thinking", "", SIG),
        PartStop(0, "thinking"),
        PartStart(index=1, kind="tool_call", name="get_weather", call_id="toolu_1"),
        PartDelta(1, "tool_call", ""),
        PartDelta(1, "tool_call", '{"location": '),
        PartDelta(1, "tool_call", '"Paris"}'),
        PartStop(1, "tool_call"),
        MessageDelta(finish_reason="tool_use", usage=USAGE),
        MessageStop(),
    ]
    clock = itertools.count(1694502400000)
    g = Grammar("anthropic", clock=lambda: next(clock))
    out = feed_all(g, events) + g.close()

    def delta(content: dict[str, Any], at: int) -> dict[str, Any]:
        return {
            "role": "assistant",
            "event_type": "delta",
            "content_items": [content],
            "usage_metadata": None,
            "finish_reason": None,
            "created_at": at,
        }

    base = 1694502400000
    want = [
        delta({"type": "thinking.delta", "thinking": "Let me"}, base),
        delta({"type": "thinking.delta", "thinking": " check"}, base + 1),
        delta({"type": "thinking.delta", "thinking": "", "fidelity": SIG}, base + 2),
        delta({"type": "thinking.done", "thinking": "Let me check", "fidelity": SIG}, base + 3),
        delta(
            {
                "type": "tool_call.delta",
                "name": "get_weather",
                "arguments": "",
                "tool_call_id": "toolu_1",
            },
            base + 4,
        ),
        delta(
            {
                "type": "tool_call.delta",
                "name": "",
                "arguments": '{"location": ',
                "tool_call_id": "",
            },
            base + 5,
        ),
        delta(
            {"type": "tool_call.delta", "name": "", "arguments": '"Paris"}', "tool_call_id": ""},
            base + 6,
        ),
        delta(
            {
                "type": "tool_call.done",
                "name": "get_weather",
                "arguments": {"location": "Paris"},
                "tool_call_id": "toolu_1",
            },
            base + 7,
        ),
        {
            "role": "assistant",
            "event_type": "stop",
            "content_items": [],
            "usage_metadata": USAGE_JSON,
            "finish_reason": "tool_call",
            "created_at": base + 8,
        },
    ]
    assert [json.dumps(wire(e)) for e in out] == [json.dumps(w) for w in want]
    assert g.stopped
    assert (g.message_id, g.model) == ("msg_1", "claude")


# --- serialising interleaved lanes ------------------------------------------------------------


def test_interleaved_tool_calls_are_serialised_without_misattribution() -> None:
    g = Grammar("acme", clock=lambda: 0)
    assert g.feed(PartStart(index=0, kind="tool_call", name="a", call_id="c0")) == []
    assert g.feed(PartStart(index=1, kind="tool_call", name="b", call_id="c1")) == []
    first = g.feed(PartDelta(0, "tool_call", '{"x": '))
    assert [i["tool_call_id"] for i in items(first)] == ["c0"]
    assert g.feed(PartDelta(1, "tool_call", '{"y": ')) == []  # held: lane 0 is streaming
    assert items(g.feed(PartDelta(0, "tool_call", "1}"))) == [
        {"type": "tool_call.delta", "name": "", "arguments": "1}", "tool_call_id": ""}
    ]
    assert g.feed(PartDelta(1, "tool_call", "2}")) == []
    released = g.feed(PartStop(0, "tool_call"))
    assert items(released) == [
        {"type": "tool_call.done", "name": "a", "arguments": {"x": 1}, "tool_call_id": "c0"},
        {"type": "tool_call.delta", "name": "b", "arguments": '{"y": ', "tool_call_id": "c1"},
        {"type": "tool_call.delta", "name": "", "arguments": "2}", "tool_call_id": ""},
    ]
    # lane 1 is the streaming one now: its fragments go out at once
    assert items(g.feed(PartDelta(1, "tool_call", " "))) == [
        {"type": "tool_call.delta", "name": "", "arguments": " ", "tool_call_id": ""}
    ]
    assert items(g.feed(PartStop(1, "tool_call"))) == [
        {"type": "tool_call.done", "name": "b", "arguments": {"y": 2}, "tool_call_id": "c1"}
    ]


def test_a_held_lane_closed_early_is_released_whole_with_its_done() -> None:
    g = Grammar("acme", clock=lambda: 0)
    feed_all(g, [PartStart(index=0, kind="text"), PartStart(index=1, kind="thinking")])
    assert g.feed(PartDelta(0, "text", "a")) != []
    assert g.feed(PartDelta(1, "thinking", "t1")) == []
    assert g.feed(PartDelta(1, "thinking", "t2")) == []
    assert g.feed(PartStop(1, "thinking")) == []  # closed, but waits its turn
    assert items(g.feed(PartStop(0, "text"))) == [
        {"type": "text.done", "text": "a"},
        {"type": "thinking.delta", "thinking": "t1"},
        {"type": "thinking.delta", "thinking": "t2"},
        {"type": "thinking.done", "thinking": "t1t2"},
    ]


def test_lanes_share_an_index_across_kinds() -> None:
    out = run(
        [
            PartStart(index=0, kind="text"),
            PartStart(index=0, kind="tool_call", name="f", call_id="c"),
            PartDelta(0, "tool_call", "{}"),
            PartDelta(0, "text", "hi"),
            PartStop(0, "text"),
            PartStop(0, "tool_call"),
            *END,
        ]
    )
    assert [i["type"] for i in items(out)] == [
        "text.delta",
        "text.done",
        "tool_call.delta",
        "tool_call.done",
    ]


def test_part_stop_without_kind_closes_the_open_lane_of_that_index() -> None:
    out = run([*text_lane(3, "a", stop=False), PartStop(3), *END])
    assert items(out)[-1] == {"type": "text.done", "text": "a"}


def test_part_stop_without_index_closes_the_oldest_open_lane() -> None:
    g = Grammar("acme", clock=lambda: 0)
    feed_all(g, [*text_lane(0, "a", stop=False), *tool_lane(1, "f", "c", "{}", stop=False)])
    assert items(g.feed(PartStop()))[0] == {"type": "text.done", "text": "a"}
    assert items(g.feed(PartStop()))[-1]["type"] == "tool_call.done"
    with pytest.raises(StreamProtocolError):
        g.feed(PartStop())


# --- what goes out per fragment ---------------------------------------------------------------


def test_one_delta_per_non_empty_fragment_and_empty_ones_dropped() -> None:
    out = run([*text_lane(0, "", "a", "", "b", ""), *END])
    assert items(out) == [
        {"type": "text.delta", "text": "a"},
        {"type": "text.delta", "text": "b"},
        {"type": "text.done", "text": "ab"},
    ]


def test_a_lane_whose_fragments_were_all_empty_has_no_done() -> None:
    out = run([*text_lane(0, "", ""), *text_lane(1, "x"), *END])
    assert [i["type"] for i in items(out)] == ["text.delta", "text.done"]


def test_a_fragment_carrying_only_fidelity_goes_out() -> None:
    out = run(
        [
            PartStart(index=0, kind="thinking"),
            PartDelta(0, "thinking", "", {"signature": "abc"}),
            PartStop(0, "thinking"),
            *text_lane(1, "x"),
            *END,
        ]
    )
    assert items(out)[:2] == [
        {"type": "thinking.delta", "thinking": "", "fidelity": {"signature": "abc"}},
        {"type": "thinking.done", "thinking": "", "fidelity": {"signature": "abc"}},
    ]


def test_a_tool_calls_first_fragment_goes_out_even_empty() -> None:
    out = run([*tool_lane(0, "ping", "call_1", ""), *END])
    assert items(out) == [
        {"type": "tool_call.delta", "name": "ping", "arguments": "", "tool_call_id": "call_1"},
        {"type": "tool_call.done", "name": "ping", "arguments": {}, "tool_call_id": "call_1"},
    ]


def test_later_tool_fragments_have_empty_name_and_id_and_empty_ones_are_dropped() -> None:
    out = run([*tool_lane(0, "f", "c", '{"a"', "", ": 1", "", "}"), *END])
    assert items(out) == [
        {"type": "tool_call.delta", "name": "f", "arguments": '{"a"', "tool_call_id": "c"},
        {"type": "tool_call.delta", "name": "", "arguments": ": 1", "tool_call_id": ""},
        {"type": "tool_call.delta", "name": "", "arguments": "}", "tool_call_id": ""},
        {"type": "tool_call.done", "name": "f", "arguments": {"a": 1}, "tool_call_id": "c"},
    ]


def test_a_tool_lane_closed_without_fragments_has_no_group() -> None:
    out = run([*tool_lane(0, "f", "c"), *text_lane(1, "x"), *END])
    assert [i["type"] for i in items(out)] == ["text.delta", "text.done"]


# --- the .done items --------------------------------------------------------------------------


def test_done_items_join_their_fragments() -> None:
    out = run(
        [
            *text_lane(0, "Hel", "lo ", "😀"),
            PartStart(index=1, kind="thinking"),
            PartDelta(1, "thinking", "a"),
            PartDelta(1, "thinking", "b"),
            PartStop(1),
            PartStart(index=2, kind="inline_data", mime_type="audio/pcm"),
            PartDelta(2, "inline_data", b"\x00\x01"),
            PartDelta(2, "inline_data", b""),
            PartDelta(2, "inline_data", b"\xff"),
            PartStop(2),
            PartStart(index=3, kind="inline_thinking", mime_type="x/y"),
            PartDelta(3, "inline_thinking", b"ab"),
            PartDelta(3, "inline_thinking", b"cd"),
            PartStop(3),
            PartStart(index=4, kind="embedding"),
            PartDelta(4, "embedding", [0.5, 1.0]),
            PartStop(4),
            PartStart(index=5, kind="embedding"),
            PartDelta(5, "embedding", []),
            PartStop(5),
            *END,
        ]
    )
    dones = [i for i in items(out) if i["type"].endswith(".done")]
    assert dones == [
        {"type": "text.done", "text": "Hello 😀"},
        {"type": "thinking.done", "thinking": "ab"},
        {"type": "inline_data.done", "data": "AAH/", "mime_type": "audio/pcm"},
        {"type": "inline_thinking.done", "data": "YWJjZA==", "mime_type": "x/y"},
        {"type": "embedding.done", "embedding": [0.5, 1.0]},
        {"type": "embedding.done", "embedding": []},
    ]
    deltas = [i for i in items(out) if i["type"].endswith(".delta")]
    assert {"type": "inline_data.delta", "data": "/w==", "mime_type": "audio/pcm"} in deltas
    assert {"type": "embedding.delta", "embedding": []} in deltas


@pytest.mark.parametrize(
    ("fragments", "arguments"),
    [
        (("",), {}),
        (("", ""), {}),
        (("{}",), {}),
        (('{"a": [1, ', '{"b": null}]', ', "c": "é"}'), {"a": [1, {"b": None}], "c": "é"}),
        ((" {", '"k": true', "} "), {"k": True}),
    ],
)
def test_tool_arguments_are_parsed_from_the_joined_string(
    fragments: tuple[str, ...], arguments: dict[str, Any]
) -> None:
    out = run([*tool_lane(0, "f", "c", *fragments), *END])
    assert items(out)[-1] == {
        "type": "tool_call.done",
        "name": "f",
        "arguments": arguments,
        "tool_call_id": "c",
    }


def test_tool_arguments_are_parsed_once(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[Any] = []
    decode = arguments_module._decode_arguments

    def counting(raw: Any) -> Any:
        calls.append(raw)
        return decode(raw)

    monkeypatch.setattr(arguments_module, "_decode_arguments", counting)
    run([*tool_lane(0, "f", "c", '{"a', '": ', "1}"), *tool_lane(1, "g", "d", ""), *END])
    assert calls == ['{"a": 1}', "{}"]


@pytest.mark.parametrize(
    "fragments",
    [('{"a": ',), ('{"a": 1', ""), ("[1, 2]",), ("3",), ('"text"',), ("null",), ("{'a': 1}",)],
    ids=["cut", "unclosed", "array", "number", "string", "null", "not-json"],
)
def test_bad_tool_arguments_raise_in_place_of_the_done(fragments: tuple[str, ...]) -> None:
    g = Grammar("acme", clock=lambda: 0)
    out = feed_all(g, tool_lane(0, "get_weather", "call_9", *fragments, stop=False))
    assert all(i["type"] == "tool_call.delta" for i in items(out))
    with pytest.raises(ToolCallArgumentParseError) as info:
        g.feed(PartStop(0, "tool_call"))
    error = info.value
    assert error.provider == "acme"
    assert error.tool_name == "get_weather"
    assert error.tool_call_id == "call_9"
    assert error.raw_arguments_length == len("".join(fragments))
    assert error.raw_arguments_preview == "".join(fragments)
    for fact in ("acme", "get_weather", "call_9"):
        assert fact in str(error)


def test_bad_tool_arguments_preview_is_bounded() -> None:
    raw = '{"blob": "' + "x" * 10_000
    with pytest.raises(ToolCallArgumentParseError) as info:
        run([*tool_lane(0, "f", "c", raw), *END])
    assert info.value.raw_arguments_length == len(raw)
    assert len(info.value.raw_arguments_preview) < 200
    assert info.value.raw_arguments_preview.startswith('{"blob"')
    assert len(str(info.value)) < 500


def test_bad_tool_arguments_closed_by_the_finish_reason_raise() -> None:
    g = Grammar("acme", clock=lambda: 0)
    feed_all(g, tool_lane(0, "f", "c", '{"a":', stop=False))
    with pytest.raises(ToolCallArgumentParseError):
        g.feed(MessageDelta(finish_reason="tool_calls"))


def test_events_released_before_an_error_are_kept_in_out() -> None:
    g = Grammar("acme", clock=lambda: 0)
    feed_all(
        g,
        [
            *tool_lane(0, "good", "c0", "{}", stop=False),
            *tool_lane(1, "bad", "c1", '{"x', stop=False),
        ],
    )
    out: list[UniEvent] = []
    with pytest.raises(ToolCallArgumentParseError) as info:
        g.feed(MessageDelta(finish_reason="tool_calls"), out)
    assert info.value.tool_name == "bad"
    assert items(out) == [
        {"type": "tool_call.done", "name": "good", "arguments": {}, "tool_call_id": "c0"},
        {"type": "tool_call.delta", "name": "bad", "arguments": '{"x', "tool_call_id": "c1"},
    ]


def test_feed_appends_to_the_given_list() -> None:
    g = Grammar("acme", clock=lambda: 0)
    out: list[UniEvent] = []
    g.feed(PartStart(index=0, kind="text"), out)
    assert g.feed(PartDelta(0, "text", "a"), out) is out
    g.feed(PartDelta(0, "text", "b"), out)
    assert [i["text"] for i in items(out)] == ["a", "b"]


# --- fidelity ---------------------------------------------------------------------------------


def test_a_repeated_identical_fidelity_goes_out_once_and_is_copied_onto_the_done() -> None:
    fid = {"phase": "final_answer"}
    out = run(
        [
            PartStart(index=0, kind="text"),
            PartDelta(0, "text", "a", fid),
            PartDelta(0, "text", "b", dict(fid)),
            PartDelta(0, "text", "", dict(fid)),
            PartStop(0),
            *END,
        ]
    )
    assert items(out) == [
        {"type": "text.delta", "text": "a", "fidelity": fid},
        {"type": "text.delta", "text": "b"},
        {"type": "text.done", "text": "ab", "fidelity": fid},
    ]


@pytest.mark.parametrize(
    ("kind", "value"),
    [
        ("text", "x"),
        ("thinking", "x"),
        ("tool_call", "{}"),
        ("inline_data", b"x"),
        ("inline_thinking", b"x"),
    ],
)
def test_fidelity_is_copied_onto_every_kind_of_done(kind: LaneKind, value: Any) -> None:
    fid = {"signature": "s"}
    events: list[LaneEvent] = [
        PartStart(index=0, kind=kind, name="f", call_id="c", mime_type="x/y"),
        PartDelta(0, kind, value),
        PartDelta(0, kind, value[:0], fid),
        PartStop(0),
        *text_lane(1, "t"),
        *END,
    ]
    out = items(run(events))
    assert out[1]["fidelity"] == fid
    assert out[2]["type"] == f"{kind}.done"
    assert out[2]["fidelity"] == fid
    assert "fidelity" not in out[0]


def test_a_different_second_fidelity_is_a_protocol_error() -> None:
    g = Grammar("acme", clock=lambda: 0)
    feed_all(g, [PartStart(index=0, kind="thinking"), PartDelta(0, "thinking", "a", {"s": 1})])
    with pytest.raises(StreamProtocolError, match="fidelity"):
        g.feed(PartDelta(0, "thinking", "", {"s": 2}))


def test_fidelity_belongs_to_its_own_group() -> None:
    out = run(
        [
            PartStart(index=0, kind="thinking"),
            PartDelta(0, "thinking", "a", {"s": 1}),
            PartStop(0),
            PartStart(index=1, kind="thinking"),
            PartDelta(1, "thinking", "b", {"s": 2}),
            PartStop(1),
            *text_lane(2, "t"),
            *END,
        ]
    )
    assert [i.get("fidelity") for i in items(out)][:4] == [{"s": 1}, {"s": 1}, {"s": 2}, {"s": 2}]


# --- the per-kind table -----------------------------------------------------------------------


def test_every_lane_kind_has_one_entry_in_the_grammars_table() -> None:
    import rillet._core._grammar as grammar_module

    assert set(typing.get_args(LaneKind)) == set(grammar_module._KINDS)


def test_a_lane_of_no_known_kind_is_a_protocol_error() -> None:
    g = Grammar("acme", clock=lambda: 0)
    with pytest.raises(StreamProtocolError, match="no known kind: 'video'"):
        g.feed(PartStart(index=0, kind="video"))  # type: ignore[arg-type]
