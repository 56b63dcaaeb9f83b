"""Run events: the public delivery stream, safe to send to a browser.

Envelope `{type, run_id, seq, elapsed_ms}`; `seq` counts from 1 without gaps, `elapsed_ms` is
monotonic. Types: `run.started`, `status`, `attempt.reset`, `answer.delta`, `reasoning.delta`
(only when the host opts in), `tool_call.started` / `tool_call.done` (the model is streaming a
tool call: names and ids; arguments only when the host opts in), `tool.started` /
`tool.completed` (an agent is running a tool: span id, name, duration, a `reason_code` on
failure; arguments and results only when the host opts in), `approval.required` /
`approval.resolved`, `usage`, `answer.done {sha256, chars}`, and exactly one
`run.done {status, code}` last (status `completed`, `error`, `cancelled` or
`approval_required`). No exception prose, provider message or credential ever enters this
stream: errors travel as safe codes.

`RunEventBuilder` is pure: it turns the handler's items (UniEvents, resets, statuses) and the
final outcome into run events, numbering them.
"""

from __future__ import annotations

from decimal import Decimal
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import attrs
import msgspec

from ._codes import done_code, retryable
from ._events import (
    TextDelta,
    ThinkingDelta,
    ToolCallDelta,
    ToolCallDone,
    UniEvent,
)
from ._finish import filtered_stop
from ._policy import Outcome
from ._text import AnswerText

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from ._events import UsageMetadata


_E = TypeVar("_E", bound="_Envelope")

__all__ = [
    "AnswerDelta",
    "AnswerDone",
    "ApprovalRequired",
    "ApprovalResolved",
    "AttemptResetEvent",
    "Entry",
    "ReasoningDelta",
    "RunDone",
    "RunEvent",
    "RunEventBuilder",
    "RunStarted",
    "StatusEvent",
    "ToolCallReady",
    "ToolCallStarted",
    "ToolCompleted",
    "ToolStarted",
    "UsageEvent",
    "decode_run_event",
]


class _Envelope(
    msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag_field="type", gc=False
):
    run_id: str
    seq: int
    elapsed_ms: int


class RunStarted(_Envelope, frozen=True, kw_only=True, omit_defaults=True, tag="run.started"):
    """The run began: which provider and model will answer."""

    provider: str = ""
    model: str = ""


class StatusEvent(_Envelope, frozen=True, kw_only=True, omit_defaults=True, tag="status"):
    """What the run is doing: `requesting`, `backing_off`, `waiting_rate_limit`, `rescuing`,
    `resuming` (the provider continues a stream that broke, from its last event: no reset
    follows), `hedged` (the first event was late, so the request went out a second time; the
    first of the two to answer is read: `reason_code` `hedge_won` when the second one was,
    `hedge_lost` when the first was), `taken_over` (the server running the run was lost;
    another runs it again: a reset follows), `queued` (waiting for a provider-stream slot),
    `step` (an agent's next model request), `fallback` (the next provider of a chain answers),
    `candidate_rejected` (buffered delivery).

    `step` is the agent step it belongs to; `provider` / `model` name who answers (`fallback`);
    `reason_code` is a safe code: why the last attempt failed (`backing_off`, `rescuing`,
    `resuming`: one of `RETRY_REASONS`, such as `connect_failed` or `stalled`;
    `waiting_rate_limit`: `overloaded` when the provider said so, else none), or why a
    candidate was rejected (`candidate_rejected`)."""

    phase: str
    attempt: int
    delay_ms: int | None = None
    step: int | None = None
    provider: str | None = None
    model: str | None = None
    reason_code: str | None = None


class AttemptResetEvent(
    _Envelope, frozen=True, kw_only=True, omit_defaults=True, tag="attempt.reset"
):
    """Everything streamed since the last reset (or the start) is void: clear it."""

    attempt: int


class AnswerDelta(_Envelope, frozen=True, kw_only=True, omit_defaults=True, tag="answer.delta"):
    """A fragment of the answer text; append each exactly once."""

    delta: str


class ReasoningDelta(
    _Envelope, frozen=True, kw_only=True, omit_defaults=True, tag="reasoning.delta"
):
    """A fragment of the model's reasoning (only when the host opts in)."""

    delta: str


class ToolCallStarted(
    _Envelope, frozen=True, kw_only=True, omit_defaults=True, tag="tool_call.started"
):
    """The model began streaming a tool call (nothing runs yet)."""

    name: str
    tool_call_id: str


