"""OpenAI's Realtime API in text mode, over a WebSocket: one session per turn.

The request is a socket (`wss://{base}/realtime?model=...`, `Authorization: Bearer`) and three
client events sent on it in order: `session.update` (text output only), one
`conversation.item.create` per message of the conversation, and `response.create`. The server
answers with events, one JSON message each; the reply is every `response.*` event up to
`response.done`, after which nothing is read (the socket would stay open for the next turn).

Both generations of the wire are read, as a server sends either: the GA names
(`response.output_text.delta`/`.done`, `session.output_modalities`) and the beta ones
(`response.text.delta`/`.done`, `session.modalities`, the `OpenAI-Beta: realtime=v1` header).
The request speaks GA unless the provider's headers ask for the beta.

Mapping: `response.created` starts the message (its id); each text content part (keyed by item
id and content index) is a text lane; each `function_call` output item a tool lane, its
arguments streamed by `response.function_call_arguments.delta`. `response.done` carries the
status and usage: `completed` is `stop` (`tool_call` after a call), `incomplete` has its
`status_details.reason` (`max_output_tokens` -> `length`, `content_filter`), `failed` is its
`status_details.error` as an in-stream `ProviderError`, `cancelled` ends the reply without a
usable finish. Usage: `input_tokens` is the prompt, its `cached_tokens` cached,
`output_tokens` the response. An `error` event is an in-stream `ProviderError` typed by its
`type`/`code`. Session and conversation events, rate-limit updates and audio events are skipped.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlsplit, urlunsplit

import msgspec
from rillet._core._errors import ProviderError, UnsupportedContentError
from rillet._core._events import (
    InlineThinkingDone,
    TextDone,
    ThinkingDone,
    ToolCallDone,
    ToolResultDone,
)
from rillet._core._lanes import (
    LaneEvent,
    MessageDelta,
    MessageStart,
    MessageStop,
    PartDelta,
    PartStart,
    PartStop,
    ProviderErrorEvent,
    RawUsage,
)

from .._core._dialect import Framing, HttpRequest, Provider, strict_decode
from ._error_body import error_from_body

if TYPE_CHECKING:
    from collections.abc import Mapping

    from rillet._core._request import TurnRequest

    from .._core._dialect import StreamDecoder

__all__ = ["OpenAIRealtimeDialect"]

NAME = "openai-realtime"

_TEXT_DELTA = frozenset({"response.output_text.delta", "response.text.delta"})
_TEXT_DONE = frozenset({"response.output_text.done", "response.text.done"})


# --- wire shapes ----------------------------------------------------------------------------------


class _Item(msgspec.Struct, frozen=True):
    id: str = ""
    type: str = ""
    name: str = ""
    call_id: str = ""


class _CachedDetails(msgspec.Struct, frozen=True):
    cached_tokens: int | None = None


class _Usage(msgspec.Struct, frozen=True):
    input_tokens: int | None = None
    output_tokens: int | None = None
    input_token_details: _CachedDetails | None = None


class _StatusDetails(msgspec.Struct, frozen=True):
    type: str | None = None
    reason: str | None = None
    error: Any = None


class _Response(msgspec.Struct, frozen=True):
    id: str = ""
    status: str | None = None
    status_details: _StatusDetails | None = None
    usage: _Usage | None = None


class _Event(msgspec.Struct, frozen=True, gc=False):
    """One server event; the fields of every kind this dialect reads, all optional."""

    type: str
    item_id: str = ""
    content_index: int = 0
    delta: str = ""
    item: _Item | None = None
    response: _Response | None = None
    error: Any = None
    part: Any = None


_decode_event = msgspec.json.Decoder(_Event)


class _StreamDecoder:
    """One session's server events."""

    __slots__ = ("_called", "_count", "_done", "_lanes", "_open", "_started")

    def __init__(self) -> None:
        self._lanes: dict[tuple[str, int], int] = {}  # (item id, content index) -> lane index
        self._open: set[int] = set()
        self._count = 0
        self._called = False
        self._started = False
        self._done = False  # `response.done` (or an error) came: nothing after is read

    def feed(self, frame: bytes | str) -> list[LaneEvent]:
        if self._done:
            return []
        try:
            event = _decode_event.decode(frame)
        except msgspec.MsgspecError:
            event = strict_decode(_decode_event, frame, NAME)
        kind = event.type
        out: list[LaneEvent] = []
        if kind in _TEXT_DELTA:
            index = self._lane(event.item_id, event.content_index, "text", out)
            if event.delta:
                out.append(PartDelta(index, "text", event.delta))
        elif kind == "response.function_call_arguments.delta":
            index = self._lane(event.item_id, -1, "tool_call", out)
            if event.delta:
                out.append(PartDelta(index, "tool_call", event.delta))
        elif kind in _TEXT_DONE:
            self._close(event.item_id, event.content_index, "text", out)
        elif kind == "response.function_call_arguments.done":
            self._close(event.item_id, -1, "tool_call", out)
        elif kind == "response.created":
            self._start(event.response, out)
        elif kind == "response.output_item.added":
            item = event.item
            if item is not None and item.type == "function_call":
                self._start(None, out)
                index = self._count
                self._count += 1
                self._lanes[(item.id, -1)] = index
                self._open.add(index)
                self._called = True
                call_id = item.call_id or item.id
                out.append(
                    PartStart(index=index, kind="tool_call", name=item.name, call_id=call_id)
                )
        elif kind == "response.done":
            self._done = True
            self._finish(event.response, out)
        elif kind == "error":
            self._done = True
            error = error_from_body(NAME, None, {"error": event.error}, in_stream=True)
            out.append(ProviderErrorEvent(error))
        return out

    def close(self) -> list[LaneEvent]:
        return []

    def _start(self, response: _Response | None, out: list[LaneEvent]) -> None:
        if not self._started:
            self._started = True
            out.append(MessageStart(id=response.id if response is not None else ""))

    def _lane(self, item_id: str, content: int, kind: Any, out: list[LaneEvent]) -> int:
        index = self._lanes.get((item_id, content))
        if index is None:
            self._start(None, out)
            index = self._count
            self._count += 1
            self._lanes[(item_id, content)] = index
            self._open.add(index)
            out.append(PartStart(index=index, kind=kind))
        return index

    def _close(self, item_id: str, content: int, kind: Any, out: list[LaneEvent]) -> None:
        index = self._lanes.get((item_id, content))
        if index is not None and index in self._open:
            self._open.discard(index)
            out.append(PartStop(index, kind))

    def _finish(self, response: _Response | None, out: list[LaneEvent]) -> None:
        self._start(response, out)
        if response is None:
            out.append(MessageStop())
            return
        details = response.status_details
        status = response.status or "completed"
        if status == "failed":
            error = details.error if details is not None else None
            out.append(
                ProviderErrorEvent(error_from_body(NAME, None, {"error": error}, in_stream=True))
            )
            return
        if status == "completed":
            reason = "tool_call" if self._called else "stop"
        else:  # incomplete, cancelled
            reason = (details.reason if details is not None else None) or status
        usage = None
        if response.usage is not None:
            u = response.usage
            cached = u.input_token_details.cached_tokens if u.input_token_details else None
            usage = RawUsage(
                prompt_tokens=u.input_tokens, response_tokens=u.output_tokens, cached_tokens=cached
            )
        out.append(MessageDelta(finish_reason=reason, usage=usage))
        out.append(MessageStop())


