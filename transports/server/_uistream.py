"""The AI SDK's UI message stream (the `ai` npm package, 7.x): `POST /v1/ui/chat` takes what
`useChat`'s default transport sends (`{id, messages: [{id, role, parts}], trigger, ...}`) and
answers SSE parts (`start`, `start-step`, `text-*`, `reasoning-*`, `tool-input-*`, `finish-step`,
`finish`, `error`, then `data: [DONE]`) with the `x-vercel-ai-ui-message-stream: v1` header.

Tools run on the client (`onToolCall` / `addToolOutput`): their outputs come back as the tool
parts of the next request. A retry that voids parts the client already shows is a `reset-step`,
which the reader answers by dropping the step's parts: this wire can take text back.
`docs/decisions.md` ("Other protocols' wires") says why each choice is what it is."""

from __future__ import annotations

import secrets
from typing import TYPE_CHECKING, Any, Protocol, cast

import attrs
import msgspec
from rillet._core._codes import describe
from rillet._core._encode import SSE_DONE, sse_json
from rillet._core._errors import EmptyResponseError
from rillet._core._events import (
    FinishReason,
    ImageUrlDone,
    TextDelta,
    TextDone,
    ThinkingDelta,
    ThinkingDone,
    ToolCallDelta,
    ToolCallDone,
    ToolResultDone,
    UniEvent,
    UniMessage,
    UsageMetadata,
)
from rillet._core._markers import AttemptReset
from rillet._core._request import ThinkingLevel, ToolChoice, ToolSpec, TurnRequest
from rillet.providers._openai_chat._inbound import shown

from ._kept import KeptStream, ReplayConnection
from ._replies import ErrorReply
from ._shared import Shared
from ._streamed import SSE_HEADERS, HeldHead, end_stream
from ._wireturn import (
    ChannelSink,
    DirectDeltas,
    ModelNotFound,
    route_model,
    run_kept_turn,
    run_wire_turn,
)

if TYPE_CHECKING:
    from rillet._core._dialect import Provider
    from rillet._core._events import ContentItem
    from rillet._turn._turn import Turn

    from ._capacity import ClientId, Ticket
    from ._http11 import HttpConnection, Request

__all__ = [
    "UI_STREAM_HEADERS",
    "UI_VERSION",
    "UiBody",
    "UiParts",
    "UiStream",
    "response_message_id",
    "ui_request",
    "ui_start",
    "ui_usage",
]


class _UiMessage(msgspec.Struct, frozen=True, kw_only=True):
    role: str
    parts: list[dict[str, Any]] = msgspec.field(default_factory=list)
    id: str = ""


class UiBody(msgspec.Struct, frozen=True, kw_only=True):
    """`useChat`'s request: the chat's id and messages, and the fields a front end may add
    through the transport's `body` (`model`, `system`, `tools`, settings)."""

    messages: list[_UiMessage]
    id: str = ""
    trigger: str = "submit-message"
    model: str | None = None
    system: str | None = None
    tools: list[ToolSpec] | None = None
    toolChoice: ToolChoice | None = None
    temperature: float | None = None
    maxOutputTokens: int | None = None
    thinkingLevel: ThinkingLevel | None = None


_decode_body = msgspec.json.Decoder(UiBody).decode

UI_VERSION = ("x-vercel-ai-ui-message-stream", "v1")
"""The header that names the UI message stream protocol's version."""
UI_STREAM_HEADERS = (*SSE_HEADERS, UI_VERSION)
"""The head of a UI message stream: an event stream, and the protocol's version."""


def _output_text(part: dict[str, Any]) -> str | None:
    """A tool part's result as text, or None while it has none."""
    state = part.get("state")
    if state == "output-available":
        output = part.get("output")
        return output if isinstance(output, str) else msgspec.json.encode(output).decode()
    if state == "output-error":
        return str(part.get("errorText") or "the tool failed")
    if state == "output-denied":
        return "the user denied this tool call"
    return None


def _tool_name(part: dict[str, Any]) -> str | None:
    kind = str(part.get("type", ""))
    if kind == "dynamic-tool":
        name = part.get("toolName")
        return name if isinstance(name, str) else None
    return kind.removeprefix("tool-") if kind.startswith("tool-") else None


