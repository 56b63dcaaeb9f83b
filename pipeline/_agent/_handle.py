"""An agent run's handle and result: its events, its approvals, how it ended."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

import attrs
import trio

from .._core._conversation import Conversation, PendingApproval
from .._core._cost import Price, Prices, as_prices
from .._core._dialect import Provider
from .._core._errors import failure
from .._core._events import UniMessage
from .._turn._handle import RunHandle
from .._turn._turn import TurnResult
from ._tools import ToolOutput

if TYPE_CHECKING:
    from collections.abc import Mapping
    from decimal import Decimal

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

    def cost(self, price: Prices | Mapping[str, Price] | None = None) -> Decimal | None:
        """What every step's reply cost (`TurnResult.cost` summed): at `price`, or at the run's
        prices when None; None when no step reported usage. A step whose usage is unknown
        adds nothing.

        Args:
            price: one model's prices (a `Price`), a table of them (`Prices`), or the prices
                of each model a step may be answered by (a chain's), by the model's name; a
                model with no price is a `KeyError` naming it, never a cost of nothing.
        """
        table = as_prices(price)  # a mapping of prices by model name, as a table
        total: Decimal | None = None
        for turn in self.turns:
            cost = turn.cost(table)
            if cost is None and table is not None and turn.usage is not None:
                model = turn.provider.model if turn.provider is not None else ""
                raise KeyError(f"no price for the model {model!r} that answered a step")
            if cost is not None:
                total = cost if total is None else total + cost
        return total

    def raise_for_outcome(self) -> AgentResult:
        """Raise the error that ended the run if it ended `error` or `cancelled`; else return
        the result (`completed`, or `approval_required`: approvals deferred, see `pending`).

        The error is the one that ended the run (a step's `AuthenticationError`...), or a
        `RunFailed` carrying the code where none says why (`max_steps`, a cancel); its
        `result` is this result, and `rillet.explain(exc)` says in a line what happened.

        Raises:
            RilletError: the run ended `error` or `cancelled`.
        """
        if self.status in ("completed", "approval_required"):
            return self
        raise failure(self.error, self.code, self)


@attrs.define(eq=False)
class _Waiting:
    """A tool call's wait for its approval: set once the host answers, with the answer."""

    pending: PendingApproval
    event: trio.Event = attrs.field(factory=trio.Event)
    approved: bool = False
    reason: str = ""


@attrs.define(eq=False)
class Agent(RunHandle[AgentResult]):
    """A running agent: iterate its events, answer its approvals, await its result."""

    conversation: Conversation
    _waiting: dict[str, _Waiting] = attrs.field(factory=dict, init=False)

    @property
    def pending_approvals(self) -> list[PendingApproval]:
        """The tool calls waiting for the host's answer now."""
        return [w.pending for w in self._waiting.values() if not w.event.is_set()]

    def expect(self, pending: PendingApproval) -> None:
        """Make an approval answerable (`approve`, `deny`) until `forget`: the agent loop calls
        it from the moment a host can see the approval's `approval.required`."""
        self._waiting[pending.approval_id] = _Waiting(pending)

    async def wait_answered(self, approval_id: str) -> tuple[bool, str]:
        """Wait for the host's answer to an expected approval: whether it approved, and the
        reason it gave."""
        waiting = self._waiting[approval_id]
        await waiting.event.wait()
        return waiting.approved, waiting.reason

    def forget(self, approval_id: str) -> None:
        """An approval is no longer answerable: answered, or its wait ended."""
        self._waiting.pop(approval_id, None)

    def approve(self, approval_id: str) -> None:
        """Let a waiting tool call run."""
        self._answer(approval_id, approved=True, reason="")

    def deny(self, approval_id: str, reason: str = "") -> None:
        """Refuse a waiting tool call; the model is told (with `reason`, if given)."""
        self._answer(approval_id, approved=False, reason=reason)

    def _answer(self, approval_id: str, *, approved: bool, reason: str) -> None:
        waiting = self._waiting.get(approval_id)
        if waiting is None or waiting.event.is_set():
            raise ValueError(f"no approval {approval_id!r} is waiting")
        waiting.approved, waiting.reason = approved, reason
        waiting.event.set()
