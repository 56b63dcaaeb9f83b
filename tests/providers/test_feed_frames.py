"""A dialect's `feed_frames` (a whole read's frames in one call) decodes exactly what its `feed`
does frame by frame: the same UniEvents, and the same error at the same frame.

Every stream decoder that has `feed_frames` is run over every recorded stream of its dialect
(our fixtures, the real-streams corpus, the benchmark's generated streams), each also cut short,
with one frame corrupted, one made to carry the wrong shape and one holding bytes that are not
UTF-8, at several read sizes;
once as the wire decoder drives it (the reads it decodes in one step, `test_read_blocks`,
included) and once with `feed_frames` hidden and every SSE frame an
`SSEEvent` (not its data's bytes, `SSEDecoder.raw`), so that the frames go to `feed` one at a
time as they did before either existed.
"""

from __future__ import annotations

import random
import re
from pathlib import Path
from typing import Any

import pytest
from rillet import RilletError
from rillet.frames import SSEDecoder
from rillet.lowlevel import WireDecoder
from rillet.providers import dialect_from_name

from bench.wire import STREAM_KINDS, build_stream

FIXTURES = Path(__file__).parent.parent / "fixtures"
FOLDERS = {
    "anthropic": "anthropic-messages",
    "gemini": "gemini",
    "ollama": "ollama-chat",
    "openai-chat": "openai-chat",
    "openai-responses": "openai-responses",
}
READ_SIZES = (1, 7, 61, 500, 1 << 20)
_TEXT_VALUE = re.compile(rb'"(?:text|content|delta|thinking|partial_json)": ?"')
_ANY_VALUE = re.compile(rb'": ?"')


def _has_feed_frames(dialect_name: str) -> bool:
    return hasattr(dialect_from_name(dialect_name).stream_decoder(), "feed_frames")


def _streams(folder: str) -> list[tuple[str, bytes]]:
    found = []
    for sub in ("providers", "real"):
        for path in sorted((FIXTURES / sub / folder).glob("*")):
            if path.suffix in (".sse", ".ndjson"):
                found.append((f"{sub}/{path.name}", path.read_bytes()))
    return found


def _generated(dialect: str) -> list[tuple[str, bytes]]:
    found = []
    for kind in STREAM_KINDS:
        stream = build_stream(kind, 300)
        if dialect_from_name(FOLDERS.get(stream.dialect, stream.dialect)).name == dialect:
            found.append((f"bench/{kind}", b"".join(stream.chunks)))
    return found


def _mutations(name: str, data: bytes, ndjson: bool) -> list[tuple[str, bytes]]:
    """The stream whole, cut short, with a frame that is not JSON and one of the wrong shape."""
    rng = random.Random(name)
    sep = b"\n" if ndjson else b"\n\n"
    frames = data.split(sep)
    out = [(name, data), (f"{name} cut", data[: rng.randrange(1, max(2, len(data)))])]
    if len(frames) > 3:
        at = rng.randrange(1, len(frames) - 1)
        broken = list(frames)
        broken[at] = broken[at][: max(1, len(broken[at]) // 2)]
        out.append((f"{name} half frame {at}", sep.join(broken)))
        shaped = list(frames)
        prefix = b"" if ndjson else b"data: "
        shaped[at] = prefix + b'{"choices": 5, "type": 5, "candidates": 5, "message": 5}'
        out.append((f"{name} wrong shape {at}", sep.join(shaped)))
        # a byte that is not UTF-8 inside a string (SSE reads it as U+FFFD, NDJSON refuses it)
        bad = list(frames)
        value = _TEXT_VALUE.search(bad[at]) or _ANY_VALUE.search(bad[at])
        if value is not None:
            bad[at] = bad[at][: value.end()] + b"\xff\xfe" + bad[at][value.end() :]
            out.append((f"{name} invalid UTF-8 {at}", sep.join(bad)))
    return out


def _decode(dialect: Any, data: bytes, size: int, batched: bool) -> tuple[list[Any], str]:
    decoder = WireDecoder(dialect, clock=lambda: 0)
    if not batched:
        decoder._many = None  # every frame through `feed`, one at a time
        decoder._lines = None  # (NDJSON lines too: none read as one block)
        if isinstance(decoder._framer, SSEDecoder):
            decoder._framer.raw = False  # and as an `SSEEvent`
    out: list[Any] = []
    try:
        for at in range(0, len(data), size):
            decoder.feed(data[at : at + size], out)
        decoder.close(out)
    except RilletError as exc:
        return out, f"{type(exc).__name__}: {exc} @{getattr(exc, 'frame_index', None)}"
    return out, "complete"


CASES = [
    (folder, name, data)
    for dialect, folder in FOLDERS.items()
    if _has_feed_frames(folder)
    for name, data in _streams(folder) + _generated(dialect_from_name(folder).name)
]


@pytest.mark.parametrize(
    ("folder", "name", "data"), CASES, ids=[f"{f}:{n}" for f, n, _ in CASES] or None
)
def test_feed_frames_decodes_what_feed_does(folder: str, name: str, data: bytes) -> None:
    dialect = dialect_from_name(folder)
    ndjson = dialect.framing == "ndjson"
    for label, stream in _mutations(name, data, ndjson):
        for size in READ_SIZES:
            batched = _decode(dialect, stream, size, batched=True)
            single = _decode(dialect, stream, size, batched=False)
            assert batched == single, f"{label}, {size}-byte reads"


def test_some_dialect_takes_frames_in_one_call() -> None:
    assert CASES, "no dialect has feed_frames: the test above checks nothing"
