"""The wire encoders (`rillet._core._encode`): what each writes is what the matching
decoder (ours for SSE, wsproto for WebSocket, msgspec for JSON Lines) reads back."""

from __future__ import annotations

import msgspec
import pytest
from rillet._core._encode import (
    SSE_DONE,
    SSE_HEARTBEAT,
    SSE_PROBE,
    SSE_RETRY,
    close_frame,
    encode_sse,
    sse_data,
    sse_run_events,
    uni_jsonl,
    ws_text_frames,
)
from rillet._core._events import UniEvent
from rillet._core._markers import AttemptReset
from rillet._core._runevents import AnswerDelta, decode_run_event
from rillet._hub._hub import Entry
from rillet.frames import SSEDecoder
from wsproto.frame_protocol import FrameProtocol, Opcode


def entry(seq: int, text: str) -> Entry:
    event = AnswerDelta(run_id="r1", seq=seq, elapsed_ms=seq, delta=text)
    return Entry(seq, event, msgspec.json.encode(event))


def test_sse_comments_and_retry_are_no_events_and_done_is_one() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(SSE_HEARTBEAT + SSE_PROBE + SSE_RETRY) == []
    assert decoder.comments == 2
    assert decoder.retry == 1000
    assert [e.data for e in decoder.feed(SSE_DONE)] == ["[DONE]"]
    assert SSE_DONE == b"data: [DONE]\n\n"


def test_run_events_as_sse_carry_resumable_ids_and_the_hubs_json() -> None:
    batch = [entry(1, "a\n\nevent: x"), entry(2, "b")]
    events = SSEDecoder().feed(sse_run_events("r1", batch))
    assert [e.id for e in events] == ["r1:1", "r1:2"]
    assert [decode_run_event(e.data) for e in events] == [b.event for b in batch]


def test_an_mmsp_data_line_is_one_event_of_the_json() -> None:
    payload = b'{"error":{"type":"X","message":"line\\nbreak"}}'
    (event,) = SSEDecoder().feed(sse_data(payload))
    assert event.data.encode() == payload
    assert sse_data(payload) == encode_sse(payload.decode())


@pytest.mark.parametrize("size", [0, 125, 126, 65535, 65536])
def test_websocket_frames_are_what_wsproto_reads(size: int) -> None:
    batch = [entry(1, "x" * size), entry(2, "y")]
    frames = FrameProtocol(client=True, extensions=[])
    frames.receive_bytes(ws_text_frames(batch) + close_frame(1013))
    got = list(frames.received_frames())
    assert [f.opcode for f in got] == [Opcode.TEXT, Opcode.TEXT, Opcode.CLOSE]
    assert [f.payload for f in got[:2]] == [b.data.decode() for b in batch]
    assert got[2].payload == (1013, "")


def test_uni_jsonl_writes_events_as_msgspec_does_and_resets_as_their_own_line() -> None:
    events = [UniEvent(event_type="stop", content_items=[], finish_reason="stop")]
    mixed: list[UniEvent | AttemptReset] = [events[0], AttemptReset(attempt=2), events[0]]
    lines = uni_jsonl(mixed).splitlines()
    assert lines[1] == b'{"type":"attempt.reset","attempt":2}'
    assert lines[0] == lines[2] == msgspec.json.encode(events[0])
    assert uni_jsonl(events) == msgspec.json.encode(events[0]) + b"\n"
