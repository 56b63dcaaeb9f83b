"""Gemini API (`POST /v1beta/models/{model}:streamGenerateContent?alt=sse`), SSE `data:` only.

Every chunk is a whole `GenerateContentResponse`; only `candidates[0]` is read. Its parts map to
lanes: text with `thought: true` is thinking, other text is text, and consecutive parts of one
kind continue one group (a change of kind closes the open lane and opens a new one). A part whose
`thoughtSignature` differs from the one already on the open group also starts a new group, since
a group carries at most one fidelity. A `functionCall` is one whole tool call (its own lane, one
fragment of `json.dumps(args)`); an `inlineData` part is one whole image (its own lane, the base64
decoded to bytes; a thought image is `inline_thinking`). Other parts (`executableCode`,
`codeExecutionResult`, `fileData`...) carry nothing we stream and are skipped. `thoughtSignature`
becomes `fidelity {"signature"}` on the fragment of the part that carried it, so a final empty
text part with a signature gives an empty text fragment carrying it.

A call whose arguments stream in (`streamFunctionCallArguments`: a part with the name and
`willContinue`, parts of `partialArgs`, an empty `functionCall` to end it) is put together by
`StreamedCall` and goes out as one whole tool call when it ends (or when the next call, another part
or the finish reason comes). Tool-call ids are `functionCall.id` when Gemini sends one, else the
function's name (`name#2`, `name#3`... for later calls of the same function, see `ToolIds`). There
is no terminal event: the reply is complete after a chunk whose candidate has a `finishReason`, so
the stop is emitted at end of input only if one came (otherwise the grammar reports the truncation).
`STOP` after a function call is `tool_call`. Usage is cumulative on every chunk: cached tokens are
`cachedContentTokenCount`, the prompt is `promptTokenCount` minus them, thoughts are
`thoughtsTokenCount` (reported apart from `candidatesTokenCount`), merged field by field (a chunk
without `candidatesTokenCount` keeps the count an earlier one gave). A prompt blocked before any
candidate (`promptFeedback.blockReason`) finishes with the block reason, so the grammar reports an
empty reply rather than a cut-off one. An `{"error": ...}` chunk ends the stream with the typed
error; a `RetryInfo.retryDelay` in it (or in an HTTP error body) becomes the error's `retry_after`.

Replaying a conversation: a tool result goes back as a `functionResponse` named after its call.
The call's name is read from the replayed assistant `tool_call.done` with the same id; an id is a
name-made one when it is that name or `name#<n>` (`strip_call_suffix(id) == name`), and then it
is never sent (Gemini only knows its own names); any other id is Gemini's own
`functionCall.id` and goes back as `functionCall.id` / `functionResponse.id`. A result whose call
is not in the conversation is named `strip_call_suffix(id)`.
"""

from __future__ import annotations

import base64
import mimetypes
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote_to_bytes

import msgspec
from rillet._errors import FrameEncodingError, MalformedFrameError, ProviderError
from rillet._events import (
    ImageUrlDone,
    InlineDataDone,
    InlineThinkingDone,
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
    PartRun,
    PartStart,
    PartStop,
    ProviderErrorEvent,
    RawUsage,
)

from ._base import (
    Framing,
    HttpRequest,
    Provider,
    ToolIds,
    dumps_arguments,
    error_from_body,
    strict_decode,
    strict_decode_event,
    strip_call_suffix,
)
from ._partial_args import PartialArg, StreamedCall

if TYPE_CHECKING:
    from collections.abc import Mapping

    from rillet._request import TurnRequest
    from rillet._sse import SSEEvent

    from ._base import StreamDecoder

__all__ = ["GeminiDialect"]

NAME = "gemini"
API_VERSION = "v1beta"
_BUDGETS = {"low": 1024, "medium": 8192, "high": 16384, "xhigh": 24576, "max": 24576}
_CHOICE_MODES = {"auto": "AUTO", "required": "ANY", "none": "NONE"}


# --- wire shapes ----------------------------------------------------------------------------------

# Decoded JSON holds no cycles, so the structs stay out of the cycle collector (`gc=False`) and the
# sequences are tuples: a stream decodes thousands of chunks, and every tracked object makes the
# collector run sooner and scan longer.


