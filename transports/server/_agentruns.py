"""Agent runs on the server: a run started on a server configured with a tool set (`tools`)
runs the agent loop with those tools, its events in the same run log as a turn's; its
approvals are answered over HTTP (`POST /v1/runs/{id}/approvals/{approval_id}`, with the run's
read token), and one no one answers within `approval_timeout` is denied, so a run never waits
for ever holding its provider-stream slot."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import msgspec
import trio
from rillet._agent import run_agent
from rillet._demo_tools import toolset
from rillet._runevents import ApprovalRequired

from ._replies import ErrorReply, Refused, not_found

if TYPE_CHECKING:
    from rillet._agent import Agent
    from rillet._request import TurnRequest
    from rillet.providers._base import Provider

    from .._http11 import HttpConnection, Request
    from ._capacity import Ticket
    from ._runs import HubFeed, RunRecord, Runs

__all__ = ["AgentRuns"]

logger = logging.getLogger("rillet.transports.server")

_MAX_REASON = 1000  # characters of a denial's reason the model is told


class _Answer(msgspec.Struct, frozen=True, kw_only=True):
    """`POST /v1/runs/{id}/approvals/{approval_id}`: the host's answer."""

    approve: bool
    reason: str = ""


_decode_answer = msgspec.json.Decoder(_Answer).decode


class AgentRuns:
    """Starting agent runs and answering their approvals, for the runs API (`Runs`)."""

    def __init__(self, runs: Runs) -> None:
        self.runs = runs

    def wanted(self, client_tools: list[Any]) -> bool:
        """Whether a new run is an agent run: the server has a tool set and the request
        brings no tools of its own (those the client runs itself, as in a plain turn)."""
        return self.runs.shared.config.tools is not None and not client_tools

    async def run(
        self,
        request: TurnRequest,
        provider: Provider,
        run_id: str,
        sink: HubFeed,
        record: RunRecord,
        ticket: Ticket,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """One agent run, in the server's nursery (as `Runs._run` is for a turn)."""
        shared = self.runs.shared
        config = shared.config
        assert config.tools is not None
        shared.metrics.runs_started += 1
        try:
            if not shared.admission.try_admit(ticket):
                await self.runs._queued(sink, record, ticket, task_status)
                if not ticket.admitted:
                    return
                task_status = trio.TASK_STATUS_IGNORED
            async with trio.open_nursery() as nursery:
                agent: Agent = await nursery.start(
                    lambda task_status: run_agent(
                        request,
                        provider,
                        tools=toolset(config.tools or ""),
                        sinks=[sink],
                        client=shared.client,
                        run_id=run_id,
                        approvals="ask",
                        reasoning=config.reasoning,
                        tool_arguments=config.tool_arguments,
                        policy=config.policy,
                        admission=shared.streams,
                        task_status=task_status,
                    )
                )
                record.agent = agent
                task_status.started()
                nursery.start_soon(_deny_unanswered, agent, shared.limits.approval_timeout)
                result = await agent.result()
                nursery.cancel_scope.cancel()
            for turn in result.turns:
                shared.metrics.finished(turn)
        except Exception as exc:  # a bug in one run must not take the server down
            logger.error("agent run %s failed: %s", run_id, type(exc).__name__, exc_info=True)
        finally:
            shared.admission.release(ticket)
            record.agent = None

    async def answer(self, http: HttpConnection, request: Request, arg: str) -> None:
        """`POST /v1/runs/{id}/approvals/{approval_id}` with the run's token and
        `{"approve": true|false, "reason": "..."}`: 200 once the waiting tool call is let run
        or refused; 404 for an unknown run or another run's token (the same bytes); 409 for
        an approval that is not waiting (unknown, or answered already). A run another server
        drives is answered there (`Runs.elsewhere`)."""
        run_id, _, approval_id = arg.partition("/")
        try:
            record = await self.runs.authorized(request, run_id)
        except Refused as refused:
            raise refused.reply() from None
        if record is None:
            raise not_found()
        answer: _Answer = await self.runs.shared.read_json(
            http, request, _decode_answer, "invalid_request"
        )
        if len(answer.reason) > _MAX_REASON:
            raise ErrorReply(400, "invalid_request", f"`reason` is over {_MAX_REASON} characters")
        mine = self.runs.runs.get(run_id)
        if mine is not None:
            body = self.decide(
                mine, run_id, approval_id, approve=answer.approve, reason=answer.reason
            )
            status = 200
        else:  # another server drives the run: it decides
            status, body = await self.runs.elsewhere(
                {
                    "op": "answer",
                    "run_id": run_id,
                    "approval_id": approval_id,
                    "approve": answer.approve,
                    "reason": answer.reason,
                }
            )
        await http.respond(status, body)

    def decide(
        self, record: RunRecord, run_id: str, approval_id: str, *, approve: bool, reason: str
    ) -> bytes:
        """Let a waiting tool call of this server's run go, or refuse it: the response body;
        `ErrorReply` 409 for an approval that is not waiting."""
        agent = record.agent
        try:
            if agent is None:
                raise ValueError(approval_id)
            if approve:
                agent.approve(approval_id)
            else:
                agent.deny(approval_id, reason)
        except ValueError:
            raise ErrorReply(
                409, "approval_not_waiting", "no such approval is waiting (answered already?)"
            ) from None
        decision = "approved" if approve else "denied"
        body = {"run_id": run_id, "approval_id": approval_id, "decision": decision}
        return msgspec.json.encode(body)


async def _deny_unanswered(agent: Agent, seconds: float) -> None:
    """Deny each approval no one answers within `seconds`."""
    async with trio.open_nursery() as nursery:
        async for event in agent.run_events():
            if type(event) is ApprovalRequired:
                assert isinstance(event, ApprovalRequired)
                nursery.start_soon(_deny_after, agent, event.approval_id, seconds)


async def _deny_after(agent: Agent, approval_id: str, seconds: float) -> None:
    await trio.sleep(seconds)
    if any(p.approval_id == approval_id for p in agent.pending_approvals):
        agent.deny(approval_id, "no answer in time")
