"""Ollama's native chat API (`POST /api/chat`), streamed as NDJSON: one JSON object per line.

Each line carries a piece of the assistant `message`: `thinking` is thinking (Ollama has no
signature, so no fidelity), `content` is text, and consecutive pieces of one kind continue one group
(a change of kind closes the open lane and opens a new one). Tool calls arrive whole: each is its
own lane with one fragment, its `arguments` object written as `json.dumps` does; its id is the
call's `id`, else the function's name (`name#2`... for later calls of the same function, see
`ToolIds`). The last line has `done: true` with `done_reason` (`stop` after a tool call is
`tool_call`; a server too old to send a reason finished normally, so it is `stop`) and the token
counts: the prompt is `prompt_eval_count`, the response `eval_count`; Ollama reports neither cached
nor thinking tokens apart. Nothing after that line is read. A `{"error": "..."}` line ends the
stream with a `ProviderError`.

Replaying a conversation: the system prompt is a `system` message; images go as base64 in
`images` (only `data:` URLs: Ollama does not fetch URLs); each tool result is a `tool` message
with `tool_name` (the name of the replayed call with that id, else `strip_call_suffix(id)`) and
`tool_call_id`, sent before the rest of the user message it came in; an assistant message is
replayed with its `content`, `thinking` and `tool_calls`. Ollama has no `tool_choice`: `none`
sends no tools, a list of names sends only those tools, `required` cannot be expressed.
"""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING, Annotated, Any, Literal
from urllib.parse import unquote_to_bytes

import msgspec
from rillet._core._errors import (
    MODEL_TOO_LARGE,
    FrameEncodingError,
    MalformedFrameError,
    ProviderError,
    UnsupportedContentError,
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
    RawUsage,
)

from .._core._dialect import (
    Framing,
    HttpRequest,
    Provider,
    ToolIds,
    dumps_arguments,
    strict_decode,
    strip_call_suffix,
)
from ._error_body import error_from_body
from ._openai_request import bearer_json_request

if TYPE_CHECKING:
    from collections.abc import Mapping

    from rillet._core._request import TurnRequest

    from .._core._dialect import StreamDecoder

__all__ = ["OllamaDialect"]

NAME = "ollama"
_TOO_BIG_FOR_MEMORY = "requires more system memory"
_THINK_LEVELS = frozenset({"low", "medium", "high"})


# --- wire shapes ----------------------------------------------------------------------------------


class _Function(msgspec.Struct, frozen=True):
    name: str
    arguments: Any = None


class _ToolCall(msgspec.Struct, frozen=True):
    function: _Function
    id: str = ""


class _Message(msgspec.Struct, frozen=True, gc=False):
    content: str = ""
    thinking: str = ""
    tool_calls: list[_ToolCall] | None = None


class _Frame(msgspec.Struct, frozen=True, gc=False):
    """A line as read once the message has started (its model, in every line, is skipped)."""

    message: _Message | None = None
    done: bool = False
    done_reason: str | None = None
    prompt_eval_count: int | None = None
    eval_count: int | None = None
    error: Any = None


class _Line(_Frame, frozen=True, gc=False):
    """A line before the message has started, or a whole reply."""

    model: str = ""


_decode_line = msgspec.json.Decoder(_Line)
_decode_frame = msgspec.json.Decoder(_Frame)


class _MoreText(msgspec.Struct, frozen=True, gc=False, kw_only=True, forbid_unknown_fields=True):
    """A message that is only more text (`_TextLine`)."""

    role: str = ""
    content: Annotated[str, msgspec.Meta(min_length=1)]
    thinking: Literal[""] = ""
    tool_calls: None = None


class _TextLine(msgspec.Struct, frozen=True, gc=False, kw_only=True, forbid_unknown_fields=True):
    """A line that is only one more fragment of the text: `_Frame`'s fields, each narrowed to
    the values the fast path of `feed_frames` takes. What decodes so decodes as a `_Frame` too
    and takes that path, so a block of such lines can be read in one call (`feed_block`).

    Every field a line may hold is read, and a line with any other is refused: msgspec checks
    that a string is UTF-8 only when it reads it, and a line that is not UTF-8 must be refused
    as the NDJSON framer refuses it."""

    model: str = ""
    created_at: str = ""
    message: _MoreText
    done: Literal[False] = False
    done_reason: str | None = None
    total_duration: int | None = None
    load_duration: int | None = None
    prompt_eval_count: int | None = None
    prompt_eval_duration: int | None = None
    eval_count: int | None = None
    eval_duration: int | None = None
    error: None = None