# --- requests -------------------------------------------------------------------------------------


def _socket_url(provider: Provider) -> str:
    """`{base}/realtime?model=...`, with `http(s)` spelled `ws(s)`."""
    url = provider.url("/realtime")
    parts = urlsplit(url)
    scheme = {"https": "wss", "http": "ws"}.get(parts.scheme, parts.scheme)
    query = f"model={quote(provider.model, safe='')}"
    if parts.query:
        query = f"{parts.query}&{query}"
    return urlunsplit((scheme, parts.netloc, parts.path, query, ""))


def _items(request: TurnRequest) -> list[dict[str, Any]]:
    """The conversation as `conversation.item.create` items."""
    items: list[dict[str, Any]] = []
    for message in request.messages:
        role = "assistant" if message.role == "assistant" else "user"
        content: list[dict[str, Any]] = []
        for part in message.content_items:
            if type(part) is TextDone:
                text_type = "output_text" if role == "assistant" else "input_text"
                content.append({"type": text_type, "text": part.text})
            elif type(part) is ToolCallDone:
                items.append(
                    {
                        "type": "function_call",
                        "call_id": part.tool_call_id,
                        "name": part.name,
                        "arguments": part.arguments,
                    }
                )
            elif type(part) is ToolResultDone:
                items.append(
                    {
                        "type": "function_call_output",
                        "call_id": part.tool_call_id,
                        "output": part.text,
                    }
                )
            elif not isinstance(part, ThinkingDone | InlineThinkingDone):  # reasoning stays home
                raise UnsupportedContentError(NAME, str(part.__struct_config__.tag))
        if content:
            items.append({"type": "message", "role": role, "content": content})
    return items


