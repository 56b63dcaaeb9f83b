"""Embeddings, not streamed: OpenAI's `POST /v1/embeddings` and Gemini's `batchEmbedContents`.

Each user message of the turn is one input: its text items joined, so the items of one message
are embedded together as one vector. The reply is one JSON body; it becomes one embedding lane
per vector, in input order (OpenAI's `index`, Gemini's request order), then the finish reason
`stop` and the usage (OpenAI reports only the prompt side; Gemini reports nothing, so every count
is None, but a usage object is still sent, so the grammar does not call the reply incomplete).

OpenAI's vectors come as JSON floats or, with `encoding_format: "base64"`, as base64 text of
little-endian float32 values, decoded here with the `array` module.
"""

from __future__ import annotations

import binascii
import sys
from array import array
from base64 import b64decode
from typing import TYPE_CHECKING, Any, Literal

import msgspec
from rillet._core._errors import MalformedFrameError, ProviderError, UnsupportedContentError
from rillet._core._events import TextDone, UniMessage
from rillet._core._lanes import (
    LaneEvent,
    MessageDelta,
    MessageStart,
    MessageStop,
    PartDelta,
    PartStart,
    PartStop,
    RawUsage,
)

from .._core._dialect import Framing, HttpRequest, Provider, strict_decode
from ._error_body import error_from_body
from ._openai_request import bearer_json_request

if TYPE_CHECKING:
    from collections.abc import Mapping

    from rillet._core._request import TurnRequest

    from .._core._dialect import StreamDecoder

__all__ = [
    "GeminiEmbeddingsDialect",
    "OpenAIEmbeddingsDialect",
    "UnsupportedContentError",
    "decode_float32",
]

NAME = "openai-embeddings"
GEMINI_NAME = "gemini-embeddings"
EncodingFormat = Literal["float", "base64"]
_BIG_ENDIAN = sys.byteorder == "big"


# --- wire shapes ----------------------------------------------------------------------------------


class _Embedding(msgspec.Struct, frozen=True):
    index: int
    embedding: list[float] | str


class _Usage(msgspec.Struct, frozen=True):
    prompt_tokens: int | None = None


class _Response(msgspec.Struct, frozen=True):
    data: list[_Embedding]
    model: str = ""
    usage: _Usage | None = None


class _GeminiEmbedding(msgspec.Struct, frozen=True):
    values: list[float]


class _GeminiResponse(msgspec.Struct, frozen=True):
    embeddings: list[_GeminiEmbedding]


_decode_response = msgspec.json.Decoder(_Response)
_decode_gemini = msgspec.json.Decoder(_GeminiResponse)


def decode_float32(text: str, provider: str = NAME) -> list[float]:
    """A base64 string of little-endian float32 values, as Python floats (OpenAI's
    `encoding_format: "base64"`). Text that is not base64 of whole float32s is malformed."""
    try:
        raw = b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise MalformedFrameError("embedding is not base64", text, provider=provider) from None
    if len(raw) % 4:
        raise MalformedFrameError(
            f"embedding of {len(raw)} bytes is not a whole number of float32 values",
            text,
            provider=provider,
        )
    values = array("f")
    values.frombytes(raw)
    if _BIG_ENDIAN:
        values.byteswap()
    return values.tolist()


def _texts(messages: list[UniMessage], provider: str) -> list[list[str]]:
    """Each user message's text items; any other item is refused. Assistant messages are not
    inputs (an embedding reply has nothing to replay)."""
    inputs: list[list[str]] = []
    for message in messages:
        if message.role != "user":
            continue
        texts: list[str] = []
        for item in message.content_items:
            if type(item) is not TextDone:
                raise UnsupportedContentError(provider, str(type(item).__struct_config__.tag))
            texts.append(item.text)
        inputs.append(texts)
    return inputs


def _vector_lanes(vectors: list[list[float]], usage: RawUsage) -> list[LaneEvent]:
    """One embedding lane per vector, in order, then the stop."""
    out: list[LaneEvent] = []
    for index, vector in enumerate(vectors):
        out.append(PartStart(index=index, kind="embedding"))
        out.append(PartDelta(index, "embedding", vector))
        out.append(PartStop(index, "embedding"))
    out.append(MessageDelta(finish_reason="stop", usage=usage))
    out.append(MessageStop())
    return out


class _NoStream:
    """The stream decoder of a wire that does not stream: the body is decoded whole at the end
    by `decode_response`, so there are no frames and nothing is owed at EOF."""

    __slots__ = ()

    def feed(self, frame: Any) -> list[LaneEvent]:
        return []

    def close(self) -> list[LaneEvent]:
        return []


