"""The NDJSON decoder: one line per JSON value however the bytes are cut, blank lines and CRLF
tolerated, a cut-off last line dropped, and typed errors that say where the bad line was."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rillet import FrameEncodingError, FrameTooLarge, RilletError
from rillet.frames import DEFAULT_MAX_FRAME, NDJSONDecoder

from ..wire_cases import cut_at

STREAM = '{"a":1}\n{"b":"é😀"}\n{"c":[1,2,3]}\n'.encode()
LINES = ['{"a":1}', '{"b":"é😀"}', '{"c":[1,2,3]}']


def decode(*chunks: bytes, max_frame: int = DEFAULT_MAX_FRAME) -> list[str]:
    decoder = NDJSONDecoder(max_frame=max_frame)
    out: list[str] = []
    for chunk in chunks:
        out += decoder.feed(chunk)
    out += decoder.close()
    return out


def test_lines_come_out_as_text() -> None:
    assert decode(STREAM) == LINES


@pytest.mark.parametrize("cut", range(len(STREAM) + 1))
def test_lines_split_at_any_point(cut: int) -> None:
    assert decode(STREAM[:cut], STREAM[cut:]) == LINES


def test_lines_fed_one_byte_at_a_time() -> None:
    assert decode(*[STREAM[i : i + 1] for i in range(len(STREAM))]) == LINES


def test_a_line_comes_out_as_soon_as_its_lf_arrives() -> None:
    decoder = NDJSONDecoder()
    assert decoder.feed(b'{"a":1}') == []
    assert decoder.feed(b"\n{") == ['{"a":1}']


def test_blank_lines_are_skipped() -> None:
    assert decode(b'\n\n{"a":1}\n\r\n  \n\t\n{"b":2}\n\n') == ['{"a":1}', '{"b":2}']


def test_crlf_line_ends() -> None:
    assert decode(b'{"a":1}\r\n{"b":2}\r\n') == ['{"a":1}', '{"b":2}']
    assert decode(b'{"a":1}\r', b'\n{"b":2}\r', b"\n") == ['{"a":1}', '{"b":2}']


def test_a_final_unterminated_line_that_parses_is_data() -> None:
    decoder = NDJSONDecoder()
    assert decoder.feed(b'{"a":1}\n{"done":true}') == ['{"a":1}']
    assert decoder.close() == ['{"done":true}']
    assert decoder.frames == 2


def test_a_final_unterminated_line_with_a_cr_is_data() -> None:
    assert decode(b'{"a":1}\r') == ['{"a":1}']


def test_a_final_unterminated_line_that_does_not_parse_is_dropped() -> None:
    decoder = NDJSONDecoder()
    assert decoder.feed(b'{"a":1}\n{"message":{"content":"hal') == ['{"a":1}']
    assert decoder.close() == []
    assert decoder.frames == 1


def test_a_final_line_cut_inside_a_character_is_a_truncation() -> None:
    decoder = NDJSONDecoder()
    cut = '{"content":"caf😀"}'.encode()[:-4]  # ends inside the emoji
    assert decoder.feed(b'{"a":1}\n' + cut) == ['{"a":1}']
    assert decoder.close() == []


def test_a_final_whitespace_line_is_nothing() -> None:
    assert decode(b'{"a":1}\n  \r') == ['{"a":1}']


def test_invalid_utf8_in_a_line_raises_with_its_position() -> None:
    decoder = NDJSONDecoder()
    stream = b'{"a":1}\n\n{"b":"\xff"}\n{"c":3}\n'
    assert decoder.feed(stream) == ['{"a":1}']  # the line before it still arrives
    with pytest.raises(FrameEncodingError) as info:
        decoder.feed(b'{"d":4}\n')
    assert info.value.offset == stream.index(b'{"b"')
    assert info.value.frame_index == 1
    assert isinstance(info.value, RilletError)


def test_invalid_utf8_in_a_line_fed_bytewise_raises_the_same() -> None:
    stream = b'{"a":1}\n{"b":"\xc3("}\n'
    with pytest.raises(FrameEncodingError) as info:
        decode(*[stream[i : i + 1] for i in range(len(stream))])
    assert info.value.offset == 8
    assert info.value.frame_index == 1


def test_invalid_utf8_in_the_middle_of_a_final_unterminated_line_raises() -> None:
    decoder = NDJSONDecoder()
    decoder.feed(b'{"a":1}\n{"b":"\xff"}')
    with pytest.raises(FrameEncodingError) as info:
        decoder.close()
    assert info.value.offset == 8
    assert info.value.frame_index == 1


def test_a_long_terminated_line_raises_with_its_offset() -> None:
    stream = b'{"a":1}\n' + b'{"b":"' + b"x" * 200 + b'"}\n'
    with pytest.raises(FrameTooLarge) as info:
        decode(stream, max_frame=100)
    assert info.value.limit == 100
    assert info.value.size > 100
    assert info.value.offset == 8


def test_a_long_unterminated_line_raises_before_it_ends() -> None:
    decoder = NDJSONDecoder(max_frame=100)
    decoder.feed(b'{"a":1}\n{"b":"')
    fed = 14
    error: RilletError | None = None
    for _ in range(1000):
        fed += 5
        try:
            decoder.feed(b"xxxxx")
        except RilletError as exc:
            error = exc
            break
    assert isinstance(error, FrameTooLarge)
    assert 100 < fed - 8 <= 100 + 5  # refused as soon as the line went past the cap
    assert error.offset == 8


def test_a_long_unterminated_line_in_a_chunk_with_a_newline_raises() -> None:
    decoder = NDJSONDecoder(max_frame=100)
    assert decoder.feed(b'{"a":1}\n' + b"y" * 150) == ['{"a":1}']
    with pytest.raises(FrameTooLarge) as info:
        decoder.close()
    assert info.value.offset == 8


def test_a_long_line_in_small_chunks_arrives_whole() -> None:
    # a 16 MiB line read 1 KiB at a time (its cost is in bench/)
    line = json.dumps({"images": ["A" * (16 * 1024 * 1024)]}).encode() + b"\n"
    decoder = NDJSONDecoder(max_frame=32 * 1024 * 1024)
    out = [x for i in range(0, len(line), 1024) for x in decoder.feed(line[i : i + 1024])]
    assert out == [line[:-1].decode()]


def test_the_default_cap_is_32_mib_and_configurable() -> None:
    assert NDJSONDecoder().max_frame == DEFAULT_MAX_FRAME == 32 * 1024 * 1024
    line = json.dumps({"x": "y" * (DEFAULT_MAX_FRAME - 20)}).encode()
    assert decode(line + b"\n") == [line.decode()]
    with pytest.raises(FrameTooLarge):
        decode(json.dumps({"x": "y" * DEFAULT_MAX_FRAME}).encode() + b"\n")
    with pytest.raises(ValueError, match="positive"):
        NDJSONDecoder(max_frame=0)


def test_the_cap_is_per_line_not_per_stream() -> None:
    decoder = NDJSONDecoder(max_frame=32)
    out: list[str] = []
    for i in range(500):
        out += decoder.feed(f'{{"i":{i}}}\n'.encode())
    assert len(out) == 500
    assert decoder.frames == 500


def test_offset_counts_every_byte_fed() -> None:
    decoder = NDJSONDecoder()
    decoder.feed(STREAM[:5])
    decoder.feed(STREAM[5:])
    assert decoder.offset == len(STREAM)


NDJSON_PIECES = st.sampled_from(
    [b'{"a":1}', b"[1,", b"2]", b"\n", b"\r\n", b"\r", b" ", b'"', b"\xff", b"\xc3", "é".encode()]
)
NDJSON_STREAMS = st.lists(NDJSON_PIECES, max_size=30).map(b"".join) | st.binary(max_size=200)


def _outcome(chunks: list[bytes], cap: int) -> tuple[list[str], type[BaseException] | None]:
    decoder = NDJSONDecoder(max_frame=cap)
    out: list[str] = []
    try:
        for chunk in chunks:
            out += decoder.feed(chunk)
        out += decoder.close()
    except RilletError as exc:
        return out, type(exc)
    return out, None


@settings(max_examples=300, deadline=None)
@given(stream=NDJSON_STREAMS, cap=st.integers(1, 64), data=st.data())
def test_arbitrary_bytes_raise_only_typed_errors(
    stream: bytes, cap: int, data: st.DataObject
) -> None:
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=6))
    lines, _ = _outcome(cut_at(stream, cuts), cap)
    assert all(isinstance(line, str) and line.strip() for line in lines)


@settings(max_examples=200, deadline=None)
@given(stream=NDJSON_STREAMS, data=st.data())
def test_every_chunking_yields_the_same_lines(stream: bytes, data: st.DataObject) -> None:
    whole, error = _outcome([stream], DEFAULT_MAX_FRAME)
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=8))
    chunked, chunked_error = _outcome(cut_at(stream, cuts), DEFAULT_MAX_FRAME)
    assert chunked_error == error
    if error is None:
        assert chunked == whole


# --- what a chunk completes before an oversized line (F26) --------------------------------------


def test_lines_before_an_oversized_line_in_the_same_chunk_arrive_first() -> None:
    decoder = NDJSONDecoder(max_frame=100)
    chunk = b'{"a":1}\n{"b":2}\n' + b"y" * 200 + b'\n{"c":3}\n'
    assert decoder.feed(chunk) == ['{"a":1}', '{"b":2}']
    with pytest.raises(FrameTooLarge) as info:
        decoder.feed(b'{"d":4}\n')
    assert info.value.offset == 16
    with pytest.raises(FrameTooLarge):  # and every call after it
        decoder.close()


def _until_error(chunks: list[bytes], cap: int) -> tuple[list[str], type[Exception] | None]:
    decoder = NDJSONDecoder(max_frame=cap)
    lines: list[str] = []
    try:
        for chunk in chunks:
            lines += decoder.feed(chunk)
        lines += decoder.close()
    except RilletError as exc:
        return lines, type(exc)
    return lines, None


@pytest.mark.parametrize(
    "bad", [b"y" * 200 + b"\n", b'{"b":"\xff"}\n'], ids=["too-large", "invalid-utf8"]
)
def test_what_arrives_before_a_bad_line_does_not_depend_on_the_chunking(bad: bytes) -> None:
    stream = b'{"a":1}\n{"b":2}\n' + bad + b'{"c":3}\n'
    whole = _until_error([stream], 100)
    assert whole[0] == ['{"a":1}', '{"b":2}']
    assert whole[1] in (FrameTooLarge, FrameEncodingError)
    assert _until_error([stream[i : i + 1] for i in range(len(stream))], 100) == whole
    for cut in range(len(stream)):
        assert _until_error([stream[:cut], stream[cut:]], 100) == whole


@pytest.mark.parametrize("size", [100_000, 5 * 1024 * 1024])
def test_a_large_line_under_the_default_cap_passes(size: int) -> None:
    line = json.dumps({"images": ["A" * size]}).encode() + b"\n"
    decoder = NDJSONDecoder()
    out = [x for i in range(0, len(line), 4096) for x in decoder.feed(line[i : i + 4096])]
    assert out == [line[:-1].decode()]


@pytest.mark.parametrize(
    "read",
    [
        b'{"a":1}\n{"b":2}\n{"c"',  # the one-step read: whole JSON lines, a cut one after
        b'{"a":1}\n\n{"b":2}\n{"c"',  # a blank line
        b'{"a":1}\n   \n{"b":2}\n{"c"',  # a line of spaces
        b' {"a":1}\n{"b":2}\n{"c"',  # a line that starts with a space
        b'{"a":1}\r\n{"b":2}\r\n{"c"',  # CRLF
        '{"a":"é"}\n{"b":"😀"}\n{"c":"\u00e9'.encode()[:-1],  # UTF-8, cut inside a character
    ],
)
def test_feed_bytes_gives_the_lines_feed_does_as_their_bytes(read: bytes) -> None:
    as_text, as_bytes = NDJSONDecoder(), NDJSONDecoder()
    lines = as_text.feed(read)
    raw = as_bytes.feed_bytes(read)
    assert all(type(line) is bytes for line in raw)
    assert [line.decode("utf-8") for line in raw] == lines
    assert len(lines) == 2
    assert (as_bytes.frames, as_bytes.offset) == (as_text.frames, as_text.offset)
    assert as_bytes.close() == as_text.close()


def test_feed_bytes_refuses_a_line_that_is_not_utf8_after_the_good_ones() -> None:
    decoder = NDJSONDecoder()
    assert decoder.feed_bytes(b'{"a":1}\n{"b":"\xff"}\n') == [b'{"a":1}']
    with pytest.raises(FrameEncodingError):
        decoder.feed_bytes(b"{}\n")
