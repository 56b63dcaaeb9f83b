"""The grammar's ends and refusals: finish reasons and usage, the violations it refuses,
incomplete, empty and failed streams, and any interleaving of well-formed lanes serialised."""

from __future__ import annotations

import base64
import itertools
import json
from typing import Any

import pytest
import rillet._core._grammar as grammar_module
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rillet import (
    EmptyResponseError,
    IncompleteStreamError,
    OverloadedError,
    ServerError,
    StreamProtocolError,
    ToolCallArgumentParseError,
    UniEvent,
    UsageMetadata,
)
from rillet._core._events import TextDelta, TextDone, ThinkingDone, ToolCallDone
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
    Ping,
    ProviderErrorEvent,
    RawUsage,
    map_finish_reason,
)

from ..grammar_support import (
    END,
    USAGE,
    USAGE_JSON,
    feed_all,
    item,
    items,
    run,
    text_lane,
    tool_lane,
    wire,
)

# --- finish reasons and usage -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "mapped"),
    [
        ("stop", "stop"),
        ("end_turn", "stop"),
        ("stop_sequence", "stop"),
        ("STOP", "stop"),
        ("completed", "stop"),
        ("tool_use", "tool_call"),
        ("tool_calls", "tool_call"),
        ("tool_call", "tool_call"),
        ("function_call", "tool_call"),
        ("length", "length"),
        ("max_tokens", "length"),
        ("MAX_TOKENS", "length"),
        ("max_output_tokens", "length"),
        ("SAFETY", "unknown"),
        ("RECITATION", "unknown"),
        ("content_filter", "unknown"),
        ("refusal", "unknown"),
        ("pause_turn", "unknown"),
        ("FINISH_REASON_UNSPECIFIED", "unknown"),
        ("", "unknown"),
    ],
)
def test_provider_stop_spellings_are_mapped(raw: str, mapped: str) -> None:
    assert map_finish_reason(raw) == mapped
    out = run([*text_lane(0, "x"), MessageDelta(finish_reason=raw, usage=USAGE), MessageStop()])
    assert out[-1].finish_reason == mapped


def test_usage_is_merged_field_by_field_later_non_null_wins() -> None:
    out = run(
        [
            MessageDelta(usage=RawUsage(prompt_tokens=10, cached_tokens=2)),
            *text_lane(0, "x"),
            MessageDelta(usage=RawUsage(response_tokens=3, cached_tokens=None)),
            MessageDelta(finish_reason="stop"),
            MessageDelta(usage=RawUsage(response_tokens=5, thoughts_tokens=7)),
            MessageStop(),
        ]
    )
    assert wire(out[-1])["usage_metadata"] == {
        "cached_tokens": 2,
        "prompt_tokens": 10,
        "thoughts_tokens": 7,
        "response_tokens": 5,
    }


def test_a_later_finish_reason_wins() -> None:
    out = run(
        [
            *text_lane(0, "x"),
            MessageDelta(finish_reason="stop"),
            MessageDelta(finish_reason="max_tokens", usage=USAGE),
            MessageStop(),
        ]
    )
    assert out[-1].finish_reason == "length"


def test_exactly_one_stop_event_and_it_is_last() -> None:
    out = run([*text_lane(0, "a", "b"), *END])
    kinds = [e.event_type for e in out]
    assert kinds.count("stop") == 1
    assert kinds[-1] == "stop"
    assert wire(out[-1]) == {
        "role": "assistant",
        "event_type": "stop",
        "content_items": [],
        "usage_metadata": USAGE_JSON,
        "finish_reason": "stop",
        "created_at": 0,
    }


def test_a_finish_reason_closes_every_open_lane() -> None:
    g = Grammar("acme", clock=lambda: 0)
    feed_all(
        g,
        [
            *text_lane(0, "a", stop=False),
            *tool_lane(1, "f", "c", '{"k": 1}', stop=False),
            PartStart(index=2, kind="thinking"),
            PartDelta(2, "thinking", "t"),
        ],
    )
    released = items(g.feed(MessageDelta(finish_reason="tool_calls", usage=USAGE)))
    assert [i["type"] for i in released] == [
        "text.done",
        "tool_call.delta",
        "tool_call.done",
        "thinking.delta",
        "thinking.done",
    ]
    with pytest.raises(StreamProtocolError):
        g.feed(PartDelta(0, "text", "late"))
    stop = g.feed(MessageStop())
    assert [e.event_type for e in stop] == ["stop"]


