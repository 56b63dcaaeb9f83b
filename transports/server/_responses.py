"""`POST /v1/responses`: OpenAI's Responses API (the open Responses specification's) over any
provider the server routes to.

A streamed response is the API's event stream: `response.created` and `response.in_progress`,
then per output item `response.output_item.added`, its parts and deltas
(`response.content_part.added`, `response.output_text.delta`, `response.refusal.delta`,
`response.reasoning_summary_text.delta`, `response.function_call_arguments.delta`), their
`.done`s and `response.output_item.done`, and last `response.completed` (or
`response.incomplete`, with its reason, when the answer was cut at the token limit or by the
provider's content rules) with the whole response and its usage. Every event carries its
`sequence_number`, from 0, and the item it belongs to its `output_index` and `item_id`. Each
MMSP group is one output item: text a `message`, thinking a `reasoning` item (its summary), a
tool call a `function_call`.

As on the Chat Completions endpoint the head waits up to one heartbeat for the first event, so a
refusal upstream keeps its HTTP status and OpenAI's error object; after it, a failure is a
`response.failed` event with the run's code, and a retry that voids what the client already has
ends the stream so (this wire cannot take text back). A whole response is one `response`
object. `previous_response_id` and a stored conversation are not served: the server keeps no
conversations (see `rillet.providers._openai_responses._inbound`).

A `background: true` response runs apart from its connection (`_kept`): streamed, its reader
follows its events and may leave and resume them at
`GET /v1/responses/{id}?stream=true&starting_after=N`; whole, the request is answered at once
(`queued`) and `GET /v1/responses/{id}` gives the response as it stands.
`POST /v1/responses/{id}/cancel` stops it. Only the client that started a background response
may read or cancel it, for `KEPT_SECONDS` after it ends, on the server process that runs it."""

from __future__ import annotations

import secrets
import time
from typing import TYPE_CHECKING, Any, cast

import attrs
import msgspec
import trio
from rillet._core._codes import RUN_CODES
from rillet._core._encode import sse_json
from rillet._core._errors import EmptyResponseError
from rillet._core._events import (
    TextDelta,
    TextDone,
    ThinkingDelta,
    ThinkingDone,
    ToolCallDelta,
    ToolCallDone,
    UniEvent,
    UsageMetadata,
)
from rillet._core._markers import AttemptReset
from rillet.providers._openai_chat._inbound import BadRequest, shown
from rillet.providers._openai_chat._stream import is_refusal
from rillet.providers._openai_responses._inbound import (
    ResponsesBody,
    decode_responses_body,
    responses_request,
)

from ._kept import KeptStream, ReplayConnection
from ._openai import admit, openai_error, reply_error, withheld
from ._replies import ErrorReply
from ._shared import Shared
from ._streamed import SSE_HEADERS, HeldHead, end_stream
from ._wireturn import ChannelSink, DirectDeltas, run_kept_turn, run_wire_turn

if TYPE_CHECKING:
    from rillet._core._dialect import Provider
    from rillet._core._events import UniMessage
    from rillet._core._request import TurnRequest
    from rillet._turn._turn import Turn, TurnResult

    from ._capacity import Ticket
    from ._http11 import HttpConnection, Request

__all__ = ["OpenAIResponses", "ResponseEvents", "responses_usage"]

_MAX_ITEMS = 2048  # as many input items as the Chat endpoint takes messages


def responses_usage(usage: UsageMetadata | None) -> dict[str, Any] | None:
    """MMSP's usage in the Responses API's terms: its input tokens include the cached ones and
    its output tokens the reasoning ones; MMSP counts each apart. None when none was reported."""
    if usage is None or (usage.prompt_tokens is None and usage.response_tokens is None):
        return None
    cached = usage.cached_tokens or 0
    thoughts = usage.thoughts_tokens or 0
    given = (usage.prompt_tokens or 0) + cached
    output = (usage.response_tokens or 0) + thoughts
    return {
        "input_tokens": given,
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": output,
        "output_tokens_details": {"reasoning_tokens": thoughts},
        "total_tokens": given + output,
    }


def _arguments(value: Any) -> str:
    return msgspec.json.encode(value).decode()