class _FunctionCall(msgspec.Struct, frozen=True, rename="camel", gc=False):
    """A whole call; or, with streamed arguments, one piece of one (`_partial_args`)."""

    name: str = ""
    args: Any = None
    id: str = ""
    partial_args: list[PartialArg] | None = None
    will_continue: bool = False


class _InlineData(msgspec.Struct, frozen=True, rename="camel", gc=False):
    data: bytes = b""
    mime_type: str = ""


class _Part(msgspec.Struct, frozen=True, rename="camel", gc=False):
    text: str | None = None
    thought: bool = False
    thought_signature: str = ""
    function_call: _FunctionCall | None = None
    inline_data: _InlineData | None = None


class _Content(msgspec.Struct, frozen=True, gc=False):
    parts: tuple[_Part, ...] = ()


class _Candidate(msgspec.Struct, frozen=True, rename="camel", gc=False):
    content: _Content | None = None
    finish_reason: str | None = None


class _Usage(msgspec.Struct, frozen=True, rename="camel", gc=False):
    prompt_token_count: int | None = None
    candidates_token_count: int | None = None
    cached_content_token_count: int | None = None
    thoughts_token_count: int | None = None


class _PromptFeedback(msgspec.Struct, frozen=True, rename="camel", gc=False):
    block_reason: str | None = None


class _Chunk(msgspec.Struct, frozen=True, rename="camel", gc=False):
    candidates: tuple[_Candidate, ...] = ()
    usage_metadata: _Usage | None = None
    prompt_feedback: _PromptFeedback | None = None
    model_version: str = ""
    response_id: str = ""
    error: dict[str, Any] | None = None


_decode_chunk = msgspec.json.Decoder(_Chunk)


def _merge_usage(old: _Usage | None, new: _Usage) -> _Usage:
    """Field by field: a count the new chunk leaves out keeps the value an earlier one gave."""
    if old is None or (
        (new.prompt_token_count is not None or old.prompt_token_count is None)
        and (new.candidates_token_count is not None or old.candidates_token_count is None)
        and (new.cached_content_token_count is not None or old.cached_content_token_count is None)
        and (new.thoughts_token_count is not None or old.thoughts_token_count is None)
    ):
        return new  # the common case: nothing to keep from before
    return _Usage(
        prompt_token_count=_later(old.prompt_token_count, new.prompt_token_count),
        candidates_token_count=_later(old.candidates_token_count, new.candidates_token_count),
        cached_content_token_count=_later(
            old.cached_content_token_count, new.cached_content_token_count
        ),
        thoughts_token_count=_later(old.thoughts_token_count, new.thoughts_token_count),
    )


def _later(old: int | None, new: int | None) -> int | None:
    return old if new is None else new


def _usage(u: _Usage) -> RawUsage:
    cached = u.cached_content_token_count
    prompt = u.prompt_token_count
    if prompt is not None and cached is not None:
        prompt -= cached
    return RawUsage(
        cached_tokens=cached,
        prompt_tokens=prompt,
        thoughts_tokens=u.thoughts_token_count,
        response_tokens=u.candidates_token_count,
    )


