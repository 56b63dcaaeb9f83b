"""The agent loop on trio: model steps and tool runs until the model answers.

```
           ┌───────────── one run: one run id, one gapless seq ──────────────┐
request ─► │ step n: budget ─► turn (provider chain) ─► tool_call? ── no ──► answer
           │                                              │ yes               │
           │   tools run concurrently in the agent's nursery (approval first  │
           │   where a tool needs it) ─► results into the conversation ─► n+1 │
           └──────────────────────────────────────────────────────────────────┘
```

Each step is a turn streamed through the same pipeline as any other (deadlines, retries,
rescue, admission), its run events adopted into the agent's one stream (`_runstream`). The
loop ends when a step finishes other than `tool_call`, or after `max_steps` model requests.
"""

from __future__ import annotations

import functools
import inspect
import re
import secrets
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager, nullcontext
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Literal, TypedDict

import attrs
import msgspec
import trio
from rillet.transports.upstream._http import default_client

from .._core._budget import ContextBudget
from .._core._codes import error_code
from .._core._conversation import Conversation, PendingApproval
from .._core._deprecated import renamed
from .._core._dialect import Provider
from .._core._errors import ContextWindowExceeded, ToolCallArgumentParseError
from .._core._events import ToolCallDone, ToolResultDone, UniMessage
from .._core._request import TurnRequest
from .._core._runevents import (
    ApprovalRequired,
    ApprovalResolved,
    RunEventBuilder,
    StatusEvent,
    ToolCompleted,
    ToolStarted,
)
from .._turn._callbacks import FragmentSink
from .._turn._chain import CircuitOpen, chain_turn
from .._turn._handle import open_run
from .._turn._history import PlainLog
from .._turn._options import RunOptions
from .._turn._runstream import RunStream
from .._turn._telemetry import Telemetry, observe
from .._turn._turn import TurnResult
from ._handle import Agent, AgentResult, AgentStatus
from ._tools import Tool, ToolOutput, run_tool, tool

if TYPE_CHECKING:
    import httpx
    from typing_extensions import Unpack

    from .._core._cost import Prices
    from .._core._policy import Policy
    from .._core._runevents import RunEvent
    from .._core._upstream import Upstream
    from .._turn._admission import Admission
    from .._turn._breakers import CircuitBreakers
    from .._turn._graph import UniItem
    from .._turn._ratelimit import RateLimiter

__all__ = [
    "Agent",
    "AgentOptions",
    "AgentResult",
    "AgentStatus",
    "StepOptions",
    "open_agent",
    "run_agent",
]

Validator = Callable[[str], "str | Awaitable[str | None] | None"]
_GRACE = 2.0  # seconds a cancelled agent still gives its last events
_CANCELLED_TEXT = "error: the call was cancelled before it finished"
_SAFE_CODE = re.compile(r"[a-z][a-z0-9_]{0,63}")


