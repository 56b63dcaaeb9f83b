"""Anthropic's Messages wire: `POST /v1/messages`, streamed (`message_start`, a
`content_block_start`/`_delta`/`_stop` run per block, `message_delta`, `message_stop`, `ping`,
each as a named SSE event) or whole (one `message`), over whichever provider the model routes
to, as `POST /v1/chat/completions` routes it. Errors are Anthropic's
`{"type": "error", "error": {"type", "message"}}`, with the status its clients map to their
exception classes; after the head, one `error` event ends the stream.

`POST /v1/messages/count_tokens` is answered 404 `not_found_error`: rillet runs no tokenizer,
and a count it guessed would mislead; each reply's `usage` says what it cost.

Behind it is the same turn as everywhere: the server's policy (deadlines, retries, rescue,
chains) and its admission. `docs/decisions.md` ("Other protocols' wires") says how the stop
reasons, usage, thinking signatures and a reset are mapped."""

from __future__ import annotations

import secrets
from typing import TYPE_CHECKING, Any

import attrs
import msgspec
from rillet._core._errors import (
    AuthenticationError,
    EmptyResponseError,
    InvalidRequestError,
    OverloadedError,
    RateLimitError,
    RescueFailed,
    past_context,
)
from rillet._core._events import (
    FinishReason,
    TextDelta,
    TextDone,
    ThinkingDelta,
    ThinkingDone,
    ToolCallDelta,
    ToolCallDone,
    UniEvent,
    UniMessage,
    UsageMetadata,
)
from rillet._core._markers import AttemptReset
from rillet.providers._anthropic._inbound import (
    MessagesBody,
    decode_messages_body,
    messages_request,
    thinking_signature,
)
from rillet.providers._anthropic._stream import BLOCK, NAME, REDACTED
from rillet.providers._openai_chat._inbound import BadRequest, shown

from ._mmsp import mmsp_error
from ._openai import refused, withheld
from ._replies import ErrorReply
from ._shared import Shared
from ._streamed import HeldHead
from ._wireturn import ChannelSink, DirectDeltas, ModelNotFound, route_model, run_wire_turn

if TYPE_CHECKING:
    from rillet._core._dialect import Provider
    from rillet._turn._turn import Turn, TurnResult

    from ._http11 import HttpConnection, Request

__all__ = ["Messages", "anthropic_error", "anthropic_message", "anthropic_usage", "stop_reason"]


# --- errors ---------------------------------------------------------------------------------------

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    415: "invalid_request_error",
    429: "rate_limit_error",
    503: "overloaded_error",
    504: "timeout_error",
    529: "overloaded_error",
}


def _kind(status: int) -> str:
    return _TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")


