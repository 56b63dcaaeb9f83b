"""The SSE encoder cannot be made to split a frame, and what it writes decodes back to what it
was given, however it is cut."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rillet import RilletError, SSEEncodeError
from rillet.frames import SSEDecoder, SSEEvent, encode_sse

from ..sse_support import datas, decode
from ..wire_cases import cut_at

# --- the encoder ------------------------------------------------------------------------------


def test_encode_simple_frame() -> None:
    assert encode_sse("hi") == b"data: hi\n\n"
    assert (
        encode_sse("hi", event="e", id="1", retry=5) == b"event: e\nid: 1\nretry: 5\ndata: hi\n\n"
    )
    assert encode_sse(comment="keep-alive") == b": keep-alive\n\n"


@pytest.mark.parametrize("data", ["a\nb", "a\rb", "a\r\nb", "a\n\nb", "\n", "a\r\n", "\r\r\n\n"])
def test_encoded_line_breaks_become_several_data_lines(data: str) -> None:
    frame = encode_sse(data)
    assert frame.count(b"data:") == len(data.replace("\r\n", "\n").replace("\r", "\n").split("\n"))
    (event,) = decode(frame)
    assert event.data == data.replace("\r\n", "\n").replace("\r", "\n")


def test_encoded_empty_data_decodes_to_an_empty_event() -> None:
    assert decode(encode_sse("")) == [SSEEvent("")]


def test_encoded_data_with_a_leading_space_survives() -> None:
    assert datas(encode_sse("  two spaces")) == ["  two spaces"]


def test_encoded_comment_with_line_breaks_stays_a_comment() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(encode_sse(comment="a\ndata: injected\r\nb")) == []
    assert decoder.comments == 3


@pytest.mark.parametrize("bad", ["a\nb", "a\rb", "a\r\nb", "a\x00b", "\n", "x\r"])
@pytest.mark.parametrize("field", ["event", "id"])
def test_line_breaks_or_nul_in_event_or_id_raise(field: str, bad: str) -> None:
    with pytest.raises(SSEEncodeError) as info:
        encode_sse("x", **{field: bad})  # type: ignore[arg-type]
    assert info.value.field == field
    assert isinstance(info.value, RilletError)
    assert isinstance(info.value, ValueError)


def test_a_negative_retry_raises() -> None:
    with pytest.raises(ValueError, match="retry"):
        encode_sse("x", retry=-1)


NAME = st.text(st.characters(exclude_characters="\r\n\x00", exclude_categories=["Cs"]))


@settings(max_examples=200, deadline=None)
@given(data=st.text(), event=NAME, id=NAME, retry=st.none() | st.integers(0, 10**9))
def test_encode_then_decode_round_trips(data: str, event: str, id: str, retry: int | None) -> None:
    decoder = SSEDecoder()
    frame = encode_sse(data, event=event, id=id, retry=retry)
    out = decoder.feed(frame) + decoder.close()
    want = data.replace("\r\n", "\n").replace("\r", "\n")
    assert out == [SSEEvent(want, event or "message", id)]
    assert decoder.retry == retry


@settings(max_examples=100, deadline=None)
@given(texts=st.lists(st.text(), min_size=1, max_size=5), sizes=st.data())
def test_encoded_frames_decode_back_in_any_chunking(texts: list[str], sizes: st.DataObject) -> None:
    stream = b"".join(encode_sse(t, id=str(i)) for i, t in enumerate(texts))
    chunks = cut_at(stream, sizes.draw(st.lists(st.integers(0, len(stream)), max_size=8)))
    want = [
        SSEEvent(t.replace("\r\n", "\n").replace("\r", "\n"), "message", str(i))
        for i, t in enumerate(texts)
    ]
    assert decode(*chunks) == want
