"""The AWS event-stream decoder, on frames made by the tests' own encoder
(`tests/providers/eventstream_frames.py`): every split point, every header type, and every way
the bytes can be broken (a CRC, a length) raising a typed error at once."""

from __future__ import annotations

import json
import struct
import uuid
import zlib
from pathlib import Path
from typing import Any

import pytest
from rillet._core._errors import EventStreamFrameError, FrameTooLarge
from rillet._core._eventstream import EventStreamDecoder

from ..providers.eventstream_frames import event, exception, frame, text_stream

STREAM = b"".join(text_stream(["Hel", "lo, ", "wörld"]))


def _all(chunks: list[bytes]) -> list[tuple[dict[str, object], bytes]]:
    decoder = EventStreamDecoder()
    out = []
    for chunk in chunks:
        out += decoder.feed(chunk)
    out += decoder.close()
    return [(m.headers, m.payload) for m in out]


def test_a_stream_cut_at_every_byte_decodes_as_the_whole() -> None:
    whole = _all([STREAM])
    assert len(whole) == 7
    assert whole[1][0][":event-type"] == "contentBlockDelta"
    assert whole[1][1] == b'{"contentBlockIndex": 0, "delta": {"text": "Hel"}}'
    for cut in range(1, len(STREAM)):
        assert _all([STREAM[:cut], STREAM[cut:]]) == whole
    assert _all([bytes([b]) for b in STREAM]) == whole


def test_every_header_type_is_read() -> None:
    uid = uuid.UUID("12345678-1234-5678-1234-567812345678")
    extra = b"".join(
        bytes([len(n)]) + n + bytes([t]) + v
        for n, t, v in [
            (b"t", 0, b""),
            (b"f", 1, b""),
            (b"b", 2, b"\xff"),
            (b"s", 3, struct.pack(">h", -2)),
            (b"i", 4, struct.pack(">i", 70000)),
            (b"l", 5, struct.pack(">q", 2**40)),
            (b"y", 6, struct.pack(">H", 3) + b"\x00\x01\x02"),
            (b"ts", 8, struct.pack(">q", 1700000000000)),
            (b"u", 9, uid.bytes),
        ]
    )
    (message,) = EventStreamDecoder().feed(frame({"str": "é"}, b"{}", extra=extra))
    assert message.headers == {
        "str": "é",
        "t": True,
        "f": False,
        "b": -1,
        "s": -2,
        "i": 70000,
        "l": 2**40,
        "y": b"\x00\x01\x02",
        "ts": 1700000000000,
        "u": uid,
    }
    assert message.payload == b"{}"
    assert message.message_type == "event"


def test_an_exception_message_is_read_as_such() -> None:
    (message,) = EventStreamDecoder().feed(exception("throttlingException", "slow down"))
    assert message.message_type == "exception"
    assert message.header(":exception-type") == "throttlingException"


def _flip(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 0x01]) + data[at + 1 :]


@pytest.mark.parametrize(
    ("at", "words"),
    [(0, "prelude CRC"), (9, "prelude CRC"), (20, "message CRC"), (-1, "message CRC")],
)
def test_a_flipped_bit_is_a_crc_error_at_once(at: int, words: str) -> None:
    good = event("messageStart", {"role": "assistant"})
    bad = _flip(good, at % len(good))
    with pytest.raises(EventStreamFrameError, match=words):
        EventStreamDecoder().feed(bad)
    decoder = EventStreamDecoder()
    assert len(decoder.feed(good + bad)) == 1  # the good message before it is not lost...
    with pytest.raises(EventStreamFrameError, match=words):
        decoder.feed(b"")  # ...and the error is raised by the next call, and every later one
    with pytest.raises(EventStreamFrameError):
        decoder.close()


def _prelude(total: int, headers: int) -> bytes:
    head = struct.pack(">II", total, headers)
    return head + struct.pack(">I", zlib.crc32(head))


@pytest.mark.parametrize(("total", "headers"), [(0, 0), (15, 0), (16, 1), (100, 90)])
def test_an_impossible_length_is_refused_without_waiting_for_more(total: int, headers: int) -> None:
    with pytest.raises(EventStreamFrameError, match="cannot hold"):
        EventStreamDecoder().feed(_prelude(total, headers))


def test_a_message_over_the_cap_is_refused_before_its_bytes_are_held() -> None:
    with pytest.raises(FrameTooLarge):
        EventStreamDecoder(max_frame=1024).feed(_prelude(10_000_000, 0))


def test_headers_that_do_not_parse_are_a_framing_error() -> None:
    # a string header whose length runs past the headers' end, CRCs right
    bad = b"\x01a\x07\x00\x09ab"
    with pytest.raises(EventStreamFrameError, match="headers do not parse"):
        EventStreamDecoder().feed(frame({}, b"{}", extra=bad))
    with pytest.raises(EventStreamFrameError, match="unknown type 12"):
        EventStreamDecoder().feed(frame({}, b"{}", extra=b"\x01a\x0c"))


def test_a_truncated_message_at_the_end_is_nothing() -> None:
    decoder = EventStreamDecoder()
    assert decoder.feed(STREAM[:-3]) != []
    assert decoder.close() == []


VECTORS = json.loads(
    (Path(__file__).parent.parent / "fixtures/bedrock-converse/reference-vectors.json").read_text()
)


def _expected(value: object) -> object:
    if isinstance(value, dict) and "bytes" in value:
        return bytes.fromhex(value["bytes"])
    if isinstance(value, dict) and "uuid" in value:
        return uuid.UUID(bytes=bytes.fromhex(value["uuid"]))
    return value


@pytest.mark.parametrize("case", VECTORS["positive"], ids=lambda c: c["name"])
def test_the_formats_reference_messages_decode_as_the_suite_says(case: dict[str, Any]) -> None:
    (message,) = EventStreamDecoder().feed(bytes.fromhex(case["hex"]))
    assert message.headers == {k: _expected(v) for k, v in case["headers"].items()}
    assert message.payload == bytes.fromhex(case["payload"])


def test_the_reference_messages_decode_one_after_another_cut_anywhere() -> None:
    stream = b"".join(bytes.fromhex(c["hex"]) for c in VECTORS["positive"])
    whole = _all([stream])
    assert len(whole) == len(VECTORS["positive"])
    for cut in range(1, len(stream), 5):
        assert _all([stream[:cut], stream[cut:]]) == whole


@pytest.mark.parametrize("case", VECTORS["negative"], ids=lambda c: c["name"])
def test_the_formats_corrupted_reference_messages_are_refused(case: dict[str, Any]) -> None:
    with pytest.raises(EventStreamFrameError):
        EventStreamDecoder().feed(bytes.fromhex(case["hex"]))