@attrs.define(eq=False)
class _Loop:
    """One run's state and the steps that change it."""

    agent: Agent
    stream: RunStream
    providers: list[Provider]
    tools: dict[str, Tool]
    template: TurnRequest
    options: RunOptions
    max_steps: int
    approvals: Literal["ask", "defer"]
    decisions: Mapping[str, bool]
    budget: ContextBudget | None
    buffered: bool
    validator: Validator | None
    max_candidates: int
    tool_arguments: bool
    tool_results: bool
    thread_limiter: trio.CapacityLimiter | None
    reset_tool_choice: bool = True
    after_resume: list[UniMessage] = attrs.field(factory=list)
    unparsed: dict[str, str] = attrs.field(factory=dict)  # call id: what the model is told
    status: AgentStatus = "cancelled"
    code: str = "cancelled"
    error: BaseException | None = None
    steps: int = 0
    turns: list[TurnResult] = attrs.field(factory=list)
    outputs: list[ToolOutput] = attrs.field(factory=list)
    text: str = ""
    message: UniMessage = attrs.field(
        factory=lambda: UniMessage(role="assistant", content_items=[])
    )

    @property
    def builder(self) -> RunEventBuilder:
        return self.stream.builder

    def end(self, status: AgentStatus, code: str, error: BaseException | None = None) -> None:
        self.status, self.code, self.error = status, code, error

    async def emit(self, kind: type[Any], **fields: Any) -> None:
        await self.stream.emit([self.builder.event(kind, **fields)])

    async def run(self) -> None:
        conversation = self.agent.conversation
        if conversation.pending:
            if not await self._resume():
                return
            self._tool_called()  # the run that deferred them called tools
            conversation.messages.extend(self.after_resume)  # the new turn follows the results
        candidates = 0
        while True:
            if self.steps >= self.max_steps:
                return self.end("error", "max_steps")
            self.steps += 1
            step = self.steps
            request = conversation.request(self.template)
            if self.budget is not None:
                try:
                    request = self.budget.fit(request)
                except ContextWindowExceeded as exc:
                    return self.end("error", exc.code, exc)
            await self.emit(StatusEvent, phase="step", attempt=1, step=step)
            try:
                chained = await chain_turn(
                    self.stream,
                    request,
                    self.providers,
                    run_id=f"{self.agent.run_id}.{step}",
                    hold_text=self.buffered,
                    step=step,
                    options=self._step_options(),
                )
            except CircuitOpen as exc:
                return self.end("error", "circuit_open", exc)
            result = chained.result
            self.turns.append(result)
            message = result.message
            self.message, self.text = message, result.text
            done = chained.sink.done
            if done is None or done.status != "completed":
                repaired = self._unparsed(result)
                if repaired is None:
                    status: Any = done.status if done is not None else "error"
                    code = done.code if done is not None else error_code(result.error)
                    return self.end(status, code, result.error)
                self.message = message = repaired
            calls = [i for i in message.content_items if type(i) is ToolCallDone]
            if calls and message.finish_reason == "tool_call":
                if step >= self.max_steps:
                    return self.end("error", "max_steps")
                if self.buffered:  # no answer candidate: its MMSP stream, not its text
                    await chained.sink.release(text=False)
                conversation.record(message)
                self._tool_called()
                if not await self._tools(step, calls):
                    return
                continue
            if self.buffered:
                reason = await self._validate(result.text)
                if reason is not None:
                    candidates += 1
                    await self.emit(
                        StatusEvent,
                        phase="candidate_rejected",
                        attempt=candidates,
                        step=step,
                        reason_code=reason,
                    )
                    if candidates >= self.max_candidates:
                        return self.end("error", "answer_rejected")
                    continue
                await chained.sink.release()
            conversation.record(result.message)
            return self.end("completed", "completed")

    def _step_options(self) -> RunOptions:
        """The options of the next step: with a `max_cost`, what the steps so far left of it
        (a step whose cost is unknown, its usage unreported, counts nothing)."""
        limit = self.options.max_cost
        if limit is None:
            return self.options
        spent = sum((t.charge for t in self.turns if t.charge is not None), Decimal(0))
        return self.options.replace(max_cost=max(limit - spent, Decimal(0)))

    def _tool_called(self) -> None:
        """A step called tools: a choice that forces a call (`required`, or names to pick
        from) is not sent again, so a model that obeys it can answer instead of calling tools
        until `max_steps`."""
        choice = self.template.tool_choice
        if self.reset_tool_choice and (choice == "required" or isinstance(choice, list)):
            self.template = msgspec.structs.replace(self.template, tool_choice="auto")

    def _unparsed(self, result: TurnResult) -> UniMessage | None:
        """For a step the stream ended at a call whose arguments are not a JSON object: the
        message with that call in it (no arguments), its result telling the model what was
        wrong, as for arguments that do not fit; None for any other failure."""
        error = result.error
        if not isinstance(error, ToolCallArgumentParseError):
            return None
        call = ToolCallDone(name=error.tool_name, arguments={}, tool_call_id=error.tool_call_id)
        preview = error.raw_arguments_preview
        self.unparsed[call.tool_call_id] = (
            f"error: invalid arguments: not a JSON object: {preview!r}"
        )
        items = [*result.message.content_items, call]
        return msgspec.structs.replace(
            result.message, content_items=items, finish_reason="tool_call"
        )

    async def _validate(self, text: str) -> str | None:
        if self.validator is None:
            return None
        verdict = self.validator(text)
        if inspect.isawaitable(verdict):
            verdict = await verdict
        if verdict is None:
            return None
        reason = str(verdict)
        return reason if _SAFE_CODE.fullmatch(reason) else "rejected"

    async def _resume(self) -> bool:
        """Answer the approvals a deferred run left; False if some are still pending."""
        conversation = self.agent.conversation
        pending, conversation.pending = conversation.pending, []
        calls = [p.tool_call for p in pending]
        ids = {p.tool_call.tool_call_id: p.approval_id for p in pending}
        return await self._tools(max((p.step for p in pending), default=0), calls, ids)

    async def _tools(
        self, step: int, calls: list[ToolCallDone], approval_ids: Mapping[str, str] | None = None
    ) -> bool:
        """Run one step's tool calls concurrently; True when every result is in the
        conversation, False when some wait for a deferred approval."""
        conversation = self.agent.conversation
        results: list[ToolResultDone] = []
        deferred: list[PendingApproval] = []
        try:
            async with trio.open_nursery() as nursery:
                for number, call in enumerate(calls, 1):
                    approval = (approval_ids or {}).get(call.tool_call_id)
                    nursery.start_soon(self._one, step, number, call, approval, results, deferred)
        except BaseException:  # cancelled mid-step: a call without its result breaks the history
            unanswered = Counter(call.tool_call_id for call in calls)
            unanswered.subtract(result.tool_call_id for result in results)
            for call in calls:
                if unanswered[call.tool_call_id] > 0:
                    unanswered[call.tool_call_id] -= 1
                    output = ToolOutput(call, _CANCELLED_TEXT, "cancelled", "cancelled")
                    self.outputs.append(output)
                    results.append(output.item)
            conversation.pending = []
            conversation.add_tool_results([*conversation.results, *results])
            conversation.results = []
            raise
        if deferred:
            conversation.pending = deferred
            conversation.results.extend(results)
            self.end("approval_required", "approval_required")
            return False
        conversation.add_tool_results([*conversation.results, *results])
        conversation.results = []
        return True

    async def _one(
        self,
        step: int,
        number: int,
        call: ToolCallDone,
        approval_id: str | None,
        results: list[ToolResultDone],
        deferred: list[PendingApproval],
    ) -> None:
        found = self.tools.get(call.name)
        unparsed = self.unparsed.pop(call.tool_call_id, None)
        if unparsed is None and found is not None and found.needs_approval:
            approval_id = approval_id or f"apr_{secrets.token_hex(6)}"
            pending = PendingApproval(approval_id=approval_id, tool_call=call, step=step)
            decision = self.decisions.get(approval_id)
            reason = ""
            if decision is None:
                if self.approvals == "defer":
                    deferred.append(pending)
                else:  # answerable from the moment a host can see the event
                    self.agent.expect(pending)
                try:
                    await self.emit(
                        ApprovalRequired,
                        approval_id=approval_id,
                        name=call.name,
                        tool_call_id=call.tool_call_id,
                        step=step,
                        arguments=call.arguments if self.tool_arguments else None,
                    )
                    if self.approvals == "defer":
                        return
                    decision, reason = await self.agent.wait_answered(approval_id)
                finally:
                    self.agent.forget(approval_id)
            await self.emit(
                ApprovalResolved,
                approval_id=approval_id,
                decision="approved" if decision else "denied",
            )
            if not decision:
                text = f"denied: the user did not allow this call{': ' + reason if reason else ''}"
                output = ToolOutput(call, text, "denied", "denied")
                self.outputs.append(output)
                results.append(output.item)
                return
        span = f"tool:{step}.{number}"
        await self.emit(
            ToolStarted,
            span_id=span,
            name=call.name,
            tool_call_id=call.tool_call_id,
            step=step,
            arguments=call.arguments if self.tool_arguments else None,
        )
        start = trio.current_time()
        try:
            if unparsed is not None:  # nothing to run: the model reads what was wrong
                output = ToolOutput(call, unparsed, "error", "tool_arguments_invalid")
            else:
                output = await run_tool(found, call, thread_limiter=self.thread_limiter)
        except BaseException as exc:
            if not _is_cancel(exc):
                raise
            with trio.CancelScope(shield=True), trio.move_on_after(_GRACE):
                await self.emit(
                    ToolCompleted,
                    span_id=span,
                    name=call.name,
                    tool_call_id=call.tool_call_id,
                    step=step,
                    duration_ms=int((trio.current_time() - start) * 1000),
                    status="cancelled",
                    reason_code="cancelled",
                )
            raise
        self.outputs.append(output)
        results.append(output.item)
        await self.emit(
            ToolCompleted,
            span_id=span,
            name=call.name,
            tool_call_id=call.tool_call_id,
            step=step,
            duration_ms=int(output.duration * 1000),
            status=output.status,
            reason_code=output.reason_code,
            result=output.text if self.tool_results else None,
        )


