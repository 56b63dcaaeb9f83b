"""OpenAI Chat Completions (`POST {base}/chat/completions`) and every compatible server.

The stream is SSE `data:` chunks ending in `data: [DONE]` (the terminal event). Only
`choices[0]` is read. A delta's wire fields map to lanes, and a new group starts whenever another
wire field starts (the lanes of the previous field close):

* `reasoning_content` (DeepSeek, vLLM, llama.cpp) and `reasoning` (OpenRouter, newer vLLM) are
  thinking; the first fragment carries `fidelity {"reasoning_field": <field>}` so the reasoning
  can be sent back in the same field (no fidelity when both fields come in one delta).
* `reasoning_details` (OpenRouter, MiniMax) are thinking too, and win over `reasoning` when both
  come (they carry the same text): `reasoning.text` / `reasoning.summary` give text, a
  `reasoning.text` `signature` an empty fragment with `fidelity {"signature"}`, and
  `reasoning.encrypted` an empty fragment with `fidelity {"encrypted_content", "format",
  "reasoning_id"}`. A detail with another `index` starts another thinking group.
* `content` is text; empty strings are not content (the role chunk's `""` opens nothing).
* `tool_calls`: one tool lane per call, told apart by the call's `index` (and by a new `id` at
  an index already in use, as servers that send whole calls at index 0 do). Earlier calls stay
  open when a later index appears, since fragments of parallel calls may interleave; the grammar
  holds later calls back until earlier ones close. A call without an id gets its function's name
  (`name#2`... for repeats).
* `audio` (OpenAI audio output): its base64 `data` fragments are decoded into one inline_data
  lane (`fidelity {"audio_id"}` carries the id to send back), its `transcript` fragments are a
  text lane after it. The audio lane opens first so the audio streams live. Streamed audio is
  always `pcm16` (24 kHz mono, little-endian) on OpenAI, so its mime type is `audio/pcm`; a
  non-streaming body's audio is sniffed (WAV, MP3, FLAC, Ogg) and falls back to `audio/pcm`.

A `finish_reason` closes every lane; `stop` after a tool call is passed as `tool_call` (some
compatible servers say `stop` there). Usage may come on any chunk. Errors inside the stream (a
top-level `error` object, vLLM's `{"object": "error", ...}`, OpenRouter's `error` with
`finish_reason: "error"`) become the typed error; a bare `finish_reason: "error"` is a
`ProviderError`.
"""

from __future__ import annotations

import base64
import binascii
from typing import TYPE_CHECKING, Any, Literal

import msgspec
from rillet._errors import (
    AuthenticationError,
    MalformedFrameError,
    OverloadedError,
    ProviderError,
    RateLimitError,
)
from rillet._events import (
    ImageUrlDone,
    InlineDataDone,
    TextDone,
    ThinkingDone,
    ToolCallDone,
    ToolResultDone,
    UniMessage,
)
from rillet._lanes import (
    LaneEvent,
    LaneKind,
    MessageDelta,
    MessageStart,
    MessageStop,
    PartDelta,
    PartStart,
    PartStop,
    ProviderErrorEvent,
    RawUsage,
)

from ._base import HttpRequest, Provider, ToolIds, dumps_arguments, error_from_body, strict_decode

if TYPE_CHECKING:
    from collections.abc import Mapping

    from rillet._request import ThinkingLevel, ToolChoice, ToolSpec, TurnRequest
    from rillet.transports import SSEEvent

    from ._base import StreamDecoder

__all__ = [
    "OpenAIChatDialect",
    "data_url",
    "http_error",
    "reasoning_effort",
    "retry_after",
    "sniff_audio",
]

NAME = "openai-chat"
STREAM_AUDIO_MIME = "audio/pcm"
_EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}
_EFFORTS: dict[str, str] = {
    "low": "low",
    "medium": "medium",
    "high": "high",
    "xhigh": "xhigh",
    "max": "xhigh",
}


