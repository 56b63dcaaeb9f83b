"""A big first read is decoded in pieces: its first events reach a sink before the rest of the
read is decoded, and what arrives is exactly what decoding the read whole gives."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from rillet import (
    Policy,
    RateLimiter,
    RilletError,
    TurnRequest,
    UniEvent,
    encode_json,
    run_turn,
    user,
)
from rillet._core._wire import HEAD_BYTES, HEAD_PIECE
from rillet.lowlevel import WireDecoder
from rillet.providers import (
    AnthropicDialect,
    Dialect,
    GeminiDialect,
    OllamaDialect,
    OpenAIChatDialect,
    OpenAIResponsesDialect,
    Provider,
)
from rillet.transports.testing import openai_text_stream
from rillet.transports.upstream import MemoryReply, MemoryUpstream

if TYPE_CHECKING:
    from collections.abc import Callable

    from rillet._turn._graph import SinkBatch

FRAGMENTS = [f"word{i} " for i in range(200)]
BODY = openai_text_stream(FRAGMENTS)
SSE = {"content-type": "text/event-stream"}


def fragments_of(batch: SinkBatch) -> list[str]:
    texts = []
    for item in batch.uni:
        if isinstance(item, UniEvent):
            for part in json.loads(encode_json(item))["content_items"]:
                if part.get("type") == "text.delta":
                    texts.append(part["text"])
    return texts


class Recorder:
    """A sink with a task of its own: the text fragments of each batch it is given."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []

    async def deliver(self, batch: SinkBatch) -> None:
        self.batches.append(fragments_of(batch))

    async def close(self) -> None:
        pass


class Inline(Recorder):
    """A sink the turn hands each batch to on its own task, as it is decoded."""

    def deliver_nowait(self, batch: SinkBatch) -> bool:
        self.batches.append(fragments_of(batch))
        return True


async def turn_with(pieces: list[bytes], sink: Recorder | None = None) -> Recorder:
    sink = sink or Recorder()
    provider = Provider(OpenAIChatDialect(), "http://first-read.invalid/v1", "m")
    upstream = MemoryUpstream([MemoryReply(pieces, headers=SSE)])
    result = await run_turn(
        TurnRequest(messages=[user("hi")]),
        provider,
        upstream=upstream,
        policy=Policy(random=lambda: 0.0),
        limiter=RateLimiter(),
        sinks=[sink],
    )
    assert result.ok
    assert result.text == "".join(FRAGMENTS)
    return sink


async def test_the_first_delta_of_a_big_first_read_reaches_a_sink_on_its_own() -> None:
    first = BODY[:4096]
    sink = await turn_with([first, BODY[4096:]])
    in_first_read = first.count(b'"content"') - first.count(b'"content":null')
    assert in_first_read >= 10  # the read holds many fragments...
    handed = next(b for b in sink.batches if b)
    # ...but a sink with a task of its own is handed the first ones before the rest of the read
    # is decoded (a frame here is about 290 bytes)
    assert 0 < len(handed) <= 3
    # every fragment arrives exactly once, in order
    assert [t for b in sink.batches for t in b] == FRAGMENTS


async def test_only_the_first_bytes_are_cut_into_pieces() -> None:
    reads = [BODY[:8192], BODY[8192:16384], BODY[16384:]]
    sink = await turn_with(reads, Inline())
    sizes = [len(b) for b in sink.batches if b]
    # a batch a piece until HEAD_BYTES of the body were decoded (each piece past HEAD_PIECE
    # bytes, so at most HEAD_BYTES / HEAD_PIECE + 1 of them)...
    pieces = sizes[:-3]
    assert 2 <= len(pieces) <= HEAD_BYTES // HEAD_PIECE + 1
    assert sum(pieces) <= BODY.count(b"\n\n", 0, HEAD_BYTES + 2 * HEAD_PIECE)
    # ...then the rest of the first read in one, and every later read whole
    assert sum(sizes[-3:]) == len(FRAGMENTS) - sum(pieces)
    assert sizes[-2] == reads[1].count(b'"content":"word')


FIXTURES = Path(__file__).parent.parent / "fixtures" / "providers"
DIALECTS: dict[str, Callable[[], Dialect]] = {
    "anthropic-messages": AnthropicDialect,
    "gemini": GeminiDialect,
    "ollama-chat": OllamaDialect,
    "openai-chat": OpenAIChatDialect,
    "openai-responses": OpenAIResponsesDialect,
}
BODIES = [
    pytest.param(folder, path.read_bytes(), id=f"{folder}/{path.name}")
    for folder in DIALECTS
    for path in sorted((FIXTURES / folder).iterdir())
    if path.suffix in (".sse", ".ndjson")
]
BODIES += [
    pytest.param("openai-chat", BODY, id="openai-chat/text-200"),
    pytest.param("openai-chat", BODY.replace(b"\n", b"\r\n"), id="openai-chat/crlf"),
]


def decoded(folder: str, reads: list[bytes]) -> tuple[list[bytes], str]:
    """The MMSP JSON of every UniEvent the reads decode to, and the error ending them if any."""
    decoder = WireDecoder(DIALECTS[folder](), clock=lambda: 0)
    out: list[Any] = []
    try:
        for read in reads:
            decoder.feed(read, out)
        decoder.close(out)
    except RilletError as exc:
        return [encode_json(e) for e in out], repr(exc)
    return [encode_json(e) for e in out], ""


@pytest.mark.parametrize(("folder", "body"), BODIES)
def test_the_head_pieces_then_the_rest_decode_exactly_what_the_whole_body_does(
    folder: str, body: bytes
) -> None:
    decoder = WireDecoder(DIALECTS[folder](), clock=lambda: 0)
    reads: list[bytes] = []
    rest = body
    while (cut := decoder.head_piece(rest)) and sum(map(len, reads)) < HEAD_BYTES:
        assert rest[:cut].endswith(b"\n")  # a frame ends there
        assert cut > HEAD_PIECE
        reads.append(rest[:cut])
        rest = rest[cut:]
    end = b"\n" if folder == "ollama-chat" else b"\n\n"
    at = body.find(end, HEAD_PIECE)
    if at >= 0 and len(body) - (at + len(end)) >= HEAD_PIECE:
        assert reads  # a frame ends past HEAD_PIECE bytes, well before the body's end: cut
    assert decoded(folder, [*reads, rest]) == decoded(folder, [body])


def test_a_small_read_and_an_unframed_body_are_decoded_whole() -> None:
    decoder = WireDecoder(OpenAIChatDialect(), clock=lambda: 0)
    assert decoder.head_piece(BODY[:HEAD_PIECE]) == 0
    assert decoder.head_piece(BODY[:4096]) > HEAD_PIECE
    # a read whose first frame end past HEAD_PIECE leaves little after it: decoded whole
    end = BODY.index(b"\n\n", HEAD_PIECE) + 2
    assert decoder.head_piece(BODY[: end + HEAD_PIECE - 1]) == 0
    assert decoder.head_piece(BODY[: end + HEAD_PIECE]) == end
    whole = WireDecoder(OpenAIChatDialect(), clock=lambda: 0, stream=False)
    assert whole.head_piece(BODY[:4096]) == 0
    assert HEAD_BYTES > HEAD_PIECE
