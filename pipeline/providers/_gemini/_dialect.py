"""Gemini API (`POST /v1beta/models/{model}:streamGenerateContent?alt=sse`), SSE `data:` only.
This module builds the requests and reads error bodies; `_stream` decodes the stream.

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
import math
import mimetypes
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote_to_bytes

import msgspec
from rillet._core._errors import FrameEncodingError, MalformedFrameError, ProviderError
from rillet._core._events import (
    ImageUrlDone,
    InlineDataDone,
    InlineThinkingDone,
    TextDone,
    ThinkingDone,
    ToolCallDone,
    ToolResultDone,
    UniMessage,
)
from rillet._core._lanes import (
    LaneEvent,
    MessageStop,
)

from ..._core._dialect import (
    Framing,
    HttpRequest,
    Provider,
    strict_decode,
    strip_call_suffix,
)
from .._error_body import error_from_body

if TYPE_CHECKING:
    from collections.abc import Mapping

    from rillet._core._request import TurnRequest

    from ..._core._dialect import StreamDecoder

from ._stream import NAME, Chunk, GeminiStreamDecoder, decode_chunk, retry_delay

__all__ = ["GeminiDialect"]

API_VERSION = "v1beta"
_BUDGETS = {"low": 1024, "medium": 8192, "high": 16384, "xhigh": 24576, "max": 24576}
_CHOICE_MODES = {"auto": "AUTO", "required": "ANY", "none": "NONE"}
_decode_chunks = msgspec.json.Decoder(tuple[Chunk, ...])


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
    """Seconds to wait: the `retry-after` header, else the body's `RetryInfo.retryDelay`. A
    header that names no usable wait (zero, negative, not a number) counts as absent."""
    for key, value in headers.items():
        if key.lower() == "retry-after":
            try:
                seconds = float(value)
            except ValueError:
                break
            if math.isfinite(seconds) and seconds > 0:
                return seconds
            break
    error = _error_object(body)
    return None if error is None else retry_delay(error)


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
        return GeminiStreamDecoder()

    def decode_response(self, body: bytes) -> list[LaneEvent]:
        """A non-streaming `GenerateContentResponse` as the stream the API would have sent;
        a JSON array of them (what `streamGenerateContent` sends without `alt=sse`) as that
        stream."""
        many = body.lstrip()[:1] == b"["
        try:
            chunks = (
                strict_decode(_decode_chunks, body, NAME)
                if many
                else (strict_decode(decode_chunk, body, NAME),)
            )
        except MalformedFrameError:
            try:
                body.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise FrameEncodingError(
                    f"response body is not valid UTF-8 (byte {exc.start})", provider=NAME
                ) from None
            raise
        decoder = GeminiStreamDecoder()
        out: list[LaneEvent] = []
        for chunk in chunks:
            out += decoder.chunk(chunk)
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
