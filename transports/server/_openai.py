"""OpenAI's Chat Completions wire: `POST /v1/chat/completions`, streamed (`chat.completion.chunk`
SSE events, a usage chunk on `stream_options.include_usage`, `data: [DONE]`) or whole (one
`chat.completion`), tool calls both ways, errors in OpenAI's `{"error": {...}}` shape.

Behind it is the same turn as everywhere: the server's policy (deadlines, retries, rescue,
chains) and its admission. `docs/decisions.md` ("Other protocols' wires") says how the
finish reasons, usage, reasoning and a reset are mapped."""

from __future__ import annotations

import secrets
import time
from typing import TYPE_CHECKING, Any, TypeVar

import attrs
import msgspec
from rillet._core._encode import SSE_DONE, sse_json
from rillet._core._errors import (
    AuthenticationError,
    EmptyResponseError,
    ProviderError,
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
from rillet.providers._openai_chat._inbound import (
    BadRequest,
    ChatBody,
    chat_request,
    decode_chat_body,
    shown,
)
from rillet.providers._openai_chat._stream import is_refusal
from rillet.providers._openai_responses._inbound import ResponsesBody

from ._mmsp import mmsp_error
from ._replies import ErrorReply
from ._shared import Shared
from ._streamed import HeldHead
from ._wireturn import ChannelSink, DirectDeltas, ModelNotFound, route_model, run_wire_turn

if TYPE_CHECKING:
    from collections.abc import Callable

    from rillet._core._dialect import Provider
    from rillet._core._request import TurnRequest
    from rillet._turn._turn import Turn, TurnResult

    from ._capacity import Ticket
    from ._http11 import HttpConnection, Request

__all__ = [
    "OpenAIChat",
    "admit",
    "completion",
    "openai_error",
    "openai_finish_reason",
    "openai_usage",
    "refused",
    "reply_error",
]


# --- what goes back -------------------------------------------------------------------------------


def openai_finish_reason(reason: FinishReason | None) -> str:
    """MMSP's finish reason in OpenAI's words: `tool_call` is `tool_calls`; `unknown` with an
    answer is `stop` (the text stands; it is also what a gateway that never says why ends with,
    WIRE.md §9 j). A reply withheld whole is `content_filter` (see `withheld`)."""
    if reason == "tool_call":
        return "tool_calls"
    if reason == "length":
        return reason
    return "stop"


def withheld(result: TurnResult) -> bool:
    """Whether the turn failed only because the provider withheld the reply (nothing but an
    `unknown` finish: filtered or blocked, WIRE.md §9 g). OpenAI answers that with
    `finish_reason: "content_filter"` and no content, and so does this endpoint."""
    error = result.error
    return isinstance(error, EmptyResponseError) and error.finish_reason == "unknown"


def openai_usage(usage: UsageMetadata | None) -> dict[str, Any] | None:
    """MMSP's usage in OpenAI's terms: OpenAI's prompt tokens include the cached ones and its
    completion tokens the reasoning ones; MMSP counts each apart. None when none was reported."""
    if usage is None or (usage.prompt_tokens is None and usage.response_tokens is None):
        return None
    cached = usage.cached_tokens or 0
    thoughts = usage.thoughts_tokens or 0
    prompt = (usage.prompt_tokens or 0) + cached
    completion = (usage.response_tokens or 0) + thoughts
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
        "completion_tokens_details": {"reasoning_tokens": thoughts},
    }


_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "insufficient_quota",  # the server's spending limit for the run (max_cost)
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    409: "conflict_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
}


def openai_error(
    result: TurnResult, provider: Provider
) -> tuple[dict[str, Any], int, list[tuple[str, str]]]:
    """A failed turn as OpenAI's error object (`message`, `type` by status, `param`, `code`: the
    run's safe code, as its `run.done` says it), with the HTTP status and extra headers MMSP's
    endpoint gives it, but for the provider's refusal of the server's own key, a 502 that says
    so. A conversation past the context window keeps OpenAI's own code,
    `context_length_exceeded`, which OpenAI's clients check to shorten it. The provider's
    refusal of the request itself (a 4xx other than 401, 403 and 429) keeps the `type`, `code`
    and `param` its error object gave, as a gateway passes them on: they say which parameter
    was wrong and how."""
    error, status, headers = mmsp_error(result, provider)
    cause = _cause(result)
    if status in (401, 403) and isinstance(cause, AuthenticationError):
        # the client's key was fine (it got this far): a 401/403 would make its SDK raise
        # AuthenticationError and its user check a key that is not at fault
        status = 502
        error = {**error, "message": f"{error['message']}: it refused the server's credentials"}
    body = {
        "message": error["message"],
        "type": _TYPES.get(status, "server_error"),
        "param": None,
        "code": error["code"],
    }
    if isinstance(cause, ProviderError) and 400 <= status < 500 and status not in (401, 403, 429):
        body.update(cause.provider_fields)
    if past_context(cause):  # OpenAI's own code and param, which callers check to shorten
        body["code"], body["param"] = "context_length_exceeded", "messages"
    return body, status, headers


