"""The embeddings dialects: OpenAI's `/v1/embeddings` and Gemini's `batchEmbedContents`."""

from __future__ import annotations

import base64
import json
import struct
from typing import Any

import pytest
from rillet import (
    EmbeddingDelta,
    EmbeddingDone,
    ImageUrlDone,
    InvalidRequestError,
    MalformedFrameError,
    RateLimitError,
    TextDone,
    TurnRequest,
    UniMessage,
    UsageMetadata,
    user,
)
from rillet._core._events import delta_event, stop_event
from rillet.lowlevel import WireDecoder
from rillet.providers import Provider, Secret
from rillet.providers._embeddings import (
    GeminiEmbeddingsDialect,
    OpenAIEmbeddingsDialect,
    UnsupportedContentError,
    decode_float32,
)

from ..wire_cases import entry_of, run

KEY = "sk-embeddings-0123456789abcdef"


def openai(key: str | None = KEY) -> Provider:
    return Provider(
        dialect=OpenAIEmbeddingsDialect(),
        base_url="https://api.openai.com/v1",
        model="text-embedding-3-small",
        api_key=Secret(key) if key else None,
    )


def gemini(key: str | None = KEY) -> Provider:
    return Provider(
        dialect=GeminiEmbeddingsDialect(),
        base_url="https://generativelanguage.googleapis.com/",
        model="gemini-embedding-001",
        api_key=Secret(key) if key else None,
    )


def b64_floats(*values: float) -> str:
    return base64.b64encode(struct.pack(f"<{len(values)}f", *values)).decode()


def body(data: list[dict[str, Any]], usage: dict[str, Any] | None = None) -> bytes:
    document: dict[str, Any] = {"object": "list", "data": data, "model": "m"}
    if usage is not None:
        document["usage"] = usage
    return json.dumps(document).encode()


def decode(dialect: OpenAIEmbeddingsDialect | GeminiEmbeddingsDialect, raw: bytes) -> list[Any]:
    decoder = WireDecoder(dialect, clock=lambda: 0)
    decoder.feed(raw)
    return decoder.close()


TURN = TurnRequest(
    messages=[
        user("first ", "input"),
        UniMessage(role="assistant", content_items=[TextDone(text="not an input")]),
        user("second"),
    ]
)


# --- OpenAI: the request --------------------------------------------------------------------------


def test_each_user_message_is_one_input_of_its_joined_text() -> None:
    http = OpenAIEmbeddingsDialect().build_request(TURN, openai())
    assert (http.method, http.url) == ("POST", "https://api.openai.com/v1/embeddings")
    assert http.json() == {
        "model": "text-embedding-3-small",
        "input": ["first input", "second"],
        "encoding_format": "float",
    }


def test_the_key_is_a_bearer_header_never_shown_in_the_repr() -> None:
    http = OpenAIEmbeddingsDialect().build_request(TURN, openai())
    assert http.headers["authorization"] == f"Bearer {KEY}"
    assert KEY not in repr(http)
    assert (
        "authorization" not in OpenAIEmbeddingsDialect().build_request(TURN, openai(None)).headers
    )


def test_base64_encoding_and_dimensions_are_asked_for_when_set() -> None:
    dialect = OpenAIEmbeddingsDialect(encoding_format="base64", dimensions=256)
    sent = dialect.build_request(TURN, openai()).json()
    assert (sent["encoding_format"], sent["dimensions"]) == ("base64", 256)


def test_extra_body_overrides_the_request_fields() -> None:
    turn = TurnRequest(
        messages=[user("x")], extra_body={"openai-embeddings": {"dimensions": 8, "user": "u1"}}
    )
    sent = OpenAIEmbeddingsDialect().build_request(turn, openai()).json()
    assert (sent["dimensions"], sent["user"]) == (8, "u1")


def test_a_non_text_item_is_refused_before_any_request() -> None:
    turn = TurnRequest(messages=[user("look", ImageUrlDone(image_url="https://x/a.png"))])
    with pytest.raises(UnsupportedContentError) as info:
        OpenAIEmbeddingsDialect().build_request(turn, openai())
    assert (info.value.provider, info.value.item_type) == ("openai-embeddings", "image_url.done")


# --- OpenAI: the reply ----------------------------------------------------------------------------


def test_base64_vectors_are_little_endian_float32() -> None:
    values = [0.375, -0.875, 2.0, -0.0078125, 1e-3]
    got = decode_float32(b64_floats(*values))
    assert got == [struct.unpack("<f", struct.pack("<f", v))[0] for v in values]
    assert got[:4] == values[:4]