class ToolCallReady(_Envelope, frozen=True, kw_only=True, omit_defaults=True, tag="tool_call.done"):
    """The model finished streaming a tool call (its arguments only when the host opts in)."""

    name: str
    tool_call_id: str
    arguments: dict[str, Any] | None = None


class ToolStarted(_Envelope, frozen=True, kw_only=True, omit_defaults=True, tag="tool.started"):
    """An agent began running a tool: `span_id` pairs it with its `tool.completed`."""

    span_id: str
    name: str
    tool_call_id: str
    step: int
    arguments: dict[str, Any] | None = None


class ToolCompleted(_Envelope, frozen=True, kw_only=True, omit_defaults=True, tag="tool.completed"):
    """A tool's run ended. `status` is `ok`, `error`, `denied` or `cancelled`; a failure
    carries a safe `reason_code`; the result's text only when the host opts in."""

    span_id: str
    name: str
    tool_call_id: str
    step: int
    duration_ms: int
    status: Literal["ok", "error", "denied", "cancelled"] = "ok"
    reason_code: str | None = None
    result: str | None = None


class ApprovalRequired(
    _Envelope, frozen=True, kw_only=True, omit_defaults=True, tag="approval.required"
):
    """A tool that needs approval is waiting for the host's answer (`approve` / `deny`);
    `arguments` says what it would run with, when the run shows tool arguments."""

    approval_id: str
    name: str
    tool_call_id: str
    step: int
    arguments: dict[str, Any] | None = None


class ApprovalResolved(
    _Envelope, frozen=True, kw_only=True, omit_defaults=True, tag="approval.resolved"
):
    """The host answered an approval: `approved` or `denied`."""

    approval_id: str
    decision: Literal["approved", "denied"]


class UsageEvent(_Envelope, frozen=True, kw_only=True, omit_defaults=True, tag="usage"):
    """The reply's token counts (None: not reported), MMSP's four (the prompt without cache
    reads, the response without thinking) and the prompt's share written to the provider's
    cache; with the run's prices, its `cost` (exact, a decimal string in JSON), so a page or
    a bill shows what the answer cost. Sent once per reply, before `answer.done`."""

    cached_tokens: int | None = None
    prompt_tokens: int | None = None
    thoughts_tokens: int | None = None
    response_tokens: int | None = None
    cache_write_tokens: int | None = None
    cost: Decimal | None = None


class AnswerDone(_Envelope, frozen=True, kw_only=True, omit_defaults=True, tag="answer.done"):
    """The answer is complete: its UTF-8 SHA-256 and character count, to check a rebuild."""

    sha256: str
    chars: int
    finish_reason: str | None = None
    filtered: bool = False
    """The provider's content rules stopped the answer partway (its finish reason `unknown`,
    the provider's own one of theirs, such as `content_filter`): the text is incomplete."""


class RunDone(_Envelope, frozen=True, kw_only=True, omit_defaults=True, tag="run.done"):
    """The run is over; exactly one, always last. `code` is a safe code, never prose (one per
    cause: `RUN_CODES`, docs/codes.md).

    `attempts` counts the attempts (the rescue included); `requests` the HTTP requests the
    provider got for them, so a reader sees what the turn cost: both always present, zeros
    included (a run stopped before its first request). `retryable` says whether asking again,
    unchanged, can help (after `retry_after_ms`, when given): where a page offers Retry."""

    status: Literal["completed", "error", "cancelled", "approval_required"]
    code: str
    attempts: int
    requests: int
    retryable: bool
    retry_after_ms: int | None = None


RunEvent = (
    RunStarted
    | StatusEvent
    | AttemptResetEvent
    | AnswerDelta
    | ReasoningDelta
    | ToolCallStarted
    | ToolCallReady
    | ToolStarted
    | ToolCompleted
    | ApprovalRequired
    | ApprovalResolved
    | UsageEvent
    | AnswerDone
    | RunDone
)

decode_run_event = msgspec.json.Decoder(RunEvent).decode
"""Decode one run event from its JSON."""