def _assistant(parts: list[dict[str, Any]], out: list[UniMessage]) -> None:
    """An assistant UI message as rillet's messages: each step's text and tool calls, then a
    user message with the results the client filled in."""
    items: list[ContentItem] = []
    results: list[ContentItem] = []

    def flush() -> None:
        if items:
            finish: FinishReason = (
                "tool_call" if any(type(i) is ToolCallDone for i in items) else "stop"
            )
            out.append(
                UniMessage(role="assistant", content_items=list(items), finish_reason=finish)
            )
        if results:
            out.append(UniMessage(role="user", content_items=list(results)))
        items.clear()
        results.clear()

    for part in parts:
        kind = part.get("type")
        if kind == "step-start":
            flush()
        elif kind == "text" and isinstance(part.get("text"), str) and part["text"]:
            if results:  # a step's text after its tool results: a new step
                flush()
            items.append(TextDone(text=part["text"]))
        elif (name := _tool_name(part)) is not None and isinstance(part.get("toolCallId"), str):
            arguments = part.get("input")
            if not isinstance(arguments, dict):
                arguments = {}
            call_id = part["toolCallId"]
            items.append(ToolCallDone(name=name, arguments=arguments, tool_call_id=call_id))
            text = _output_text(part)
            if text is not None:
                results.append(ToolResultDone(text=text, tool_call_id=call_id))
        # reasoning (no signature to replay it with), sources, files and data parts: not sent
    flush()


def ui_request(body: UiBody) -> TurnRequest:
    """`useChat`'s messages as rillet's turn request: system messages and `system` are the
    system prompt; user text and image files are the user's items; assistant tool parts are
    tool calls, and their outputs tool results. Raises `ValueError`."""
    system = [body.system] if body.system else []
    messages: list[UniMessage] = []
    for message in body.messages:
        texts = [p.get("text") for p in message.parts if p.get("type") == "text"]
        if message.role == "system":
            system.extend(t for t in texts if isinstance(t, str))
        elif message.role == "user":
            items: list[ContentItem] = [TextDone(text=t) for t in texts if isinstance(t, str) and t]
            for part in message.parts:
                media = str(part.get("mediaType", ""))
                if part.get("type") == "file" and media.startswith("image/"):
                    items.append(ImageUrlDone(image_url=str(part.get("url", ""))))
            if items:
                messages.append(UniMessage(role="user", content_items=items))
        elif message.role == "assistant":
            _assistant(message.parts, messages)
        else:
            raise ValueError(f"unknown role {shown(message.role)}")
    if not messages:
        raise ValueError("`messages` holds nothing to answer")
    return TurnRequest(
        messages=messages,
        system_prompt="\n\n".join(system) or None,
        tools=body.tools or [],
        tool_choice=body.toolChoice,
        max_tokens=body.maxOutputTokens,
        temperature=body.temperature,
        thinking_level=body.thinkingLevel,
    )


def response_message_id(body: UiBody) -> str:
    """The id the `start` part gives the reply: a request that ends with an assistant message
    (its tool outputs sent back) is continued, so the reply keeps that message's id, as the AI
    SDK's own server does; with a new id the client would show a second assistant message."""
    last = body.messages[-1] if body.messages else None
    if last is not None and last.role == "assistant" and last.id:
        return last.id
    return f"msg-{secrets.token_hex(12)}"


_FINISH = {"stop": "stop", "length": "length", "tool_call": "tool-calls", "unknown": "other"}