def _cause(result: TurnResult) -> BaseException | None:
    """What failed the turn: its error, or for a failed rescue what failed the stream before
    it (else the rescue's own)."""
    error = result.error
    if isinstance(error, RescueFailed):
        error = error.stream_error or error.rescue_error
    return error


def reply_error(reply: ErrorReply, kind: str, code: str | None) -> ErrorReply:
    """One of the shared checks' refusals, reworded in OpenAI's error shape (its `type` and
    `code`), for the endpoints that speak OpenAI's wires."""
    message = msgspec.json.decode(reply.body)["error"]["message"]
    return ErrorReply(
        reply.status, kind, message, headers=reply.headers, close=reply.close, param=None, code=code
    )


@attrs.define
class _Chunks:
    """Builds the `chat.completion.chunk`s of one response."""

    id: str
    model: str
    include_usage: bool
    created: int = attrs.field(factory=lambda: int(time.time()))
    calls: dict[str, int] = attrs.field(factory=dict)  # tool_call_id -> index
    current: int | None = None  # the call the next fragment without an id continues
    role_sent: bool = False
    refusing: bool = False  # the text being streamed is the model's refusal
    refused: bool = False  # a refusal was streamed: the reply's finish is OpenAI's `stop`

    def chunk(self, delta: dict[str, Any], finish: str | None = None) -> bytes:
        if not self.role_sent:
            delta = {"role": "assistant", **delta}
            self.role_sent = True
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        value: dict[str, Any] = {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [choice],
        }
        if self.include_usage:
            value["usage"] = None
        return sse_json(value)

    def usage_chunk(self, usage: UsageMetadata | None) -> bytes:
        value = {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [],
            "usage": openai_usage(usage),
        }
        return sse_json(value)

    def tool_call(self, call_id: str, name: str, arguments: str) -> bytes:
        """A tool call's fragment: MMSP names the call on its first fragment only, so a
        fragment without an id continues the call begun last."""
        index = self.calls.get(call_id) if call_id else self.current
        if index is None:
            index = self.calls[call_id] = len(self.calls)
            call = {
                "index": index,
                "id": call_id,
                "type": "function",
                "function": {"name": name, "arguments": arguments},
            }
        else:
            call = {"index": index, "function": {"arguments": arguments}}
        self.current = index
        return self.chunk({"tool_calls": [call]})

    def event(self, event: UniEvent, finish: str | None = None) -> bytes:
        """The chunks of one UniEvent (b"" for what OpenAI's wire has no place for); `finish`
        overrides a stop's finish reason."""
        if event.event_type == "stop":
            reason = finish or openai_finish_reason(event.finish_reason)
            out = self.chunk({}, reason)
            if self.include_usage:
                out += self.usage_chunk(event.usage_metadata)
            return out
        out = b""
        for item in event.content_items:
            if type(item) is TextDelta:
                if item.fidelity is not None:
                    self.refusing = is_refusal(item.fidelity)
                    self.refused = self.refused or self.refusing
                if item.text:
                    out += self.chunk({"refusal" if self.refusing else "content": item.text})
            elif type(item) is TextDone:
                self.refusing = False
            elif type(item) is ThinkingDelta and item.thinking:
                out += self.chunk({"reasoning_content": item.thinking})
            elif type(item) is ToolCallDelta:
                out += self.tool_call(item.tool_call_id, item.name, item.arguments)
            elif type(item) is ToolCallDone and item.tool_call_id not in self.calls:
                out += self.tool_call(item.tool_call_id, item.name, _json(item.arguments))
        return out


def _json(value: Any) -> str:
    return msgspec.json.encode(value).decode()


def refused(result: TurnResult) -> bool:
    """Whether the turn's answer is a refusal: OpenAI's own finish for it is `stop`, not the
    `content_filter` of a reply its rules cut short."""
    return result.provider_finish_reason == "refusal" and any(
        type(item) is TextDone and is_refusal(item.fidelity)
        for item in result.message.content_items
    )


