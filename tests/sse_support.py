"""What the SSE decoder's tests share: a whole decode, its data, and ways to cut the bytes."""

from __future__ import annotations

from rillet.frames import DEFAULT_MAX_FRAME, SSEDecoder, SSEEvent

BOM = b"\xef\xbb\xbf"
EMOJI = "😀".encode()  # four bytes


def decode(*chunks: bytes, max_frame: int = DEFAULT_MAX_FRAME) -> list[SSEEvent]:
    """The events of the chunks fed in turn, the decoder then closed."""
    decoder = SSEDecoder(max_frame=max_frame)
    out: list[SSEEvent] = []
    for chunk in chunks:
        out += decoder.feed(chunk)
    out += decoder.close()
    return out


def datas(*chunks: bytes) -> list[str]:
    """The data of each event `decode` gives."""
    return [event.data for event in decode(*chunks)]


def bytewise(data: bytes) -> list[bytes]:
    """`data` one byte a chunk."""
    return [data[i : i + 1] for i in range(len(data))]