@attrs.define
class UiParts:
    """Turns a turn's UniEvents into UI message stream parts: one text or reasoning part per
    item (opened at its first fragment, ended at its `.done`), a tool call's input streamed and
    then made available whole."""

    count: int = 0
    text: str | None = None  # the open text part's id
    reasoning: str | None = None  # the open reasoning part's id
    call: tuple[str, str] | None = None  # the call whose input streams: its id and name

    def _id(self, kind: str) -> str:
        self.count += 1
        return f"{kind}-{self.count}"

    def close(self) -> list[dict[str, Any]]:
        """The ends of the open text and reasoning parts."""
        parts: list[dict[str, Any]] = []
        if self.text is not None:
            parts.append({"type": "text-end", "id": self.text})
        if self.reasoning is not None:
            parts.append({"type": "reasoning-end", "id": self.reasoning})
        self.text = self.reasoning = None
        return parts

    def abandon(self, error_text: str) -> list[dict[str, Any]]:
        """The ends of what is open when the run fails: text and reasoning ended, and a tool
        call whose input was still streaming closed as `tool-input-error` (a reader would
        otherwise keep showing it as streaming)."""
        parts = self.close()
        if self.call is not None:
            call_id, name = self.call
            parts.append(
                {
                    "type": "tool-input-error",
                    "toolCallId": call_id,
                    "toolName": name,
                    "input": None,
                    "errorText": error_text,
                }
            )
            self.call = None
        return parts

    def reset(self) -> None:
        """A new attempt: the reader dropped the step's parts; nothing is open."""
        self.text = self.reasoning = self.call = None

    def event(self, event: UniEvent, finish: str | None = None) -> list[dict[str, Any]]:
        """The parts of one UniEvent; `finish` overrides a stop's finish reason."""
        if event.event_type == "stop":
            reason = finish or _FINISH.get(event.finish_reason or "unknown", "other")
            finished = self.finish(reason, event.usage_metadata)
            return [*self.close(), {"type": "finish-step"}, finished]
        parts: list[dict[str, Any]] = []
        for item in event.content_items:
            if type(item) is TextDelta:
                if self.text is None:
                    parts += self.close()
                    self.text = self._id("text")
                    parts.append({"type": "text-start", "id": self.text})
                if item.text:
                    parts.append({"type": "text-delta", "id": self.text, "delta": item.text})
            elif type(item) is TextDone:
                if self.text is None and item.text:  # a whole item with no fragments before
                    parts += [*self.close(), *self._whole("text", item.text)]
                parts += self.close()
            elif type(item) is ThinkingDelta:
                if self.reasoning is None:
                    parts += self.close()
                    self.reasoning = self._id("reasoning")
                    parts.append({"type": "reasoning-start", "id": self.reasoning})
                if item.thinking:
                    delta = {"type": "reasoning-delta", "id": self.reasoning}
                    parts.append({**delta, "delta": item.thinking})
            elif type(item) is ThinkingDone:
                parts += self.close()
            elif type(item) is ToolCallDelta:
                if item.tool_call_id:  # MMSP names a call on its first fragment only
                    parts += self.close()
                    self.call = (item.tool_call_id, item.name)
                    start = {"toolCallId": item.tool_call_id, "toolName": item.name}
                    parts.append({"type": "tool-input-start", **start})
                if self.call is not None and item.arguments:
                    delta = {"toolCallId": self.call[0], "inputTextDelta": item.arguments}
                    parts.append({"type": "tool-input-delta", **delta})
            elif type(item) is ToolCallDone:
                parts += self.close()
                self.call = None
                done = {"toolCallId": item.tool_call_id, "toolName": item.name}
                parts.append({"type": "tool-input-available", **done, "input": item.arguments})
        return parts

    def _whole(self, kind: str, text: str) -> list[dict[str, Any]]:
        part_id = self._id(kind)
        return [
            {"type": f"{kind}-start", "id": part_id},
            {"type": f"{kind}-delta", "id": part_id, "delta": text},
            {"type": f"{kind}-end", "id": part_id},
        ]

    @staticmethod
    def finish(reason: str, usage: UsageMetadata | None = None) -> dict[str, Any]:
        """The `finish` part, with the turn's token usage as message metadata when known."""
        part: dict[str, Any] = {"type": "finish", "finishReason": reason}
        counted = ui_usage(usage)
        if counted:
            part["messageMetadata"] = {"usage": counted}
        return part


def ui_start(provider: Provider, message_id: str) -> bytes:
    """A reply's first parts: `start`, with the model that answers as message metadata a
    front end can show (`message.metadata`), and the first `start-step`."""
    about = {"model": provider.model, "provider": provider.label}
    start = {"type": "start", "messageId": message_id, "messageMetadata": about}
    return sse_json(start) + sse_json({"type": "start-step"})