@attrs.define
class _Open:
    """The output item being streamed."""

    kind: str  # message, refusal, reasoning, function_call
    item: dict[str, Any]
    index: int
    text: list[str] = attrs.field(factory=list)


@attrs.define
class ResponseEvents:
    """Builds the events of one streamed response, and the response they describe."""

    id: str
    model: str
    request: dict[str, Any]  # the request's echoed fields (instructions, tools, settings)
    created_at: int = attrs.field(factory=lambda: int(time.time()))
    sequence: int = 0
    output: list[dict[str, Any]] = attrs.field(factory=list)
    current: _Open | None = None
    started: bool = False
    kept: KeptStream | None = None  # a background response's events, for its readers

    def response(self, status: str, **fields: Any) -> dict[str, Any]:
        """The response object as it stands (`status`, and any field given over it)."""
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "error": None,
            "incomplete_details": None,
            "model": self.model,
            "output": list(self.output) if status != "in_progress" else [],
            "usage": None,
            **self.request,
            **fields,
        }

    def event(self, kind: str, **fields: Any) -> bytes:
        """One event, numbered."""
        value = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        data = b"event: %s\n%s" % (kind.encode(), sse_json(value))
        if self.kept is not None:  # one chunk per event: a reader resumes by its number
            self.kept.append(data)
        return data

    def start(self) -> bytes:
        """`response.created` and `response.in_progress`, once."""
        if self.started:
            return b""
        self.started = True
        head = self.response("in_progress")
        return self.event("response.created", response=head) + self.event(
            "response.in_progress", response=head
        )

    def reset(self) -> None:
        """Nothing sent yet: forget what a voided attempt built."""
        self.output.clear()
        self.current = None

    def frames(self, event: UniEvent) -> bytes:
        """The events of one MMSP delta (b"" for what this wire has no place for)."""
        out = self.start()
        for item in event.content_items:
            kind = type(item)
            if kind is TextDelta:
                assert isinstance(item, TextDelta)
                refusal = item.fidelity is not None and is_refusal(item.fidelity)
                out += self._open("refusal" if refusal else "message")
                if item.text:
                    out += self._delta(item.text)
            elif kind is ThinkingDelta:
                assert isinstance(item, ThinkingDelta)
                out += self._open("reasoning")
                if item.thinking:
                    out += self._delta(item.thinking)
            elif kind is ToolCallDelta:
                assert isinstance(item, ToolCallDelta)
                out += self._open("function_call", item)
                if item.arguments:
                    out += self._delta(item.arguments)
            elif isinstance(item, (TextDone, ThinkingDone, ToolCallDone)):
                out += self.close_item(item)
        return out

    def _open(self, kind: str, call: ToolCallDelta | None = None) -> bytes:
        if self.current is not None:
            return b""
        index = len(self.output)
        if kind == "function_call":
            assert call is not None
            call_id = call.tool_call_id or f"call_{secrets.token_hex(12)}"
            body: dict[str, Any] = {
                "id": f"fc_{secrets.token_hex(12)}",
                "type": "function_call",
                "status": "in_progress",
                "arguments": "",
                "call_id": call_id,
                "name": call.name,
            }
        elif kind == "reasoning":
            body = {"id": f"rs_{secrets.token_hex(12)}", "type": "reasoning", "summary": []}
        else:
            body = {
                "id": f"msg_{secrets.token_hex(12)}",
                "type": "message",
                "status": "in_progress",
                "content": [],
                "role": "assistant",
            }
        self.current = _Open(kind, body, index)
        out = self.event("response.output_item.added", output_index=index, item=body)
        where = {"item_id": body["id"], "output_index": index}
        if kind == "message":
            part = {"type": "output_text", "annotations": [], "logprobs": [], "text": ""}
            out += self.event("response.content_part.added", **where, content_index=0, part=part)
        elif kind == "refusal":
            part = {"type": "refusal", "refusal": ""}
            out += self.event("response.content_part.added", **where, content_index=0, part=part)
        elif kind == "reasoning":
            part = {"type": "summary_text", "text": ""}
            out += self.event(
                "response.reasoning_summary_part.added", **where, summary_index=0, part=part
            )
        return out

    def _delta(self, text: str) -> bytes:
        current = self.current
        assert current is not None
        current.text.append(text)
        where = {"item_id": current.item["id"], "output_index": current.index}
        if current.kind == "message":
            return self.event(
                "response.output_text.delta", **where, content_index=0, delta=text, logprobs=[]
            )
        if current.kind == "refusal":
            return self.event("response.refusal.delta", **where, content_index=0, delta=text)
        if current.kind == "reasoning":
            return self.event(
                "response.reasoning_summary_text.delta", **where, summary_index=0, delta=text
            )
        return self.event("response.function_call_arguments.delta", **where, delta=text)

    def close_item(self, done: TextDone | ThinkingDone | ToolCallDone) -> bytes:
        """The events that end an item (its `.done`s and `response.output_item.done`),
        opening it first when no delta did."""
        current = self.current
        if current is None:  # a group with no delta of its own: open it first
            if type(done) is TextDone:
                refusal = done.fidelity is not None and is_refusal(done.fidelity)
                head = self._open("refusal" if refusal else "message")
            elif type(done) is ThinkingDone:
                head = self._open("reasoning")
            else:
                assert isinstance(done, ToolCallDone)
                delta = ToolCallDelta(name=done.name, arguments="", tool_call_id=done.tool_call_id)
                head = self._open("function_call", delta)
            return head + self.close_item(done)
        self.current = None
        item, where = current.item, {"item_id": current.item["id"], "output_index": current.index}
        out = b""
        if current.kind in ("message", "refusal"):
            assert isinstance(done, TextDone)
            if current.kind == "message":
                part = {"type": "output_text", "annotations": [], "logprobs": [], "text": done.text}
                out += self.event(
                    "response.output_text.done",
                    **where,
                    content_index=0,
                    text=done.text,
                    logprobs=[],
                )
            else:
                part = {"type": "refusal", "refusal": done.text}
                out += self.event(
                    "response.refusal.done", **where, content_index=0, refusal=done.text
                )
            out += self.event("response.content_part.done", **where, content_index=0, part=part)
            item = {**item, "status": "completed", "content": [part]}
        elif current.kind == "reasoning":
            assert isinstance(done, ThinkingDone)
            part = {"type": "summary_text", "text": done.thinking}
            out += self.event(
                "response.reasoning_summary_text.done", **where, summary_index=0, text=done.thinking
            )
            out += self.event(
                "response.reasoning_summary_part.done", **where, summary_index=0, part=part
            )
            item = {**item, "summary": [part]}
            encrypted = (done.fidelity or {}).get("encrypted_content")
            if encrypted:
                item["encrypted_content"] = encrypted
        else:
            assert isinstance(done, ToolCallDone)
            arguments = _arguments(done.arguments)
            out += self.event(
                "response.function_call_arguments.done",
                **where,
                name=item["name"],
                arguments=arguments,
            )
            item = {**item, "status": "completed", "arguments": arguments}
        self.output.append(item)
        return out + self.event("response.output_item.done", output_index=current.index, item=item)

    def finish(self, stop: UniEvent, reason: str | None) -> bytes:
        """The last event: `response.completed`, or `response.incomplete` with its reason
        (`max_output_tokens`, `content_filter`)."""
        out = self.start()
        usage = responses_usage(stop.usage_metadata)
        if reason is None:
            return out + self.event(
                "response.completed", response=self.response("completed", usage=usage)
            )
        whole = self.response("incomplete", usage=usage, incomplete_details={"reason": reason})
        return out + self.event("response.incomplete", response=whole)

    def failed(self, error: dict[str, Any]) -> bytes:
        """`response.failed` with the run's code and its sentence: the error object's message,
        then what the code means and what to do (a reader shows the message alone)."""
        code = error.get("code") or "server_error"
        message = error["message"]
        if (info := RUN_CODES.get(code)) is not None:
            message = f"{message}: {info.sentence}"
        fault = {"code": code, "message": message}
        return self.start() + self.event(
            "response.failed", response=self.response("failed", error=fault)
        )