# --- wire shapes ----------------------------------------------------------------------------------


class _Function(msgspec.Struct, frozen=True, gc=False):
    name: str | None = None
    arguments: str | None = None


class _ToolCall(msgspec.Struct, frozen=True, gc=False):
    index: int | None = None
    id: str | None = None
    function: _Function | None = None


class _Detail(msgspec.Struct, frozen=True, gc=False):
    type: str = ""
    text: str | None = None
    summary: str | None = None
    signature: str | None = None
    data: str | None = None
    id: str | None = None
    format: str | None = None
    index: int | None = None


class _Audio(msgspec.Struct, frozen=True, gc=False):
    id: str | None = None
    data: str | None = None
    transcript: str | None = None


class _Delta(msgspec.Struct, frozen=True, gc=False):
    """A streamed `delta`, and also a non-streaming `message` (same fields, whole values)."""

    content: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None
    reasoning_details: list[_Detail] | None = None
    tool_calls: list[_ToolCall] | None = None
    audio: _Audio | None = None


class _Choice(msgspec.Struct, frozen=True, gc=False):
    index: int | None = None
    delta: _Delta | None = None
    message: _Delta | None = None
    finish_reason: str | None = None


class _PromptDetails(msgspec.Struct, frozen=True, gc=False):
    cached_tokens: int | None = None


class _CompletionDetails(msgspec.Struct, frozen=True, gc=False):
    reasoning_tokens: int | None = None


class _Usage(msgspec.Struct, frozen=True, gc=False):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    prompt_tokens_details: _PromptDetails | None = None
    completion_tokens_details: _CompletionDetails | None = None
    prompt_cache_hit_tokens: int | None = None


class _Frame(msgspec.Struct, frozen=True, gc=False):
    """A streamed chunk as read once the message has started (its id and model, the same in
    every chunk, are skipped rather than decoded); also an error body (`error`, vLLM's
    `object`)."""

    object: str | None = None
    choices: list[_Choice] | None = None
    usage: _Usage | None = None
    error: Any = None
    message: str | None = None
    type: str | None = None
    code: Any = None


class _Chunk(_Frame, frozen=True, gc=False):
    """A streamed chunk before the message has started, or a whole completion."""

    id: str | None = None
    model: str | None = None


_decode_chunk = msgspec.json.Decoder(_Chunk)
_decode_frame = msgspec.json.Decoder(_Frame)

# Field codes: which wire field the open group came from.
_NONE, _RC, _R, _DETAILS, _CONTENT, _TOOLS, _AUDIO = range(7)


def _usage(u: _Usage) -> RawUsage:
    cached = None
    if u.prompt_tokens_details is not None:
        cached = u.prompt_tokens_details.cached_tokens
    elif u.prompt_cache_hit_tokens is not None:  # DeepSeek without prompt_tokens_details
        cached = u.prompt_cache_hit_tokens
    reasoning = None
    if u.completion_tokens_details is not None:
        reasoning = u.completion_tokens_details.reasoning_tokens
    prompt = None if u.prompt_tokens is None else u.prompt_tokens - (cached or 0)
    response = None if u.completion_tokens is None else u.completion_tokens - (reasoning or 0)
    return RawUsage(
        cached_tokens=cached,
        prompt_tokens=prompt,
        thoughts_tokens=reasoning,
        response_tokens=response,
    )


def _chunk_error(chunk: _Frame) -> ProviderErrorEvent | None:
    """The in-stream error a chunk reports, if it reports one."""
    if chunk.error:
        return ProviderErrorEvent(
            error_from_body(NAME, None, {"error": chunk.error}, in_stream=True)
        )
    if chunk.object == "error":
        body = {"object": "error", "message": chunk.message, "type": chunk.type, "code": chunk.code}
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