def test_message_start_and_ping_emit_nothing() -> None:
    g = Grammar("acme", clock=lambda: 0)
    assert g.feed(MessageStart(id="m1", model="x")) == []
    assert g.feed(Ping()) == []
    assert (g.message_id, g.model) == ("m1", "x")


def test_a_second_message_start_is_a_protocol_error() -> None:
    g = Grammar("acme", clock=lambda: 0)
    g.feed(MessageStart(id="m1"))
    with pytest.raises(StreamProtocolError, match="second message start"):
        g.feed(MessageStart(id="m2"))


# --- violations -------------------------------------------------------------------------------


def _protocol_error(events: list[LaneEvent]) -> StreamProtocolError:
    g = Grammar("acme", clock=lambda: 0)
    with pytest.raises(StreamProtocolError) as info:
        feed_all(g, events)
    assert info.value.provider == "acme"
    assert "acme" in str(info.value)
    return info.value


def test_a_delta_for_no_open_lane_is_a_protocol_error() -> None:
    _protocol_error([PartDelta(0, "text", "x")])
    _protocol_error([*text_lane(0, "a"), PartDelta(0, "text", "x")])


def test_a_delta_of_the_wrong_kind_for_its_lane_is_a_protocol_error() -> None:
    error = _protocol_error([*tool_lane(0, "f", "c", stop=False), PartDelta(0, "text", "x")])
    assert "tool_call" in str(error)


@pytest.mark.parametrize(
    ("kind", "value"),
    [
        ("text", b"x"),
        ("thinking", 1),
        ("tool_call", {"a": 1}),
        ("inline_data", "x"),
        ("inline_thinking", "x"),
        ("embedding", "x"),
    ],
)
def test_a_fragment_value_of_the_wrong_type_is_a_protocol_error(kind: LaneKind, value: Any) -> None:
    _protocol_error(
        [
            PartStart(index=0, kind=kind, name="f", call_id="c"),
            PartDelta(0, kind, value),
        ]
    )


@pytest.mark.parametrize(
    "late",
    [
        [MessageStop()],
        [PartStart(index=5, kind="text"), PartDelta(5, "text", "late"), PartStop(5, "text")],
        [PartDelta(0, "text", "x")],
        [PartStop()],
        [MessageDelta(finish_reason="length", usage=RawUsage(prompt_tokens=99))],
        [MessageStart()],
        [Ping()],
        [ProviderErrorEvent(ServerError("acme", "late", in_stream=True))],
    ],
    ids=["message-stop", "a-lane", "a-fragment", "part-stop", "usage", "start", "ping", "error"],
)
def test_anything_after_the_stop_is_ignored(late: list[LaneEvent]) -> None:
    # a second `[DONE]`, chunks after it, events after `message_stop`: the reply is complete
    g = Grammar("acme", clock=lambda: 0)
    out = feed_all(g, [*text_lane(0, "x"), *END])
    assert feed_all(g, late) == []
    batch: list[UniEvent] = []
    g.feed_many(late, batch)
    assert batch == []
    assert g.close() == []
    assert out[-1].event_type == "stop"
    assert out[-1].finish_reason == "stop"
    assert out[-1].usage_metadata is not None
    assert out[-1].usage_metadata.prompt_tokens == 10


def test_the_rest_of_a_batch_after_the_stop_is_ignored() -> None:
    g = Grammar("acme", clock=lambda: 0)
    out: list[UniEvent] = []
    g.feed_many([*text_lane(0, "x"), *END, PartDelta(0, "text", "y"), MessageStop()], out)
    assert [e.event_type for e in out] == ["delta", "delta", "stop"]


def test_close_after_the_stop_returns_nothing() -> None:
    g = Grammar("acme", clock=lambda: 0)
    feed_all(g, [*text_lane(0, "x"), *END])
    assert g.close() == []


@pytest.mark.parametrize(("name", "call_id"), [("", "c"), ("f", ""), ("", "")])
def test_a_tool_lane_without_a_name_or_id_is_a_protocol_error(name: str, call_id: str) -> None:
    _protocol_error([PartStart(index=0, kind="tool_call", name=name, call_id=call_id)])


def test_a_lane_opened_twice_is_a_protocol_error() -> None:
    _protocol_error([PartStart(index=0, kind="text"), PartStart(index=0, kind="text")])


def test_a_closed_lane_may_be_opened_again() -> None:
    out = run([*text_lane(0, "a"), *text_lane(0, "b"), *END])
    assert [i["text"] for i in items(out) if i["type"] == "text.done"] == ["a", "b"]


def test_a_part_stop_for_no_open_lane_is_a_protocol_error() -> None:
    _protocol_error([PartStop(0)])
    _protocol_error([PartStop(0, "text")])
    _protocol_error([*text_lane(0, "a"), PartStop(0, "text")])