def _echoed(body: ResponsesBody) -> dict[str, Any]:
    """The request's fields a response object repeats, as the client gave them."""
    extra = body.extra
    return {
        "instructions": body.instructions,
        "max_output_tokens": body.max_output_tokens,
        "metadata": extra.get("metadata") or {},
        "parallel_tool_calls": extra.get("parallel_tool_calls", True),
        "temperature": body.temperature,
        "tool_choice": body.tool_choice or "auto",
        "tools": body.tools or [],
        "top_p": extra.get("top_p"),
        "text": body.text or {"format": {"type": "text"}},
        "reasoning": body.reasoning or {"effort": None, "summary": None},
        "store": False,
        "background": bool(body.background),
    }


def whole_response(
    events: ResponseEvents, message: UniMessage, reason: str | None
) -> dict[str, Any]:
    """A whole response for the turn's message: its items built as the stream would build
    them, then the response object (`completed`, or `incomplete` with its reason)."""
    for part in message.content_items:
        if isinstance(part, (TextDone, ThinkingDone, ToolCallDone)):
            events.close_item(part)
    usage = responses_usage(message.usage_metadata)
    if reason is None:
        return events.response("completed", usage=usage)
    return events.response("incomplete", usage=usage, incomplete_details={"reason": reason})


_INCOMPLETE = {
    "code": "IncompleteStreamError",
    "message": "the upstream attempt failed mid-stream; retry the request",
}


