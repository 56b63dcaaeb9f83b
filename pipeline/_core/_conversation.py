"""Conversation state: the messages of a multi-turn exchange, kept with their fidelity.

Each turn's assistant message is recorded as the turn assembled it (the `.done` items with
their `fidelity`, the usage, the finish reason), and the tool results go in as a user message
of `tool_result` items, so the next request sends the history back verbatim on every
dialect: Anthropic's thinking signatures and redacted thinking, the Responses API's encrypted
reasoning, Gemini's thought signatures, OpenRouter's reasoning details.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs
import msgspec

from ._events import ContentItem, TextDone, ToolCallDone, ToolResultDone, UniMessage
from ._request import ToolSpec, TurnRequest

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["Conversation", "PendingApproval", "exchanges"]


class PendingApproval(msgspec.Struct, frozen=True, kw_only=True):
    """A tool call that waits for the host's approval (approvals deferred): answer it with
    `run_agent(..., conversation=c, decisions={approval_id: True})` later."""

    approval_id: str
    tool_call: ToolCallDone
    step: int = 0


class _State(msgspec.Struct, kw_only=True, omit_defaults=True):
    system_prompt: str | None = None
    messages: list[UniMessage] = msgspec.field(default_factory=list)
    pending: list[PendingApproval] = msgspec.field(default_factory=list)
    results: list[ToolResultDone] = msgspec.field(default_factory=list)


@attrs.define(eq=False)
class Conversation:
    """The history an agent (or a host) sends back turn after turn.

    Attributes:
        system_prompt: the instructions that precede the conversation.
        messages: the messages, oldest first.
        pending: tool calls of the last assistant message still waiting for approval.
        results: the results of that message's other calls, sent once none is pending.
    """

    system_prompt: str | None = None
    messages: list[UniMessage] = attrs.field(factory=list)
    pending: list[PendingApproval] = attrs.field(factory=list)
    results: list[ToolResultDone] = attrs.field(factory=list)

    def add_user(self, *items: str | ContentItem) -> UniMessage:
        """Append a user message (plain strings become text items)."""
        content: list[ContentItem] = [TextDone(text=i) if isinstance(i, str) else i for i in items]
        message = UniMessage(role="user", content_items=content)
        self.messages.append(message)
        return message

    def record(self, message: UniMessage) -> None:
        """Append an assistant message exactly as its turn assembled it."""
        if message.role != "assistant":
            raise ValueError("record takes the assistant's messages; use add_user for the user's")
        self.messages.append(message)

    def add_tool_results(self, results: Sequence[ToolResultDone]) -> UniMessage:
        """Append the results of the last assistant message's tool calls, in its calls'
        order, as one user message."""
        order = {call.tool_call_id: n for n, call in enumerate(self._last_calls())}
        items = sorted(results, key=lambda r: order.get(r.tool_call_id, len(order)))
        message = UniMessage(role="user", content_items=list(items))
        self.messages.append(message)
        return message

    def _last_calls(self) -> list[ToolCallDone]:
        for message in reversed(self.messages):
            if message.role == "assistant":
                return [i for i in message.content_items if type(i) is ToolCallDone]
        return []

    def tool_calls(self) -> list[ToolCallDone]:
        """The last assistant message's tool calls that have no result yet."""
        answered: set[str] = set()
        for message in reversed(self.messages):
            if message.role == "assistant":
                return [
                    i
                    for i in message.content_items
                    if type(i) is ToolCallDone and i.tool_call_id not in answered
                ]
            answered.update(
                i.tool_call_id for i in message.content_items if type(i) is ToolResultDone
            )
        return []

    def request(
        self, template: TurnRequest | None = None, *, tools: Sequence[ToolSpec] = ()
    ) -> TurnRequest:
        """The next turn's request: the template's settings (or the defaults) with this
        history, these instructions, and the template's tools followed by `tools`."""
        base = template or TurnRequest(messages=[])
        names = {t.name for t in base.tools}
        return msgspec.structs.replace(
            base,
            messages=list(self.messages),
            system_prompt=self.system_prompt
            if self.system_prompt is not None
            else base.system_prompt,
            tools=[*base.tools, *(t for t in tools if t.name not in names)],
        )

    def encode(self) -> bytes:
        """The whole state as JSON (MMSP's message shape), to keep between runs."""
        return msgspec.json.encode(
            _State(
                system_prompt=self.system_prompt,
                messages=self.messages,
                pending=self.pending,
                results=self.results,
            )
        )

    @classmethod
    def decode(cls, data: bytes | str) -> Conversation:
        """A conversation from `encode`'s JSON."""
        state = msgspec.json.decode(data, type=_State)
        return cls(state.system_prompt, state.messages, state.pending, state.results)


def _is_question(message: UniMessage) -> bool:
    """A user message that asks something (not only tool results): an exchange starts here."""
    return message.role == "user" and any(
        type(i) is not ToolResultDone for i in message.content_items
    )


def exchanges(messages: Sequence[UniMessage]) -> list[list[UniMessage]]:
    """The messages cut into exchanges: a question, then the replies, tool calls and tool
    results that answer it (what stays or goes together when a history must shrink)."""
    out: list[list[UniMessage]] = []
    for message in messages:
        if not out or _is_question(message):
            out.append([message])
        else:
            out[-1].append(message)
    return out