class OpenAIRealtimeDialect:
    """OpenAI's Realtime API, text in and text out, over a WebSocket."""

    name = NAME
    framing: Framing = "message"

    def build_request(
        self, request: TurnRequest, provider: Provider, *, stream: bool = True
    ) -> HttpRequest:
        """The socket and the client events of one turn. The API only streams: a request with
        `stream=False` (the rescue) is the same session, its reply read whole."""
        beta = any(
            k.lower() == "openai-beta" and "realtime" in v for k, v in provider.headers.items()
        )
        session: dict[str, Any] = (
            {"modalities": ["text"]}
            if beta
            else {
                "type": "realtime",
                "output_modalities": ["text"],
            }
        )
        if request.system_prompt:
            session["instructions"] = request.system_prompt
        if request.tools:
            session["tools"] = [
                {
                    "type": "function",
                    "name": t.name,
                    "description": t.description,
                    "parameters": t.parameters or {"type": "object", "properties": {}},
                }
                for t in request.tools
            ]
        choice = request.tool_choice
        if choice in ("auto", "none", "required"):
            session["tool_choice"] = choice
        elif isinstance(choice, list) and len(choice) == 1:
            session["tool_choice"] = {"type": "function", "name": choice[0]}
        if request.max_tokens is not None:
            key = "max_response_output_tokens" if beta else "max_output_tokens"
            session[key] = request.max_tokens
        if request.temperature is not None and beta:
            session["temperature"] = request.temperature
        session.update(request.extra_body.get(NAME, {}))
        events: list[dict[str, Any]] = [{"type": "session.update", "session": session}]
        events += [{"type": "conversation.item.create", "item": i} for i in _items(request)]
        events.append({"type": "response.create"})
        headers = dict(provider.headers)
        if provider.api_key is not None:
            headers["authorization"] = f"Bearer {provider.api_key.reveal()}"
        return HttpRequest(
            method="GET",
            url=_socket_url(provider),
            headers=headers,
            messages=tuple(msgspec.json.encode(e) for e in events),
        )

    def stream_decoder(self) -> StreamDecoder:
        """A fresh decoder for one session's server events."""
        return _StreamDecoder()

    def decode_response(self, body: bytes) -> list[LaneEvent]:
        """A recorded session, one server event per line, as its lane events."""
        decoder = _StreamDecoder()
        out: list[LaneEvent] = []
        for line in body.splitlines():
            if line.strip():
                out += decoder.feed(line)
        return out

    def error_from_response(
        self, status: int, headers: Mapping[str, str], body: bytes
    ) -> ProviderError:
        """A refused handshake: OpenAI's error body, typed by status and type."""
        return error_from_body(NAME, status, body)