def _error(kind: str, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": kind, "message": message}}


def _reply(status: int, message: str, headers: tuple[tuple[str, str], ...] = ()) -> ErrorReply:
    """A refusal before the turn, in Anthropic's error shape, its type by its status."""
    reply = ErrorReply(status, "", "", headers=headers)
    reply.body = msgspec.json.encode(_error(_kind(status), message))
    return reply


def _reworded(reply: ErrorReply, message: str | None = None) -> ErrorReply:
    """One of the shared checks' refusals (415, 413, 400, 429...) in Anthropic's shape."""
    said = message or msgspec.json.decode(reply.body)["error"]["message"]
    return _reply(reply.status, said, tuple(reply.headers))


def anthropic_error(
    result: TurnResult, provider: Provider
) -> tuple[dict[str, Any], int, list[tuple[str, str]]]:
    """A failed turn as Anthropic's error object, with the HTTP status its SDK maps to the
    matching exception class (429 `RateLimitError`, 529 `OverloadedError`, 400
    `BadRequestError`...) and the headers MMSP's endpoint gives it (`retry-after`,
    `x-should-retry: false`: the server already retried). The provider's refusal of the
    server's own key is a 502 `api_error` saying so, not the client's `authentication_error`;
    a conversation past the context window says `prompt is too long`, as Anthropic does and
    as its clients check before they shorten one."""
    error, status, headers = mmsp_error(result, provider)
    cause = result.error
    if isinstance(cause, RescueFailed):
        cause = cause.stream_error or cause.rescue_error
    message = str(error["message"])
    if isinstance(cause, AuthenticationError):
        status, message = 502, f"{message}: it refused the server's credentials"
    elif isinstance(cause, OverloadedError):
        status = 529
    elif isinstance(cause, RateLimitError):
        status = 429
    elif isinstance(cause, InvalidRequestError):
        status = 400 if status < 400 or status >= 500 else status
    if past_context(cause):
        status, message = 400, f"prompt is too long: {message}"
    return _error(_kind(status), message), status, headers


# --- what goes back -------------------------------------------------------------------------------

_OWN_STOPS = frozenset(
    {
        "end_turn",
        "max_tokens",
        "stop_sequence",
        "tool_use",
        "pause_turn",
        "refusal",
        "model_context_window_exceeded",
    }
)
_STOPS: dict[FinishReason | None, str] = {"length": "max_tokens", "tool_call": "tool_use"}


def stop_reason(finish: FinishReason | None, result: TurnResult) -> str:
    """Anthropic's stop reason: the provider's own when it speaks Anthropic's wire, `refusal`
    for a reply the provider refused or filtered, else MMSP's finish in Anthropic's words
    (`stop` is `end_turn`: other wires do not say whether a stop sequence ended the reply)."""
    own = result.provider_finish_reason
    provider = result.provider
    if provider is not None and provider.dialect.name == NAME and own in _OWN_STOPS:
        return own
    if refused(result) or result.filtered:
        return "refusal"
    return _STOPS.get(finish, "end_turn")


def anthropic_usage(usage: UsageMetadata | None) -> dict[str, int]:
    """MMSP's usage in Anthropic's terms: its input tokens leave out the cached ones, as
    MMSP's prompt tokens do; its output tokens include the thinking ones."""
    usage = usage or UsageMetadata()
    return {
        "input_tokens": usage.prompt_tokens or 0,
        "cache_read_input_tokens": usage.cached_tokens or 0,
        "output_tokens": (usage.response_tokens or 0) + (usage.thoughts_tokens or 0),
    }


def _json(value: Any) -> str:
    return msgspec.json.encode(value).decode()


def _text_block(item: TextDone) -> dict[str, Any]:
    fidelity = item.fidelity or {}
    kept = fidelity.get(BLOCK)
    if isinstance(kept, dict):
        return kept  # a server tool's block, as the provider sent it
    block: dict[str, Any] = {"type": "text", "text": item.text}
    if fidelity.get("citations"):
        block["citations"] = fidelity["citations"]
    return block


def _thinking_block(item: ThinkingDone) -> dict[str, Any]:
    signature = thinking_signature(item.fidelity)
    if item.thinking == REDACTED and signature:
        return {"type": "redacted_thinking", "data": signature}
    return {"type": "thinking", "thinking": item.thinking, "signature": signature}


def _tool_use(call_id: str, name: str, fidelity: dict[str, Any] | None) -> dict[str, Any]:
    """A `tool_use` block's head. A call that carries a fidelity (Gemini's thought signature,
    which Gemini wants back with the call) has it as `signature`, packed as a thinking
    block's is: Anthropic's blocks have no field for it, and a client sends back the blocks it
    was given, extra fields included."""
    block = {"type": "tool_use", "id": call_id, "name": name}
    if fidelity:
        block["signature"] = thinking_signature(fidelity)
    return block


def anthropic_message(
    message: UniMessage, message_id: str, model: str, stop: str
) -> dict[str, Any]:
    """A whole `message` for the turn's assistant message."""
    content: list[dict[str, Any]] = []
    for item in message.content_items:
        if type(item) is TextDone:
            content.append(_text_block(item))
        elif type(item) is ThinkingDone:
            content.append(_thinking_block(item))
        elif type(item) is ToolCallDone:
            call = _tool_use(item.tool_call_id, item.name, item.fidelity)
            content.append({**call, "input": item.arguments})
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": anthropic_usage(message.usage_metadata),
    }


def _event(name: str, value: dict[str, Any]) -> bytes:
    return b"event: %s\ndata: %s\n\n" % (
        name.encode(),
        msgspec.json.encode({"type": name, **value}),
    )


PING = _event("ping", {})