def completion(
    message: UniMessage, completion_id: str, model: str, finish: str | None = None
) -> dict[str, Any]:
    """A whole `chat.completion` for the turn's assistant message (`finish` overrides its
    finish reason)."""
    texts = [item for item in message.content_items if type(item) is TextDone]
    text = "".join(item.text for item in texts if not is_refusal(item.fidelity))
    refusal = "".join(item.text for item in texts if is_refusal(item.fidelity))
    thinking = "".join(
        item.thinking for item in message.content_items if type(item) is ThinkingDone
    )
    calls = [
        {
            "id": item.tool_call_id,
            "type": "function",
            "function": {"name": item.name, "arguments": _json(item.arguments)},
        }
        for item in message.content_items
        if type(item) is ToolCallDone
    ]
    reply: dict[str, Any] = {"role": "assistant", "content": text or None}
    reply["refusal"] = refusal or None
    if thinking:
        reply["reasoning_content"] = thinking
    if calls:
        reply["tool_calls"] = calls
    reason = openai_finish_reason(message.finish_reason)
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {"index": 0, "message": reply, "logprobs": None, "finish_reason": finish or reason}
        ],
        "usage": openai_usage(message.usage_metadata),
    }


_MAX_MESSAGES = 2048
"""The most messages one request may hold, as OpenAI's API allows: more is no conversation one
turn should carry, and a body under the size limit could hold tens of thousands of them, each
read, kept and sent upstream (reading a run of tool results once cost its square)."""

_INCOMPLETE = {
    "message": "the upstream attempt failed mid-stream; retry the request",
    "type": "server_error",
    "param": None,
    "code": "IncompleteStreamError",
}


B = TypeVar("B", bound=ChatBody | ResponsesBody)


async def admit(
    shared: Shared,
    http: HttpConnection,
    request: Request,
    decode: Callable[[bytes], B],
    build: Callable[[B, str], TurnRequest],
) -> tuple[B, TurnRequest, Provider, Ticket]:
    """What both of OpenAI's wires do before a turn, each refusal in OpenAI's error shape: the
    server key, the body (`decode`), the model's provider, the turn request for its wire
    (`build`, given the dialect's name, raising `BadRequest` with the parameter at fault), and
    a place in the admission."""
    try:
        shared.require_key(request)
    except ErrorReply as reply:
        raise reply_error(reply, "authentication_error", "invalid_api_key") from None
    try:
        body: B = await shared.read_json(http, request, decode, "invalid_request_error")
    except ErrorReply as reply:
        raise reply_error(reply, "invalid_request_error", None) from None
    try:
        provider = route_model(shared, body.model)
    except ErrorReply as reply:  # a model that cannot be served as configured
        raise reply_error(reply, "invalid_request_error", "model_unavailable") from None
    except ModelNotFound:
        raise ErrorReply(
            404,
            "invalid_request_error",
            f"the model {shown(body.model)} does not exist or is not served here",
            param="model",
            code="model_not_found",
        ) from None
    try:
        turn_request = build(body, provider.dialect.name)
    except BadRequest as exc:
        raise ErrorReply(
            400, "invalid_request_error", str(exc), param=exc.param, code=exc.code
        ) from None
    try:
        ticket = shared.reserve(request, mmsp=False)
    except ErrorReply as reply:
        raise reply_error(reply, "rate_limit_error", "rate_limit_exceeded") from None
    return body, turn_request, provider, ticket


def _chat_request(body: ChatBody, dialect: str) -> TurnRequest:
    if len(body.messages) > _MAX_MESSAGES:  # refused before they are read: see there
        raise BadRequest(f"`messages` holds more than {_MAX_MESSAGES} messages", "messages")
    return chat_request(body, dialect)