KEPT_SECONDS = 600.0
"""How long a background response stays to be read or resumed once it has ended."""
KEPT_MOST = 256
"""The most background responses a server process keeps; past it the oldest ended go first."""


@attrs.define(eq=False)
class _Background:
    """A background response: its events as they came, and who may read them."""

    stream: KeptStream
    events: ResponseEvents
    cancelled: bool = False

    def snapshot(self) -> dict[str, Any]:
        """The response as it stands: its last event's once it has ended, else in progress
        with the items it has so far."""
        if self.stream.done and self.stream.chunks:
            last = self.stream.chunks[-1]
            response: dict[str, Any] = msgspec.json.decode(last[last.index(b"data: ") + 6 :])[
                "response"
            ]
            if self.cancelled:
                response["status"] = "cancelled"
            return response
        return self.events.response("cancelled" if self.cancelled else "in_progress")


@attrs.define(eq=False)
class OpenAIResponses:
    """`POST /v1/responses`; a background response's `GET /v1/responses/{id}` (whole, or its
    events resumed with `stream=true&starting_after=N`) and `POST /v1/responses/{id}/cancel`."""

    shared: Shared
    background: dict[str, _Background] = attrs.field(factory=dict)
    """The background responses kept, by id, the oldest first."""

    async def create(self, http: HttpConnection, request: Request, _: str) -> None:
        """A response, streamed or whole, once admitted; every answer carries an
        `x-request-id`, as OpenAI's do."""
        tagged = (("x-request-id", f"req_{secrets.token_hex(16)}"),)
        try:
            await self._create(http, request, tagged)
        except ErrorReply as reply:
            reply.headers = [*reply.headers, *tagged]
            raise

    async def _create(
        self, http: HttpConnection, request: Request, tagged: tuple[tuple[str, str], ...]
    ) -> None:
        body, turn_request, provider, ticket = await admit(
            self.shared, http, request, decode_responses_body, _responses_request
        )
        events = ResponseEvents(
            f"resp_{secrets.token_hex(16)}", body.model or provider.model, _echoed(body)
        )
        if body.background:
            await self._background(http, request, body, events, ticket, turn_request, provider)
            return

        async def pump(turn: Turn, sink: ChannelSink) -> None:
            if body.stream:
                await self._stream(http, turn, sink, provider, events, tagged)
            else:
                await self._whole(http, turn, sink, provider, events, tagged)

        await run_wire_turn(
            self.shared,
            http,
            ticket,
            turn_request,
            provider,
            pump,
            route="responses",
            whole=not body.stream,
        )

    async def _background(
        self,
        http: HttpConnection,
        request: Request,
        body: ResponsesBody,
        events: ResponseEvents,
        ticket: Ticket,
        turn_request: TurnRequest,
        provider: Provider,
    ) -> None:
        """`background: true`: the response runs apart from this connection, its events kept
        (`_kept`) to be read or resumed; this request reads them from the first (streamed),
        or is answered at once with the response queued."""
        stream = KeptStream(self.shared.client_id(request))
        events.kept = stream
        kept = self.background[events.id] = _Background(stream, events)
        self._forget_old()
        self.shared.nursery.start_soon(self._run_background, kept, ticket, turn_request, provider)
        if body.stream:
            completed = await stream.follow(http, SSE_HEADERS, 0, self.shared.limits.heartbeat)
            await end_stream(http, completed, self.shared.limits.close_timeout)
            return
        queued = msgspec.json.encode(events.response("queued"))
        await http.respond(200, queued, [("content-type", "application/json")])

    async def _run_background(
        self,
        kept: _Background,
        ticket: Ticket,
        turn_request: TurnRequest,
        provider: Provider,
    ) -> None:
        # the events keep themselves (`ResponseEvents.kept`): what the pump writes is dropped
        into = cast("HttpConnection", ReplayConnection(lambda data: None))

        async def pump(turn: Turn, sink: ChannelSink) -> None:
            await self._stream(into, turn, sink, provider, kept.events, ())

        def started(turn: Turn) -> None:
            kept.stream.stop = turn.cancel

        try:
            await run_kept_turn(
                self.shared,
                ticket,
                turn_request,
                provider,
                pump,
                route="responses",
                started=started,
            )
        finally:
            kept.stream.close()
            await trio.sleep(KEPT_SECONDS)  # (cancelled with the server)
            if self.background.get(kept.events.id) is kept:
                del self.background[kept.events.id]

    def _forget_old(self) -> None:
        """Past `KEPT_MOST`, the oldest ended responses go."""
        ended = [key for key, kept in self.background.items() if kept.stream.done]
        for key in ended[: max(0, len(self.background) - KEPT_MOST)]:
            del self.background[key]

    def _mine(self, request: Request, response_id: str) -> _Background:
        """A kept response the asker started; OpenAI's 404 otherwise."""
        try:
            self.shared.require_key(request)
        except ErrorReply as reply:
            raise reply_error(reply, "authentication_error", "invalid_api_key") from None
        kept = self.background.get(response_id)
        if kept is None or kept.stream.owner != self.shared.client_id(request):
            raise ErrorReply(
                404,
                "invalid_request_error",
                f"No response found with id {shown(response_id)}: only a background response"
                " is kept, by the server process that runs it, for 10 minutes after it ends.",
                param=None,
                code=None,
            )
        return kept

    async def retrieve(self, http: HttpConnection, request: Request, response_id: str) -> None:
        """`GET /v1/responses/{id}`: the response as it stands, or with `stream=true` its
        events from the first after `starting_after` (from the start without it)."""
        kept = self._mine(request, response_id)
        if request.query.get("stream", "").lower() != "true":
            answer = msgspec.json.encode(kept.snapshot())
            await http.respond(200, answer, [("content-type", "application/json")])
            return
        after = request.query.get("starting_after", "-1")
        try:
            start = int(after) + 1
        except ValueError:
            start = -1
        if start < 0:
            raise ErrorReply(
                400,
                "invalid_request_error",
                "starting_after must be a sequence number (an integer from 0)",
                param="starting_after",
                code=None,
            )
        completed = await kept.stream.follow(http, SSE_HEADERS, start, self.shared.limits.heartbeat)
        await end_stream(http, completed, self.shared.limits.close_timeout)

    async def cancel(self, http: HttpConnection, request: Request, response_id: str) -> None:
        """`POST /v1/responses/{id}/cancel`: stop a background response (its readers get its
        end); the response, `cancelled` unless it had ended."""
        kept = self._mine(request, response_id)
        if not kept.stream.done:
            kept.cancelled = True
            if kept.stream.stop is not None:
                kept.stream.stop()
        answer = msgspec.json.encode(kept.snapshot())
        await http.respond(200, answer, [("content-type", "application/json")])

    async def _whole(
        self,
        http: HttpConnection,
        turn: Turn,
        sink: ChannelSink,
        provider: Provider,
        events: ResponseEvents,
        tagged: tuple[tuple[str, str], ...],
    ) -> None:
        async for _ in sink.receive:  # a whole reply: what the turn brings home is answered
            sink.done()
        result = await turn.result()
        if result.ok or withheld(result):
            reason = _reason(result)
            whole = whole_response(events, result.message, reason)
            if not result.ok:
                assert isinstance(result.error, EmptyResponseError)
                whole["usage"] = responses_usage(result.error.usage_metadata)
            await http.respond(200, msgspec.json.encode(whole), tagged)
            return
        error, status, headers = openai_error(result, provider)
        await http.respond(status, msgspec.json.encode({"error": error}), [*headers, *tagged])

    async def _stream(
        self,
        http: HttpConnection,
        turn: Turn,
        sink: ChannelSink,
        provider: Provider,
        events: ResponseEvents,
        tagged: tuple[tuple[str, str], ...],
    ) -> None:
        """The turn as the Responses event stream (see the module's docstring); plain deltas
        written on the turn's own task once the head is out (`DirectDeltas`)."""
        head = HeldHead(http, self.shared.limits.heartbeat, tagged)
        sink.direct = DirectDeltas(head, events.frames, self.shared.metrics.count)
        while (items := await head.receive(sink.receive)) is not None:
            if type(items) is bytes:  # encoded by the turn, which could not write them
                await head.send(items)
                sink.done()
                continue
            out: list[bytes] = []
            stop: UniEvent | None = None
            reset = False
            for item in items:
                if type(item) is AttemptReset:
                    if head.wrote:
                        reset = True
                        break
                    out.clear()  # nothing sent yet: the voided events are dropped unsent
                    events.reset()
                    continue
                assert isinstance(item, UniEvent)
                if item.event_type == "stop":
                    stop = item
                    continue
                out.append(events.frames(item))
            frames = b"".join(out)
            if frames:
                self.shared.metrics.count(len(out))
                await head.send(frames)
            if not reset and stop is None:  # the end stays owed: nothing may follow it
                sink.done()
            if reset:
                await http.send_data(events.failed(_INCOMPLETE))
                turn.cancel()
                return
            if stop is not None:
                reason = None
                if stop.finish_reason == "length":
                    reason = "max_output_tokens"
                elif stop.finish_reason == "unknown":
                    # the stop is the turn's last event: its result says whether the
                    # provider's content rules cut the answer
                    reason = _reason(await turn.result())
                await head.send(events.finish(stop, reason))
                return
        result = await turn.result()
        if result.ok or withheld(result):  # a rescued reply, or one withheld whole
            message = result.message
            if not result.ok:
                assert isinstance(result.error, EmptyResponseError)
                stop = UniEvent(
                    event_type="stop",
                    content_items=[],
                    usage_metadata=result.error.usage_metadata,
                    finish_reason="unknown",
                )
                await head.send(events.finish(stop, "content_filter"))
                return
            frames = events.start()
            for part in message.content_items:
                if isinstance(part, (TextDone, ThinkingDone, ToolCallDone)):
                    frames += events.close_item(part)
            stop = UniEvent(
                event_type="stop",
                content_items=[],
                usage_metadata=message.usage_metadata,
                finish_reason=message.finish_reason,
            )
            await head.send(frames + events.finish(stop, _reason(result)))
            return
        error, status, headers = openai_error(result, provider)
        if not head.started and events.kept is None:
            await http.respond(status, msgspec.json.encode({"error": error}), [*headers, *tagged])
            return
        await head.start()
        await http.send_data(events.failed(error))


def _responses_request(body: ResponsesBody, dialect: str) -> TurnRequest:
    if isinstance(body.input, list) and len(body.input) > _MAX_ITEMS:
        raise BadRequest(f"`input` holds more than {_MAX_ITEMS} items", "input")
    return responses_request(body, dialect)


def _reason(result: TurnResult) -> str | None:
    """Why the turn's response is incomplete, or None when it completed."""
    if not result.ok:
        return "content_filter"  # withheld whole
    if result.message.finish_reason == "length":
        return "max_output_tokens"
    if result.filtered and result.provider_finish_reason != "refusal":
        return "content_filter"
    return None
