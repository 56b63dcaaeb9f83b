"""The lane events the grammar's tests feed it, and the UniEvents they read back as JSON."""

from __future__ import annotations

import json
from typing import Any

from rillet import UniEvent, encode_json
from rillet.lowlevel import (
    Grammar,
    LaneEvent,
    MessageDelta,
    MessageStop,
    PartDelta,
    PartStart,
    PartStop,
    RawUsage,
)

USAGE = RawUsage(cached_tokens=0, prompt_tokens=10, thoughts_tokens=None, response_tokens=5)
USAGE_JSON = {
    "cached_tokens": 0,
    "prompt_tokens": 10,
    "thoughts_tokens": None,
    "response_tokens": 5,
}
SIG = {"signature": "..."}


def wire(event: UniEvent) -> dict[str, Any]:
    return json.loads(encode_json(event))  # type: ignore[no-any-return]


def item(event: UniEvent) -> dict[str, Any]:
    data = wire(event)
    assert data["event_type"] == "delta"
    (content,) = data["content_items"]
    return content  # type: ignore[no-any-return]


def items(events: list[UniEvent]) -> list[dict[str, Any]]:
    return [item(e) for e in events if e.event_type == "delta"]


def feed_all(g: Grammar, events: list[LaneEvent]) -> list[UniEvent]:
    out: list[UniEvent] = []
    for event in events:
        out += g.feed(event)
    return out


def run(events: list[LaneEvent], provider: str = "acme") -> list[UniEvent]:
    g = Grammar(provider, clock=lambda: 0)
    out = feed_all(g, events)
    out += g.close()
    return out


def text_lane(index: int, *fragments: str, stop: bool = True) -> list[LaneEvent]:
    events: list[LaneEvent] = [PartStart(index=index, kind="text")]
    events += [PartDelta(index, "text", f) for f in fragments]
    if stop:
        events.append(PartStop(index, "text"))
    return events


def tool_lane(
    index: int, name: str, call_id: str, *fragments: str, stop: bool = True
) -> list[LaneEvent]:
    events: list[LaneEvent] = [PartStart(index=index, kind="tool_call", name=name, call_id=call_id)]
    events += [PartDelta(index, "tool_call", f) for f in fragments]
    if stop:
        events.append(PartStop(index, "tool_call"))
    return events


END: list[LaneEvent] = [MessageDelta(finish_reason="stop", usage=USAGE), MessageStop()]