@pytest.mark.parametrize(
    "text", ["not base64!", base64.b64encode(b"\x00\x00\x80").decode()], ids=["alphabet", "length"]
)
def test_base64_that_is_not_whole_float32s_is_malformed(text: str) -> None:
    with pytest.raises(MalformedFrameError):
        OpenAIEmbeddingsDialect().decode_response(
            body([{"index": 0, "embedding": text}], {"prompt_tokens": 1})
        )


def test_vectors_come_out_in_index_order_whatever_the_body_order() -> None:
    data = [
        {"object": "embedding", "index": 2, "embedding": [2.0]},
        {"object": "embedding", "index": 0, "embedding": b64_floats(0.5)},
        {"object": "embedding", "index": 1, "embedding": [1.0]},
    ]
    got = run(OpenAIEmbeddingsDialect(), [body(data, {"prompt_tokens": 7, "total_tokens": 7})])
    want = []
    for vector in ([0.5], [1.0], [2.0]):
        want += [
            entry_of(delta_event(EmbeddingDelta(embedding=vector), 0)),
            entry_of(delta_event(EmbeddingDone(embedding=vector), 0)),
        ]
    want.append(entry_of(stop_event(UsageMetadata(prompt_tokens=7), "stop", 0)))
    assert got == want


def test_two_vectors_with_one_index_are_malformed() -> None:
    data = [{"index": 0, "embedding": [1.0]}, {"index": 0, "embedding": [2.0]}]
    with pytest.raises(MalformedFrameError):
        OpenAIEmbeddingsDialect().decode_response(body(data))


def test_a_reply_without_usage_still_stops_with_every_count_unreported() -> None:
    events = decode(OpenAIEmbeddingsDialect(), body([{"index": 0, "embedding": [1.0]}]))
    assert events[-1] == stop_event(UsageMetadata(), "stop", 0)


def test_the_stream_decoder_has_nothing_to_do() -> None:
    stream = OpenAIEmbeddingsDialect().stream_decoder()
    assert (stream.feed("anything"), stream.close()) == ([], [])


def test_an_http_429_body_is_a_rate_limit_error() -> None:
    error_body = (
        b'{"error": {"message": "slow", "type": "requests", "code": "rate_limit_exceeded"}}'
    )
    error = OpenAIEmbeddingsDialect().error_from_response(429, {}, error_body)
    assert type(error) is RateLimitError
    assert error.status == 429


def test_an_http_400_body_is_an_invalid_request() -> None:
    error_body = b'{"error": {"message": "bad input", "type": "invalid_request_error"}}'
    error = OpenAIEmbeddingsDialect().error_from_response(400, {}, error_body)
    assert type(error) is InvalidRequestError


# --- Gemini ---------------------------------------------------------------------------------------


def test_gemini_sends_one_request_per_user_message() -> None:
    http = GeminiEmbeddingsDialect(dimensions=64).build_request(TURN, gemini())
    assert http.url == (
        "https://generativelanguage.googleapis.com/v1beta/models/"
        "gemini-embedding-001:batchEmbedContents"
    )
    assert http.headers["x-goog-api-key"] == KEY
    model = "models/gemini-embedding-001"
    assert http.json() == {
        "requests": [
            {
                "model": model,
                "content": {"parts": [{"text": "first "}, {"text": "input"}]},
                "outputDimensionality": 64,
            },
            {
                "model": model,
                "content": {"parts": [{"text": "second"}]},
                "outputDimensionality": 64,
            },
        ]
    }


def test_gemini_vectors_come_in_request_order_with_a_usage_of_nones() -> None:
    raw = b'{"embeddings": [{"values": [0.25, 0.5]}, {"values": [-1.0]}]}'
    events = decode(GeminiEmbeddingsDialect(), raw)
    done = [e.content_items[0] for e in events if e.event_type == "delta"][1::2]
    assert done == [EmbeddingDone(embedding=[0.25, 0.5]), EmbeddingDone(embedding=[-1.0])]
    assert events[-1] == stop_event(UsageMetadata(), "stop", 0)


def test_gemini_errors_are_typed_by_their_status_word() -> None:
    error_body = b'{"error": {"code": 429, "message": "quota", "status": "RESOURCE_EXHAUSTED"}}'
    error = GeminiEmbeddingsDialect().error_from_response(429, {}, error_body)
    assert type(error) is RateLimitError