class RunEventBuilder:
    """Numbers and builds one run's events from the handler's items. Pure.

    Attributes:
        text: the answer text delivered so far (since the last reset).

    Given the accumulator's `answer` (`text=`), it reads the text from there, which its owner
    keeps and resets: the turn's text is accumulated once. Without one, it keeps its own.
    """

    def __init__(
        self,
        run_id: str,
        clock: Callable[[], float],
        *,
        reasoning: bool = False,
        tool_arguments: bool = False,
        text: AnswerText | None = None,
    ) -> None:
        self.run_id = run_id
        self._clock = clock
        self._t0 = clock()
        self._seq = 0
        self._reasoning = reasoning
        self._tool_arguments = tool_arguments
        self._answer = text if text is not None else AnswerText()
        self._writes = text is None  # it keeps the text itself
        self.finish_reason: str | None = None
        self.done = False

    def _env(self) -> dict[str, Any]:
        self._seq += 1
        return {
            "run_id": self.run_id,
            "seq": self._seq,
            "elapsed_ms": int((self._clock() - self._t0) * 1000),
        }

    @property
    def text(self) -> str:
        """The answer text delivered since the last reset."""
        return self._answer.text

    def started(self, provider: str, model: str) -> RunEvent:
        """`run.started`."""
        return RunStarted(**self._env(), provider=provider, model=model)

    def status(
        self, phase: str, attempt: int, delay: float = 0.0, reason: str | None = None
    ) -> RunEvent:
        """A `status` event (`reason`: the safe code of why a retry or the rescue follows)."""
        delay_ms = int(delay * 1000) if delay else None
        return StatusEvent(
            **self._env(), phase=phase, attempt=attempt, delay_ms=delay_ms, reason_code=reason
        )

    def reset(self, attempt: int) -> RunEvent:
        """`attempt.reset`: the text so far is void."""
        if self._writes:
            self._answer.reset()
        self.finish_reason = None
        return AttemptResetEvent(**self._env(), attempt=attempt)

    def uni_many(self, events: Sequence[UniEvent], out: list[RunEvent]) -> None:
        """The run events a batch of UniEvents shows as, appended to `out`. The batch is
        stamped once (its events arrived together), and a text fragment takes one step."""
        run_id = self.run_id
        elapsed = int((self._clock() - self._t0) * 1000)
        text = self._answer.parts if self._writes else None
        for event in events:
            items = event.content_items
            if items and type(items[0]) is TextDelta:
                fragment = items[0].text
                if fragment:
                    self._seq += 1
                    if text is not None:
                        text.append(fragment)
                    out.append(
                        AnswerDelta(
                            run_id=run_id, seq=self._seq, elapsed_ms=elapsed, delta=fragment
                        )
                    )
                continue
            if items and type(items[0]) is ThinkingDelta and not self._reasoning:
                continue  # reasoning stays out of the public stream unless opted in
            run = self.uni(event)
            if run is not None:
                out.append(run)
        if text is not None:
            self._answer.settle()  # a few long strings, not one per fragment

    def uni(self, event: UniEvent) -> RunEvent | None:
        """The run event a UniEvent shows as, if any."""
        if event.event_type == "stop":
            self.finish_reason = event.finish_reason  # its usage comes with the closing events
            return None
        item = event.content_items[0]
        kind = type(item)
        if kind is TextDelta:
            text = item.text  # type: ignore[union-attr]
            if not text:
                return None
            if self._writes:
                self._answer.append(text)
            return AnswerDelta(**self._env(), delta=text)
        if kind is ThinkingDelta:
            thinking = item.thinking  # type: ignore[union-attr]
            if not self._reasoning or not thinking:
                return None
            return ReasoningDelta(**self._env(), delta=thinking)
        if kind is ToolCallDelta:
            assert isinstance(item, ToolCallDelta)
            if not item.name:
                return None
            return ToolCallStarted(**self._env(), name=item.name, tool_call_id=item.tool_call_id)
        if kind is ToolCallDone:
            assert isinstance(item, ToolCallDone)
            arguments = item.arguments if self._tool_arguments else None
            return ToolCallReady(
                **self._env(), name=item.name, tool_call_id=item.tool_call_id, arguments=arguments
            )
        return None

    def event(self, kind: type[_E], **fields: Any) -> _E:
        """This run's next event of type `kind` with `fields` (the envelope filled in)."""
        return kind(**self._env(), **fields)

    def adopt(self, event: RunEvent) -> RunEvent:
        """Another run's event (an agent step's, a chain's next provider's) as this run's next
        one: run id, `seq` and `elapsed_ms` are this run's, and the text it carries counts
        (`answer.delta` appends, `attempt.reset` voids)."""
        kind = type(event)
        if kind is AnswerDelta:
            self._answer.append(event.delta)  # type: ignore[union-attr]
        elif kind is AttemptResetEvent:
            self._answer.reset()
            self.finish_reason = None
        elif kind is AnswerDone:
            self.finish_reason = event.finish_reason  # type: ignore[union-attr]
        return msgspec.structs.replace(event, **self._env())

    def adopt_many(self, events: Sequence[RunEvent]) -> list[RunEvent]:
        """`adopt` for a batch that arrived together: stamped once, as `uni_many` does."""
        run_id = self.run_id
        elapsed = int((self._clock() - self._t0) * 1000)
        replace = msgspec.structs.replace
        answer = self._answer
        parts = answer.parts
        out: list[RunEvent] = []
        for event in events:
            kind = type(event)
            if kind is AnswerDelta:
                parts.append(event.delta)  # type: ignore[union-attr]
            elif kind is AttemptResetEvent or kind is AnswerDone:
                out.append(self.adopt(event))
                parts = answer.parts
                continue
            self._seq += 1
            out.append(replace(event, run_id=run_id, seq=self._seq, elapsed_ms=elapsed))
        answer.settle()  # a few long strings, not one per fragment
        return out

    def close(
        self,
        status: str,
        code: str,
        *,
        attempts: int,
        requests: int | None = None,
        retry_after: float | None = None,
    ) -> list[RunEvent]:
        """The closing events for a status and code the caller decided: `answer.done` over
        the text delivered since the last reset when `status` is `completed`, then
        `run.done` (`requests`, the HTTP requests sent, defaults to `attempts`)."""
        out: list[RunEvent] = []
        if status == "completed":
            answer = self._answer
            out.append(
                AnswerDone(
                    **self._env(),
                    sha256=answer.sha256,
                    chars=answer.chars,
                    finish_reason=self.finish_reason,
                )
            )
        retry_ms = int(retry_after * 1000) if retry_after is not None else None
        out.append(
            RunDone(
                **self._env(),
                status=status,  # type: ignore[arg-type]
                code=code,
                attempts=attempts,
                requests=attempts if requests is None else requests,
                retryable=retryable(code),
                retry_after_ms=retry_ms,
            )
        )
        self.done = True
        return out

    def finish(
        self,
        outcome: Outcome,
        error: BaseException | None,
        *,
        attempts: int,
        requests: int | None = None,
        retry_after: float | None = None,
        provider_finish: str | None = None,
        usage: UsageMetadata | None = None,
        cache_write: int | None = None,
        cost: Decimal | None = None,
    ) -> list[RunEvent]:
        """The closing events: `usage` when the reply reported some (with its `cache_write`
        tokens and `cost`), `answer.done` when a complete answer arrived, then `run.done`.

        `requests` (the HTTP requests sent) defaults to `attempts`. A reply cut by the length
        limit ends `error` / `provider_length` (`max_cost` when the run's money set the
        limit: `error` says so), keeping its partial text and without `answer.done`; so does
        one without visible text (`empty_response`).
        """
        out: list[RunEvent] = []
        if usage is not None:
            out.append(
                UsageEvent(
                    **self._env(),
                    cached_tokens=usage.cached_tokens,
                    prompt_tokens=usage.prompt_tokens,
                    thoughts_tokens=usage.thoughts_tokens,
                    response_tokens=usage.response_tokens,
                    cache_write_tokens=cache_write,
                    cost=cost,
                )
            )
        code = done_code(outcome, error, self.finish_reason)
        if outcome.succeeded:
            answer = self._answer
            if code == "completed":
                status = "completed"
                out.append(
                    AnswerDone(
                        **self._env(),
                        sha256=answer.sha256,
                        chars=answer.chars,
                        finish_reason=self.finish_reason,
                        filtered=filtered_stop(self.finish_reason, provider_finish),
                    )
                )
            else:  # cut at the token limit
                status = "error"
        elif outcome is Outcome.CANCELLED:
            status = "cancelled"
        else:
            status = "error"
        retry_ms = None
        if outcome is Outcome.RATE_LIMITED and retry_after is not None:
            retry_ms = int(retry_after * 1000)
        out.append(
            RunDone(
                **self._env(),
                status=status,  # type: ignore[arg-type]
                code=code,
                attempts=attempts,
                requests=attempts if requests is None else requests,
                retryable=retryable(code),
                retry_after_ms=retry_ms,
            )
        )
        self.done = True
        return out


@attrs.frozen
class Entry:
    """One logged run event: its seq, the event, and its JSON (encoded once for everyone): what a
    run log keeps and every wire encoder writes."""

    seq: int
    event: RunEvent
    data: bytes
