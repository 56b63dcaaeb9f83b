"""How a Chat Completions stream (`POST {base}/chat/completions`, OpenAI and every compatible
server) maps to lane events.

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
  `refusal` (OpenAI's words when the model refuses, sent in place of `content`) is text too, a
  group of its own whose first fragment carries `fidelity {"refusal": true}`, and
  the reply's `stop` is then passed as `refusal`: the provider's rules stopped the answer, as
  Anthropic's `refusal` stop reason says.
  Mistral's reasoning models send it as a list of chunks: `{"type": "text", "text"}` is text,
  `{"type": "thinking", "thinking": [{"type": "text", "text"}]}` is thinking with
  `fidelity {"reasoning_field": "content"}` (sent back as such chunks); other chunk types are
  skipped.
* `tool_calls`: one tool lane per call, told apart by the call's `index` (and by a new `id` at
  an index already in use, as servers that send whole calls at index 0 do); a fragment without
  an index goes to the open call whose `id` it repeats, else to the call streaming now. Earlier
  calls stay open when a later index appears, since fragments of parallel calls may interleave;
  the grammar holds later calls back until earlier ones close. A call without an id gets its
  function's name (`name#2`... for repeats).
* `audio` (OpenAI audio output): its base64 `data` fragments are decoded into one inline_data
  lane (`fidelity {"audio_id"}` carries the id to send back), its `transcript` fragments are a
  text lane after it. The audio lane opens first so the audio streams live. Streamed audio is
  always `pcm16` (24 kHz mono, little-endian) on OpenAI, so its mime type is `audio/pcm`; a
  non-streaming body's audio is sniffed (WAV, MP3, FLAC, Ogg) and falls back to `audio/pcm`.

A `finish_reason` closes every lane; `stop` after a tool call is passed as `tool_call` (some
compatible servers say `stop` there). Usage may come on any chunk (Groq's only in `x_groq.usage`),
or never: many compatible servers ignore `include_usage`, and some never set a finish reason;
`[DONE]` ends the reply all the same (the grammar gives null usage, finish `unknown`), and nothing
after it is read. A body that ends cleanly without `[DONE]` is whole once both its finish reason
and its usage came (Cerebras never sends `[DONE]`); else it was cut off. Errors inside the stream
(a top-level `error` object, vLLM's `{"object": "error", ...}`, OpenRouter's `error` with
`finish_reason: "error"`, MiniMax's `base_resp`, any `event: error` frame whatever its data)
become the typed error; a bare `finish_reason: "error"` is a `ProviderError`.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Any

import msgspec
from rillet._core._errors import MalformedFrameError, ProviderError
from rillet._core._lanes import (
    LaneEvent,
    LaneKind,
    MessageDelta,
    MessageStart,
    MessageStop,
    PartDelta,
    PartRun,
    PartStart,
    PartStop,
    ProviderErrorEvent,
)

from ..._core._dialect import ToolIds, sse_event, sse_text, strict_decode
from ._wire import (
    DETAIL_TYPES,
    FIELD_SHAPES,
    NAME,
    STREAM_AUDIO_MIME,
    Audio,
    Chunk,
    ChunkUsage,
    ContentPart,
    Delta,
    Detail,
    Frame,
    ToolCall,
    arguments_run,
    arguments_text,
    b64,
    checked_detail,
    chunk_error,
    decode_chunk,
    decode_frame,
    event_error,
    field_run,
    first_choice,
    raw_usage,
    sniff_audio,
    thinking_texts,
)

if TYPE_CHECKING:
    from rillet._core._events import Fidelity
    from rillet._core._sse import SSEEvent

__all__ = [
    "NAME",
    "REFUSAL_FIDELITY",
    "ChatStreamDecoder",
    "decode_completion",
    "is_refusal",
    "sniff_audio",
]

REFUSAL_FIDELITY: dict[str, Any] = {"refusal": True}
"""The fidelity of a refusal's first text fragment: the words are the model's refusal, which
OpenAI's wires carry in a field (`refusal`) of their own."""