def _b64(text: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise MalformedFrameError(f"audio data is not base64: {exc}", text, provider=NAME) from None


def _first_choice(choices: list[_Choice] | None) -> _Choice | None:
    """Choice 0 (with `n > 1` several choices share the stream; only the first is read)."""
    if not choices:
        return None
    first = choices[0]
    if first.index is None or first.index == 0:
        return first
    return next((c for c in choices if c.index == 0), None)


class _StreamDecoder:
    """One attempt's Chat Completions stream (also replays a whole completion in one go)."""

    __slots__ = (
        "_audio_lane",
        "_field",
        "_ids",
        "_keys",
        "_lane",
        "_last_key",
        "_next",
        "_open",
        "_started",
        "_think_fid",
        "_think_key",
        "_tool_seen",
        "_tools",
        "_transcript_lane",
    )

    def __init__(self) -> None:
        self._field = _NONE
        self._lane = 0  # the lane of a one-lane field (text, thinking)
        self._next = 0  # the next lane index to hand out
        self._open: list[tuple[LaneKind, int]] = []  # lanes of the current field
        self._tools: dict[int, tuple[int, str]] = {}  # wire key -> (lane, call id)
        self._keys = 0  # keys for calls that come without an index
        self._last_key: int | None = None
        self._think_key: int | None = None
        self._think_fid: dict[str, Any] | None = None
        self._audio_lane = -1
        self._transcript_lane = -1
        self._tool_seen = False
        self._started = False
        self._ids = ToolIds()

    def feed(self, frame: SSEEvent) -> list[LaneEvent]:
        data = frame.data
        if data == "[DONE]":
            return [MessageStop()]
        out: list[LaneEvent] = []
        chunk: _Frame
        if self._started:
            try:  # the hot path: one call into msgspec; on error, strict_decode types it
                chunk = _decode_frame.decode(data)
            except msgspec.MsgspecError:
                chunk = strict_decode(_decode_frame, data, NAME)
        else:
            try:
                first: _Chunk = _decode_chunk.decode(data)
            except msgspec.MsgspecError:
                first = strict_decode(_decode_chunk, data, NAME)
            if first.id or first.model:
                self._started = True
                out.append(MessageStart(first.id or "", first.model or ""))
            chunk = first
        choice = _first_choice(chunk.choices)
        if choice is not None and choice.delta is not None:
            self.delta(choice.delta, out)
        if chunk.error or chunk.object == "error":
            error = _chunk_error(chunk)
            assert error is not None
            out.append(error)
            return out
        reason = choice.finish_reason if choice is not None else None
        if reason or chunk.usage is not None:
            self.finish(reason, chunk.usage, out)
        return out

    def close(self) -> list[LaneEvent]:
        return []

    # --- groups -----------------------------------------------------------------------------------

    def _switch(self, field: int, out: list[LaneEvent]) -> None:
        """Another wire field starts: close every lane of the current one."""
        for kind, index in self._open:
            out.append(PartStop(index, kind))
        self._open.clear()
        self._tools.clear()
        self._last_key = None
        self._think_key = None
        self._think_fid = None
        self._field = field

    def _start(
        self,
        kind: LaneKind,
        out: list[LaneEvent],
        *,
        name: str = "",
        call_id: str = "",
        mime_type: str = "",
    ) -> int:
        index = self._next
        self._next += 1
        self._open.append((kind, index))
        out.append(
            PartStart(index=index, kind=kind, name=name, call_id=call_id, mime_type=mime_type)
        )
        return index

    def _stop(self, kind: LaneKind, index: int, out: list[LaneEvent]) -> None:
        self._open.remove((kind, index))
        out.append(PartStop(index, kind))

    def delta(self, delta: _Delta, out: list[LaneEvent]) -> None:
        """The lane events of one delta (or one whole message), in wire-field order."""
        content = delta.content
        if (
            content
            and self._field == _CONTENT
            and delta.reasoning_content is None
            and delta.reasoning is None
            and delta.reasoning_details is None
            and delta.tool_calls is None
            and delta.audio is None
        ):  # the hot path: one more fragment of the text being streamed
            out.append(PartDelta(self._lane, "text", content))
            return
        if delta.reasoning_details:
            self._details(delta.reasoning_details, out)
        else:
            rc = delta.reasoning_content
            r = delta.reasoning
            if rc and r:
                self._thinking(_RC, rc, "", out)
            elif rc:
                self._thinking(_RC, rc, "reasoning_content", out)
            elif r:
                self._thinking(_R, r, "reasoning", out)
        if content:
            if self._field != _CONTENT:
                self._switch(_CONTENT, out)
                self._lane = self._start("text", out)
            out.append(PartDelta(self._lane, "text", content))
        if delta.tool_calls:
            self._tool_calls(delta.tool_calls, out)
        if delta.audio is not None:
            self._audio(delta.audio, out)

    def _thinking(self, field: int, text: str, wire_name: str, out: list[LaneEvent]) -> None:
        """A reasoning fragment; a group's first carries the wire field it came in, if one."""
        if self._field != field:
            self._switch(field, out)
            self._lane = self._start("thinking", out)
            fidelity = {"reasoning_field": wire_name} if wire_name else None
            out.append(PartDelta(self._lane, "thinking", text, fidelity))
        else:
            out.append(PartDelta(self._lane, "thinking", text))

    def _details(self, details: list[_Detail], out: list[LaneEvent]) -> None:
        for detail in details:
            fragments: list[tuple[str, dict[str, Any] | None]] = []
            kind = detail.type
            if kind == "reasoning.text":
                if detail.text:
                    fragments.append((detail.text, None))
                if detail.signature:
                    fragments.append(("", {"signature": detail.signature}))
            elif kind == "reasoning.summary":
                if detail.summary:
                    fragments.append((detail.summary, None))
            elif kind == "reasoning.encrypted" and detail.data:
                fidelity: dict[str, Any] = {"encrypted_content": detail.data}
                if detail.format:
                    fidelity["format"] = detail.format
                if detail.id:
                    fidelity["reasoning_id"] = detail.id
                fragments.append(("", fidelity))
            if not fragments:
                continue
            key = detail.index if detail.index is not None else self._think_key
            if self._field != _DETAILS:
                self._switch(_DETAILS, out)
                self._lane = self._start("thinking", out)
            elif key != self._think_key:  # another reasoning block
                self._restart_thinking(out)
            self._think_key = key
            for value, fid in fragments:
                if fid is not None:
                    if self._think_fid is not None and fid != self._think_fid:
                        self._restart_thinking(out)  # a block carries one fidelity
                    self._think_fid = fid
                out.append(PartDelta(self._lane, "thinking", value, fid))

    def _restart_thinking(self, out: list[LaneEvent]) -> None:
        self._stop("thinking", self._lane, out)
        self._lane = self._start("thinking", out)
        self._think_fid = None

    def _tool_calls(self, calls: list[_ToolCall], out: list[LaneEvent]) -> None:
        if self._field != _TOOLS:
            self._switch(_TOOLS, out)
        tools = self._tools
        for call in calls:
            function = call.function
            arguments = function.arguments if function is not None else None
            name = (function.name if function is not None else None) or ""
            key = call.index
            if key is None:  # no index: an id or a name starts a call, else it continues one
                if call.id or name or self._last_key is None:
                    self._keys += 1
                    key = -self._keys  # keyed apart from indexed calls
                else:
                    key = self._last_key
            self._last_key = key
            current = tools.get(key)
            if current is not None and not (call.id and call.id != current[1]):
                if arguments:
                    out.append(PartDelta(current[0], "tool_call", arguments))
                continue
            if current is not None:  # a new call at an index in use: the old one is complete
                self._stop("tool_call", current[0], out)
            call_id = call.id or (self._ids.next(name) if name else "")
            lane = self._start("tool_call", out, name=name, call_id=call_id)
            tools[key] = (lane, call_id)
            self._tool_seen = True
            out.append(PartDelta(lane, "tool_call", arguments or ""))

    def _audio(self, audio: _Audio, out: list[LaneEvent]) -> None:
        data = _b64(audio.data) if audio.data else b""
        if self._field != _AUDIO:
            self._switch(_AUDIO, out)
            mime = sniff_audio(data) if data else STREAM_AUDIO_MIME
            self._audio_lane = self._start("inline_data", out, mime_type=mime)
            self._transcript_lane = -1
        if data or audio.id:
            fidelity = {"audio_id": audio.id} if audio.id else None
            out.append(PartDelta(self._audio_lane, "inline_data", data, fidelity))
        if audio.transcript:
            if self._transcript_lane < 0:
                self._transcript_lane = self._start("text", out)
            out.append(PartDelta(self._transcript_lane, "text", audio.transcript))

    def finish(self, reason: str | None, usage: _Usage | None, out: list[LaneEvent]) -> None:
        """The finish reason and/or usage of a chunk (a finish reason closes every lane)."""
        if reason == "error":
            out.append(
                ProviderErrorEvent(
                    ProviderError(
                        NAME, "the reply ended with finish_reason 'error'", in_stream=True
                    )
                )
            )
            return
        if reason:
            if reason == "stop" and self._tool_seen:
                reason = "tool_call"
            self._open.clear()  # the finish reason closes them all
            self._switch(_NONE, out)
        else:
            reason = None
        if reason is not None or usage is not None:
            out.append(
                MessageDelta(
                    finish_reason=reason, usage=_usage(usage) if usage is not None else None
                )
            )


# --- the request ----------------------------------------------------------------------------------


def data_url(data: bytes, mime_type: str) -> str:
    """Bytes as a `data:` URL."""
    return f"data:{mime_type};base64,{base64.b64encode(data).decode('ascii')}"


def reasoning_effort(level: ThinkingLevel | None) -> str | None:
    """OpenAI's `reasoning_effort` for a thinking level (`max` is OpenAI's highest, `xhigh`).

    `none` sends nothing: models that do not reason refuse the field, the newest reasoning
    models default to no reasoning, and older ones cannot turn it off."""
    return None if level is None else _EFFORTS.get(level)


def retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds to wait, from `retry-after-ms` (checked first) or `retry-after` in seconds; an
    HTTP-date `retry-after` is not read (it would need a clock)."""
    lowered = {k.lower(): v for k, v in headers.items()}
    for key, scale in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        value = lowered.get(key)
        if value is None:
            continue
        try:
            seconds = float(value) / scale
        except ValueError:
            continue
        if seconds >= 0:
            return seconds
    return None


_STATUS_WINS: dict[int, type[ProviderError]] = {
    401: AuthenticationError,
    403: AuthenticationError,
    429: RateLimitError,
    503: OverloadedError,
}


def http_error(
    provider: str, status: int, headers: Mapping[str, str], body: bytes
) -> ProviderError:
    """The typed error for an OpenAI-style HTTP error: the body's type or code decides, except
    for 401/403/429/503, whose status is more specific than the body (OpenAI answers a bad key
    with 401 and `type: "invalid_request_error"`). `retry-after-ms` / `retry-after` are read."""
    error = error_from_body(provider, status, body)
    cls = _STATUS_WINS.get(status, type(error))
    return cls(
        provider,
        error.provider_message,
        status=error.status,
        error_type=error.error_type,
        retry_after=retry_after(headers),
    )


def _part(item: ImageUrlDone | InlineDataDone) -> dict[str, Any]:
    if type(item) is ImageUrlDone:
        return {"type": "image_url", "image_url": {"url": item.image_url}}
    assert type(item) is InlineDataDone
    mime = item.mime_type
    if mime.startswith("image/"):
        return {"type": "image_url", "image_url": {"url": data_url(item.data, mime)}}
    audio_format = {"audio/wav": "wav", "audio/x-wav": "wav", "audio/mpeg": "mp3"}.get(mime)
    if audio_format is not None:
        return {
            "type": "input_audio",
            "input_audio": {
                "data": base64.b64encode(item.data).decode("ascii"),
                "format": audio_format,
            },
        }
    filename = "attachment." + (mime.split("/")[-1] or "bin")
    return {"type": "file", "file": {"filename": filename, "file_data": data_url(item.data, mime)}}


def _user_messages(message: UniMessage) -> list[dict[str, Any]]:
    """A user message: text and media as one `user` message, each tool result as a `tool`
    message (its images follow in a `user` message, since tool messages carry only text)."""
    out: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []

    def flush() -> None:
        if not parts:
            return
        if len(parts) == 1 and parts[0]["type"] == "text":
            out.append({"role": "user", "content": parts[0]["text"]})
        else:
            out.append({"role": "user", "content": list(parts)})
        parts.clear()

    for item in message.content_items:
        if type(item) is TextDone:
            parts.append({"type": "text", "text": item.text})
        elif type(item) is ImageUrlDone or type(item) is InlineDataDone:
            parts.append(_part(item))
        elif type(item) is ToolResultDone:
            flush()
            out.append({"role": "tool", "tool_call_id": item.tool_call_id, "content": item.text})
            if item.images:
                out.append(
                    {
                        "role": "user",
                        "content": [
                            {"type": "image_url", "image_url": {"url": url}} for url in item.images
                        ],
                    }
                )
    flush()
    return out


def _assistant_message(message: UniMessage) -> dict[str, Any]:
    """An assistant message replayed: text joined into `content`, tool calls with their
    arguments as a JSON string, reasoning where its fidelity says (`reasoning_field`, or
    `reasoning_details` for a signature or encrypted reasoning); thinking without such a
    fidelity is not sent back. Audio is sent back by its id."""
    text: list[str] = []
    calls: list[dict[str, Any]] = []
    fields: dict[str, list[str]] = {}
    details: list[dict[str, Any]] = []
    audio_id = ""
    for item in message.content_items:
        if type(item) is TextDone:
            text.append(item.text)
        elif type(item) is ToolCallDone:
            calls.append(
                {
                    "id": item.tool_call_id,
                    "type": "function",
                    "function": {"name": item.name, "arguments": dumps_arguments(item.arguments)},
                }
            )
        elif type(item) is ThinkingDone:
            fidelity = item.fidelity or {}
            field = fidelity.get("reasoning_field")
            if isinstance(field, str) and field:
                fields.setdefault(field, []).append(item.thinking)
            elif "signature" in fidelity:
                details.append(
                    {
                        "type": "reasoning.text",
                        "text": item.thinking,
                        "signature": fidelity["signature"],
                        "index": len(details),
                    }
                )
            elif "encrypted_content" in fidelity:
                detail: dict[str, Any] = {
                    "type": "reasoning.encrypted",
                    "data": fidelity["encrypted_content"],
                }
                if "format" in fidelity:
                    detail["format"] = fidelity["format"]
                if "reasoning_id" in fidelity:
                    detail["id"] = fidelity["reasoning_id"]
                detail["index"] = len(details)
                details.append(detail)
        elif type(item) is InlineDataDone:
            audio = (item.fidelity or {}).get("audio_id")
            if isinstance(audio, str) and audio:
                audio_id = audio
    out: dict[str, Any] = {"role": "assistant"}
    if text or not (calls or audio_id):
        out["content"] = "".join(text)
    for field, chunks in fields.items():
        out[field] = "".join(chunks)
    if details:
        out["reasoning_details"] = details
    if calls:
        out["tool_calls"] = calls
    if audio_id:
        out["audio"] = {"id": audio_id}
    return out


def _tools(tools: list[ToolSpec]) -> list[dict[str, Any]]:
    out = []
    for tool in tools:
        function: dict[str, Any] = {"name": tool.name}
        if tool.description:
            function["description"] = tool.description
        function["parameters"] = tool.parameters or _EMPTY_PARAMETERS
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(choice: ToolChoice, tools: list[ToolSpec]) -> tuple[Any, list[ToolSpec]]:
    """`tool_choice` and the tools to offer: one name forces that function; several names offer
    only those tools with `required` (every compatible server understands that)."""
    if isinstance(choice, str):
        return choice, tools
    if len(choice) == 1:
        return {"type": "function", "function": {"name": choice[0]}}, tools
    names = set(choice)
    return "required", [t for t in tools if t.name in names]


class OpenAIChatDialect:
    """OpenAI's Chat Completions API and the servers that speak it.

    Args:
        stream_options: send `stream_options: {"include_usage": true}` with a streaming request
            (without it OpenAI sends no usage; Mistral rejects the field, and sends usage anyway).
        max_tokens_field: the body field for `max_tokens`: OpenAI's current
            `max_completion_tokens` (its reasoning models refuse `max_tokens`), or `max_tokens`
            for servers that only know the older name.
    """

    name = NAME
    framing: Literal["sse"] = "sse"

    def __init__(
        self, *, stream_options: bool = True, max_tokens_field: str = "max_completion_tokens"
    ) -> None:
        self.stream_options = stream_options
        self.max_tokens_field = max_tokens_field

    def build_request(
        self, request: TurnRequest, provider: Provider, *, stream: bool = True
    ) -> HttpRequest:
        """`POST {base}/chat/completions` (the base URL includes `/v1`) with a Bearer key."""
        messages: list[dict[str, Any]] = []
        if request.system_prompt:
            messages.append({"role": "system", "content": request.system_prompt})
        for message in request.messages:
            if message.role == "assistant":
                messages.append(_assistant_message(message))
            else:
                messages.extend(_user_messages(message))
        body: dict[str, Any] = {"model": provider.model, "messages": messages}
        tools = request.tools
        if tools:
            if request.tool_choice is not None:
                body["tool_choice"], tools = _tool_choice(request.tool_choice, tools)
            body["tools"] = _tools(tools)
        if request.max_tokens is not None:
            body[self.max_tokens_field] = request.max_tokens
        if request.temperature is not None:
            body["temperature"] = request.temperature
        effort = reasoning_effort(request.thinking_level)
        if effort is not None:
            body["reasoning_effort"] = effort
        body["stream"] = stream  # explicit either way: a non-streaming request says so
        if stream and self.stream_options:
            body["stream_options"] = {"include_usage": True}
        body.update(request.extra_body.get(NAME, {}))
        headers = {"content-type": "application/json", **provider.headers}
        if provider.api_key is not None:
            headers["authorization"] = f"Bearer {provider.api_key.reveal()}"
        return HttpRequest(
            url=provider.url("chat/completions"), headers=headers, body=msgspec.json.encode(body)
        )

    def stream_decoder(self) -> StreamDecoder:
        """A fresh decoder for one attempt's chunks."""
        return _StreamDecoder()

    def decode_response(self, body: bytes) -> list[LaneEvent]:
        """A non-streaming completion as the stream the API would have sent."""
        completion: _Chunk = strict_decode(_decode_chunk, body, NAME)
        error = _chunk_error(completion)
        if error is not None:
            return [error]
        decoder = _StreamDecoder()
        out: list[LaneEvent] = [MessageStart(completion.id or "", completion.model or "")]
        choice = _first_choice(completion.choices)
        reason = None
        if choice is not None:
            if choice.message is not None:
                decoder.delta(choice.message, out)
            reason = choice.finish_reason
        decoder.finish(reason, completion.usage, out)
        out.append(MessageStop())
        return out

    def error_from_response(
        self, status: int, headers: Mapping[str, str], body: bytes
    ) -> ProviderError:
        """`{"error": {"message", "type", "code"}}` typed as `http_error` says."""
        return http_error(NAME, status, headers, body)
