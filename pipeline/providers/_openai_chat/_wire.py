"""OpenAI Chat Completions' wire shapes, sans-I/O: the chunk (and whole completion) structs, their
usage and errors, and the small readers the stream decoder (`_stream`) uses."""

from __future__ import annotations

import base64
import binascii
from typing import Annotated, Any, Literal

import msgspec
from rillet._core._errors import MalformedFrameError, ProviderError
from rillet._core._lanes import (
    ProviderErrorEvent,
    RawUsage,
)

from ..._core._dialect import answer_tokens, sse_text, uncached_tokens
from .._error_body import base_resp_error, body_text, error_from_body

__all__ = ["NAME", "STREAM_AUDIO_MIME", "sniff_audio"]

NAME = "openai-chat"
STREAM_AUDIO_MIME = "audio/pcm"


# --- wire shapes ----------------------------------------------------------------------------------


class _Function(msgspec.Struct, frozen=True, gc=False):
    """A call's name and arguments: JSON text, as OpenAI sends them, or the JSON object itself,
    as llama.cpp's server (in some releases), TGI and others send them (`arguments_text`)."""

    name: str | None = None
    arguments: str | dict[str, Any] | None = None


def arguments_text(arguments: str | dict[str, Any]) -> str:
    """A call's arguments as the JSON text they stand for."""
    if type(arguments) is str:
        return arguments
    return msgspec.json.encode(arguments).decode("utf-8")


class ToolCall(msgspec.Struct, frozen=True, gc=False):
    index: int | None = None
    id: str | None = None
    function: _Function | None = None


class Detail(msgspec.Struct, frozen=True, gc=False):
    """A `reasoning_details` entry. Its fields are read loosely and checked for the known types
    only (`checked_detail`), so an entry of another type is skipped whatever it holds."""

    type: str = ""
    text: Any = None
    summary: Any = None
    signature: Any = None
    data: Any = None
    id: Any = None
    format: Any = None
    index: Any = None


DETAIL_TYPES = frozenset({"reasoning.text", "reasoning.summary", "reasoning.encrypted"})


def checked_detail(detail: Detail) -> Detail:
    """A known detail, its fields checked: strings (or null), and an integer index."""
    for value in (detail.text, detail.summary, detail.signature, detail.data, detail.id):
        if value is not None and type(value) is not str:
            raise MalformedFrameError(
                f"a {detail.type} detail with a field of the wrong type", str(detail), provider=NAME
            )
    if detail.format is not None and type(detail.format) is not str:
        raise MalformedFrameError("a detail whose format is no string", str(detail), provider=NAME)
    if detail.index is not None and type(detail.index) is not int:
        raise MalformedFrameError("a detail whose index is no integer", str(detail), provider=NAME)
    return detail


class Audio(msgspec.Struct, frozen=True, gc=False):
    id: str | None = None
    data: str | None = None
    transcript: str | None = None


class ContentPart(msgspec.Struct, frozen=True, gc=False):
    """One chunk of a `content` list (Mistral's reasoning models): `{"type": "text", "text"}` or
    `{"type": "thinking", "thinking": [{"type": "text", "text"}]}`. The fields are read loosely
    and checked for the known types only, so a chunk of another type is skipped whatever it
    holds."""

    type: str = ""
    text: Any = None
    thinking: Any = None


class Delta(msgspec.Struct, frozen=True, gc=False):
    """A streamed `delta`, and also a non-streaming `message` (same fields, whole values)."""

    content: str | list[ContentPart] | None = None
    refusal: str | None = None  # OpenAI's words when the model refuses, in place of `content`
    reasoning_content: str | None = None
    reasoning: str | None = None
    reasoning_details: list[Detail] | None = None
    tool_calls: list[ToolCall] | None = None
    audio: Audio | None = None


class _Choice(msgspec.Struct, frozen=True, gc=False):
    index: int | None = None
    delta: Delta | None = None
    message: Delta | None = None
    finish_reason: str | None = None


class _PromptDetails(msgspec.Struct, frozen=True, gc=False):
    cached_tokens: int | None = None
    cache_write_tokens: int | None = None  # OpenRouter's: of `prompt_tokens`, written to cache


class _CompletionDetails(msgspec.Struct, frozen=True, gc=False):
    reasoning_tokens: int | None = None


class ChunkUsage(msgspec.Struct, frozen=True, gc=False):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    total_tokens: int | None = None
    prompt_tokens_details: _PromptDetails | None = None
    completion_tokens_details: _CompletionDetails | None = None
    prompt_cache_hit_tokens: int | None = None


class _Groq(msgspec.Struct, frozen=True, gc=False):
    """Groq's `x_groq`: where it reports usage (same fields) instead of a top-level `usage`."""

    usage: ChunkUsage | None = None