@attrs.define
class _Blocks:
    """Builds the events of one streamed message: a block opens on its group's first fragment
    (the grammar never interleaves groups) and closes on its `.done`."""

    id: str
    model: str
    index: int = 0  # the open block's index, or the next one's
    open: str | None = None  # the open block's type

    def start(self) -> bytes:
        message = anthropic_message(
            UniMessage(role="assistant", content_items=[]), self.id, self.model, ""
        )
        message["stop_reason"] = None
        message["usage"] = {"input_tokens": 0, "output_tokens": 0}
        return _event("message_start", {"message": message}) + PING

    def _open(self, block: dict[str, Any]) -> bytes:
        self.open = block["type"]
        return _event("content_block_start", {"index": self.index, "content_block": block})

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return _event("content_block_delta", {"index": self.index, "delta": delta})

    def _close(self) -> bytes:
        if self.open is None:
            return b""
        self.open = None
        self.index += 1
        return _event("content_block_stop", {"index": self.index - 1})

    def item(self, item: Any) -> bytes:
        """The events of one content item (b"" for what Anthropic's wire has no block for)."""
        kind = type(item)
        if kind is TextDelta:
            out = b""
            fidelity = item.fidelity or {}
            if self.open is None:
                kept = fidelity.get(BLOCK)  # a server tool's block: it opens whole
                out = self._open(kept if isinstance(kept, dict) else {"type": "text", "text": ""})
            if item.text:
                out += self._delta({"type": "text_delta", "text": item.text})
            return out + self._citations(fidelity)
        if kind is ThinkingDelta:
            out = b""
            if self.open is None:
                signature = (item.fidelity or {}).get("signature")
                if item.thinking == REDACTED and isinstance(signature, str):
                    return self._open({"type": "redacted_thinking", "data": signature})
                out = self._open({"type": "thinking", "thinking": "", "signature": ""})
            if item.thinking:
                out += self._delta({"type": "thinking_delta", "thinking": item.thinking})
            return out
        if kind is ToolCallDelta:
            out = b""
            if self.open is None:
                call = _tool_use(item.tool_call_id, item.name, item.fidelity)
                out = self._open({**call, "input": {}})
            if item.arguments:
                out += self._delta({"type": "input_json_delta", "partial_json": item.arguments})
            return out
        if kind is TextDone:
            if self.open is None:  # a group whose fragments were not streamed: whole
                return self.item(TextDelta(text=item.text, fidelity=item.fidelity)) + self._close()
            return self._close()
        if kind is ThinkingDone:
            if self.open is None:
                out = self.item(ThinkingDelta(thinking=item.thinking, fidelity=item.fidelity))
            else:
                out = b""
            signature = thinking_signature(item.fidelity)
            if self.open == "thinking" and signature:
                out += self._delta({"type": "signature_delta", "signature": signature})
            return out + self._close()
        if kind is ToolCallDone:
            out = b""
            if self.open is None:
                arguments = _json(item.arguments)
                start = ToolCallDelta(
                    name=item.name,
                    arguments=arguments,
                    tool_call_id=item.tool_call_id,
                    fidelity=item.fidelity,
                )
                out = self.item(start)
            return out + self._close()
        return b""

    def _citations(self, fidelity: dict[str, Any]) -> bytes:
        citations = fidelity.get("citations")
        if self.open != "text" or not isinstance(citations, list):
            return b""
        return b"".join(
            self._delta({"type": "citations_delta", "citation": citation}) for citation in citations
        )

    def stop(self, reason: str, usage: UsageMetadata | None) -> bytes:
        """The end of the message: the open block's stop, the stop reason and usage."""
        delta = {
            "delta": {"stop_reason": reason, "stop_sequence": None},
            "usage": anthropic_usage(usage),
        }
        return self._close() + _event("message_delta", delta) + _event("message_stop", {})


class _Head(HeldHead):
    """The stream's head: it goes out with `message_start` and a `ping`, as Anthropic's does,
    and a quiet stream sends `ping` events, which Anthropic's clients read and skip."""

    beat = PING

    def __init__(
        self,
        http: HttpConnection,
        heartbeat: float,
        headers: tuple[tuple[str, str], ...],
        blocks: _Blocks,
    ) -> None:
        super().__init__(http, heartbeat, headers)
        self.blocks = blocks

    async def start(self) -> None:
        if not self.started:
            await super().start()
            await self.http.send_data(self.blocks.start())


_INCOMPLETE = "the upstream attempt failed mid-stream and was retried; retry the request"


