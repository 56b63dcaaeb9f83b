"""The SSE decoder keeps every WHATWG event-stream rule, whatever the chunking (the encoder's
tests: `test_sse_encode`)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rillet import FrameTooLarge, RilletError
from rillet._core._errors import SSEErrorField
from rillet.frames import DEFAULT_MAX_FRAME, SSEDecoder, SSEEvent

from ..sse_support import BOM, EMOJI, bytewise, datas, decode
from ..wire_cases import cut_at

# --- BOM --------------------------------------------------------------------------------------


def test_a_leading_bom_is_stripped() -> None:
    assert datas(BOM + b"data: a\n\n") == ["a"]


def test_a_leading_bom_split_across_chunks_is_stripped() -> None:
    assert datas(*bytewise(BOM + b"data: a\n\n")) == ["a"]


def test_only_one_leading_bom_is_stripped() -> None:
    # the second BOM is part of the first line's field name, so that line is an unknown field
    assert datas(BOM + BOM + b"data: a\n\ndata: b\n\n") == ["b"]


def test_a_bom_after_the_start_is_not_stripped() -> None:
    assert datas(b"data: a\n\n" + BOM + b"data: b\n\n") == ["a"]
    assert datas(b"data: a\n\n", BOM + b"data: b\n\n") == ["a"]


def test_a_bom_inside_a_value_is_kept() -> None:
    assert datas(BOM + b"data: \xef\xbb\xbfx\n\n") == ["\ufeffx"]


# --- line ends --------------------------------------------------------------------------------


@pytest.mark.parametrize("end", [b"\n", b"\r", b"\r\n"], ids=["LF", "CR", "CRLF"])
def test_every_line_end_works(end: bytes) -> None:
    stream = b"data: a" + end + b"data: b" + end + end + b"data: c" + end + end
    assert datas(stream) == ["a\nb", "c"]
    assert datas(*bytewise(stream)) == ["a\nb", "c"]


def test_mixed_line_ends_in_one_stream() -> None:
    assert datas(b"data: a\rdata: b\ndata: c\r\n\r\ndata: d\n\r") == ["a\nb\nc", "d"]


def test_a_crlf_split_across_chunks_counts_once() -> None:
    assert datas(b"data: a\r", b"\ndata: b\r\n\r\n") == ["a\nb"]


def test_a_crlf_split_by_an_empty_chunk_counts_once() -> None:
    assert datas(b"data: a\r", b"", b"\ndata: b\r\n\r\n") == ["a\nb"]


def test_a_lone_cr_ends_its_line_at_once() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: a\r\r") == [SSEEvent("a")]


def test_cr_cr_across_chunks_is_a_blank_line() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: a\r") == []
    assert decoder.feed(b"\r") == [SSEEvent("a")]


# --- fields -----------------------------------------------------------------------------------


def test_comment_lines_are_skipped_and_counted() -> None:
    decoder = SSEDecoder()
    out = decoder.feed(b": keep-alive\n\ndata: a\n: in between\ndata: b\n\n:\n\n")
    assert out == [SSEEvent("a\nb")]
    assert decoder.comments == 3
    assert decoder.frames == 1


def test_a_field_without_a_colon_has_an_empty_value() -> None:
    assert datas(b"data\n\n") == [""]
    assert datas(b"data\ndata\n\n") == ["\n"]
    assert decode(b"event: x\nevent\ndata: a\n\n") == [SSEEvent("a", "message")]


def test_an_unknown_field_is_ignored() -> None:
    assert decode(b"foo: bar\ndata: a\nDATA: b\n\n") == [SSEEvent("a")]


def test_exactly_one_leading_space_is_removed() -> None:
    assert datas(b"data:a\n\n") == ["a"]
    assert datas(b"data: a\n\n") == ["a"]
    assert datas(b"data:  a\n\n") == [" a"]
    assert datas(b"data:\ta\n\n") == ["\ta"]
    assert datas(b"data: a \n\n") == ["a "]
    assert decode(b"event:  x\ndata: 1\n\n") == [SSEEvent("1", " x")]
    assert decode(b"id:  7\ndata: 1\n\n") == [SSEEvent("1", "message", " 7")]


def test_a_value_may_contain_colons() -> None:
    assert datas(b'data: {"a": "b:c"}\n\n') == ['{"a": "b:c"}']


def test_multi_line_data_is_joined_with_lf() -> None:
    assert datas(b"data: a\ndata: b\ndata: c\n\n") == ["a\nb\nc"]
    assert datas(b"data: a\ndata:\n\n") == ["a\n"]
    assert datas(b"data:\ndata: a\n\n") == ["\na"]


def test_empty_data_dispatches_an_empty_string() -> None:
    assert decode(b"data:\n\n") == [SSEEvent("")]
    assert decode(b"data: \n\n") == [SSEEvent("")]


def test_an_id_containing_nul_is_ignored() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"id: 1\ndata: a\n\nid: 2\x003\ndata: b\n\n") == [
        SSEEvent("a", "message", "1"),
        SSEEvent("b", "message", "1"),
    ]
    assert decoder.last_event_id == "1"


def test_an_empty_id_resets_it() -> None:
    assert decode(b"id: 5\ndata: a\n\nid\ndata: b\n\nid: 6\ndata: c\n\nid:\ndata: d\n\n") == [
        SSEEvent("a", "message", "5"),
        SSEEvent("b", "message", ""),
        SSEEvent("c", "message", "6"),
        SSEEvent("d", "message", ""),
    ]


def test_the_id_persists_across_events() -> None:
    assert decode(b"id: 9\ndata: a\n\ndata: b\n\n") == [
        SSEEvent("a", "message", "9"),
        SSEEvent("b", "message", "9"),
    ]


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (b"retry: 3000", 3000),
        (b"retry:0", 0),
        (b"retry: 007", 7),
        (b"retry: 30a0", None),
        (b"retry: -1", None),
        (b"retry: 1.5", None),
        (b"retry: ", None),
        (b"retry", None),
        (b"retry: +5", None),
        (b"retry:  5", None),
        ("retry: ３".encode(), None),
        ("retry: ²".encode(), None),
    ],
)
def test_retry_is_accepted_only_when_all_ascii_digits(line: bytes, expected: int | None) -> None:
    decoder = SSEDecoder()
    assert decoder.feed(line + b"\n\n") == []
    assert decoder.retry == expected


def test_an_invalid_retry_keeps_the_last_valid_one() -> None:
    decoder = SSEDecoder()
    decoder.feed(b"retry: 100\n\nretry: x\n\n")
    assert decoder.retry == 100


def test_a_block_without_data_dispatches_nothing_but_commits_its_id() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"id: 7\n\n") == []
    assert decoder.last_event_id == "7"
    assert decoder.frames == 0
    assert decoder.feed(b"data: x\n\n") == [SSEEvent("x", "message", "7")]


def test_an_id_is_committed_only_by_the_blank_line() -> None:
    decoder = SSEDecoder()
    decoder.feed(b"id: 1\ndata: a\n\nid: 2\n")
    assert decoder.last_event_id == "1"
    decoder.feed(b"\n")
    assert decoder.last_event_id == "2"


def test_the_event_name_is_reset_after_each_dispatch() -> None:
    assert decode(b"event: ping\ndata: 1\n\ndata: 2\n\n") == [
        SSEEvent("1", "ping"),
        SSEEvent("2", "message"),
    ]


def test_the_event_name_is_reset_by_a_block_without_data() -> None:
    assert decode(b"event: foo\n\ndata: x\n\n") == [SSEEvent("x", "message")]


def test_an_empty_event_name_is_message() -> None:
    assert decode(b"event:\ndata: x\n\n") == [SSEEvent("x", "message")]


def test_an_unfinished_event_at_eof_is_discarded() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: a\n\ndata: b\n") == [SSEEvent("a")]
    assert decoder.close() == []
    decoder = SSEDecoder()
    assert decoder.feed(b"data: a") == []
    assert decoder.close() == []
    assert decoder.frames == 0


def test_frames_and_offset_count_what_was_fed() -> None:
    decoder = SSEDecoder()
    decoder.feed(b"data: a\n\nda")
    decoder.feed(b"ta: b\n\n")
    assert decoder.frames == 2
    assert decoder.offset == len(b"data: a\n\ndata: b\n\n")


# --- UTF-8 ------------------------------------------------------------------------------------


def test_a_four_byte_character_cut_into_single_bytes_is_reassembled() -> None:
    out = datas(b"data: <", *bytewise(EMOJI), b">\n\n")
    assert out == ["<😀>"]
    assert "\ufffd" not in out[0]


@pytest.mark.parametrize("text", ["é", "€", "你好", "😀👋🏽", "ﬀ"])
def test_multi_byte_text_survives_every_cut(text: str) -> None:
    stream = f"event: é{text}\nid: {text}\ndata: {text}\n\n".encode()
    for cut in range(len(stream) + 1):
        assert decode(stream[:cut], stream[cut:]) == [SSEEvent(text, "é" + text, text)]


def test_invalid_utf8_is_replaced_and_the_stream_goes_on() -> None:
    out = decode(b"data: a\xffb\n\nevent: \xc3\ndata: \xe2\x82\ndata: ok\n\ndata: next\n\n")
    assert out == [
        SSEEvent("a\ufffdb"),
        SSEEvent("\ufffd\nok", "\ufffd"),
        SSEEvent("next"),
    ]


def test_invalid_utf8_fed_bytewise_is_replaced_the_same_way() -> None:
    stream = b"data: a\xffb\xf0\x9f\x98\n\ndata: \xed\xa0\x80z\n\n"
    assert decode(*bytewise(stream)) == decode(stream)
    assert decode(stream)[0].data == "a\ufffdb\ufffd"


def test_a_truncated_character_at_eof_does_not_raise() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: \xf0\x9f") == []
    assert decoder.close() == []


# --- the frame-size cap -----------------------------------------------------------------------


def test_the_default_cap_is_32_mib() -> None:
    assert DEFAULT_MAX_FRAME == 32 * 1024 * 1024
    assert SSEDecoder().max_frame == DEFAULT_MAX_FRAME


def test_a_frame_just_under_the_default_cap_passes() -> None:
    payload = b"x" * (DEFAULT_MAX_FRAME - 16)
    assert datas(b"data: " + payload + b"\n\n") == [payload.decode()]


def test_a_long_line_over_the_default_cap_raises() -> None:
    with pytest.raises(FrameTooLarge) as info:
        decode(b"data: " + b"x" * DEFAULT_MAX_FRAME + b"\n\n")
    assert info.value.limit == DEFAULT_MAX_FRAME
    assert info.value.size > DEFAULT_MAX_FRAME


@pytest.mark.parametrize("field", [b"data: ", b"event: ", b"id: ", b"other: ", b"data"])
def test_a_long_complete_line_of_any_field_raises(field: bytes) -> None:
    with pytest.raises(FrameTooLarge):
        decode(field + b"x" * 200 + b"\n\n", max_frame=100)


@pytest.mark.parametrize("field", [b"data: ", b"event: ", b"id: ", b"other: "])
def test_a_long_unfinished_line_raises(field: bytes) -> None:
    decoder = SSEDecoder(max_frame=100)
    with pytest.raises(FrameTooLarge):
        decoder.feed(field + b"x" * 200)


def test_a_long_multi_line_event_raises() -> None:
    with pytest.raises(FrameTooLarge):
        decode(b"data: 0123456789\n" * 20 + b"\n", max_frame=100)


def drip(decoder: SSEDecoder, chunk: bytes, times: int) -> tuple[int, RilletError | None]:
    """Feed `chunk` again and again: how many bytes went in up to the call that raised, and
    what it raised."""
    fed = 0
    for _ in range(times):
        fed += len(chunk)
        try:
            decoder.feed(chunk)
        except RilletError as exc:
            return fed, exc
    return fed, None


def test_a_long_multi_line_event_raises_before_it_ends() -> None:
    fed, error = drip(SSEDecoder(max_frame=100), b"data: 0123456789\n", 20)
    assert isinstance(error, FrameTooLarge)
    assert fed <= 17 * 10  # ten lines hold 100 bytes of data: the cap


def test_the_cap_is_configurable() -> None:
    assert datas(b"data: " + b"x" * 150 + b"\n\n") == ["x" * 150]
    with pytest.raises(FrameTooLarge) as info:
        decode(b"data: " + b"x" * 150 + b"\n\n", max_frame=100)
    assert info.value.limit == 100
    with pytest.raises(ValueError, match="positive"):
        SSEDecoder(max_frame=0)


def test_the_cap_is_per_frame_not_per_stream() -> None:
    decoder = SSEDecoder(max_frame=64)
    events: list[SSEEvent] = []
    for i in range(1000):
        events += decoder.feed(f"id: {i}\ndata: {'y' * 40}\n\n".encode())
    assert len(events) == 1000


def test_the_decoder_holds_at_most_one_frame_of_a_dripped_line() -> None:
    decoder = SSEDecoder(max_frame=100)
    decoder.feed(b"data: ")
    fed, error = drip(decoder, b"xxxxx", 1000)
    # it refused the line as soon as the buffered part went past the cap
    assert isinstance(error, FrameTooLarge)
    assert 100 < 6 + fed <= 100 + 5


def test_a_long_line_in_small_chunks_arrives_whole() -> None:
    # a 4 MiB inline image in one data line, read 1 KiB at a time (its cost is in bench/)
    payload = b"A" * (4 * 1024 * 1024)
    stream = b"data: " + payload + b"\n\n"
    decoder = SSEDecoder(max_frame=8 * 1024 * 1024)
    events = [e for i in range(0, len(stream), 1024) for e in decoder.feed(stream[i : i + 1024])]
    assert [len(e.data) for e in events] == [len(payload)]


def test_a_frame_too_large_error_is_a_rillet_error_with_its_facts() -> None:
    with pytest.raises(RilletError) as info:
        decode(b"data: " + b"x" * 300, max_frame=100)
    error = info.value
    assert isinstance(error, FrameTooLarge)
    assert error.limit == 100
    assert error.offset is not None
    assert "100" in str(error)


# --- chunking never changes the result, and nothing escapes but typed errors -------------------

SSE_PIECES = st.sampled_from(
    [
        b"data:",
        b"data: ",
        b"event: ",
        b"id: ",
        b"id",
        b"retry: 12",
        b"retry: x",
        b": c",
        b"\n",
        b"\r",
        b"\r\n",
        b"\n\n",
        b"\r\n\r\n",
        b"a",
        b"xyz",
        b":",
        b" ",
        b"\x00",
        b"\xff",
        b"\xc3",
        b"\xa9",
        "é".encode(),
        EMOJI,
        EMOJI[:2],
        BOM,
    ]
)
SSE_STREAMS = st.lists(SSE_PIECES, max_size=40).map(b"".join) | st.binary(max_size=200)


def _outcome(chunks: list[bytes]) -> tuple[list[SSEEvent], str, int | None, int]:
    decoder = SSEDecoder()
    events: list[SSEEvent] = []
    for chunk in chunks:
        events += decoder.feed(chunk)
    events += decoder.close()
    return events, decoder.last_event_id, decoder.retry, decoder.comments


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stream=SSE_STREAMS, data=st.data())
def test_every_chunking_yields_the_same_events(stream: bytes, data: st.DataObject) -> None:
    whole = _outcome([stream])
    assert _outcome(bytewise(stream)) == whole
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=10))
    assert _outcome(cut_at(stream, cuts)) == whole


@settings(max_examples=300, deadline=None)
@given(stream=SSE_STREAMS, cap=st.integers(1, 64), data=st.data())
def test_arbitrary_bytes_raise_only_typed_errors(
    stream: bytes, cap: int, data: st.DataObject
) -> None:
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=6))
    decoder = SSEDecoder(max_frame=cap)
    try:
        for chunk in cut_at(stream, cuts):
            for event in decoder.feed(chunk):
                assert isinstance(event.data, str)
        decoder.close()
    except RilletError:
        pass


# --- what a chunk completes before an oversized frame (F26) -------------------------------------


def test_events_before_an_oversized_frame_in_the_same_chunk_arrive_first() -> None:
    decoder = SSEDecoder(max_frame=100)
    chunk = b"data: a\n\ndata: b\n\ndata: " + b"x" * 200 + b"\n\ndata: c\n\n"
    assert decoder.feed(chunk) == [SSEEvent("a"), SSEEvent("b")]
    with pytest.raises(FrameTooLarge) as info:
        decoder.feed(b"data: d\n\n")
    assert info.value.limit == 100
    with pytest.raises(FrameTooLarge):  # and every call after it
        decoder.close()


def test_events_before_an_oversized_unfinished_frame_in_the_same_chunk_arrive_first() -> None:
    decoder = SSEDecoder(max_frame=100)
    assert decoder.feed(b"data: a\n\ndata: " + b"x" * 200) == [SSEEvent("a")]
    with pytest.raises(FrameTooLarge):
        decoder.close()


def _until_too_large(chunks: list[bytes], cap: int) -> tuple[list[SSEEvent], bool]:
    decoder = SSEDecoder(max_frame=cap)
    events: list[SSEEvent] = []
    try:
        for chunk in chunks:
            events += decoder.feed(chunk)
        events += decoder.close()
    except FrameTooLarge:
        return events, True
    return events, False


@settings(max_examples=100, deadline=None)
@given(cuts=st.lists(st.integers(0, 260), max_size=8))
def test_what_arrives_before_an_oversized_frame_does_not_depend_on_the_chunking(
    cuts: list[int],
) -> None:
    stream = b"data: a\n\nevent: e\ndata: b\n\ndata: " + b"x" * 200 + b"\n\ndata: c\n\n"
    whole = _until_too_large([stream], 100)
    assert whole == ([SSEEvent("a"), SSEEvent("b", "e")], True)
    assert _until_too_large(bytewise(stream), 100) == whole
    assert _until_too_large(cut_at(stream, cuts), 100) == whole


@pytest.mark.parametrize("size", [100_000, 5 * 1024 * 1024])
def test_a_large_frame_under_the_default_cap_passes(size: int) -> None:
    # a Responses `response.completed` repeating a long answer, a Gemini inline image
    payload = b"A" * size
    stream = b"data: " + payload + b"\n\n"
    decoder = SSEDecoder()
    events = [e for i in range(0, len(stream), 4096) for e in decoder.feed(stream[i : i + 4096])]
    assert [len(e.data) for e in events] == [size]


# --- comments never pile up, a `retry` line counts when its line ends (F58) ---------------------


def test_keep_alive_comments_without_blank_lines_do_not_accumulate() -> None:
    decoder = SSEDecoder(max_frame=100)
    for _ in range(10_000):
        assert decoder.feed(b": ping\n") == []
    assert decoder.comments == 10_000
    assert decoder.feed(b"data: a\n\n") == [SSEEvent("a")]


def test_keep_alive_comments_after_a_field_line_do_not_accumulate() -> None:
    decoder = SSEDecoder(max_frame=100)
    assert decoder.feed(b"data: a\n") == []
    for _ in range(10_000):
        assert decoder.feed(b": keep-alive\n") == []
    assert decoder.feed(b"data: b\n\n") == [SSEEvent("a\nb")]
    assert decoder.comments == 10_000


def test_comments_dripped_one_byte_at_a_time_do_not_accumulate() -> None:
    decoder = SSEDecoder(max_frame=16)
    for byte in bytewise(b": a longer keep-alive comment\n" * 50 + b"data: x\n\n"):
        out = decoder.feed(byte)
    assert out == [SSEEvent("x")]
    assert decoder.comments == 50


def test_a_long_unfinished_comment_line_is_dropped_as_it_arrives() -> None:
    decoder = SSEDecoder(max_frame=100)
    decoder.feed(b": ")
    for _ in range(1000):
        assert decoder.feed(b"xxxxx") == []
    assert decoder.feed(b"\ndata: a\n\n") == [SSEEvent("a")]
    assert decoder.comments == 1


def test_comments_inside_a_block_do_not_count_toward_the_cap() -> None:
    stream = b"data: a\n" + b": " + b"c" * 200 + b"\ndata: b\n\n"
    assert decode(stream, max_frame=100) == [SSEEvent("a\nb")]
    assert decode(*bytewise(stream), max_frame=100) == [SSEEvent("a\nb")]


def test_f58_a_retry_line_in_a_block_that_never_completes_sets_the_reconnection_time() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: a\n\nretry: 3000\ndata: never dispatched") == [SSEEvent("a")]
    assert decoder.close() == []
    assert decoder.retry == 3000


def test_f58_a_retry_line_not_ended_at_eof_is_not_a_line() -> None:
    decoder = SSEDecoder()
    decoder.feed(b"retry: 1000\n\ndata: x\nretry: 3000")
    decoder.close()
    assert decoder.retry == 1000


@pytest.mark.parametrize("cut", range(1, 20))
def test_f58_the_retry_line_counts_however_the_block_was_cut(cut: int) -> None:
    stream = b"retry: 3000\nid: 4\ndata: x"
    decoder = SSEDecoder()
    decoder.feed(stream[:cut])
    decoder.feed(stream[cut:])
    decoder.close()
    assert decoder.retry == 3000
    assert decoder.last_event_id == ""  # an id is committed only by a dispatch


def test_raw_hands_a_one_line_event_on_as_its_data_bytes() -> None:
    stream = (
        b'data: {"a":"\xc3\xa9"}\n\n'  # the commonest event: its data's bytes, as they came
        b"data: bad \xff byte\n\n"  # bytes that are not UTF-8 too: the reader replaces them
        b"event: named\ndata: x\n\n"  # a named event: its name and its data's bytes
        b"data: two\ndata: lines\n\n"  # several data lines: an SSEEvent
        b"id: 7\ndata: y\n\n"  # an id line: an SSEEvent
    )
    raw, plain = SSEDecoder(), SSEDecoder()
    raw.raw = True
    got: list[Any] = list(raw.feed(stream))
    want = plain.feed(stream)
    assert got[:3] == ['{"a":"é"}'.encode(), b"bad \xff byte", ("named", b"x")]
    assert got[3:] == want[3:]
    as_events = [SSEEvent(g.decode("utf-8", "replace")) for g in got[:2]]
    assert [*as_events, SSEEvent(got[2][1].decode(), got[2][0])] == want[:3]
    assert (raw.frames, raw.last_event_id) == (plain.frames, plain.last_event_id) == (5, "7")


CRLF_BLOCKS = st.sampled_from(
    [
        b'data: {"a": "\xc3\xa9"}',
        b"data: x",
        b"data:",
        b"event: e\r\ndata: y",
        b"id: 3\r\ndata: z",
        b": ping",
        b": data: not an event",
        b"retry: 5",
        b"data: \xff",
    ]
)
# mostly the CRLF blank line of a CRLF stream, now and then another line end or blank line
CRLF_ENDS = st.sampled_from([b"\r\n\r\n"] * 8 + [b"\n\n", b"\r\r", b"\r\n\n", b"\n\r\n", b"\r\n"])


def _counts(chunks: list[bytes]) -> list[int]:
    """How many events had come out after each chunk."""
    decoder = SSEDecoder()
    counts, n = [], 0
    for chunk in chunks:
        n += len(decoder.feed(chunk))
        counts.append(n)
    return counts


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(blocks=st.lists(st.tuples(CRLF_BLOCKS, CRLF_ENDS), max_size=30), data=st.data())
def test_crlf_streams_read_alike_in_any_chunking(
    blocks: list[tuple[bytes, bytes]], data: st.DataObject
) -> None:
    # chunks of whole CRLF blocks take a step of their own; one byte at a time never does
    stream = b"".join(block + end for block, end in blocks)
    reference = _outcome(bytewise(stream))
    assert _outcome([stream]) == reference
    chunks = cut_at(stream, data.draw(st.lists(st.integers(0, len(stream)), max_size=12)))
    assert _outcome(chunks) == reference
    # and each event comes out with the chunk that completes it, as byte by byte
    by_byte = [0, *_counts(bytewise(stream))]  # after 0, 1, 2, ... bytes
    ends = [sum(len(c) for c in chunks[: i + 1]) for i in range(len(chunks))]
    assert _counts(chunks) == [by_byte[end] for end in ends]
    for cut in range(len(stream) + 1):
        assert _counts([stream[:cut], stream[cut:]]) == [by_byte[cut], by_byte[-1]]


# --- an `error:` line: the report llama.cpp-family servers write for a failed stream -----------

LLAMA_FAILED = (
    b'data: {"choices":[{"delta":{"content":"Hi"}}]}\n\n'
    b'error: {"code":400,"message":"the request exceeds the available context size, try'
    b' increasing it","type":"invalid_request_error"}\n\n'
    b"data: [DONE]\n\n"
)


def _until_failed(chunks: list[bytes]) -> tuple[list[SSEEvent], SSEErrorField]:
    """The events given before the stream's `error:` line, and the error it ends with."""
    decoder = SSEDecoder()
    out: list[SSEEvent] = []
    try:
        for chunk in chunks:
            out += decoder.feed(chunk)
        decoder.close()
    except SSEErrorField as error:
        return out, error
    raise AssertionError("the stream ended without its error")