class StepOptions(TypedDict, total=False):
    """The `run_turn` keywords `run_agent` takes as they are and passes on to every step
    (with `client`, `reasoning`, `tool_arguments`, `breakers` and `chain_on_permanent`, which
    say something of the agent's own stream too)."""

    policy: Policy | None
    upstream: Upstream | None
    limiter: RateLimiter | None
    admission: Admission | None
    stream: bool
    on_text: Callable[[str], object] | None
    on_thinking: Callable[[str], object] | None
    on_reset: Callable[[int], object] | None


class AgentOptions(StepOptions, total=False):
    """`run_agent`'s keyword options, as `open_agent` takes them."""

    options: RunOptions | None
    tools: Sequence[Tool | Callable[..., Any]]
    conversation: Conversation | None
    max_steps: int
    approvals: Literal["ask", "defer"]
    decisions: Mapping[str, bool] | None
    delivery: Literal["streaming", "buffered"] | None
    validator: Validator | None
    max_candidates: int
    budget: ContextBudget | None
    sinks: Sequence[Any]
    client: httpx.AsyncClient | None
    run_id: str | None
    reasoning: bool
    tool_arguments: bool
    tool_results: bool
    breakers: CircuitBreakers | None
    chain_on_permanent: bool
    telemetry: Telemetry | None
    prices: Prices | None
    max_cost: Decimal | None
    fallback_on_permanent: bool | None  # chain_on_permanent's old name, for one release
    thread_limiter: trio.CapacityLimiter | None
    reset_tool_choice: bool


