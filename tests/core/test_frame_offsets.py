"""A frame that fails to decode is located by its byte offset in the stream (F22): where its SSE
block or NDJSON line starts, however the reads cut the bytes, when the reads tell it.

A read that holds the failing frame (whole body, a read per event, larger reads) names where
its block starts; a read that holds only the frame's end (small reads) counts back over the
frame's bytes. The error always names the provider and the frame's index.
"""

from __future__ import annotations

import pytest
from rillet import MalformedFrameError
from rillet.lowlevel import WireDecoder
from rillet.providers import dialect_from_name

GOOD = [
    b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":'
    b'{"role":"assistant","content":""}}]}\n\n',
    b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":'
    b'{"content":"Hello"}}]}\n\n',
]
BAD = b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"conte\n\n'
AFTER = b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"!"}}]}\n\n'
NAMED_BAD = (
    b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,"delta":'
    b'{"type":"text_delta","text":5}}\n\n'
)


def _feed(decoder: WireDecoder, reads: list[bytes]) -> None:
    for read in reads:
        decoder.feed(read)


def _locate(dialect: str, reads: list[bytes]) -> MalformedFrameError:
    decoder = WireDecoder(dialect_from_name(dialect), clock=lambda: 0)
    with pytest.raises(MalformedFrameError) as info:
        _feed(decoder, reads)
    return info.value


def _cut(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


@pytest.mark.parametrize("size", [1, 2, 7, 64, 100, 4096])
def test_a_frame_that_is_not_json_is_located_wherever_the_reads_cut(size: int) -> None:
    data = b"".join(GOOD) + BAD + AFTER
    error = _locate("openai-chat", _cut(data, size))
    assert error.offset == len(b"".join(GOOD))
    assert (error.provider, error.frame_index) == ("openai-chat", 2)
    assert f"byte {len(b''.join(GOOD))}" in str(error)


def test_a_read_per_event_locates_the_frame_at_its_read() -> None:
    error = _locate("openai-chat", [*GOOD, BAD + AFTER])
    assert error.offset == len(b"".join(GOOD))


@pytest.mark.parametrize("size", [1, 3, 50, 4096])
def test_a_named_event_of_the_wrong_shape_is_located_at_its_event_line(size: int) -> None:
    start = (
        b'event: message_start\ndata: {"type":"message_start","message":{"id":"m","model":"c",'
        b'"content":[],"usage":{"input_tokens":1}}}\n\n'
        b'event: content_block_start\ndata: {"type":"content_block_start","index":0,'
        b'"content_block":{"type":"text","text":""}}\n\n'
    )
    error = _locate("anthropic", _cut(start + NAMED_BAD, size))
    assert error.offset == len(start)


@pytest.mark.parametrize("size", [1, 5, 4096])
def test_an_ndjson_line_is_located_at_its_start(size: int) -> None:
    first = b'{"model":"m","message":{"role":"assistant","content":"a"},"done":false}\n'
    bad = b'{"model":"m","message":{"role":"assistant","content":7},"done":false}\n'
    error = _locate("ollama-chat", _cut(first + bad, size))
    assert error.offset in (len(first), None)
    if size > len(bad):
        assert error.offset == len(first)