def is_refusal(fidelity: Fidelity | None) -> bool:
    """Whether a text item's fidelity says its words are the model's refusal (OpenAI answers
    one in `refusal`, with `content: null` and the finish reason `stop`)."""
    return fidelity is not None and fidelity.get("refusal") is True


class Field(enum.IntEnum):
    """Which wire field the open group came from (an int, so comparing costs what an int's
    does on the hot path)."""

    NONE = 0  # no group is open
    REASONING_CONTENT = 1  # `reasoning_content` (DeepSeek, vLLM, llama.cpp)
    REASONING = 2  # `reasoning` (OpenRouter, newer vLLM)
    DETAILS = 3  # `reasoning_details`
    CONTENT = 4  # `content` as a string, or a text part of a `content` list
    TOOLS = 5  # `tool_calls`
    AUDIO = 6  # `audio`
    THINK_PART = 7  # a thinking part of a `content` list
    REFUSAL = 8  # `refusal`


class End(enum.IntFlag):
    """What of a reply's end came: its finish reason, its usage, or both (`WHOLE`)."""

    NONE = 0
    FINISH = 1
    USAGE = 2
    WHOLE = 3


# module constants: one global load each on the hot path, not a class attribute lookup
_NONE, _RC, _R, _DETAILS = Field.NONE, Field.REASONING_CONTENT, Field.REASONING, Field.DETAILS
_CONTENT, _TOOLS, _AUDIO, _THINK_PART = Field.CONTENT, Field.TOOLS, Field.AUDIO, Field.THINK_PART
_REFUSAL = Field.REFUSAL
_PAUSE = 8  # reads read chunk by chunk after one that was not all more of its field
# the one-lane fields whose reads may be all more of them (`field_run`): wire name, lane kind
_FIELD_RUNS: dict[Field, tuple[str, LaneKind]] = {
    _CONTENT: ("content", "text"),
    _RC: ("reasoning_content", "thinking"),
    _R: ("reasoning", "thinking"),
}