class _StreamDecoder:
    """One attempt's chunks (also used once for a non-streaming body)."""

    __slots__ = (
        "_called",
        "_count",
        "_finished",
        "_ids",
        "_index",
        "_kind",
        "_last_usage",
        "_signature",
        "_started",
        "_streamed",
        "failed_at",
    )

    def __init__(self) -> None:
        self._kind: LaneKind | None = None  # the open text or thinking lane, if any
        self._index = 0  # its index
        self._signature = ""  # the signature already on it
        self._count = 0  # lanes opened so far: the next lane's index
        self._ids = ToolIds()
        self._called = False  # a functionCall was seen
        self._finished = False  # a finish reason was seen
        self._started = False  # MessageStart went out
        self._last_usage: _Usage | None = None
        self._streamed: StreamedCall | None = None  # a call whose arguments are streaming in
        self.failed_at = 0  # the frame `feed_frames` failed on

    sse_bytes = True  # an unnamed event may come as its data's bytes (`FramesDecoder`)

    def feed(self, frame: SSEEvent | bytes) -> list[LaneEvent]:
        data = frame if type(frame) is bytes else frame.data  # type: ignore[union-attr]
        try:  # the hot path: one call into msgspec; on error, strict_decode types it
            decoded = _decode_chunk.decode(data)
        except msgspec.MsgspecError:
            decoded = strict_decode_event(_decode_chunk, data, NAME)
        return self.chunk(decoded)

    def feed_frames(self, frames: list[Any], out: list[LaneEvent]) -> None:
        """`feed` on each frame in turn, with its fast path inline (`FramesDecoder`): a chunk
        whose one part is more text (or thinking) for the open lane, without a signature, and
        no finish reason, error or call streaming in, joins the run of them handed on as one
        `PartRun`; the only other thing
        it carries is the cumulative usage, which is kept for the finish."""
        decode = _decode_chunk.decode
        # what the fast path needs of the state changes only in `chunk`: read it again after one
        lane = self._fast_lane()
        index = self._index
        thought = lane == "thinking"
        run: list[str] | None = None  # the run of fragments being handed on (`PartRun`)
        at = 0
        try:
            for at, frame in enumerate(frames):  # noqa: B007 - `at` names the failing frame
                data = frame if type(frame) is bytes else frame.data
                try:
                    chunk = decode(data)
                except msgspec.MsgspecError:
                    chunk = strict_decode_event(_decode_chunk, data, NAME)
                if lane is not None and chunk.candidates and chunk.error is None:
                    candidate = chunk.candidates[0]
                    content = candidate.content
                    if (
                        content is not None
                        and candidate.finish_reason is None
                        and len(content.parts) == 1
                    ):
                        part = content.parts[0]
                        text = part.text
                        if (
                            text
                            and part.thought == thought
                            and not part.thought_signature
                            and part.function_call is None
                            and part.inline_data is None
                        ):
                            u = chunk.usage_metadata
                            if u is not None:
                                self._last_usage = _merge_usage(self._last_usage, u)
                            if run is None:
                                run = []
                                out.append(PartRun(index, lane, run))
                            run.append(text)
                            continue
                run = None
                out += self.chunk(chunk)
                lane = self._fast_lane()
                index = self._index
                thought = lane == "thinking"
        except BaseException:
            self.failed_at = at
            raise

    def _fast_lane(self) -> LaneKind | None:
        """The open lane a chunk of one plain part may go on with inline (`feed_frames`): None
        before the reply started, after its finish reason, or while a call streams in."""
        if self._started and not self._finished and self._streamed is None:
            return self._kind
        return None

    def close(self) -> list[LaneEvent]:
        if self._finished:
            return [MessageStop()]
        # cut off: the usage so far still reaches the grammar (and its IncompleteStreamError)
        u = self._last_usage
        return [] if u is None else [MessageDelta(usage=_usage(u))]

    def chunk(self, chunk: _Chunk) -> list[LaneEvent]:
        """The lane events of one decoded chunk."""
        out: list[LaneEvent] = []
        if not self._started and (chunk.response_id or chunk.model_version):
            self._started = True
            out.append(MessageStart(chunk.response_id, chunk.model_version))
        finish: str | None = None
        if chunk.candidates:
            candidate = chunk.candidates[0]
            if candidate.content is not None:
                for part in candidate.content.parts:
                    self._part(part, out)
            finish = candidate.finish_reason
            if finish is not None and self._called and finish.upper() == "STOP":
                finish = "tool_call"
        elif chunk.prompt_feedback is not None:
            finish = chunk.prompt_feedback.block_reason
        # usage is cumulative and repeated on every chunk: keep the latest, and hand it on only
        # with the finish reason (or at the end of a stream cut off before one)
        u = chunk.usage_metadata
        if u is not None:
            u = _merge_usage(self._last_usage, u)  # a count missing here keeps its last value
            if self._finished and u != self._last_usage:  # usage after the finish reason
                out.append(MessageDelta(usage=_usage(u)))
            self._last_usage = u
        if finish is not None and self._streamed is not None:
            self._flush(out)  # the reply is over: so is the call streaming in
        if finish is not None:
            self._finished = True
            last = self._last_usage
            out.append(
                MessageDelta(finish_reason=finish, usage=None if last is None else _usage(last))
            )
        if chunk.error is not None:
            error = error_from_body(NAME, None, {"error": chunk.error}, in_stream=True)
            error.retry_after = _retry_delay(chunk.error)
            out.append(ProviderErrorEvent(error))
        return out

    def _part(self, part: _Part, out: list[LaneEvent]) -> None:
        signature = part.thought_signature
        fidelity = {"signature": signature} if signature else None
        text = part.text
        call = part.function_call
        if call is not None:
            self._call(call, fidelity, out)
            return
        if self._streamed is not None and (text or part.inline_data is not None):
            self._flush(out)
        if text is not None and part.inline_data is None:
            kind: LaneKind = "thinking" if part.thought else "text"
            if kind != self._kind or (
                signature and self._signature and signature != self._signature
            ):
                if not text and fidelity is None:
                    return  # an empty part neither continues nor starts a group
                self._open(kind, out)
            elif not text and fidelity is None:
                return
            if signature:
                self._signature = signature
            out.append(PartDelta(self._index, kind, text, fidelity))
            return
        data = part.inline_data
        if data is not None:
            media: LaneKind = "inline_thinking" if part.thought else "inline_data"
            index = self._whole(out)
            out.append(PartStart(index=index, kind=media, mime_type=data.mime_type))
            out.append(PartDelta(index, media, data.data, fidelity))
            out.append(PartStop(index, media))
        # executableCode, codeExecutionResult, fileData...: nothing to stream

    def _call(
        self, call: _FunctionCall, fidelity: dict[str, Any] | None, out: list[LaneEvent]
    ) -> None:
        """A `functionCall` part: a whole call, or the start, a piece or the end of a call whose
        arguments stream in (a part without a name goes on with the call streaming now)."""
        streamed = self._streamed
        if streamed is not None and not call.name:
            if streamed.fidelity is None:
                streamed.fidelity = fidelity
            if isinstance(call.args, dict):
                streamed.arguments.update(call.args)
            for partial in call.partial_args or ():
                streamed.apply(partial)
            if not call.will_continue:
                self._flush(out)
            return
        if streamed is not None:
            self._flush(out)  # another call began: the one before is complete
        if not call.name:
            raise MalformedFrameError("a function call without a name", str(call), provider=NAME)
        self._called = True
        if call.will_continue or call.partial_args:
            streamed = StreamedCall(call.name, call.id, fidelity, NAME, call.args)
            for partial in call.partial_args or ():
                streamed.apply(partial)
            self._streamed = streamed
            if not call.will_continue:
                self._flush(out)
            return
        args = call.args if call.args is not None else {}
        self._whole_call(call.name, call.id, args, fidelity, out)

    def _flush(self, out: list[LaneEvent]) -> None:
        """The call whose arguments streamed in is complete: one tool call with them all."""
        streamed = self._streamed
        assert streamed is not None
        self._streamed = None
        self._whole_call(
            streamed.name, streamed.call_id, streamed.arguments, streamed.fidelity, out
        )

    def _whole_call(
        self,
        name: str,
        call_id: str,
        args: Any,
        fidelity: dict[str, Any] | None,
        out: list[LaneEvent],
    ) -> None:
        call_id = call_id or self._ids.next(name)
        index = self._whole(out)
        out.append(PartStart(index=index, kind="tool_call", name=name, call_id=call_id))
        out.append(PartDelta(index, "tool_call", dumps_arguments(args), fidelity))
        out.append(PartStop(index, "tool_call"))

    def _open(self, kind: LaneKind, out: list[LaneEvent]) -> None:
        """Close the open text/thinking lane, if any, and open a new one of `kind`."""
        if self._kind is not None:
            out.append(PartStop(self._index, self._kind))
        self._index = self._count
        self._count += 1
        self._kind = kind
        self._signature = ""
        out.append(PartStart(index=self._index, kind=kind))

    def _whole(self, out: list[LaneEvent]) -> int:
        """Close the open text/thinking lane, if any; the index for a whole item's lane."""
        if self._kind is not None:
            out.append(PartStop(self._index, self._kind))
            self._kind = None
        index = self._count
        self._count += 1
        return index