class OpenAIEmbeddingsDialect:
    """OpenAI's embeddings endpoint (and the OpenAI-compatible ones of vLLM, Ollama, LiteLLM...).

    `encoding_format` is what the request asks for (`float` is understood by every compatible
    server; `base64` is a quarter of the size); `dimensions` shortens the vectors where the model
    supports it. Either may also be set per turn in `extra_body["openai-embeddings"]`.
    """

    name = NAME
    framing: Framing = "json"

    def __init__(
        self, *, encoding_format: EncodingFormat = "float", dimensions: int | None = None
    ) -> None:
        self.encoding_format = encoding_format
        self.dimensions = dimensions

    def build_request(
        self, request: TurnRequest, provider: Provider, *, stream: bool = True
    ) -> HttpRequest:
        """`POST {base}/embeddings` (the base URL includes `/v1`); `stream` is ignored, the
        endpoint answers with one body."""
        body: dict[str, Any] = {
            "model": provider.model,
            "input": ["".join(texts) for texts in _texts(request.messages, NAME)],
            "encoding_format": self.encoding_format,
        }
        if self.dimensions is not None:
            body["dimensions"] = self.dimensions
        return bearer_json_request(NAME, request, provider, "/embeddings", body)

    def stream_decoder(self) -> StreamDecoder:
        """A decoder with nothing to do: the reply is one body, see `decode_response`."""
        return _NoStream()

    def decode_response(self, body: bytes) -> list[LaneEvent]:
        """The body as one embedding lane per `data` entry in `index` order, then the stop with
        the prompt tokens (the other counts are not reported)."""
        response = strict_decode(_decode_response, body, NAME)
        data = sorted(response.data, key=lambda entry: entry.index)
        if len({entry.index for entry in data}) != len(data):
            raise MalformedFrameError("two embeddings share an index", body, provider=NAME)
        vectors = [
            entry.embedding if type(entry.embedding) is list else decode_float32(entry.embedding)
            for entry in data
        ]
        usage = response.usage
        out: list[LaneEvent] = [MessageStart(model=response.model)]
        out += _vector_lanes(
            vectors, RawUsage(prompt_tokens=usage.prompt_tokens if usage is not None else None)
        )
        return out

    def error_from_response(
        self, status: int, headers: Mapping[str, str], body: bytes
    ) -> ProviderError:
        """`{"error": {"message", "type", "code"}}` typed by its type or code, else the status."""
        return error_from_body(NAME, status, body)


class GeminiEmbeddingsDialect:
    """Gemini's `batchEmbedContents`: one request per user message, each a content of its text
    parts (embedded together as one vector). `dimensions` sets `outputDimensionality`."""

    name = GEMINI_NAME
    framing: Framing = "json"

    def __init__(self, *, dimensions: int | None = None) -> None:
        self.dimensions = dimensions

    def build_request(
        self, request: TurnRequest, provider: Provider, *, stream: bool = True
    ) -> HttpRequest:
        """`POST {base}/v1beta/models/{model}:batchEmbedContents` with `x-goog-api-key`."""
        model = provider.model.removeprefix("models/")
        requests: list[dict[str, Any]] = []
        for texts in _texts(request.messages, GEMINI_NAME):
            entry: dict[str, Any] = {
                "model": f"models/{model}",
                "content": {"parts": [{"text": text} for text in texts]},
            }
            if self.dimensions is not None:
                entry["outputDimensionality"] = self.dimensions
            requests.append(entry)
        body: dict[str, Any] = {"requests": requests}
        body.update(request.extra_body.get(GEMINI_NAME, {}))
        headers = {"content-type": "application/json", **provider.headers}
        if provider.api_key is not None:
            headers["x-goog-api-key"] = provider.api_key.reveal()
        return HttpRequest(
            url=provider.url(f"/v1beta/models/{model}:batchEmbedContents"),
            headers=headers,
            body=msgspec.json.encode(body),
        )

    def stream_decoder(self) -> StreamDecoder:
        """A decoder with nothing to do: the reply is one body, see `decode_response`."""
        return _NoStream()

    def decode_response(self, body: bytes) -> list[LaneEvent]:
        """`{"embeddings": [{"values"}]}` as one embedding lane per vector in request order; no
        usage is reported, so every count is None."""
        response = strict_decode(_decode_gemini, body, GEMINI_NAME)
        return _vector_lanes([e.values for e in response.embeddings], RawUsage())

    def error_from_response(
        self, status: int, headers: Mapping[str, str], body: bytes
    ) -> ProviderError:
        """`{"error": {"code", "message", "status"}}` typed by its status word, else the status."""
        return error_from_body(GEMINI_NAME, status, body)