def ui_usage(usage: UsageMetadata | None) -> dict[str, int]:
    """Token usage as the AI SDK counts it (`LanguageModelUsage`): input with the cached
    tokens in it, output with the reasoning tokens in it, and each of those apart; a count the
    provider did not report is left out, not 0."""
    if usage is None:
        return {}
    cached, prompt = usage.cached_tokens, usage.prompt_tokens
    thoughts, response = usage.thoughts_tokens, usage.response_tokens
    out: dict[str, int] = {}
    if prompt is not None:
        out["inputTokens"] = prompt + (cached or 0)
    if response is not None:
        out["outputTokens"] = response + (thoughts or 0)
    if prompt is not None and response is not None:
        out["totalTokens"] = out["inputTokens"] + out["outputTokens"]
    if cached is not None:
        out["cachedInputTokens"] = cached
    if thoughts is not None:
        out["reasoningTokens"] = thoughts
    return out


class UiAgents(Protocol):
    """Agent runs on this wire (the server's tools, `_uiagent`), for a request that brings no
    tools of its own to a server configured with a tool set."""

    def read(self, body: UiBody) -> Any:
        """The request as an agent run. Raises `ValueError`."""
        ...

    async def run(
        self, http: HttpConnection, ticket: Ticket, run: Any, provider: Provider, message_id: str
    ) -> None:
        """Run it and write its parts; the ticket is released there."""
        ...


