"""OpenAI Chat Completions (`POST {base}/chat/completions`) and every compatible server: the
request (messages, tools, reasoning effort), what its HTTP errors mean, and the dialect. How its
stream maps to lane events is `_stream`.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Literal

from rillet._core._errors import (
    UNCURABLE_CODES,
    AuthenticationError,
    OverloadedError,
    ProviderError,
    RateLimitError,
)
from rillet._core._events import (
    ImageUrlDone,
    InlineDataDone,
    TextDone,
    ThinkingDone,
    ToolCallDone,
    ToolResultDone,
    UniMessage,
)

from ..._core._dialect import HttpRequest, Provider, dumps_arguments
from .._error_body import error_from_body
from .._openai_request import bearer_json_request, media_part, user_messages
from ._stream import NAME, ChatStreamDecoder, decode_completion, is_refusal, sniff_audio

if TYPE_CHECKING:
    from collections.abc import Mapping

    from rillet._core._lanes import LaneEvent
    from rillet._core._request import ThinkingLevel, ToolChoice, ToolSpec, TurnRequest

    from ..._core._dialect import StreamDecoder

__all__ = [
    "OpenAIChatDialect",
    "http_error",
    "reasoning_effort",
    "retry_after",
    "sniff_audio",
]

_EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}
_EFFORTS: dict[str, str] = {
    "low": "low",
    "medium": "medium",
    "high": "high",
    "xhigh": "xhigh",
    "max": "xhigh",
}


# --- the request ----------------------------------------------------------------------------------


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
    # a quota code outranks the status: a 429 `insufficient_quota` is no rate limit, nor is a
    # request too large for the limit itself
    quota = (error.error_type or "").lower() in UNCURABLE_CODES
    cls = type(error) if quota else _STATUS_WINS.get(status, type(error))
    typed = cls(
        provider,
        error.provider_message,
        status=error.status,
        error_type=error.error_type,
        retry_after=retry_after(headers),
        provider_fields=error.provider_fields,
    )
    typed.token_limit, typed.tokens_needed = error.token_limit, error.tokens_needed
    return typed


def _image(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


def _file(filename: str, file_data: str) -> dict[str, Any]:
    return {"type": "file", "file": {"filename": filename, "file_data": file_data}}


def _media(item: ImageUrlDone | InlineDataDone) -> dict[str, Any]:
    return media_part(item, image=_image, file=_file)


def _tool_result(item: ToolResultDone) -> list[dict[str, Any]]:
    """A `tool` message; its images follow in a `user` message (tool messages carry only text)."""
    out: list[dict[str, Any]] = [
        {"role": "tool", "tool_call_id": item.tool_call_id, "content": item.text}
    ]
    if item.images:
        out.append({"role": "user", "content": [_image(url) for url in item.images]})
    return out


def _user_messages(message: UniMessage) -> list[dict[str, Any]]:
    """A user message: text and media as one `user` message, each tool result as a `tool`
    message (its images follow in a `user` message, since tool messages carry only text)."""
    out = user_messages(message, text_type="text", media=_media, tool_result=_tool_result)
    if message.name is not None:  # the speaker's name, on what the user said
        for said in out:
            if said["role"] == "user":
                said["name"] = message.name
    return out


def _assistant_message(message: UniMessage) -> dict[str, Any]:
    """An assistant message replayed: text joined into `content`, tool calls with their
    arguments as a JSON string, reasoning where its fidelity says (`reasoning_field`, or
    `reasoning_details` for a signature or encrypted reasoning); thinking without such a
    fidelity is not sent back. Audio is sent back by its id, a refusal in `refusal`."""
    text: list[str] = []
    refusal: list[str] = []  # the model's refusal, sent back in its own field
    chunks: list[dict[str, Any]] = []  # `content` as chunks, when reasoning came in it
    calls: list[dict[str, Any]] = []
    fields: dict[str, list[str]] = {}
    details: list[dict[str, Any]] = []
    audio_id = ""
    for item in message.content_items:
        if type(item) is TextDone and is_refusal(item.fidelity):
            refusal.append(item.text)
        elif type(item) is TextDone:
            text.append(item.text)
            chunks.append({"type": "text", "text": item.text})
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
            if field == "content":
                thought = [{"type": "text", "text": item.thinking}]
                chunks.append({"type": "thinking", "thinking": thought})
            elif isinstance(field, str) and field:
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
    if message.name is not None:
        out["name"] = message.name
    if any(chunk["type"] == "thinking" for chunk in chunks):
        out["content"] = chunks  # Mistral's reasoning models take their thinking back there
    elif text or not (calls or audio_id or refusal):
        out["content"] = "".join(text)
    if refusal:
        out["refusal"] = "".join(refusal)
    for field, fragments in fields.items():
        out[field] = "".join(fragments)
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
        if tool.strict is not None:
            function["strict"] = tool.strict
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


_OPTIONAL_FIELDS = ("stream_options", "max_completion_tokens")
"""Fields of ours a compatible server may refuse, which the request can do without."""
_REFUSED = re.compile(
    r"(?:unknown|unrecognized|unsupported|unexpected|extra) (?:request )?"
    r"(?:parameter|argument|field|key|input)s?(?: supplied)?:? ['\"`]?(\w+)",
    re.IGNORECASE,
)
"""How a server names a field it does not take: "Unknown parameter: 'stream_options'" (a
gateway), "Unrecognized request argument supplied: stream_options" (older Azure)."""
_LOCATED = re.compile(r'"loc":\s*\[[^\]]*?"(\w+)"\]')
"""The field a pydantic error is about: the last of its location."""


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
        self._refused: dict[str, set[str]] = {}  # base URL -> optional fields its server refused

    def adapt(self, provider: Provider, error: ProviderError) -> bool:
        """Whether the request can be sent again without what `error` says the server refused:
        `stream_options` (a gateway that knows no such field: then no usage comes), or
        `max_completion_tokens` (a server that knows only `max_tokens`). Remembered for the base
        URL, so the next turns to it send the request it takes from the first."""
        if error.status not in (400, 422):
            return False
        said = error.provider_message
        named = {m.group(1) for m in _REFUSED.finditer(said)}
        if "extra_forbidden" in said:  # pydantic's list of what failed where (FastAPI's 422)
            named.update(m.group(1) for m in _LOCATED.finditer(said))
        refused = self._refused.setdefault(provider.base_url, set())
        for name in _OPTIONAL_FIELDS:
            if name in named and name not in refused:
                refused.add(name)
                return True
        return False

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
        refused = self._refused.get(provider.base_url, ())
        if request.max_tokens is not None:
            field = self.max_tokens_field
            if field in refused:
                field = "max_tokens"
            body[field] = request.max_tokens
        if request.temperature is not None:
            body["temperature"] = request.temperature
        effort = reasoning_effort(request.thinking_level)
        if effort is not None:
            body["reasoning_effort"] = effort
        body["stream"] = stream  # explicit either way: a non-streaming request says so
        if stream and self.stream_options and "stream_options" not in refused:
            body["stream_options"] = {"include_usage": True}
        return bearer_json_request(NAME, request, provider, "chat/completions", body)

    def stream_decoder(self) -> StreamDecoder:
        """A fresh decoder for one attempt's chunks."""
        return ChatStreamDecoder()

    def decode_response(self, body: bytes) -> list[LaneEvent]:
        """A non-streaming completion as the stream the API would have sent."""
        return decode_completion(body)

    def error_from_response(
        self, status: int, headers: Mapping[str, str], body: bytes
    ) -> ProviderError:
        """`{"error": {"message", "type", "code"}}` typed as `http_error` says."""
        return http_error(NAME, status, headers, body)