class Frame(msgspec.Struct, frozen=True, gc=False):
    """A streamed chunk as read once the message has started (its id and model, the same in
    every chunk, are skipped rather than decoded); also an error body (`error`, vLLM's
    `object`)."""

    object: str | None = None
    choices: list[_Choice] | None = None
    usage: ChunkUsage | None = None
    x_groq: _Groq | None = None
    error: Any = None
    message: str | None = None
    type: str | None = None
    code: Any = None
    base_resp: Any = None  # MiniMax's status, in every chunk: an error when its code is not 0


class Chunk(Frame, frozen=True, gc=False):
    """A streamed chunk before the message has started, or a whole completion."""

    id: str | None = None
    model: str | None = None


decode_chunk = msgspec.json.Decoder(Chunk)
decode_frame = msgspec.json.Decoder(Frame)


# A chunk that is only one more fragment of choice 0's text: `Frame`'s fields (and those of its
# choices and delta), each narrowed to the values the stream decoder's fast path takes (no
# finish, no usage, no error, no field but `content`). What decodes so decodes as a `Frame`
# too and takes that path, so a read of such chunks needs no check of its own but one
# (`object`, which is no error).


class _MoreText(msgspec.Struct, frozen=True, gc=False):
    content: Annotated[str, msgspec.Meta(min_length=1)]
    reasoning_content: None = None
    reasoning: None = None
    reasoning_details: None = None
    tool_calls: None = None
    audio: None = None
    refusal: None = None


