"""Tools the server runs, on the AI SDK's UI message stream: with `ServerConfig.tools` set, a
`POST /v1/ui/chat` that brings no tools of its own is an agent run (as `POST /v1/runs` is), and
its stream shows what the agent does in the parts the AI SDK reads:

- each step is a `start-step` ... `finish-step`: the model's text, reasoning and calls (their
  input as `tool-input-*`), then what its calls' tools did; one `finish` at the run's end,
  with its usage as message metadata;
- a tool the server runs: `data-tool-status` (`{toolCallId, name, status: "running"}`,
  transient: progress a front end may show, not kept in the message) as it starts, then
  `tool-output-available` with its result, or `tool-output-error` with a safe sentence;
- a tool that needs approval: `tool-approval-request` (`approvalId`, `toolCallId`), and the run
  ends there (`finish`, `tool-calls`). The stream is stateless as the AI SDK's own server is:
  `addToolApprovalResponse` sends the conversation back with that tool part
  `approval-responded`, and the next request runs the approved call (or answers a denied one
  with `tool-output-denied`), then goes on in the same assistant message.

`ui_conversation` reads the request (pure); `UiAgentRuns.run` runs the agent and writes its
parts.
A client that leaves cancels the run; a run that fails ends with its open parts closed and an
`error` part saying what happened, never the provider's words.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import attrs
import msgspec
import trio
from rillet._agent._demo_tools import toolset
from rillet._agent._loop import run_agent
from rillet._core._codes import describe
from rillet._core._conversation import Conversation, PendingApproval
from rillet._core._encode import SSE_DONE, sse_json
from rillet._core._events import ToolCallDone, ToolResultDone, UniEvent, UniMessage
from rillet._core._request import TurnRequest
from rillet._core._runevents import (
    ApprovalRequired,
    ApprovalResolved,
    AttemptResetEvent,
    RunDone,
    ToolCompleted,
    ToolStarted,
)
from rillet._turn._turn import SinkBatch

from ._shared import Shared
from ._streamed import HeldHead, end_stream, until_gone
from ._uistream import UI_VERSION, UiParts, ui_request, ui_start
from ._wireturn import admitted

if TYPE_CHECKING:
    from rillet._core._dialect import Provider

    from ._capacity import Ticket
    from ._http11 import HttpConnection
    from ._uistream import UiBody

__all__ = ["UiAgentRuns", "UiConversation", "ui_conversation"]


@attrs.frozen
class UiConversation:
    """A UI chat request as an agent run: the request (its new messages, when no approval is
    answered), the conversation so far, and the approvals the client answered.

    Attributes:
        request: the turn request (its messages are new ones; none when resuming).
        conversation: the history the agent continues (pending calls included).
        decisions: the client's answers, by approval id.
        calls: the tool call each pending approval is for, by approval id.
    """

    request: TurnRequest
    conversation: Conversation
    decisions: dict[str, bool]
    calls: dict[str, str]


def _answered(part: dict[str, Any]) -> tuple[str, bool | None] | None:
    """A tool part's approval: its id and the client's answer (None: not answered yet)."""
    approval = part.get("approval")
    if part.get("state") not in ("approval-requested", "approval-responded"):
        return None
    if not isinstance(approval, dict) or not isinstance(approval.get("id"), str):
        return None
    approved = approval.get("approved")
    return approval["id"], approved if isinstance(approved, bool) else None


def ui_conversation(body: UiBody) -> UiConversation:
    """The request as an agent run. A last assistant message whose tool parts wait for (or
    carry) an approval continues that message: its calls are the conversation's pending ones,
    the results of its other calls are kept for when none is pending. Raises `ValueError`."""
    request = ui_request(body)
    last = body.messages[-1] if body.messages else None
    waiting = []
    if last is not None and last.role == "assistant":
        waiting = [(p, a) for p in last.parts if (a := _answered(p)) is not None]
    if not waiting:
        empty = Conversation(system_prompt=request.system_prompt)
        return UiConversation(request, empty, {}, {})
    messages = list(request.messages)
    results: list[ToolResultDone] = []
    if messages and messages[-1].role == "user":  # the results the other calls already have
        results = [i for i in messages.pop().content_items if type(i) is ToolResultDone]
    calls = {c.tool_call_id: c for c in _calls(messages[-1] if messages else None)}
    pending: list[PendingApproval] = []
    decisions: dict[str, bool] = {}
    for part, (approval_id, approved) in waiting:
        call = calls.get(str(part.get("toolCallId")))
        if call is None:
            raise ValueError(f"approval {approval_id!r} names no tool call of the message")
        pending.append(PendingApproval(approval_id=approval_id, tool_call=call))
        if approved is not None:
            decisions[approval_id] = approved
    conversation = Conversation(
        system_prompt=request.system_prompt, messages=messages, pending=pending, results=results
    )
    resumed = msgspec.structs.replace(request, messages=[])
    by_id = {p.approval_id: p.tool_call.tool_call_id for p in pending}
    return UiConversation(resumed, conversation, decisions, by_id)


def _calls(message: UniMessage | None) -> list[ToolCallDone]:
    if message is None or message.role != "assistant":
        return []
    return [i for i in message.content_items if type(i) is ToolCallDone]


@attrs.define(eq=False)
class _Feed:
    """The agent's sink: its batches into a channel the stream's writer reads."""

    send: trio.MemorySendChannel[SinkBatch]

    async def deliver(self, batch: SinkBatch) -> None:
        await self.send.send(batch)

    async def close(self) -> None:
        await self.send.aclose()


@attrs.define(eq=False)
class _AgentParts:
    """The parts of an agent run's batches (see the module's docstring)."""

    calls: dict[str, str]  # approval id -> tool call id
    parts: UiParts = attrs.Factory(UiParts)
    stopped: bool = False  # its model request ended: its tools' parts may follow
    finish: str = "stop"
    usage: Any = None

    def batch(self, batch: SinkBatch, wrote: bool) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for event in batch.run:
            if type(event) is AttemptResetEvent:
                self.parts.reset()
                out = [{"type": "reset-step"}] if wrote else []
        for item in batch.uni:
            if not isinstance(item, UniEvent):
                continue  # a reset: the run event above said it
            if self.stopped:  # the next model request: a step of its own
                out += [{"type": "finish-step"}, {"type": "start-step"}]
                self.stopped = False
            if item.event_type == "stop":
                self.finish = {"tool_call": "tool-calls", "length": "length"}.get(
                    item.finish_reason or "", "stop"
                )
                self.usage = item.usage_metadata or self.usage
                out += self.parts.close()
                self.stopped = True
                continue
            out += self.parts.event(item)
        for event in batch.run:
            out += self._run_event(event)
        return out

    def _run_event(self, event: object) -> list[dict[str, Any]]:
        kind = type(event)
        if kind is ToolStarted:
            assert isinstance(event, ToolStarted)
            status = {"toolCallId": event.tool_call_id, "name": event.name, "status": "running"}
            return [{"type": "data-tool-status", "data": status, "transient": True}]
        if kind is ToolCompleted:
            assert isinstance(event, ToolCompleted)
            call = {"toolCallId": event.tool_call_id}
            if event.status == "ok":
                output = event.result if event.result is not None else ""
                return [{"type": "tool-output-available", **call, "output": output}]
            text = f"the tool {event.name} failed ({event.reason_code or event.status})"
            return [{"type": "tool-output-error", **call, "errorText": text}]
        if kind is ApprovalRequired:
            assert isinstance(event, ApprovalRequired)
            self.calls[event.approval_id] = event.tool_call_id
            ask = {"approvalId": event.approval_id, "toolCallId": event.tool_call_id}
            return [{"type": "tool-approval-request", **ask}]
        if kind is ApprovalResolved:
            assert isinstance(event, ApprovalResolved)
            denied = self.calls.get(event.approval_id)
            if event.decision == "denied" and denied is not None:
                return [{"type": "tool-output-denied", "toolCallId": denied}]
        return []

    def end(self, done: RunDone) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if done.status in ("completed", "approval_required"):
            out += [*self.parts.close(), {"type": "finish-step"}]
            finish = "tool-calls" if done.status == "approval_required" else self.finish
            out.append(self.parts.finish(finish, self.usage))
        elif done.status == "error":
            text = describe(done.code)
            out += [*self.parts.abandon(text), {"type": "error", "errorText": text}]
        return out


@attrs.define(eq=False)
class UiAgentRuns:
    """The UI stream's agent runs (`UiStream.agents`): a request read as one, and its run."""

    shared: Shared

    def read(self, body: UiBody) -> UiConversation:
        """`ui_conversation`. Raises `ValueError`."""
        return ui_conversation(body)

    async def run(
        self,
        http: HttpConnection,
        ticket: Ticket,
        run: UiConversation,
        provider: Provider,
        message_id: str,
    ) -> None:
        """Wait for a slot (while the client stays), run the agent with the server's tools and
        write its parts; a client that leaves cancels it. The ticket is released here.

        Args:
            http: the client's connection.
            ticket: the client's place in the admission.
            run: the request as an agent run (`ui_conversation`).
            provider: the model's provider.
            message_id: the reply's message id (`start`).
        """
        shared = self.shared
        config = shared.config
        assert config.tools is not None
        try:
            if not await admitted(shared, http, ticket):
                return
            send, receive = trio.open_memory_channel["SinkBatch"](64)
            completed = False
            async with trio.open_nursery() as nursery:
                agent = await nursery.start(
                    functools.partial(
                        run_agent,
                        run.request,
                        provider,
                        tools=toolset(config.tools),
                        conversation=run.conversation,
                        decisions=run.decisions,
                        approvals="defer",
                        sinks=[_Feed(send)],
                        client=shared.client,
                        policy=config.policy,
                        admission=shared.streams,
                        prices=config.prices,
                        max_cost=config.max_cost,
                        reasoning=config.reasoning,
                        tool_arguments=True,
                        tool_results=True,
                    )
                )
                writer = functools.partial(_write, shared, http, receive, run, provider, message_id)
                try:
                    completed = await until_gone(http, writer)
                finally:
                    if not completed:
                        agent.cancel()
            await end_stream(http, completed, shared.limits.close_timeout)
        finally:
            shared.admission.release(ticket)


async def _write(
    shared: Shared,
    http: HttpConnection,
    receive: trio.MemoryReceiveChannel[SinkBatch],
    run: UiConversation,
    provider: Provider,
    message_id: str,
) -> None:
    head = HeldHead(http, shared.limits.heartbeat, (UI_VERSION,))
    await head.start()
    await head.send(ui_start(provider, message_id))
    parts = _AgentParts(dict(run.calls))
    done: RunDone | None = None
    while (batch := await head.receive(receive)) is not None:
        out = parts.batch(batch, head.wrote)
        for event in batch.run:
            if type(event) is RunDone:
                done = event
        if done is not None:
            out += parts.end(done)
        if out:
            shared.metrics.count(len(out))
            await head.send(b"".join(sse_json(part) for part in out))
    await http.send_data(SSE_DONE)