class ChatStreamDecoder:
    """One attempt's Chat Completions stream (also replays a whole completion in one go)."""

    __slots__ = (
        "_audio_lane",
        "_done",
        "_ended",
        "_field",
        "_ids",
        "_keys",
        "_lane",
        "_last_key",
        "_next",
        "_open",
        "_pause",
        "_refused",
        "_started",
        "_think_fid",
        "_think_key",
        "_tool_seen",
        "_tools",
        "_transcript_lane",
        "failed_at",
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
        self._refused = False  # a `refusal` came: the model declined
        self._started = False
        self._done = False  # `[DONE]` came: nothing after it is read
        self._ended = End.NONE  # what of the end came (`close` reads it)
        self._ids = ToolIds()
        self.failed_at = 0  # the frame `feed_frames` failed on
        self._pause = 0  # reads to go before a read is tried as one run again (`_run`)

    sse_bytes = True  # an event may come as its data's bytes (`FramesDecoder`)

    def feed(self, frame: SSEEvent | bytes | tuple[str, bytes]) -> list[LaneEvent]:
        """The lane events of one chunk; nothing once `[DONE]` came. The event's name is read
        only for `error`: vLLM, TGI and others send an error so, whatever its data's shape."""
        if self._done:
            return []  # a second `[DONE]`, chunks after it: the reply is over
        name, data = sse_event(frame)
        if data == b"[DONE]" if type(data) is bytes else data == "[DONE]":
            self._done = True
            return [MessageStop()]
        if name == "error":
            self._done = True
            return [ProviderErrorEvent(event_error(data))]
        out: list[LaneEvent] = []
        chunk: Frame
        if self._started:
            try:  # the hot path: one call into msgspec; on error, strict_decode types it
                chunk = decode_frame.decode(data)
            except msgspec.MsgspecError:
                chunk = strict_decode(decode_frame, sse_text(data), NAME)
        else:
            try:
                first: Chunk = decode_chunk.decode(data)
            except msgspec.MsgspecError:
                first = strict_decode(decode_chunk, sse_text(data), NAME)
            if first.id or first.model:
                self._started = True
                out.append(MessageStart(first.id or "", first.model or ""))
            chunk = first
        self.chunk(chunk, out)
        return out

    def feed_frames(self, frames: list[Any], out: list[LaneEvent]) -> None:
        """`feed` on each chunk in turn, with the commonest chunks (one more fragment of the open
        text lane or of the open tool call's arguments) handled inline (`FramesDecoder`)."""
        decode = decode_frame.decode
        tools = self._tools  # cleared, never replaced
        # the state the fast path reads, kept in locals: only the slow paths change it
        streaming = self._started and not self._done
        field = self._field
        lane = self._lane
        # the run of fragments being handed on (`PartRun`): the text's (`run_lane` -1) or the
        # arguments of the call in lane `run_lane`
        run: list[str] | None = None
        run_lane = -1
        if streaming and (field in _FIELD_RUNS or field == _TOOLS):
            # the commonest reads of all, nothing but more of the field streaming now: no
            # check per chunk (`_run`)
            if self._pause:
                self._pause -= 1
            else:
                part = self._run(frames, field, lane)
                if part is not None:
                    out.append(part)
                    return
                self._pause = _PAUSE
        at = 0
        try:
            for at, frame in enumerate(frames):  # noqa: B007 - `at` names the failing frame
                if type(frame) is bytes:
                    data = frame
                    done = data == b"[DONE]"
                elif type(frame) is tuple:  # a named event: `error` goes the slow way too
                    data = frame[1]
                    done = data == b"[DONE]" or frame[0] == "error"
                else:
                    data = frame.data
                    done = data == "[DONE]" or frame.event == "error"
                if not streaming or done:
                    run = None
                    out += self.feed(frame)
                    streaming = self._started and not self._done
                    field = self._field
                    lane = self._lane
                    continue
                try:
                    chunk = decode(data)
                except msgspec.MsgspecError:
                    chunk = strict_decode(decode_frame, sse_text(data), NAME)
                choices = chunk.choices
                if choices:
                    choice = choices[0]
                    delta = choice.delta
                    if (
                        delta is not None
                        and not choice.index  # choice 0 (or no index): the one read
                        and not choice.finish_reason
                        and delta.reasoning_content is None
                        and delta.reasoning is None
                        and delta.reasoning_details is None
                        and delta.audio is None
                        and chunk.usage is None
                        and chunk.x_groq is None
                        and not chunk.error
                        and chunk.object != "error"
                    ):
                        content = delta.content
                        calls = delta.tool_calls
                        if calls is None:
                            if field == _CONTENT and type(content) is str and content:
                                if run is None or run_lane != -1:
                                    run, run_lane = [], -1
                                    out.append(PartRun(lane, "text", run))
                                run.append(content)
                                continue
                        elif field == _TOOLS and content is None and len(calls) == 1:
                            call = calls[0]
                            key = call.index
                            current = tools.get(key) if key is not None else None
                            if current is not None and (call.id is None or call.id == current[1]):
                                # one more fragment of an open call's arguments
                                self._last_key = key
                                function = call.function
                                if function is not None and (given := function.arguments):
                                    if run is None or run_lane != current[0]:
                                        run, run_lane = [], current[0]
                                        out.append(PartRun(run_lane, "tool_call", run))
                                    if type(given) is not str:  # the object itself
                                        given = arguments_text(given)
                                    run.append(given)
                                continue
                run = None
                self.chunk(chunk, out)
                field = self._field
                lane = self._lane
        except BaseException:
            self.failed_at = at
            raise

    def _run(self, frames: list[Any], field: Field, lane: int) -> PartRun | None:
        """A read whose chunks are all more of the field streaming now (text, reasoning, the
        arguments of the call streaming now) as one run, decoded with shapes that admit
        nothing else; None for any other read."""
        named = _FIELD_RUNS.get(field)
        if named is not None:
            wire, kind = named
            run = field_run(frames, FIELD_SHAPES[wire], wire)
            return None if run is None else PartRun(lane, kind, run)
        key = self._last_key
        current = self._tools.get(key) if key is not None else None
        if key is None or current is None:
            return None
        run = arguments_run(frames, key, current[1])
        return None if run is None else PartRun(current[0], "tool_call", run)

    def chunk(self, chunk: Frame, out: list[LaneEvent]) -> None:
        """The lane events of one decoded chunk (after its `MessageStart`, if it carries one)."""
        choice = first_choice(chunk.choices)
        if choice is not None and choice.delta is not None:
            self.delta(choice.delta, out)
        if chunk.error or chunk.object == "error" or chunk.base_resp is not None:
            error = chunk_error(chunk)
            if error is not None:
                out.append(error)
                return
        reason = choice.finish_reason if choice is not None else None
        usage = chunk.usage
        if usage is None and chunk.x_groq is not None:
            usage = chunk.x_groq.usage
        if reason or usage is not None:
            self.finish(reason, usage, out)

    def close(self) -> list[LaneEvent]:
        """The body's clean end. `[DONE]` is the stream's own end; without it, a reply whose
        finish reason and usage both came is whole too (some servers never send `[DONE]`, so
        asking again would get the same bytes), and what else is cut off is a truncation."""
        if not self._done and self._ended == End.WHOLE:
            self._done = True
            return [MessageStop()]
        return []

    # --- groups -----------------------------------------------------------------------------------

    def _switch(self, field: Field, out: list[LaneEvent]) -> None:
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

    def delta(self, delta: Delta, out: list[LaneEvent]) -> None:
        """The lane events of one delta (or one whole message), in wire-field order, but for
        fragments of the open calls beside the start of another field: those go first."""
        content = delta.content
        if (
            type(content) is str
            and content
            and self._field == _CONTENT
            and delta.reasoning_content is None
            and delta.reasoning is None
            and delta.reasoning_details is None
            and delta.tool_calls is None
            and delta.audio is None
        ):  # the hot path: one more fragment of the text being streamed
            out.append(PartDelta(self._lane, "text", content))
            return
        calls = delta.tool_calls
        if (
            calls
            and self._field == _TOOLS
            and (content or delta.reasoning_content or delta.reasoning or delta.reasoning_details)
            and self._continue(calls)
        ):
            # fragments of the open calls, with another field starting in the same delta: the
            # calls take theirs first (the other field would close them), whatever the order
            self._tool_calls(calls, out)
            calls = None
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
        if isinstance(content, str):
            if content:
                self._text(content, out)
        elif content:
            self._content_parts(content, out)
        if delta.refusal:
            self._refused = True
            self._refusal(delta.refusal, out)
        if calls:
            self._tool_calls(calls, out)
        if delta.audio is not None:
            self._audio(delta.audio, out)

    def _text(self, text: str, out: list[LaneEvent]) -> None:
        if self._field != _CONTENT:
            self._switch(_CONTENT, out)
            self._lane = self._start("text", out)
        out.append(PartDelta(self._lane, "text", text))

    def _refusal(self, text: str, out: list[LaneEvent]) -> None:
        """A fragment of the model's refusal: text of a group of its own, whose first fragment
        says so (`fidelity {"refusal": true}`), so it can be answered and sent back as one."""
        if self._field != _REFUSAL:
            self._switch(_REFUSAL, out)
            self._lane = self._start("text", out)
            out.append(PartDelta(self._lane, "text", text, REFUSAL_FIDELITY))
        else:
            out.append(PartDelta(self._lane, "text", text))

    def _content_parts(self, parts: list[ContentPart], out: list[LaneEvent]) -> None:
        """A `content` list (Mistral's reasoning models): text chunks are text, thinking chunks
        thinking (sent back in `content`, so `reasoning_field` says so); other types are skipped."""
        for part in parts:
            if part.type == "text":
                if type(part.text) is not str:
                    raise MalformedFrameError("a text chunk without text", str(part), provider=NAME)
                if part.text:
                    self._text(part.text, out)
            elif part.type == "thinking":
                for text in thinking_texts(part.thinking):
                    self._thinking(_THINK_PART, text, "content", out)

    def _thinking(self, field: Field, text: str, wire_name: str, out: list[LaneEvent]) -> None:
        """A reasoning fragment; a group's first carries the wire field it came in, if one."""
        if self._field != field:
            self._switch(field, out)
            self._lane = self._start("thinking", out)
            fidelity = {"reasoning_field": wire_name} if wire_name else None
            out.append(PartDelta(self._lane, "thinking", text, fidelity))
        else:
            out.append(PartDelta(self._lane, "thinking", text))

    def _details(self, details: list[Detail], out: list[LaneEvent]) -> None:
        for detail in details:
            kind = detail.type
            if kind not in DETAIL_TYPES:
                continue  # a type added later
            checked_detail(detail)
            fragments: list[tuple[str, dict[str, Any] | None]] = []
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

    def _continue(self, calls: list[ToolCall]) -> bool:
        """Whether every fragment goes on with an open call (as `_tool_calls` keys them), none
        starting one."""
        tools = self._tools
        for call in calls:
            if call.index is not None:
                current = tools.get(call.index)
                if current is None or (call.id and call.id != current[1]):
                    return False
            elif call.id:
                if all(known != call.id for _, known in tools.values()):
                    return False
            elif self._last_key is None or (call.function is not None and call.function.name):
                return False
        return True

    def _tool_calls(self, calls: list[ToolCall], out: list[LaneEvent]) -> None:
        if self._field != _TOOLS:
            self._switch(_TOOLS, out)
        tools = self._tools
        for call in calls:
            function = call.function
            given = function.arguments if function is not None else None
            arguments = None if given is None else arguments_text(given)
            name = (function.name if function is not None else None) or ""
            key = call.index
            if key is None and call.id:  # no index, but the id of an open call: that call
                key = next((k for k, (_, known) in tools.items() if known == call.id), None)
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

    def _audio(self, audio: Audio, out: list[LaneEvent]) -> None:
        data = b64(audio.data) if audio.data else b""
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

    def finish(self, reason: str | None, usage: ChunkUsage | None, out: list[LaneEvent]) -> None:
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
            if reason == "stop" and self._refused:
                reason = "refusal"
            elif reason == "stop" and self._tool_seen:
                reason = "tool_call"
            self._open.clear()  # the finish reason closes them all
            self._switch(_NONE, out)
        else:
            reason = None
        if reason is not None:
            self._ended |= End.FINISH
        if usage is not None:
            self._ended |= End.USAGE
        if reason is not None or usage is not None:
            out.append(
                MessageDelta(
                    finish_reason=reason, usage=raw_usage(usage) if usage is not None else None
                )
            )


def decode_completion(body: bytes) -> list[LaneEvent]:
    """A non-streaming completion as the lane events of the stream the API would have sent."""
    completion: Chunk = strict_decode(decode_chunk, body, NAME)
    error = chunk_error(completion)
    if error is not None:
        return [error]
    decoder = ChatStreamDecoder()
    out: list[LaneEvent] = [MessageStart(completion.id or "", completion.model or "")]
    choice = first_choice(completion.choices)
    reason = None
    if choice is not None:
        if choice.message is not None:
            decoder.delta(choice.message, out)
        reason = choice.finish_reason
    decoder.finish(reason, completion.usage, out)
    out.append(MessageStop())
    return out