class _TextChoice(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    index: Literal[0] | None = None
    delta: _MoreText
    message: Delta | None = None
    finish_reason: Literal[""] | None = None


class _TextChunk(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    object: str | None = None
    choices: Annotated[list[_TextChoice], msgspec.Meta(min_length=1)]
    usage: None = None
    x_groq: None = None
    error: None = None
    message: str | None = None
    type: str | None = None
    code: Any = None
    base_resp: Any = None


class _MoreFunction(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    name: str | None = None
    arguments: Annotated[str, msgspec.Meta(min_length=1)]


class _MoreCall(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    index: int
    id: str | None = None
    function: _MoreFunction


class _MoreArguments(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    content: None = None
    reasoning_content: None = None
    reasoning: None = None
    reasoning_details: None = None
    tool_calls: Annotated[list[_MoreCall], msgspec.Meta(min_length=1, max_length=1)]
    audio: None = None
    refusal: None = None


class _ArgumentsChoice(_TextChoice, frozen=True, gc=False, kw_only=True):
    delta: _MoreArguments  # type: ignore[assignment]


class _ArgumentsChunk(_TextChunk, frozen=True, gc=False, kw_only=True):
    choices: Annotated[list[_ArgumentsChoice], msgspec.Meta(min_length=1)]  # type: ignore[assignment]


_decode_arguments = msgspec.json.Decoder(_ArgumentsChunk)


def arguments_run(frames: list[Any], key: int, call_id: str) -> list[str] | None:
    """The argument fragments of a read's chunks when every one is only more of the arguments
    of the call at wire index `key` (`_ArgumentsChunk`, with that index and no other id); None
    otherwise."""
    decode = _decode_arguments.decode
    run = []
    try:
        for frame in frames:
            chunk = decode(frame)
            call = chunk.choices[0].delta.tool_calls[0]
            if (
                call.index != key
                or (call.id is not None and call.id != call_id)
                or chunk.object == "error"
            ):
                return None
            run.append(call.function.arguments)
    except (msgspec.MsgspecError, TypeError):  # (TypeError: a named event's tuple)
        return None
    return run


class _MoreReasoningContent(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    content: Literal[""] | None = None
    reasoning_content: Annotated[str, msgspec.Meta(min_length=1)]
    reasoning: str | None = None  # (beside `reasoning_content`, the same words: not read)
    reasoning_details: None = None
    tool_calls: None = None
    audio: None = None
    refusal: None = None


class _MoreReasoning(_MoreReasoningContent, frozen=True, gc=False, kw_only=True):
    reasoning_content: Literal[""] | None = None  # type: ignore[assignment]
    reasoning: Annotated[str, msgspec.Meta(min_length=1)]


class _ReasoningContentChoice(_TextChoice, frozen=True, gc=False, kw_only=True):
    delta: _MoreReasoningContent  # type: ignore[assignment]


class _ReasoningChoice(_TextChoice, frozen=True, gc=False, kw_only=True):
    delta: _MoreReasoning  # type: ignore[assignment]


class _ReasoningContentChunk(_TextChunk, frozen=True, gc=False, kw_only=True):
    choices: Annotated[list[_ReasoningContentChoice], msgspec.Meta(min_length=1)]  # type: ignore[assignment]


class _ReasoningChunk(_TextChunk, frozen=True, gc=False, kw_only=True):
    choices: Annotated[list[_ReasoningChoice], msgspec.Meta(min_length=1)]  # type: ignore[assignment]


FIELD_SHAPES: dict[str, msgspec.json.Decoder[Any]] = {
    "content": msgspec.json.Decoder(_TextChunk),
    "reasoning_content": msgspec.json.Decoder(_ReasoningContentChunk),
    "reasoning": msgspec.json.Decoder(_ReasoningChunk),
}
"""Each text-like delta field's narrowed chunk shape (`field_run`)."""


def field_run(
    frames: list[Any], decoder: msgspec.json.Decoder[Any], field: str
) -> list[str] | None:
    """The fragments of a read's chunks when every one is only more of one delta field (text,
    or reasoning in the field its group streams in), `decoder` the field's narrowed shape
    (`FIELD_SHAPES`); None otherwise (a chunk of another kind, `[DONE]`, a named event)."""
    decode = decoder.decode
    run = []
    try:
        for frame in frames:
            chunk = decode(frame)
            if chunk.object == "error":
                return None
            run.append(getattr(chunk.choices[0].delta, field))
    except (msgspec.MsgspecError, TypeError):  # (TypeError: a named event's tuple)
        return None
    return run


def raw_usage(u: ChunkUsage) -> RawUsage:
    cached = written = None
    if u.prompt_tokens_details is not None:
        cached = u.prompt_tokens_details.cached_tokens
        written = u.prompt_tokens_details.cache_write_tokens
    elif u.prompt_cache_hit_tokens is not None:  # DeepSeek without prompt_tokens_details
        cached = u.prompt_cache_hit_tokens
    reasoning = None
    if u.completion_tokens_details is not None:
        reasoning = u.completion_tokens_details.reasoning_tokens
    prompt = uncached_tokens(u.prompt_tokens, cached, u.completion_tokens, u.total_tokens)
    response = answer_tokens(u.completion_tokens, reasoning, u.total_tokens, u.prompt_tokens)
    return RawUsage(
        cached_tokens=cached,
        prompt_tokens=prompt,
        thoughts_tokens=reasoning,
        response_tokens=response,
        cache_write_tokens=written,
    )


def chunk_error(chunk: Frame) -> ProviderErrorEvent | None:
    """The in-stream error a chunk reports, if it reports one."""
    if chunk.error:
        return ProviderErrorEvent(
            error_from_body(NAME, None, {"error": chunk.error}, in_stream=True)
        )
    if chunk.object == "error":
        body = {"object": "error", "message": chunk.message, "type": chunk.type, "code": chunk.code}
        return ProviderErrorEvent(error_from_body(NAME, None, body, in_stream=True))
    if base_resp_error(chunk.base_resp) is not None:
        body = {"base_resp": chunk.base_resp}
        return ProviderErrorEvent(error_from_body(NAME, None, body, in_stream=True))
    return None


def sniff_audio(data: bytes) -> str:
    """The mime type of a whole audio file from its first bytes; `audio/pcm` (headerless PCM,
    what OpenAI streams) when no known header is there."""
    if data[:4] == b"RIFF" and data[8:12] == b"WAVE":
        return "audio/wav"
    if data[:3] == b"ID3" or (len(data) > 1 and data[0] == 0xFF and data[1] & 0xE0 == 0xE0):
        return "audio/mpeg"
    if data[:4] == b"fLaC":
        return "audio/flac"
    if data[:4] == b"OggS":
        return "audio/ogg"
    return STREAM_AUDIO_MIME


def b64(text: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise MalformedFrameError(f"audio data is not base64: {exc}", text, provider=NAME) from None


def thinking_texts(thinking: Any) -> list[str]:
    """The texts of a thinking chunk's `thinking` (a list of text chunks, or a plain string)."""
    if type(thinking) is str:
        return [thinking] if thinking else []
    if not isinstance(thinking, list):
        raise MalformedFrameError("a thinking chunk without a list", str(thinking), provider=NAME)
    texts = []
    for chunk in thinking:
        if not isinstance(chunk, dict):
            raise MalformedFrameError(
                "a thinking chunk that is no object", str(chunk), provider=NAME
            )
        if chunk.get("type", "text") != "text":
            continue
        text = chunk.get("text")
        if type(text) is not str:
            raise MalformedFrameError(
                "a thinking text chunk without text", str(chunk), provider=NAME
            )
        if text:
            texts.append(text)
    return texts


def first_choice(choices: list[_Choice] | None) -> _Choice | None:
    """Choice 0 (with `n > 1` several choices share the stream; only the first is read)."""
    if not choices:
        return None
    first = choices[0]
    if first.index is None or first.index == 0:
        return first
    return next((c for c in choices if c.index == 0), None)


def event_error(data: str | bytes) -> ProviderError:
    """The error an `event: error` frame carries: its data's error shape when it is a JSON
    object (`{"error": {...}}`, `{"code": 400, "details": "..."}`), else its words."""
    text = sse_text(data)
    try:
        body = msgspec.json.decode(text)
    except (msgspec.DecodeError, RecursionError):
        body = None
    if not isinstance(body, dict):
        body = {"error": body_text(text)}
    return error_from_body(NAME, None, body, in_stream=True)
