"""An agent run's handle and result: its events, its approvals, how it ended."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

import attrs
import trio

from .._core._conversation import Conversation, PendingApproval
from .._core._dialect import Provider
from .._core._events import UniMessage
from .._core._runevents import RunEvent
from .._turn._turn import TurnResult, UniItem, _Log
from ._tools import ToolOutput

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

__all__ = ["Agent", "AgentResult", "AgentStatus"]

AgentStatus = Literal["completed", "error", "cancelled", "approval_required"]


@attrs.frozen
class AgentResult:
    """How an agent run ended.

    Attributes:
        status: `completed`, `error`, `cancelled`, or `approval_required` (approvals were
            deferred and a tool waits for one: see `pending`).
        code: the safe code `run.done` carried (`completed`, `max_steps`, `timeout`...).
        text: the answer's text (the last step's).
        message: the last assistant message.
        steps: model requests made.
        turns: each step's turn result, in order.
        tool_outputs: every tool call's outcome, in the order they ended.
        pending: the tool calls waiting for approval.
        conversation: the conversation, with this run's messages recorded.
        provider: the provider that gave the last reply.
        error: the error that ended the run, if one did.
    """

    status: AgentStatus
    code: str
    text: str
    message: UniMessage
    steps: int
    turns: list[TurnResult]
    tool_outputs: list[ToolOutput]
    pending: list[PendingApproval]
    conversation: Conversation
    provider: Provider | None = None
    error: BaseException | None = None

    @property
    def ok(self) -> bool:
        """Whether the agent answered."""
        return self.status == "completed"

    @property
    def requests(self) -> int:
        """HTTP requests sent to providers by every step (retries and rescues included)."""
        return sum(t.requests for t in self.turns)


@attrs.define(eq=False)
class _Waiting:
    event: trio.Event = attrs.field(factory=trio.Event)
    approved: bool = False
    reason: str = ""


@attrs.define(eq=False)
class Agent:
    """A running agent: iterate its events, answer its approvals, await its result."""

    run_id: str
    conversation: Conversation
    _run: _Log[RunEvent] = attrs.field(factory=_Log)
    _uni: _Log[UniItem] = attrs.field(factory=_Log)
    _done: trio.Event = attrs.field(factory=trio.Event)
    _result: AgentResult | None = None
    _cancel_scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    _waiting: dict[str, tuple[PendingApproval, _Waiting]] = attrs.field(factory=dict, init=False)

    def run_events(self, after: int = 0) -> AsyncIterator[RunEvent]:
        """The public stream of the whole run (every step), from `seq` `after + 1`, ending
        with `run.done`."""
        return self._run.follow(after)

    def uni_events(self) -> AsyncIterator[UniItem]:
        """Every step's MMSP stream, one after another (each ends with its own stop)."""
        return self._uni.follow()

    @property
    def pending_approvals(self) -> list[PendingApproval]:
        """The tool calls waiting for the host's answer now."""
        return [pending for pending, _ in self._waiting.values()]

    def approve(self, approval_id: str) -> None:
        """Let a waiting tool call run."""
        self._answer(approval_id, approved=True, reason="")

    def deny(self, approval_id: str, reason: str = "") -> None:
        """Refuse a waiting tool call; the model is told (with `reason`, if given)."""
        self._answer(approval_id, approved=False, reason=reason)

    def _answer(self, approval_id: str, *, approved: bool, reason: str) -> None:
        entry = self._waiting.pop(approval_id, None)
        if entry is None:
            raise ValueError(f"no approval {approval_id!r} is waiting")
        waiting = entry[1]
        waiting.approved, waiting.reason = approved, reason
        waiting.event.set()

    async def result(self) -> AgentResult:
        """Wait for the run to end; its result."""
        await self._done.wait()
        assert self._result is not None
        return self._result

    def cancel(self) -> None:
        """Cancel the run; it still ends with `run.done{status: "cancelled"}`."""
        self._cancel_scope.cancel()

    @property
    def done(self) -> bool:
        """Whether the run has ended."""
        return self._done.is_set()