def test_something_that_is_not_a_lane_event_is_a_protocol_error() -> None:
    _protocol_error(["text"])  # type: ignore[list-item]


# --- incomplete, empty, and failed streams ----------------------------------------------------


def test_eof_without_message_stop_is_incomplete_and_open_groups_get_no_done() -> None:
    g = Grammar("acme", clock=lambda: 0)
    out = feed_all(g, [*text_lane(0, "done"), *tool_lane(1, "f", "c", '{"a": 1}', stop=False)])
    with pytest.raises(IncompleteStreamError) as info:
        g.close()
    assert info.value.missing == ("usage_metadata", "finish_reason")
    assert info.value.provider == "acme"
    assert [i["type"] for i in items(out)] == ["text.delta", "text.done", "tool_call.delta"]


def test_eof_after_finish_and_usage_but_without_message_stop_is_incomplete() -> None:
    g = Grammar("acme", clock=lambda: 0)
    feed_all(g, [*text_lane(0, "x"), MessageDelta(finish_reason="end_turn", usage=USAGE)])
    with pytest.raises(IncompleteStreamError) as info:
        g.close()
    assert info.value.missing
    assert info.value.finish_reason == "stop"
    assert info.value.usage_metadata is not None
    assert info.value.usage_metadata.prompt_tokens == 10


def test_message_stop_without_usage_is_complete_with_null_usage() -> None:
    out = run([*text_lane(0, "x"), MessageDelta(finish_reason="length"), MessageStop()])
    stop = out[-1]
    assert stop.event_type == "stop"
    assert stop.finish_reason == "length"
    assert stop.usage_metadata == UsageMetadata(
        cached_tokens=None, prompt_tokens=None, thoughts_tokens=None, response_tokens=None
    )
    assert [i["type"] for i in items(out)] == ["text.delta", "text.done"]


def test_message_stop_without_finish_reason_finishes_unknown() -> None:
    out = run([*text_lane(0, "x", stop=False), MessageDelta(usage=USAGE), MessageStop()])
    stop = out[-1]
    assert stop.finish_reason == "unknown"
    assert stop.usage_metadata is not None
    assert stop.usage_metadata.response_tokens == 5
    # the terminal event closes what is still open
    assert [i["type"] for i in items(out)] == ["text.delta", "text.done"]


def test_message_stop_alone_after_text_is_complete() -> None:
    out = run([*text_lane(0, "x", stop=False), MessageStop()])
    assert out[-1].finish_reason == "unknown"
    assert out[-1].usage_metadata == UsageMetadata()


def test_message_stop_without_finish_reason_closes_a_tool_call_and_parses_it() -> None:
    g = Grammar("acme", clock=lambda: 0)
    out = feed_all(g, [*tool_lane(0, "f", "c", '{"loc', stop=False), MessageDelta(usage=USAGE)])
    with pytest.raises(ToolCallArgumentParseError):
        g.feed(MessageStop(), out)
    assert [i["type"] for i in items(out)] == ["tool_call.delta"]


def test_a_reply_of_only_thinking_is_empty() -> None:
    g = Grammar("acme", clock=lambda: 0)
    events: list[LaneEvent] = [
        PartStart(index=0, kind="thinking"),
        PartDelta(0, "thinking", "hmm"),
        PartStop(0),
        PartStart(index=1, kind="inline_thinking", mime_type="x/y"),
        PartDelta(1, "inline_thinking", b"z"),
        PartStop(1),
        *text_lane(2, "", ""),
        MessageDelta(finish_reason="end_turn", usage=USAGE),
    ]
    feed_all(g, events)
    with pytest.raises(EmptyResponseError) as info:
        g.feed(MessageStop())
    assert info.value.finish_reason == "stop"
    assert info.value.usage_metadata.prompt_tokens == 10
    assert info.value.provider == "acme"
    assert not g.stopped


def test_a_reply_of_nothing_is_empty() -> None:
    with pytest.raises(EmptyResponseError):
        run(END)


@pytest.mark.parametrize(
    "lane",
    [
        [
            PartStart(index=0, kind="inline_data", mime_type="image/png"),
            PartDelta(0, "inline_data", b"x"),
        ],
        [PartStart(index=0, kind="embedding"), PartDelta(0, "embedding", [])],
        [
            PartStart(index=0, kind="tool_call", name="f", call_id="c"),
            PartDelta(0, "tool_call", ""),
        ],
    ],
    ids=["inline_data", "embedding", "tool_call"],
)
def test_content_other_than_text_is_not_empty(lane: list[LaneEvent]) -> None:
    out = run([*lane, *END])
    assert out[-1].event_type == "stop"