class _AsciiText(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    """`_MoreText` for a block of ASCII bytes only, which are UTF-8 whatever msgspec reads."""

    content: Annotated[str, msgspec.Meta(min_length=1)]
    thinking: Literal[""] = ""
    tool_calls: None = None


class _AsciiLine(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    """`_TextLine` for a block of ASCII bytes only: the fields it skips need no reading."""

    message: _AsciiText
    done: Literal[False] = False
    done_reason: str | None = None
    prompt_eval_count: int | None = None
    eval_count: int | None = None
    error: None = None


_decode_text_lines = msgspec.json.Decoder(list[_TextLine])
_decode_ascii_lines = msgspec.json.Decoder(list[_AsciiLine])
_PAUSE = 8  # reads fed line by line after a block that was not all text


class _StreamDecoder:
    """One attempt's lines (also used once for a non-streaming body)."""

    __slots__ = (
        "_called",
        "_count",
        "_done",
        "_ids",
        "_index",
        "_kind",
        "_pause",
        "_started",
        "failed_at",
    )

    def __init__(self) -> None:
        self._kind: LaneKind | None = None  # the open text or thinking lane, if any
        self._index = 0  # its index
        self._count = 0  # lanes opened so far: the next lane's index
        self._ids = ToolIds()
        self._called = False  # a tool call was seen
        self._started = False  # MessageStart went out
        self._done = False  # the `done: true` line (or an error) came: nothing after is read
        self.failed_at = 0  # the frame `feed_frames` failed on
        self._pause = 0  # reads to go before a block is tried again (`feed_block`)

    def feed(self, frame: str) -> list[LaneEvent]:
        if self._done:
            return []
        if not self._started:
            try:
                first = _decode_line.decode(frame)
            except msgspec.MsgspecError:
                first = strict_decode(_decode_line, frame, NAME)
            return self.line(first)
        try:  # the hot path: one call into msgspec; on error, strict_decode types it
            decoded = _decode_frame.decode(frame)
        except msgspec.MsgspecError:
            decoded = strict_decode(_decode_frame, frame, NAME)
        message = decoded.message
        if (
            message is not None
            and message.content
            and self._kind == "text"
            and not message.thinking
            and not message.tool_calls
            and not decoded.done
            and decoded.error is None
        ):  # one more fragment of the text being streamed
            return [PartDelta(self._index, "text", message.content)]
        return self.line(decoded)

    def feed_frames(self, frames: list[Any], out: list[LaneEvent]) -> None:
        """`feed` on each line in turn, with its fast path inline (`FramesDecoder`): a line of
        more text for the open text lane joins the run of them handed on as one `PartRun`."""
        decode = _decode_frame.decode
        run: list[str] | None = None  # the text run being handed on
        # the state the fast path reads, kept in locals: only the slow paths change it
        streaming = self._started and not self._done
        texting = self._kind == "text"
        at = 0
        try:
            for at, frame in enumerate(frames):  # noqa: B007 - `at` names the failing frame
                if streaming:
                    try:
                        decoded = decode(frame)
                    except msgspec.MsgspecError:
                        decoded = strict_decode(_decode_frame, frame, NAME)
                    message = decoded.message
                    if (
                        texting
                        and message is not None
                        and message.content
                        and not message.thinking
                        and not message.tool_calls
                        and not decoded.done
                        and decoded.error is None
                    ):
                        if run is None:
                            run = []
                            out.append(PartRun(self._index, "text", run))
                        run.append(message.content)
                        continue
                    out += self.line(decoded)
                else:
                    out += self.feed(frame)
                run = None
                streaming = self._started and not self._done
                texting = self._kind == "text"
        except BaseException:
            self.failed_at = at
            raise

    def feed_block(self, block: bytes, lines: int, out: list[LaneEvent]) -> bool:
        """A read's `lines` whole lines (`block`, a LF between each two) in one call, when each
        is one more fragment of the open text lane (`_TextLine`): the one `PartRun` that
        `feed_frames` makes of them. False, with nothing changed, for any other block: its
        lines are then fed as usual."""
        if self._kind != "text" or self._done or not self._started:
            return False
        if self._pause:
            self._pause -= 1
            return False
        try:
            decode = (_decode_ascii_lines if block.isascii() else _decode_text_lines).decode
            decoded = decode(b"[%b]" % block.replace(b"\n", b","))
        except msgspec.MsgspecError:  # a line of another kind, not JSON, or not UTF-8
            self._pause = _PAUSE
            return False
        if len(decoded) != lines:  # a line that held two JSON values, a comma between
            return False
        out.append(PartRun(self._index, "text", [line.message.content for line in decoded]))
        return True

    def close(self) -> list[LaneEvent]:
        return []

    def line(self, line: _Frame) -> list[LaneEvent]:
        """The lane events of one decoded line."""
        out: list[LaneEvent] = []
        if not self._started and isinstance(line, _Line) and line.model:
            self._started = True
            out.append(MessageStart(model=line.model))
        message = line.message
        if message is not None:
            if message.thinking:
                self._piece("thinking", message.thinking, out)
            if message.content:
                self._piece("text", message.content, out)
            if message.tool_calls:
                for call in message.tool_calls:
                    self._call(call, out)
        if line.error is not None:
            self._done = True
            error = error_from_body(NAME, None, {"error": line.error}, in_stream=True)
            out.append(ProviderErrorEvent(error))
        elif line.done:
            self._done = True
            reason = line.done_reason or "stop"
            if self._called and reason == "stop":
                reason = "tool_call"
            usage = RawUsage(prompt_tokens=line.prompt_eval_count, response_tokens=line.eval_count)
            out.append(MessageDelta(finish_reason=reason, usage=usage))
            out.append(MessageStop())
        return out

    def _piece(self, kind: LaneKind, value: str, out: list[LaneEvent]) -> None:
        if kind != self._kind:
            if self._kind is not None:
                out.append(PartStop(self._index, self._kind))
            self._kind = kind
            self._index = self._count
            self._count += 1
            out.append(PartStart(index=self._index, kind=kind))
        out.append(PartDelta(self._index, kind, value))

    def _call(self, call: _ToolCall, out: list[LaneEvent]) -> None:
        if self._kind is not None:
            out.append(PartStop(self._index, self._kind))
            self._kind = None
        self._called = True
        function = call.function
        index = self._count
        self._count += 1
        arguments = function.arguments
        if not isinstance(arguments, str):
            arguments = dumps_arguments(arguments if arguments is not None else {})
        call_id = call.id or self._ids.next(function.name)
        out.append(PartStart(index=index, kind="tool_call", name=function.name, call_id=call_id))
        out.append(PartDelta(index, "tool_call", arguments))
        out.append(PartStop(index, "tool_call"))


# --- requests -------------------------------------------------------------------------------------


def _image(url: str) -> str:
    """An image for `images`: a `data:` URL's payload as base64 text."""
    if not url.startswith("data:"):
        raise UnsupportedContentError(NAME, "image_url.done (not a data: URL)")
    head, _, payload = url.partition(",")
    if "base64" in head[5:].split(";")[1:]:
        return payload
    return base64.b64encode(unquote_to_bytes(payload)).decode("ascii")


def _messages(request: TurnRequest) -> list[dict[str, Any]]:
    names = {
        item.tool_call_id: item.name
        for message in request.messages
        if message.role == "assistant"
        for item in message.content_items
        if type(item) is ToolCallDone
    }
    out: list[dict[str, Any]] = []
    if request.system_prompt:
        out.append({"role": "system", "content": request.system_prompt})
    for message in request.messages:
        if message.role == "assistant":
            out.append(_assistant(message))
        else:
            out.extend(_user(message, names))
    return out


def _assistant(message: UniMessage) -> dict[str, Any]:
    text: list[str] = []
    thinking: list[str] = []
    images: list[str] = []
    calls: list[dict[str, Any]] = []
    for item in message.content_items:
        if type(item) is TextDone:
            text.append(item.text)
        elif type(item) is ThinkingDone:
            thinking.append(item.thinking)
        elif type(item) is ToolCallDone:
            calls.append(
                {
                    "id": item.tool_call_id,
                    "function": {"name": item.name, "arguments": item.arguments},
                }
            )
        elif type(item) is InlineDataDone:
            images.append(base64.b64encode(item.data).decode("ascii"))
    out: dict[str, Any] = {"role": "assistant", "content": "\n".join(text)}
    if thinking:
        out["thinking"] = "\n".join(thinking)
    if images:
        out["images"] = images
    if calls:
        out["tool_calls"] = calls
    return out


def _user(message: UniMessage, names: Mapping[str, str]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    text: list[str] = []
    images: list[str] = []
    for item in message.content_items:
        if type(item) is TextDone:
            text.append(item.text)
        elif type(item) is ImageUrlDone:
            images.append(_image(item.image_url))
        elif type(item) is ToolResultDone:
            call_id = item.tool_call_id
            result: dict[str, Any] = {
                "role": "tool",
                "content": item.text,
                "tool_name": names.get(call_id) or strip_call_suffix(call_id),
                "tool_call_id": call_id,
            }
            if item.images:
                result["images"] = [_image(url) for url in item.images]
            out.append(result)
    if text or images:
        user: dict[str, Any] = {"role": "user", "content": "\n".join(text)}
        if images:
            user["images"] = images
        out.append(user)
    return out


class OllamaDialect:
    """Ollama's native `/api/chat`."""

    name = NAME
    framing: Framing = "ndjson"

    def build_request(
        self, request: TurnRequest, provider: Provider, *, stream: bool = True
    ) -> HttpRequest:
        """`POST {base}/api/chat`; a Bearer header only when a key is set (a proxy's)."""
        body: dict[str, Any] = {
            "model": provider.model,
            "messages": _messages(request),
            "stream": stream,
        }
        tools = request.tools
        choice = request.tool_choice
        if choice == "none":
            tools = []
        elif isinstance(choice, list) and choice:
            tools = [t for t in tools if t.name in choice]
        if tools:
            body["tools"] = [
                {
                    "type": "function",
                    "function": {
                        "name": t.name,
                        "description": t.description,
                        "parameters": t.parameters or {"type": "object", "properties": {}},
                    },
                }
                for t in tools
            ]
        level = request.thinking_level
        if level is not None:
            body["think"] = level if level in _THINK_LEVELS else level != "none"
        options: dict[str, Any] = {}
        if request.max_tokens is not None:
            options["num_predict"] = request.max_tokens
        if request.temperature is not None:
            options["temperature"] = request.temperature
        if options:
            body["options"] = options
        return bearer_json_request(NAME, request, provider, "/api/chat", body)

    def stream_decoder(self) -> StreamDecoder:
        """A fresh decoder for one attempt's lines."""
        return _StreamDecoder()

    def decode_response(self, body: bytes) -> list[LaneEvent]:
        """A non-streaming reply (one object of the final line's shape, the whole `message`) as
        the stream the API would have sent."""
        try:
            line = strict_decode(_decode_line, body, NAME)
        except MalformedFrameError:
            try:
                body.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise FrameEncodingError(
                    f"response body is not valid UTF-8 (byte {exc.start})", provider=NAME
                ) from None
            raise
        out = _StreamDecoder().line(line)
        if not out or type(out[-1]) is not MessageStop:
            out.append(MessageStop())
        return out

    def error_from_response(
        self, status: int, headers: Mapping[str, str], body: bytes
    ) -> ProviderError:
        """`{"error": "..."}`, typed by the status alone (Ollama sends no error type), but for a
        model this machine cannot hold (`model requires more system memory (5.5 GiB) than is
        available`, a 500): the same request fails the same way, so it carries
        `model_too_large` and is never retried."""
        error = error_from_body(NAME, status, body)
        if _TOO_BIG_FOR_MEMORY in error.provider_message.lower():
            return ProviderError(
                NAME, error.provider_message, status=status, error_type=MODEL_TOO_LARGE
            )
        return error