@attrs.define(eq=False)
class OpenAIChat:
    """`POST /v1/chat/completions`."""

    shared: Shared

    async def completions(self, http: HttpConnection, request: Request, _: str) -> None:
        """A chat completion, streamed or whole, once admitted. Every answer, refusals too,
        carries an `x-request-id` as OpenAI's do: its SDK reads it (`_request_id`, an error's
        `request_id`) for its users to log and quote."""
        tagged = (("x-request-id", f"req_{secrets.token_hex(16)}"),)
        try:
            await self._complete(http, request, tagged)
        except ErrorReply as reply:
            reply.headers = [*reply.headers, *tagged]
            raise

    async def _complete(
        self, http: HttpConnection, request: Request, tagged: tuple[tuple[str, str], ...]
    ) -> None:
        body, turn_request, provider, ticket = await admit(
            self.shared, http, request, decode_chat_body, _chat_request
        )
        completion_id = f"chatcmpl-{secrets.token_hex(12)}"
        model = body.model or provider.model
        if body.stream:
            include = body.stream_options is not None and body.stream_options.include_usage
            chunks = _Chunks(completion_id, model, include)

            async def pump(turn: Turn, sink: ChannelSink) -> None:
                await self._stream(http, turn, sink, provider, chunks, tagged)

        else:

            async def pump(turn: Turn, sink: ChannelSink) -> None:
                async for _ in sink.receive:  # a whole reply: what the turn brings home is answered
                    sink.done()
                result = await turn.result()
                if result.ok or withheld(result):
                    finish = None if result.ok else "content_filter"
                    if result.filtered and not refused(result):
                        finish = "content_filter"  # the text stands, cut short as OpenAI says
                    whole = completion(result.message, completion_id, model, finish)
                    if not result.ok:
                        assert isinstance(result.error, EmptyResponseError)
                        whole["usage"] = openai_usage(result.error.usage_metadata)
                    await http.respond(200, msgspec.json.encode(whole), tagged)
                    return
                error, status, headers = openai_error(result, provider)
                body = msgspec.json.encode({"error": error})
                await http.respond(status, body, [*headers, *tagged])

        await run_wire_turn(
            self.shared,
            http,
            ticket,
            turn_request,
            provider,
            pump,
            route="chat",
            whole=not body.stream,
        )

    async def _stream(
        self,
        http: HttpConnection,
        turn: Turn,
        sink: ChannelSink,
        provider: Provider,
        chunks: _Chunks,
        tagged: tuple[tuple[str, str], ...],
    ) -> None:
        """The turn as chunks. As on the MMSP endpoint, the head waits up to one heartbeat for
        the first event so an upstream refusal gets its HTTP status; after that an error is one
        `{"error"}` event and `[DONE]`, and a reset that voids chunks the client has ends the
        stream so (`IncompleteStreamError`): OpenAI's wire cannot take text back. Once the
        head is out, the turn writes plain deltas itself (`DirectDeltas`)."""
        head = HeldHead(http, self.shared.limits.heartbeat, tagged)
        sink.direct = DirectDeltas(head, chunks.event, self.shared.metrics.count)
        while (items := await head.receive(sink.receive)) is not None:
            if type(items) is bytes:  # encoded by the turn, which could not write them
                await head.send(items)
                sink.done()
                continue
            out: list[bytes] = []
            stopped = reset = False
            unknown: UniEvent | None = None  # a stop of no known reason: the turn says which
            for item in items:
                if type(item) is AttemptReset:
                    if head.wrote:
                        reset = True
                        break
                    out.clear()  # nothing sent yet: the voided chunks are dropped unsent
                    chunks.calls.clear()
                    chunks.current = None
                    chunks.role_sent = False
                    chunks.refusing = chunks.refused = False
                    continue
                assert isinstance(item, UniEvent)
                stopped = item.event_type == "stop"
                if stopped and item.finish_reason == "unknown":
                    unknown = item
                    continue
                out.append(chunks.event(item))
            frames = b"".join(out)
            if frames:
                self.shared.metrics.count(len(out))
                await head.send(frames)
            if not (reset or stopped):  # the end stays owed: nothing may be written after it
                sink.done()
            if reset:
                await http.send_data(sse_json({"error": _INCOMPLETE}) + SSE_DONE)
                turn.cancel()
                return
            if stopped:
                if unknown is not None:
                    # the stop is the turn's last event: its result is due, and says whether
                    # the provider's content rules cut the answer (OpenAI's `content_filter`)
                    filtered = (await turn.result()).filtered and not chunks.refused
                    await head.send(chunks.event(unknown, "content_filter" if filtered else None))
                await http.send_data(SSE_DONE)
                return
        result = await turn.result()
        if result.ok or withheld(result):
            await head.start()
            end = SSE_DONE
            if not result.ok:
                assert isinstance(result.error, EmptyResponseError)
                usage = chunks.usage_chunk(result.error.usage_metadata)
                finish = chunks.chunk({}, "content_filter")
                end = finish + (usage if chunks.include_usage else b"") + end
            await http.send_data(end)
            return
        error, status, headers = openai_error(result, provider)
        if not head.started:
            await http.respond(status, msgspec.json.encode({"error": error}), [*headers, *tagged])
            return
        await http.send_data(sse_json({"error": error}) + SSE_DONE)