def _is_cancel(exc: BaseException) -> bool:
    """A trio cancel, bare or all a group holds (a tool's own nursery wraps it so)."""
    if isinstance(exc, BaseExceptionGroup):
        return exc.split(trio.Cancelled)[1] is None
    return isinstance(exc, trio.Cancelled)


def _as_tool(value: Tool | Callable[..., Any]) -> Tool:
    return value if isinstance(value, Tool) else tool(value)


async def run_agent(
    request: TurnRequest,
    provider: Provider | Sequence[Provider],
    *,
    tools: Sequence[Tool | Callable[..., Any]] = (),
    conversation: Conversation | None = None,
    max_steps: int = 8,
    approvals: Literal["ask", "defer"] = "ask",
    decisions: Mapping[str, bool] | None = None,
    delivery: Literal["streaming", "buffered"] | None = None,
    validator: Validator | None = None,
    max_candidates: int = 3,
    budget: ContextBudget | None = None,
    sinks: Sequence[Any] = (),
    client: httpx.AsyncClient | None = None,
    run_id: str | None = None,
    reasoning: bool = False,
    tool_arguments: bool = False,
    tool_results: bool = False,
    breakers: CircuitBreakers | None = None,
    chain_on_permanent: bool = False,
    telemetry: Telemetry | None = None,
    prices: Prices | None = None,
    max_cost: Decimal | None = None,
    fallback_on_permanent: bool | None = None,
    thread_limiter: trio.CapacityLimiter | None = None,
    reset_tool_choice: bool = True,
    options: RunOptions | None = None,
    policy: Policy | None = None,
    upstream: Upstream | None = None,
    limiter: RateLimiter | None = None,
    admission: Admission | None = None,
    stream: bool = True,
    on_text: Callable[[str], object] | None = None,
    on_thinking: Callable[[str], object] | None = None,
    on_reset: Callable[[int], object] | None = None,
    task_status: trio.TaskStatus[Agent] = trio.TASK_STATUS_IGNORED,
) -> AgentResult:
    """Run an agent to its end: model steps, tool runs, until the model answers.

    `request` holds the new messages (appended to `conversation`, a new one by default) and
    the generation settings; `tools` are `Tool`s or plain functions (made tools with `tool`).
    `provider` may be a chain (`chain_on_permanent` as for `run_turn`; `fallback_on_permanent`,
    its old name, is still taken for one release and warns once). Use
    `agent = await nursery.start(run_agent, ...)` for the `Agent` handle (events, approvals,
    result), or `open_agent`.

    Approvals: `ask` waits for `agent.approve(id)` / `agent.deny(id, reason)`; `defer` ends
    the run `approval_required` with the calls in `result.pending` (answer them in a later
    run with `decisions`; its new messages follow those calls' results, and with approvals
    deferred a new message before every pending call has a decision is a `ValueError`).
    Delivery: `streaming` (the default without a validator) sends the answer as it comes;
    `buffered` (the default with one, and the only mode a validator takes) holds it until
    `validator(text)` returns None (a safe code rejects it, and the model is asked again, at
    most `max_candidates` times). `budget` fits each request to the model's context window.
    `tool_arguments` / `tool_results` opt the public stream into a tool's arguments and result
    text. A `tool_choice` that forces a call (`required`, or names) holds until a step calls a
    tool; later steps send `auto`, so a model that obeys it can still answer
    (`reset_tool_choice=False` keeps it on every step). `options` (a `RunOptions`) or the
    keywords that are its fields (`client`, `reasoning`, `tool_arguments`, `breakers`,
    `chain_on_permanent`, `policy`, `upstream`, `limiter`, `admission`, `stream`,
    `telemetry`, `prices`; one or the other) go to every step, as `run_turn` takes them;
    `max_cost` is the whole run's, each step's request capped at what is left. The agent keeps
    its own history, so `history` does not apply. `on_text`, `on_thinking` and `on_reset` are
    called as `run_turn` calls them, for every step's text the public stream shows.
    """
    if fallback_on_permanent is not None:
        renamed("run_agent(fallback_on_permanent=...)", "run_agent(chain_on_permanent=...)")
        chain_on_permanent = fallback_on_permanent
    opts = RunOptions.merged(
        options,
        {
            "client": client,
            "reasoning": reasoning,
            "tool_arguments": tool_arguments,
            "breakers": breakers,
            "chain_on_permanent": chain_on_permanent,
            "telemetry": telemetry,
            "prices": prices,
            "max_cost": max_cost,
            "policy": policy,
            "upstream": upstream,
            "limiter": limiter,
            "admission": admission,
            "stream": stream,
        },
    )
    reasoning, tool_arguments = opts.reasoning, opts.tool_arguments
    if max_steps < 1:
        raise ValueError("max_steps must be at least 1")
    if delivery is None:
        delivery = "buffered" if validator is not None else "streaming"
    elif validator is not None and delivery != "buffered":
        raise ValueError("a validator needs delivery='buffered': streaming would bypass it")
    providers = [provider] if isinstance(provider, Provider) else list(provider)
    if not providers:
        raise ValueError("run_agent needs at least one provider")
    made = [_as_tool(t) for t in tools]
    found = {t.name: t for t in made}
    if len(found) < len(made):
        twice = sorted({t.name for t in made if sum(u.name == t.name for u in made) > 1})
        raise ValueError(f"two tools share a name: {', '.join(map(repr, twice))}")
    conv = conversation if conversation is not None else Conversation()
    owed = [p for p in conv.pending if p.approval_id not in (decisions or {})]
    if request.messages and owed and approvals == "defer":
        raise ValueError(
            "the conversation's pending approvals need decisions before a new message: "
            + ", ".join(p.approval_id for p in owed)
        )
    if conv.system_prompt is None:
        conv.system_prompt = request.system_prompt
    if not conv.pending:
        conv.messages.extend(request.messages)
    given = {t.name for t in request.tools}
    specs = [t.spec for t in found.values() if t.name not in given]
    template = msgspec.structs.replace(request, messages=[], tools=[*request.tools, *specs])
    run_log: PlainLog[RunEvent] = PlainLog()
    uni_log: PlainLog[UniItem] = PlainLog()
    scope = trio.CancelScope()
    agent = Agent(
        run_id or secrets.token_hex(8), conv, uni=uni_log, run=run_log, cancel_scope=scope
    )
    builder = RunEventBuilder(
        agent.run_id, trio.current_time, reasoning=reasoning, tool_arguments=tool_arguments
    )
    if on_text is not None or on_thinking is not None or on_reset is not None:
        sinks = [*sinks, FragmentSink(on_text, on_thinking, on_reset)]
    # an `invoke_agent` span holding its steps' turns and a span per tool run
    observer = observe(opts.telemetry, providers[0], "invoke_agent", turn=False)
    if observer is not None:
        sinks = [*sinks, observer]
    run_stream = RunStream(builder, sinks, run_log, uni_log)
    own: httpx.AsyncClient | None = None  # one client for every step
    if opts.client is None and opts.upstream is None:
        own = default_client()
        opts = opts.replace(client=own)
    loop = _Loop(
        agent=agent,
        stream=run_stream,
        providers=providers,
        tools=found,
        template=template,
        options=opts,
        max_steps=max_steps,
        approvals=approvals,
        decisions=decisions or {},
        budget=budget,
        buffered=delivery == "buffered",
        validator=validator,
        max_candidates=max_candidates,
        tool_arguments=tool_arguments,
        tool_results=tool_results,
        thread_limiter=thread_limiter,
        reset_tool_choice=reset_tool_choice,
        after_resume=list(request.messages) if conv.pending else [],
    )
    try:
        with scope:
            await run_stream.emit([builder.started(providers[0].label, providers[0].model)])
            task_status.started(agent)
            try:
                with observer.current() if observer is not None else nullcontext():
                    await loop.run()
            except Exception as exc:  # a sink's or a tool runner's own failure: not a cancel
                loop.end("error", "internal_error", exc)
                raise
    finally:
        last = loop.turns[-1] if loop.turns else None
        result = AgentResult(
            status=loop.status,
            code=loop.code,
            text=loop.text,
            message=loop.message,
            steps=loop.steps,
            turns=loop.turns,
            tool_outputs=loop.outputs,
            pending=list(conv.pending),
            conversation=conv,
            provider=last.provider if last is not None else None,
            error=loop.error,
        )
        agent.finish(result)
        try:
            # every turn's own count, a step's cancelled before its result came back included
            attempts, requests = run_stream.attempts, run_stream.requests
            await run_stream.finish(
                builder.close(loop.status, loop.code, attempts=attempts, requests=requests),
                cancelled=loop.status == "cancelled" or loop.code == "internal_error",
            )
        finally:
            if own is not None:
                with trio.CancelScope(shield=True), trio.move_on_after(_GRACE):
                    await own.aclose()
    return result


@asynccontextmanager
async def open_agent(
    request: TurnRequest,
    provider: Provider | Sequence[Provider],
    **options: Unpack[AgentOptions],
) -> AsyncIterator[Agent]:
    """Run an agent for the duration of the block; leaving the block cancels it if it is
    still running. Takes `run_agent`'s keyword options (`AgentOptions`)."""
    async with open_run(functools.partial(run_agent, request, provider, **options)) as agent:
        yield agent