def test_a_provider_error_event_raises_its_error_and_open_groups_get_no_done() -> None:
    error = OverloadedError("acme", "Overloaded", error_type="overloaded_error", in_stream=True)
    g = Grammar("acme", clock=lambda: 0)
    out = feed_all(g, [*text_lane(0, "a"), *text_lane(1, "b", stop=False)])
    with pytest.raises(OverloadedError) as info:
        g.feed(ProviderErrorEvent(error), out)
    assert info.value is error
    assert [i["type"] for i in items(out)] == ["text.delta", "text.done", "text.delta"]


def test_created_at_comes_from_the_injected_clock() -> None:
    ticks = iter(range(100, 200))
    g = Grammar("acme", clock=lambda: next(ticks))
    out = feed_all(g, [*text_lane(0, "a", "b"), *END])
    assert [e.created_at for e in out] == [100, 101, 102, 103]


def test_the_default_clock_is_wall_clock_milliseconds() -> None:
    g = Grammar("acme")
    out = feed_all(g, [*text_lane(0, "a")])
    assert out[0].created_at > 1_600_000_000_000


# --- any interleaving of well-formed lanes ----------------------------------------------------

KINDS: list[LaneKind] = ["text", "thinking", "tool_call", "inline_data", "embedding"]
JSON_OBJECTS = st.dictionaries(
    st.text(max_size=4), st.integers() | st.text(max_size=4) | st.booleans(), max_size=3
)


@st.composite
def lane_specs(draw: st.DrawFn) -> list[tuple[LaneKind, list[Any]]]:
    specs: list[tuple[LaneKind, list[Any]]] = []
    for _ in range(draw(st.integers(1, 5))):
        kind = draw(st.sampled_from(KINDS))
        fragments: list[Any]
        if kind in ("text", "thinking"):
            fragments = draw(st.lists(st.text(max_size=3), max_size=4))
        elif kind == "tool_call":
            raw = json.dumps(draw(JSON_OBJECTS), ensure_ascii=False)
            cuts = sorted(draw(st.lists(st.integers(0, len(raw)), max_size=4)))
            bounds = [0, *cuts, len(raw)]
            fragments = [raw[a:b] for a, b in itertools.pairwise(bounds)]
            if draw(st.booleans()):
                fragments = ["", *fragments]
        elif kind == "inline_data":
            fragments = draw(st.lists(st.binary(max_size=3), max_size=4))
        else:
            fragments = [draw(st.lists(st.floats(-10, 10), max_size=3))]
        specs.append((kind, fragments))
    return specs


def _expected_groups(specs: list[tuple[LaneKind, list[Any]]]) -> list[list[dict[str, Any]]]:
    """What each lane should come out as: its deltas then its done, [] if nothing went out."""
    groups: list[list[dict[str, Any]]] = []
    for i, (kind, fragments) in enumerate(specs):
        group: list[dict[str, Any]] = []
        if kind == "tool_call":
            name, call_id = f"tool{i}", f"call{i}"
            for n, frag in enumerate(fragments):
                if n == 0:
                    group.append(_tool_delta(name, frag, call_id))
                elif frag:
                    group.append(_tool_delta("", frag, ""))
            args = json.loads("".join(fragments) or "{}")
            if group:
                group.append(
                    {
                        "type": "tool_call.done",
                        "name": name,
                        "arguments": args,
                        "tool_call_id": call_id,
                    }
                )
        elif kind in ("text", "thinking"):
            kept = [f for f in fragments if f]
            group = [{"type": f"{kind}.delta", kind: f} for f in kept]
            if kept:
                group.append({"type": f"{kind}.done", kind: "".join(kept)})
        elif kind == "inline_data":
            kept = [f for f in fragments if f]
            group = [_inline("inline_data.delta", f) for f in kept]
            if kept:
                group.append(_inline("inline_data.done", b"".join(kept)))
        else:
            group = [{"type": "embedding.delta", "embedding": v} for v in fragments]
            group.append({"type": "embedding.done", "embedding": fragments[0]})
        groups.append(group)
    return groups


def _tool_delta(name: str, arguments: str, call_id: str) -> dict[str, Any]:
    return {
        "type": "tool_call.delta",
        "name": name,
        "arguments": arguments,
        "tool_call_id": call_id,
    }


def _inline(kind: str, data: bytes) -> dict[str, Any]:
    return {"type": kind, "data": base64.b64encode(data).decode("ascii"), "mime_type": "m/t"}