# --- requests -------------------------------------------------------------------------------------


def _data_url(url: str) -> tuple[str, str]:
    """A `data:` URL's mime type and its payload as base64 text."""
    head, _, payload = url.partition(",")
    params = head[5:].split(";")
    if "base64" in params[1:]:
        return params[0], payload
    return params[0], base64.b64encode(unquote_to_bytes(payload)).decode("ascii")


def _image(url: str) -> dict[str, Any]:
    if url.startswith("data:"):
        mime_type, data = _data_url(url)
        return {"inlineData": {"mimeType": mime_type, "data": data}}
    file_data = {"fileUri": url}
    guessed = mimetypes.guess_type(url)[0]
    if guessed:
        file_data["mimeType"] = guessed
    return {"fileData": file_data}


def _signed(part: dict[str, Any], fidelity: dict[str, Any] | None) -> dict[str, Any]:
    signature = (fidelity or {}).get("signature")
    if signature:
        part["thoughtSignature"] = signature
    return part


def _is_provider_id(call_id: str, name: str) -> bool:
    """Whether a call id is Gemini's own `functionCall.id` rather than one made from the name."""
    return strip_call_suffix(call_id) != name


def _parts(message: UniMessage, names: Mapping[str, str]) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = []
    for item in message.content_items:
        if type(item) is TextDone:
            if item.text or item.fidelity:
                parts.append(_signed({"text": item.text}, item.fidelity))
        elif type(item) is ThinkingDone:
            parts.append(_signed({"text": item.thinking, "thought": True}, item.fidelity))
        elif type(item) is ToolCallDone:
            call: dict[str, Any] = {"name": item.name, "args": item.arguments}
            if _is_provider_id(item.tool_call_id, item.name):
                call["id"] = item.tool_call_id
            parts.append(_signed({"functionCall": call}, item.fidelity))
        elif type(item) is ToolResultDone:
            call_id = item.tool_call_id
            name = names.get(call_id) or strip_call_suffix(call_id)
            response: dict[str, Any] = {"name": name, "response": {"output": item.text}}
            if _is_provider_id(call_id, name):
                response["id"] = call_id
            parts.append({"functionResponse": response})
            parts.extend(_image(url) for url in item.images or ())
        elif type(item) is ImageUrlDone:
            parts.append(_image(item.image_url))
        elif type(item) is InlineDataDone or type(item) is InlineThinkingDone:
            blob = {"mimeType": item.mime_type, "data": base64.b64encode(item.data).decode()}
            part: dict[str, Any] = {"inlineData": blob}
            if type(item) is InlineThinkingDone:
                part["thought"] = True
            parts.append(_signed(part, item.fidelity))
    return parts