@attrs.define(eq=False)
class UiStream:
    """`POST /v1/ui/chat`, and with `ServerConfig.ui_resume` its kept streams:
    `GET /v1/ui/chat/{id}/stream` resumes a chat's current one, `DELETE` stops it
    (`_kept`)."""

    shared: Shared
    agents: UiAgents | None = None
    replays: dict[str, KeptStream] = attrs.field(factory=dict)
    """Each chat's kept stream, by the chat's id, while it runs."""

    async def chat(self, http: HttpConnection, request: Request, _: str) -> None:
        """A turn as the AI SDK's UI message stream, once admitted. Refusals of the request
        itself (the key, the body, the model, the admission) are HTTP errors, which the
        transport throws; a turn that fails is an `error` part, which `useChat` shows."""
        self.shared.require_key(request)
        body: UiBody = await self.shared.read_json(http, request, _decode_body, "invalid_request")
        agents = self.agents if self.shared.config.tools is not None and not body.tools else None
        try:
            turn_request = ui_request(body)
            agent_run = agents.read(body) if agents is not None else None
        except ValueError as exc:
            raise ErrorReply(400, "invalid_request", str(exc)) from None
        try:
            provider = route_model(self.shared, body.model)
        except ModelNotFound:
            raise ErrorReply(404, "model_not_found", "no such model is served here") from None
        ticket = self.shared.reserve(request, mmsp=False)

        message_id = response_message_id(body)
        if agents is not None:  # the server runs its tools (not kept for a resume)
            await agents.run(http, ticket, agent_run, provider, message_id)
            return
        if self.shared.config.ui_resume and body.id:
            replay = self._keep(body.id, self.shared.client_id(request))
            self.shared.nursery.start_soon(
                self._run_kept, body.id, replay, ticket, turn_request, provider, message_id
            )
            await self._follow(http, replay)  # its first reader
            return

        async def pump(turn: Turn, sink: ChannelSink) -> None:
            await self._stream(http, turn, sink, provider, message_id)

        await run_wire_turn(self.shared, http, ticket, turn_request, provider, pump, route="ui")

    def _keep(self, chat_id: str, owner: ClientId) -> KeptStream:
        """A new kept stream for the chat; the one it had, if it still runs, is stopped (a new
        message in a chat supersedes the answer still coming)."""
        old = self.replays.pop(chat_id, None)
        if old is not None and old.stop is not None:
            old.stop()
        replay = self.replays[chat_id] = KeptStream(owner)
        return replay

    async def _run_kept(
        self,
        chat_id: str,
        replay: KeptStream,
        ticket: Ticket,
        turn_request: TurnRequest,
        provider: Provider,
        message_id: str,
    ) -> None:
        """A kept stream's run: its pump writes into the replay, whoever reads it."""
        # the pump's connection is the replay's stand-in (it writes, never waits)
        into = cast("HttpConnection", ReplayConnection(replay.append))

        async def pump(turn: Turn, sink: ChannelSink) -> None:
            await self._stream(into, turn, sink, provider, message_id)

        def started(turn: Turn) -> None:
            replay.stop = turn.cancel

        try:
            await run_kept_turn(
                self.shared, ticket, turn_request, provider, pump, route="ui", started=started
            )
        finally:
            replay.close()
            if self.replays.get(chat_id) is replay:
                del self.replays[chat_id]

    def _mine(self, request: Request, chat_id: str) -> KeptStream | None:
        """The chat's kept stream, if it runs and the asker started it."""
        self.shared.require_key(request)
        replay = self.replays.get(chat_id)
        if replay is None or replay.owner != self.shared.client_id(request):
            return None
        return replay

    async def resume(self, http: HttpConnection, request: Request, chat_id: str) -> None:
        """`GET /v1/ui/chat/{id}/stream`: the chat's kept stream from its first part, then
        what follows; 204 when it has none (`useChat` then shows what it stored)."""
        replay = self._mine(request, chat_id)
        if replay is None:
            await http.respond(204, b"")
            return
        await self._follow(http, replay)

    async def _follow(self, http: HttpConnection, replay: KeptStream) -> None:
        """One reader of a kept stream, to its end or the reader's leaving."""
        completed = await replay.follow(http, UI_STREAM_HEADERS)
        await end_stream(http, completed, self.shared.limits.close_timeout)

    async def stop(self, http: HttpConnection, request: Request, chat_id: str) -> None:
        """`DELETE /v1/ui/chat/{id}/stream`: stop the chat's kept stream (its readers get
        its end); 204 either way."""
        replay = self._mine(request, chat_id)
        if replay is not None and replay.stop is not None:
            replay.stop()
        await http.respond(204, b"")

    async def _stream(
        self,
        http: HttpConnection,
        turn: Turn,
        sink: ChannelSink,
        provider: Provider,
        message_id: str,
    ) -> None:
        """The turn's parts. The head goes out at once (the stream's own `start` part first);
        after it, the turn writes plain deltas itself (`DirectDeltas`), and everything else
        comes here: a reset (`reset-step`), the stop, the turn's end."""
        parts = UiParts()
        head = HeldHead(http, self.shared.limits.heartbeat, (UI_VERSION,))
        await head.start()
        # the model that answers, as message metadata a front end can show (`message.metadata`)
        await http.send_data(ui_start(provider, message_id))

        def frame(event: UniEvent) -> bytes:
            return b"".join([sse_json(part) for part in parts.event(event)])

        sink.direct = DirectDeltas(head, frame, self.shared.metrics.count)
        stopped = False
        unknown: UniEvent | None = None  # a stop of no known reason: the turn says which
        while not stopped and (items := await head.receive(sink.receive)) is not None:
            if type(items) is bytes:  # encoded by the turn, which could not write them
                await head.send(items)
                sink.done()
                continue
            out: list[dict[str, Any]] = []
            for item in items:
                if type(item) is AttemptReset:
                    parts.reset()
                    # parts not yet sent are dropped; the reader drops those it has
                    out = [{"type": "reset-step"}] if head.wrote else []
                    continue
                assert isinstance(item, UniEvent)
                stopped = item.event_type == "stop"
                if stopped and item.finish_reason == "unknown":
                    unknown = item
                    continue
                out += parts.event(item)
            if out:
                self.shared.metrics.count(len(out))
                await head.send(b"".join(sse_json(part) for part in out))
            if not stopped:  # the end stays owed: nothing may be written after it
                sink.done()
        if stopped:
            if unknown is not None:
                # the stop is the turn's last event: its result is due, and says whether the
                # provider's content rules cut the answer (the AI SDK's `content-filter`)
                filtered = (await turn.result()).filtered
                last = parts.event(unknown, "content-filter" if filtered else None)
                await http.send_data(b"".join(sse_json(part) for part in last))
            await http.send_data(SSE_DONE)
            return
        result = await turn.result()
        end: list[dict[str, Any]] = parts.close()
        if result.ok:  # a rescued reply ends without a stop of its own
            end += [{"type": "finish-step"}, parts.finish("stop", result.message.usage_metadata)]
        elif isinstance(result.error, EmptyResponseError) and result.error.finish_reason in (
            "unknown",
            None,
        ):  # withheld whole: filtered or blocked
            end += [{"type": "finish-step"}, parts.finish("content-filter")]
        else:  # the run's code and its sentence: never the provider's words
            text = describe(result.code)
            end += parts.abandon(text)  # a tool call cut off mid-input ends as an error too
            end.append({"type": "error", "errorText": text})
        await http.send_data(b"".join(sse_json(part) for part in end) + SSE_DONE)
