"""An MMSP server (`POST {base}/stream`, the base URL ending in `/v1`), streaming UniEvents.

The request is `{"model", "messages", "config"}`: the turn's UniMessages as MMSP's JSON (bytes
as base64) and MMSP's UniConfig, only the keys that are set. The answer is SSE: one `data:` line
per UniEvent of the server's public stream, then `data: [DONE]`; SSE comments are keep-alives
the framer already skips. An error is `{"error": {"type", "message", ...}}`: the HTTP body of a
refused request, or one event (followed by `[DONE]`) once the stream has begun; its `type` is
MMSP's class name or the upstream SDK's, mapped onto ours where the name says which.

The events are already UniEvents, but they are turned back into lane events so the grammar checks
the server's stream like any other: each group gets a lane of its own (a new index per group),
its first `K.delta` opens it (a tool call's carries the name and the call id), every delta is a
fragment, and `K.done` closes it; the stop event is the finish reason and the usage, then the
end. `[DONE]` without a stop adds nothing, so the grammar reports the stream incomplete; a stop
without usage is a complete reply whose counts are all null.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec
from rillet._core._errors import (
    AuthenticationError,
    EmptyResponseError,
    IncompleteStreamError,
    InvalidRequestError,
    MalformedFrameError,
    OverloadedError,
    ProviderError,
    RateLimitError,
    RilletError,
    ServerError,
    StreamProtocolError,
    ToolCallArgumentParseError,
    UnsupportedOperationError,
    preview,
)
from rillet._core._events import (
    EmbeddingDelta,
    EmbeddingDone,
    InlineDataDelta,
    InlineDataDone,
    InlineThinkingDelta,
    InlineThinkingDone,
    TextDelta,
    TextDone,
    ThinkingDelta,
    ThinkingDone,
    ToolCallDelta,
    ToolCallDone,
    UniEvent,
    UsageMetadata,
    decode_uni_event,
)
from rillet._core._lanes import (
    LaneEvent,
    LaneKind,
    MessageDelta,
    MessageStop,
    PartDelta,
    PartStart,
    PartStop,
    ProviderErrorEvent,
    RawUsage,
)

from .._core._dialect import Framing, HttpRequest, Provider, strict_decode
from ._error_body import provider_error

if TYPE_CHECKING:
    from collections.abc import Mapping

    from rillet._core._request import TurnRequest
    from rillet._core._sse import SSEEvent

    from .._core._dialect import StreamDecoder

__all__ = [
    "DEFAULT_BASE_URL",
    "MMSPDialect",
    "UnsupportedOperationError",
    "error_from_wire",
    "list_models_request",
    "parse_model_list",
]

NAME = "mmsp"
DEFAULT_BASE_URL = "http://127.0.0.1:25752/v1"
DONE = "[DONE]"


# --- errors ---------------------------------------------------------------------------------------

# MMSP's provider-error names and the upstream SDKs' (which an MMSP server passes through by
# class name) that say which of our classes they are.
_PROVIDER_ERRORS: dict[str, type[ProviderError]] = {
    "ProviderError": ProviderError,
    "RateLimitError": RateLimitError,
    "OverloadedError": OverloadedError,
    "ServerError": ServerError,
    "InternalServerError": ServerError,
    "InvalidRequestError": InvalidRequestError,
    "BadRequestError": InvalidRequestError,
    "AuthenticationError": AuthenticationError,
    "PermissionDeniedError": AuthenticationError,
}


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _usage_metadata(value: Any) -> UsageMetadata | None:
    if not isinstance(value, dict):
        return None
    try:
        return msgspec.convert(value, UsageMetadata)
    except msgspec.ValidationError:
        return None


def error_from_wire(
    error: Mapping[str, Any], *, status: int | None = None, in_stream: bool = False
) -> RilletError:
    """The typed error for an MMSP error object `{"type", "message", ...fields}`.

    A `type` naming one of our classes gives that class, with the fields MMSP sends for it (the
    stream errors' `missing`, `finish_reason`, `usage_metadata`, tool name and id...); an
    `UpstreamError` (a server relaying another MMSP server) is unwrapped to the error it carries;
    any other type is a `ProviderError` whose `error_type` is that type, typed by its status
    (the HTTP status, else the error's own `status`) when there is one.
    """
    kind = error.get("type")
    kind = kind if isinstance(kind, str) and kind else None
    message = error.get("message")
    message = message if isinstance(message, str) else ""
    status = status if status is not None else _int(error.get("status"))
    if kind == "UpstreamError" and isinstance(error.get("error"), dict) and error["error"]:
        return error_from_wire(error["error"], status=status, in_stream=in_stream)
    if kind == "IncompleteStreamError":
        missing = error.get("missing")
        return IncompleteStreamError(
            NAME,
            tuple(str(m) for m in missing)
            if isinstance(missing, list) and missing
            else ("usage_metadata", "finish_reason"),
            error.get("finish_reason") if isinstance(error.get("finish_reason"), str) else None,
            _usage_metadata(error.get("usage_metadata")),
        )
    if kind == "EmptyResponseError":
        finish = error.get("finish_reason")
        return EmptyResponseError(
            NAME,
            finish if isinstance(finish, str) else None,
            _usage_metadata(error.get("usage_metadata")),
        )
    if kind == "StreamProtocolError":
        return StreamProtocolError(NAME, f"the server reported: {preview(message)}")
    if kind == "ToolCallArgumentParseError":
        raw = error.get("raw_arguments_preview")
        exc = ToolCallArgumentParseError(
            NAME,
            str(error.get("tool_name") or ""),
            str(error.get("tool_call_id") or ""),
            raw if isinstance(raw, str) else "",
            "reported by the server",
        )
        length = _int(error.get("raw_arguments_length"))
        if length is not None:
            exc.raw_arguments_length = length
        return exc
    cls = _PROVIDER_ERRORS.get(kind or "")
    if cls is not None:
        return cls(NAME, message, status=status, error_type=kind, in_stream=in_stream)
    return provider_error(
        NAME, status=status, error_types=(kind,), message=message, in_stream=in_stream
    )


# --- the stream -----------------------------------------------------------------------------------


class _ErrorFrame(msgspec.Struct, frozen=True):
    error: dict[str, Any] | str


_decode_error = msgspec.json.Decoder(_ErrorFrame)


def _error_object(data: str | bytes, why: str) -> dict[str, Any]:
    """The error object of a frame that is not a UniEvent; a frame that is no error either is
    malformed, and says why it is not a UniEvent."""
    try:
        error = _decode_error.decode(data).error
    except msgspec.DecodeError:  # ValidationError included
        raise MalformedFrameError(
            f"frame is neither a UniEvent nor an error: {why}", data, provider=NAME
        ) from None
    return {"message": error} if isinstance(error, str) else error


# Each item type of the assistant's stream and the kind of lane it belongs to.
_DELTAS: dict[type, LaneKind] = {
    TextDelta: "text",
    ThinkingDelta: "thinking",
    ToolCallDelta: "tool_call",
    InlineDataDelta: "inline_data",
    InlineThinkingDelta: "inline_thinking",
    EmbeddingDelta: "embedding",
}
_DONES: dict[type, LaneKind] = {
    TextDone: "text",
    ThinkingDone: "thinking",
    ToolCallDone: "tool_call",
    InlineDataDone: "inline_data",
    InlineThinkingDone: "inline_thinking",
    EmbeddingDone: "embedding",
}


def _raw_usage(usage: UsageMetadata | None) -> RawUsage | None:
    if usage is None:
        return None
    return RawUsage(
        cached_tokens=usage.cached_tokens,
        prompt_tokens=usage.prompt_tokens,
        thoughts_tokens=usage.thoughts_tokens,
        response_tokens=usage.response_tokens,
    )


class _StreamDecoder:
    """One attempt's stream from an MMSP server."""

    __slots__ = ("_call_id", "_done", "_index", "_kind")

    def __init__(self) -> None:
        self._kind: LaneKind | None = None  # the open group's kind
        self._index = -1  # the open (or last) group's lane index
        self._call_id = ""  # the open tool call's id
        self._done = False  # `[DONE]` came

    def feed(self, frame: SSEEvent) -> list[LaneEvent]:
        data = frame.data
        if self._done:
            return []  # nothing is read after the end marker
        if data == DONE:
            self._done = True
            return []
        try:
            event = decode_uni_event(data)
        except msgspec.ValidationError as exc:
            return [
                ProviderErrorEvent(error_from_wire(_error_object(data, str(exc)), in_stream=True))
            ]
        except msgspec.DecodeError as exc:
            raise MalformedFrameError(f"frame is not JSON: {exc}", data, provider=NAME) from None
        if event.event_type == "stop":
            return self._stop(event)
        out: list[LaneEvent] = []
        for item in event.content_items:
            self._item(item, out)
        return out

    def _item(self, item: Any, out: list[LaneEvent]) -> None:
        cls = type(item)
        if cls is TextDelta and self._kind == "text":  # the hot path: more text
            out.append(PartDelta(self._index, "text", item.text, item.fidelity))
            return
        kind = _DELTAS.get(cls)
        if kind is not None:
            self._delta(kind, item, out)
            return
        kind = _DONES.get(cls)
        if kind is None:
            raise MalformedFrameError(f"{_tag(item)} is no item of the assistant's stream", "")
        # a done that closes no open group stops a lane that is not open: the grammar says so
        if kind == self._kind:
            self._kind = None
        out.append(PartStop(max(self._index, 0), kind))

    def _delta(self, kind: LaneKind, item: Any, out: list[LaneEvent]) -> None:
        # A delta opens a lane only when no group is open. A delta of another kind while a group
        # is open goes out as a fragment for a lane that is not open, and a second tool call
        # before the first is done as its lane opened twice: the grammar refuses both.
        if self._kind is None or (
            kind == "tool_call" == self._kind
            and item.tool_call_id
            and item.tool_call_id != self._call_id
        ):
            if self._kind is None:
                self._index += 1
                self._kind = kind
            if kind == "tool_call":
                self._call_id = item.tool_call_id
                out.append(
                    PartStart(
                        index=self._index, kind=kind, name=item.name, call_id=item.tool_call_id
                    )
                )
            elif kind == "inline_data" or kind == "inline_thinking":
                out.append(PartStart(index=self._index, kind=kind, mime_type=item.mime_type))
            else:
                out.append(PartStart(index=self._index, kind=kind))
        if kind == "text":
            value: Any = item.text
        elif kind == "thinking":
            value = item.thinking
        elif kind == "tool_call":
            value = item.arguments
        elif kind == "embedding":
            out.append(PartDelta(self._index, kind, item.embedding))
            return
        else:
            value = item.data
        out.append(PartDelta(self._index, kind, value, item.fidelity))

    def _stop(self, event: UniEvent) -> list[LaneEvent]:
        if event.content_items:
            raise MalformedFrameError("the stop event carries content items", "")
        return [
            MessageDelta(finish_reason=event.finish_reason, usage=_raw_usage(event.usage_metadata)),
            MessageStop(),
        ]

    def close(self) -> list[LaneEvent]:
        return []


def _tag(item: Any) -> str:
    return str(type(item).__struct_config__.tag)


# --- the request ----------------------------------------------------------------------------------


def _config(request: TurnRequest) -> dict[str, Any]:
    """MMSP's UniConfig: only the keys the turn sets."""
    config: dict[str, Any] = {}
    if request.max_tokens is not None:
        config["max_tokens"] = request.max_tokens
    if request.temperature is not None:
        config["temperature"] = request.temperature
    if request.tools:
        tools = []
        for tool in request.tools:
            spec: dict[str, Any] = {"name": tool.name, "description": tool.description}
            if tool.parameters is not None:
                spec["parameters"] = tool.parameters
            tools.append(spec)
        config["tools"] = tools
    if request.thinking_level is not None:
        config["thinking_level"] = request.thinking_level
    if request.tool_choice is not None:
        config["tool_choice"] = request.tool_choice
    if request.system_prompt:
        config["system_prompt"] = request.system_prompt
    return config


def _headers(provider: Provider, accept: str) -> dict[str, str]:
    headers = {"accept": accept, **provider.headers}
    if provider.api_key is not None:
        headers["authorization"] = f"Bearer {provider.api_key.reveal()}"
    return headers


def list_models_request(provider: Provider) -> HttpRequest:
    """`GET {base}/models`: the models the server's table serves (OpenAI's list shape)."""
    return HttpRequest(
        method="GET",
        url=provider.url("/models"),
        headers=_headers(provider, "application/json"),
        body=b"",
    )


class _Model(msgspec.Struct, frozen=True):
    id: str


class _ModelList(msgspec.Struct, frozen=True):
    data: list[_Model]


_decode_models = msgspec.json.Decoder(_ModelList)


def parse_model_list(body: bytes, provider: str = NAME) -> list[str]:
    """The model ids of an OpenAI-shaped listing `{"data": [{"id"}, ...]}`, in the order sent."""
    return [model.id for model in strict_decode(_decode_models, body, provider).data]


class MMSPDialect:
    """An MMSP server's `/v1/stream`: UniEvents relayed, and checked again by our grammar."""

    name = NAME
    framing: Framing = "sse"

    def build_request(
        self, request: TurnRequest, provider: Provider, *, stream: bool = True
    ) -> HttpRequest:
        """`POST {base}/stream` with `{"model", "messages", "config"}` and a bearer key if set.

        `extra_body["mmsp"]` is merged into the body, except its `config`, which is merged into
        the config (MMSP options rillet does not model: `prompt_caching`, `fast_mode`...). An
        MMSP server only streams, so `stream=False` raises `UnsupportedOperationError`.
        """
        if not stream:
            raise _no_whole_reply()
        extra = dict(request.extra_body.get(NAME, {}))
        config = _config(request)
        extra_config = extra.pop("config", None)
        if isinstance(extra_config, dict):
            config.update(extra_config)
        body: dict[str, Any] = {
            "model": provider.model,
            "messages": request.messages,
            "config": config,
            **extra,
        }
        headers = {"content-type": "application/json", **_headers(provider, "text/event-stream")}
        return HttpRequest(
            url=provider.url("/stream"), headers=headers, body=msgspec.json.encode(body)
        )

    def stream_decoder(self) -> StreamDecoder:
        """A fresh decoder for one attempt's events."""
        return _StreamDecoder()

    def decode_response(self, body: bytes) -> list[LaneEvent]:
        """An MMSP server has no non-streaming reply: always `UnsupportedOperationError`."""
        raise _no_whole_reply()

    def error_from_response(
        self, status: int, headers: Mapping[str, str], body: bytes
    ) -> ProviderError:
        """A refused request's `{"error": {"type", "message"}}` typed by its type and status.

        A stream error class in the body (which a server does not send before streaming) is
        reported as the provider error it carries, typed by the status.
        """
        try:
            error = _error_object(body, "a refused request")
        except MalformedFrameError:
            error = {"message": body.decode("utf-8", "replace")}
        found = error_from_wire(error, status=status)
        if isinstance(found, ProviderError):
            return found
        kind, message = error.get("type"), error.get("message")
        return provider_error(
            NAME,
            status=status,
            error_types=(kind if isinstance(kind, str) else None,),
            message=message if isinstance(message, str) else "",
        )


def _no_whole_reply() -> UnsupportedOperationError:
    return UnsupportedOperationError(
        NAME,
        "non-streaming",
        "an MMSP server only streams (POST /v1/stream); it has no non-streaming reply",
    )