def _parse_groups(out: list[UniEvent]) -> list[list[dict[str, Any]]]:
    """Split the output into groups, checking `(K.delta+ K.done)* stop` on the way."""
    assert out, "nothing came out"
    assert out[-1].event_type == "stop"
    assert all(e.event_type == "delta" for e in out[:-1])
    groups: list[list[dict[str, Any]]] = []
    current: list[dict[str, Any]] = []
    for content in items(out[:-1]):
        kind, phase = content["type"].split(".")
        if current:
            assert current[0]["type"] == f"{kind}.delta", "groups interleave"
        else:
            assert phase == "delta", "a group must start with a delta"
        current.append(content)
        if phase == "done":
            groups.append(current)
            current = []
    assert not current, "a group was left without its done"
    return groups


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(specs=lane_specs(), data=st.data())
def test_any_interleaving_of_well_formed_lanes_obeys_the_grammar(
    specs: list[tuple[LaneKind, list[Any]]], data: st.DataObject
) -> None:
    # each lane's own ops, in order; the lane opens in list order, some close by the finish reason
    ops: list[list[LaneEvent]] = []
    for i, (kind, fragments) in enumerate(specs):
        lane_ops: list[LaneEvent] = [
            PartStart(index=i, kind=kind, name=f"tool{i}", call_id=f"call{i}", mime_type="m/t")
        ]
        lane_ops += [PartDelta(i, kind, f) for f in fragments]
        if data.draw(st.booleans(), label=f"lane {i} closes itself"):
            lane_ops.append(PartStop(i, kind))
        ops.append(lane_ops)
    # interleave: a lane may only start once every lane before it has started
    events: list[LaneEvent] = []
    cursor = [0] * len(ops)
    while any(c < len(o) for c, o in zip(cursor, ops, strict=True)):
        ready = [
            i for i, o in enumerate(ops) if cursor[i] < len(o) and (i == 0 or cursor[i - 1] > 0)
        ]
        i = data.draw(st.sampled_from(ready))
        events.append(ops[i][cursor[i]])
        cursor[i] += 1
    events += [MessageDelta(finish_reason="stop"), MessageDelta(usage=USAGE), MessageStop()]

    want = [g for g in _expected_groups(specs) if g]
    has_content = any(g[-1]["type"].split(".")[0] != "thinking" for g in want)
    if not has_content:
        with pytest.raises(EmptyResponseError):
            run(events)
        return
    out = run(events)
    assert [json.dumps(g) for g in _parse_groups(out)] == [json.dumps(g) for g in want]


@pytest.mark.parametrize("batched", [False, True])
def test_long_lanes_keep_every_fragment_however_they_are_joined(batched: bool) -> None:
    # more fragments than one joined piece holds, in the three string kinds, one lane held
    # back while another streams: each `.done` is its lane's fragments joined, exactly once
    n = 3 * grammar_module._PIECE + 7
    words = [f"w{i} é " for i in range(n)]
    args = [f'"k{i}": {i}, ' for i in range(n)]
    events: list[LaneEvent] = [
        PartStart(index=0, kind="thinking"),
        PartStart(index=1, kind="text"),
        *[PartDelta(1, "text", w) for w in words[: n // 2]],
        *[PartDelta(0, "thinking", w) for w in words],
        PartStop(0, "thinking"),
        *[PartDelta(1, "text", w) for w in words[n // 2 :]],
        PartStop(1, "text"),
        PartStart(index=2, kind="tool_call", name="f", call_id="c1"),
        PartDelta(2, "tool_call", "{"),
        *[PartDelta(2, "tool_call", a) for a in args],
        PartDelta(2, "tool_call", '"end": 0}'),
        PartStop(2, "tool_call"),
        MessageDelta(finish_reason="tool_use", usage=RawUsage(prompt_tokens=1, response_tokens=2)),
        MessageStop(),
    ]
    g = Grammar("acme", clock=lambda: 0)
    if batched:
        out: list[UniEvent] = []
        g.feed_many(events, out)
    else:
        out = feed_all(g, events)
    out += g.close()
    done = [e.content_items[0] for e in out if e.content_items and "done" in item(e)["type"]]
    assert done[0] == ThinkingDone(thinking="".join(words))
    assert done[1] == TextDone(text="".join(words))
    assert isinstance(done[2], ToolCallDone)
    assert done[2].arguments == json.loads("{" + "".join(args) + '"end": 0}')
    firsts = [e.content_items[0] for e in out if e.content_items]
    assert "".join(i.text for i in firsts if isinstance(i, TextDelta)) == "".join(words)