@attrs.define(eq=False)
class Messages:
    """`POST /v1/messages` and `POST /v1/messages/count_tokens`."""

    shared: Shared

    async def count_tokens(self, http: HttpConnection, request: Request, _: str) -> None:
        """`POST /v1/messages/count_tokens`: not served (see the module's docstring)."""
        raise _reply(
            404,
            "POST /v1/messages/count_tokens is not served here: rillet counts no tokens before "
            "a reply; read each reply's usage instead",
            (("request-id", f"req_{secrets.token_hex(12)}"),),
        )

    async def create(self, http: HttpConnection, request: Request, _: str) -> None:
        """A message, streamed or whole, once admitted. Every answer carries a `request-id`,
        as Anthropic's do: its SDK reads it for its users to log and quote."""
        tagged = (("request-id", f"req_{secrets.token_hex(12)}"),)
        try:
            await self._create(http, request, tagged)
        except ErrorReply as reply:
            reply.headers = [*reply.headers, *tagged]
            raise

    async def _create(
        self, http: HttpConnection, request: Request, tagged: tuple[tuple[str, str], ...]
    ) -> None:
        try:
            self.shared.require_key(request)
        except ErrorReply as reply:
            raise _reworded(
                reply, "missing or wrong server key (x-api-key or Authorization: Bearer)"
            ) from None
        try:
            body: MessagesBody = await self.shared.read_json(
                http, request, decode_messages_body, "invalid_request_error"
            )
        except ErrorReply as reply:
            raise _reworded(reply) from None
        try:
            provider = route_model(self.shared, body.model)
        except ErrorReply as reply:  # a model that cannot be served as configured
            raise _reworded(
                reply, f"model: {shown(body.model)} cannot be served as configured"
            ) from None
        except ModelNotFound:
            raise _reply(404, f"model: {shown(body.model)} is not served here") from None
        try:
            turn_request = messages_request(body, provider.dialect.name)
        except BadRequest as exc:
            raise _reply(400, str(exc)) from None
        beta = request.headers.get("anthropic-beta")
        if beta and provider.dialect.name == NAME:
            # the features the client asked for by name, which only Anthropic's wire knows;
            # another provider neither has them nor needs the name (`docs/decisions.md`)
            provider = attrs.evolve(provider, headers={**provider.headers, "anthropic-beta": beta})
        try:
            ticket = self.shared.reserve(request, mmsp=False)
        except ErrorReply as reply:
            raise _reworded(reply) from None
        message_id = f"msg_{secrets.token_hex(12)}"
        blocks = _Blocks(message_id, body.model)

        async def pump(turn: Turn, sink: ChannelSink) -> None:
            if body.stream:
                await self._stream(http, turn, sink, provider, blocks, tagged)
                return
            async for _ in sink.receive:  # a whole reply: what the turn brings home is answered
                sink.done()
            result = await turn.result()
            if result.ok or withheld(result):
                message = result.message
                if not result.ok:
                    assert isinstance(result.error, EmptyResponseError)
                    usage = result.error.usage_metadata
                    message = UniMessage(role="assistant", content_items=[], usage_metadata=usage)
                stop = stop_reason(message.finish_reason, result) if result.ok else "refusal"
                whole = anthropic_message(message, message_id, body.model, stop)
                await http.respond(200, msgspec.json.encode(whole), tagged)
                return
            error, status, headers = anthropic_error(result, provider)
            await http.respond(status, msgspec.json.encode(error), [*headers, *tagged])

        await run_wire_turn(
            self.shared,
            http,
            ticket,
            turn_request,
            provider,
            pump,
            route="messages",
            whole=not body.stream,
        )

    async def _stream(
        self,
        http: HttpConnection,
        turn: Turn,
        sink: ChannelSink,
        provider: Provider,
        blocks: _Blocks,
        tagged: tuple[tuple[str, str], ...],
    ) -> None:
        """The turn as Anthropic's events. The head waits up to one heartbeat for the first
        event so an upstream refusal gets its HTTP status; after that an error is one `error`
        event, and a reset that voids blocks the client has ends the stream so: Anthropic's
        wire cannot take a block back. Once the head is out, the turn writes plain deltas itself
        (`DirectDeltas`)."""
        head = _Head(http, self.shared.limits.heartbeat, tagged, blocks)

        def frame(event: UniEvent) -> bytes:
            return b"".join([blocks.item(part) for part in event.content_items])

        sink.direct = DirectDeltas(head, frame, self.shared.metrics.count)
        while (items := await head.receive(sink.receive)) is not None:
            if type(items) is bytes:  # encoded by the turn, which could not write them
                await head.send(items)
                sink.done()
                continue
            out: list[bytes] = []
            for item in items:
                if type(item) is AttemptReset:
                    self.shared.metrics.reset()
                    if head.wrote:
                        incomplete = _error("api_error", _INCOMPLETE)
                        await head.send(b"".join(out) + _event("error", incomplete))
                        turn.cancel()
                        return
                    out.clear()  # nothing sent yet: the voided blocks are dropped unsent
                    blocks.index, blocks.open = 0, None
                    continue
                assert isinstance(item, UniEvent)
                if item.event_type == "stop":
                    # the turn's last event: its result is due, and says the provider's own
                    # stop reason
                    result = await turn.result()
                    out.append(
                        blocks.stop(stop_reason(item.finish_reason, result), item.usage_metadata)
                    )
                    self.shared.metrics.count(len(out))
                    await head.send(b"".join(out))
                    return
                out.extend(blocks.item(part) for part in item.content_items)
            frames = b"".join(out)
            if frames:
                self.shared.metrics.count(len(out))
                await head.send(frames)
            sink.done()
        result = await turn.result()
        if result.ok or withheld(result):  # a reply withheld whole: a refusal with no block
            usage = None
            if isinstance(result.error, EmptyResponseError):
                usage = result.error.usage_metadata
            reason = "refusal"
            if result.ok:  # a rescued reply without a stop cannot happen; end it anyway
                reason = stop_reason(result.message.finish_reason, result)
            await head.send(blocks.stop(reason, usage))
            return
        error, status, headers = anthropic_error(result, provider)
        if not head.started:
            await http.respond(status, msgspec.json.encode(error), [*headers, *tagged])
            return
        await http.send_data(_event("error", error))