@pytest.mark.parametrize("cut", [None, 1], ids=["whole", "bytewise"])
def test_an_error_line_ends_the_stream_with_its_text_after_the_events_before_it(
    cut: int | None,
) -> None:
    chunks = [LLAMA_FAILED] if cut is None else bytewise(LLAMA_FAILED)
    out, error = _until_failed(chunks)
    assert [e.data for e in out] == ['{"choices":[{"delta":{"content":"Hi"}}]}']
    assert error.text.startswith('{"code":400,"message":"the request exceeds the available')
    assert "[DONE]" not in error.text  # nothing after the report is read


@pytest.mark.parametrize(
    ("line", "text"),
    [
        (b'error: {"detail": "failed to decode the prompt"}\n\n', '{"detail": "failed to decode'),
        (b"error: the model crashed\n\n", "the model crashed"),
        (b"error:no space\r\n\r\n", "no space"),
        (b"error: cut at the end of the stream\n", "cut at the end"),  # no blank line after it
    ],
    ids=["detail-json", "plain-text", "crlf-no-space", "at-eof"],
)
def test_an_error_line_of_any_shape_is_read(line: bytes, text: str) -> None:
    out, error = _until_failed([b": keep-alive\n\n", line])
    assert out == []
    assert error.text.startswith(text)


def test_an_error_line_is_bounded() -> None:
    _, error = _until_failed([b"error: " + b"x" * 100_000 + b"\n\n"])
    assert len(error.text) == 4096


def test_a_field_named_otherwise_is_still_ignored() -> None:
    # only `error` is read: `errors:`, `Error:` and `x-error:` stay unknown fields (WHATWG)
    assert decode(b"errors: a\nError: b\nx-error: c\ndata: d\n\n") == [SSEEvent("d")]