def _contents(messages: list[UniMessage]) -> list[dict[str, Any]]:
    names = {
        item.tool_call_id: item.name
        for message in messages
        if message.role == "assistant"
        for item in message.content_items
        if type(item) is ToolCallDone
    }
    contents = []
    for message in messages:
        parts = _parts(message, names)
        if parts:
            role = "model" if message.role == "assistant" else "user"
            contents.append({"role": role, "parts": parts})
    return contents


def _model_path(model: str, stream: bool) -> str:
    model = model.removeprefix("models/")
    method = "streamGenerateContent?alt=sse" if stream else "generateContent"
    return f"/{API_VERSION}/models/{model}:{method}"


def _retry_after(headers: Mapping[str, str], body: bytes) -> float | None:
    """Seconds to wait: the `retry-after` header, else the body's `RetryInfo.retryDelay`."""
    for key, value in headers.items():
        if key.lower() == "retry-after":
            try:
                return float(value)
            except ValueError:
                break
    error = _error_object(body)
    return None if error is None else _retry_delay(error)


def _error_object(body: bytes) -> Any:
    """The `error` object of an error body: `{"error": ...}`, or that inside a one-element JSON
    array (what the streaming endpoint answers without `alt=sse`); None if neither."""
    try:
        data = msgspec.json.decode(body)
    except (msgspec.DecodeError, RecursionError):
        return None
    if isinstance(data, list) and len(data) == 1:
        data = data[0]
    return data.get("error") if isinstance(data, dict) else None


def _retry_delay(error: Any) -> float | None:
    """The wait an error object's `google.rpc.RetryInfo` detail asks for (`"37s"` -> 37.0)."""
    details = error.get("details") if isinstance(error, dict) else None
    if not isinstance(details, list):
        return None
    for detail in details:
        if isinstance(detail, dict) and str(detail.get("@type", "")).endswith("RetryInfo"):
            delay = detail.get("retryDelay")
            if isinstance(delay, str) and delay.endswith("s"):
                try:
                    seconds = float(delay[:-1])
                except ValueError:
                    return None
                return seconds if seconds >= 0 else None
    return None


class GeminiDialect:
    """The Gemini API's `generateContent` / `streamGenerateContent`."""

    name = NAME
    framing: Framing = "sse"

    def build_request(
        self, request: TurnRequest, provider: Provider, *, stream: bool = True
    ) -> HttpRequest:
        """`POST {base}/v1beta/models/{model}:streamGenerateContent?alt=sse` (or
        `:generateContent`), the key in `x-goog-api-key`, never in the URL."""
        body: dict[str, Any] = {"contents": _contents(request.messages)}
        if request.system_prompt:
            body["systemInstruction"] = {"parts": [{"text": request.system_prompt}]}
        if request.tools:
            declarations = []
            for tool in request.tools:
                declaration: dict[str, Any] = {"name": tool.name}
                if tool.description:
                    declaration["description"] = tool.description
                if tool.parameters is not None:
                    declaration["parametersJsonSchema"] = tool.parameters
                declarations.append(declaration)
            body["tools"] = [{"functionDeclarations": declarations}]
        choice = request.tool_choice
        if isinstance(choice, list):
            if choice:
                body["toolConfig"] = {
                    "functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": choice}
                }
        elif choice is not None:
            body["toolConfig"] = {"functionCallingConfig": {"mode": _CHOICE_MODES[choice]}}
        config: dict[str, Any] = {}
        if request.max_tokens is not None:
            config["maxOutputTokens"] = request.max_tokens
        if request.temperature is not None:
            config["temperature"] = request.temperature
        level = request.thinking_level
        if level == "none":
            config["thinkingConfig"] = {"thinkingBudget": 0}
        elif level is not None:
            config["thinkingConfig"] = {"includeThoughts": True, "thinkingBudget": _BUDGETS[level]}
        if config:
            body["generationConfig"] = config
        body.update(request.extra_body.get(NAME, {}))
        headers = {"content-type": "application/json", **provider.headers}
        if provider.api_key is not None:
            headers["x-goog-api-key"] = provider.api_key.reveal()
        return HttpRequest(
            url=provider.url(_model_path(provider.model, stream)),
            headers=headers,
            body=msgspec.json.encode(body),
        )

    def stream_decoder(self) -> StreamDecoder:
        """A fresh decoder for one attempt's chunks."""
        return _StreamDecoder()

    def decode_response(self, body: bytes) -> list[LaneEvent]:
        """A non-streaming `GenerateContentResponse` as the stream the API would have sent."""
        try:
            chunk = strict_decode(_decode_chunk, body, NAME)
        except MalformedFrameError:
            try:
                body.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise FrameEncodingError(
                    f"response body is not valid UTF-8 (byte {exc.start})", provider=NAME
                ) from None
            raise
        out = _StreamDecoder().chunk(chunk)
        out.append(MessageStop())
        return out

    def error_from_response(
        self, status: int, headers: Mapping[str, str], body: bytes
    ) -> ProviderError:
        """`{"error": {"code", "message", "status"}}` typed by its status word, with the wait a
        429 asks for (`retry-after`, or the body's `RetryInfo`)."""
        error_object = _error_object(body)
        wrapped = error_object is not None and body.lstrip()[:1] == b"["
        error = error_from_body(NAME, status, {"error": error_object} if wrapped else body)
        if error.retry_after is None:
            error.retry_after = _retry_after(headers, body)
        return error
