"""`rillet run --tools ...`: the agent loop on the command line.

The answer streams to stdout as for a plain turn; each tool's run is one line on stderr in
text mode (`⚙ get_weather(city="Paris") … done 0.1 s`). A tool that needs approval asks on
the terminal (`y/N` on stderr, the answer read from the terminal); with no one to ask (stdin
is not a terminal, or `--no-input`) the approval is deferred and the run ends with `run.done`
status `approval_required`, which the command line exits 3 for.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import signal
import sys
from typing import TYPE_CHECKING, Any

import attrs
import trio

from .._core._explain import filtered_line
from .._core._runevents import (
    ApprovalRequired,
    ApprovalResolved,
    RunDone,
    StatusEvent,
    ToolCallReady,
    ToolCompleted,
    ToolStarted,
)
from .._turn._turn import SinkBatch
from ._stdout import cancel_when_gone

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from .._agent._loop import Agent, AgentResult
    from .._agent._tools import Tool
    from .._core._dialect import Provider
    from .._core._request import TurnRequest

__all__ = [
    "AgentTerminal",
    "agent_outcome",
    "answer_approvals",
    "ask_on_tty",
    "call_signature",
    "end_question",
    "parse_chain",
    "run_agent_cli",
]

_UNSHOWN = ("error", "approval_required")  # run.done statuses the command line words itself


def call_signature(name: str, arguments: dict[str, Any] | None) -> str:
    """A tool call as a person reads it: `get_weather(city="Paris")`."""
    if not arguments:
        return f"{name}()"
    shown = ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in arguments.items())
    return f"{name}({shown})"


@attrs.define(eq=False)
class AgentTerminal:
    """A terminal sink for an agent run: the agent's own events in words on stderr (each
    tool's run, one line once it ends), the terminal's lines for the rest, minus the `run.done`
    lines the command line words itself and the `step` status (a new step is not news)."""

    sink: Any
    err: Any = None  # where the tool lines go; None: the current sys.stderr
    _started: dict[str, ToolStarted] = attrs.field(factory=dict)
    _arguments: dict[str, dict[str, Any] | None] = attrs.field(factory=dict)  # by call id
    _asked: dict[str, ApprovalRequired] = attrs.field(factory=dict)  # by approval id

    @property
    def broken_pipe(self) -> bool:
        """Whether stdout's reader went away."""
        return bool(getattr(self.sink, "broken_pipe", False))

    async def deliver(self, batch: SinkBatch) -> None:
        """Pass the terminal its events; word the tools' runs."""
        kept: list[Any] = []
        for event in batch.run:
            kind = type(event)
            if kind is ToolCallReady:
                assert isinstance(event, ToolCallReady)
                self._arguments[event.tool_call_id] = event.arguments
            elif kind is ApprovalRequired:
                assert isinstance(event, ApprovalRequired)
                self._asked[event.approval_id] = event
            elif kind is ApprovalResolved:
                assert isinstance(event, ApprovalResolved)
                asked = self._asked.pop(event.approval_id, None)
                if asked is not None and event.decision == "denied":
                    await self._flush(kept, batch)
                    arguments = self._arguments.get(asked.tool_call_id)
                    self._write(f"⚙ {call_signature(asked.name, arguments)} … denied")
            if kind is ToolStarted:
                assert isinstance(event, ToolStarted)
                self._started[event.span_id] = event
            elif kind is ToolCompleted:
                assert isinstance(event, ToolCompleted)
                await self._flush(kept, batch)
                self._tool_line(event)
            elif (kind is StatusEvent and event.phase == "step") or (  # type: ignore[union-attr]
                kind is RunDone and event.status in _UNSHOWN  # type: ignore[union-attr]
            ):
                continue
            else:
                kept.append(event)
        await self._flush(kept, batch)

    async def _flush(self, kept: list[Any], batch: SinkBatch) -> None:
        if kept:
            await self.sink.deliver(SinkBatch(list(kept), batch.uni))
            kept.clear()

    def _tool_line(self, done: ToolCompleted) -> None:
        started = self._started.pop(done.span_id, None)
        arguments = started.arguments if started is not None else None
        outcome = {
            "ok": "done",
            "error": f"failed ({done.reason_code or 'error'})",
            "denied": "denied",
            "cancelled": "cancelled",
        }[done.status]
        seconds = done.duration_ms / 1000
        self._write(f"⚙ {call_signature(done.name, arguments)} … {outcome} {seconds:.1f} s")

    def _write(self, line: str) -> None:
        """One line on stderr (what its encoding cannot show replaced); a closed stderr is
        silently skipped."""
        err = self.err if self.err is not None else sys.stderr
        encoding = getattr(err, "encoding", None) or "utf-8"
        line = line.encode(encoding, "replace").decode(encoding)
        note = getattr(self.sink, "note", None)
        if self.err is None and note is not None:  # the terminal's: after its spinner is gone
            note(line)
            return
        try:
            err.write(line + "\n")
            err.flush()
        except (BrokenPipeError, ValueError):
            pass

    async def close(self) -> None:
        """Close the terminal sink."""
        await self.sink.close()


_asking = [False]  # a y/N question waits on stderr's last line for its answer


async def ask_on_tty(question: str) -> bool:
    """Ask a yes/no question on the terminal: the question on stderr, the answer read from
    the terminal itself (not stdin, which may be the prompt). No answer means no."""

    def ask() -> str:
        sys.stderr.write(question)
        sys.stderr.flush()
        try:
            with open("/dev/tty", encoding="utf-8", errors="replace") as tty:
                return tty.readline()
        except OSError:
            return ""
        finally:
            _asking[0] = False

    _asking[0] = True
    try:
        answer = await trio.to_thread.run_sync(ask, abandon_on_cancel=True)
    finally:
        end_question()
    return answer.strip().lower() in ("y", "yes")


def end_question() -> None:
    """Close the line of a question still waiting for its answer (Ctrl-C came instead), so
    what follows starts a line of its own rather than `^Ccancelled` after the question."""
    if _asking[0]:
        _asking[0] = False
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.write("\n")
            sys.stderr.flush()


async def answer_approvals(agent: Agent, ask: Callable[[str], Any]) -> None:
    """Ask about each approval the run waits for, one at a time, as they come: `ask(question)`
    returns (or awaits to) whether to let the call run."""
    async for event in agent.run_events():
        if type(event) is not ApprovalRequired:
            continue
        assert isinstance(event, ApprovalRequired)
        waiting = [p for p in agent.pending_approvals if p.approval_id == event.approval_id]
        if not waiting:
            continue
        shown = call_signature(event.name, waiting[0].tool_call.arguments)
        allowed = ask(f"rillet: {shown} needs your approval — run it? [y/N] ")
        if inspect.isawaitable(allowed):
            allowed = await allowed
        with contextlib.suppress(ValueError):  # the run may have ended meanwhile
            if allowed:
                agent.approve(event.approval_id)
            else:
                agent.deny(event.approval_id, "the user said no")


async def run_agent_cli(
    request: TurnRequest,
    providers: Sequence[Provider],
    tools: Sequence[Tool],
    sinks: Sequence[Any],
    *,
    interactive: bool,
    max_steps: int,
    ask: Callable[[str], Any] = ask_on_tty,
    **options: Any,
) -> AgentResult:
    """Run the agent; Ctrl-C cancels it (the sinks still get `run.done`). Interactive, each
    approval is asked with `ask`; otherwise approvals are deferred."""
    from .._agent._loop import run_agent

    async with trio.open_nursery() as nursery:
        agent: Agent = await nursery.start(
            lambda task_status: run_agent(
                request,
                list(providers),
                tools=tools,
                sinks=sinks,
                max_steps=max_steps,
                approvals="ask" if interactive else "defer",
                task_status=task_status,
                **options,
            )
        )

        async def on_sigint() -> None:
            with trio.open_signal_receiver(signal.SIGINT) as signals:
                async for _ in signals:
                    end_question()
                    agent.cancel()
                    return

        nursery.start_soon(on_sigint)
        nursery.start_soon(cancel_when_gone, sinks, agent.cancel)
        if interactive:
            nursery.start_soon(answer_approvals, agent, ask)
        result = await agent.result()
        nursery.cancel_scope.cancel()
    return result


def parse_chain(spec: str | None) -> list[tuple[str, str | None]]:
    """`--fallback PROVIDER[:MODEL],...` as (provider, model) pairs. A URL keeps its port:
    `http://host:8000/v1:model` names the model after the last colon. `ValueError` for a
    list that names no provider."""
    pairs: list[tuple[str, str | None]] = []
    for raw in (spec or "").split(","):
        item = raw.strip()
        if not item:
            continue
        kind, model = item, None
        if item.lower().startswith(("http://", "https://")):
            head, _, tail = item.rpartition(":")
            if tail and "/" not in tail and not tail.isdigit() and "//" in head:
                kind, model = head, tail
        elif ":" in item:
            kind, _, rest = item.partition(":")
            model = rest or None
        pairs.append((kind, model))
    return pairs


def agent_outcome(result: AgentResult) -> tuple[int | None, str]:
    """The exit code and the line on stderr for how an agent run ended; None for an error
    the caller words from the failed turn (its cause and what to do)."""
    from ._exits import EXIT_APPROVAL, EXIT_CANCELLED, EXIT_ERROR, EXIT_OK

    if result.status == "approval_required":
        names = ", ".join(sorted({p.tool_call.name for p in result.pending}))
        return EXIT_APPROVAL, (
            f"{names} needs approval and there is no one to ask (stdin is not a terminal, "
            "or --no-input) — run it on a terminal to answer y/N"
        )
    if result.status == "cancelled":
        return EXIT_CANCELLED, ""
    if result.status == "completed":
        if result.message.finish_reason == "length":
            return EXIT_ERROR, "the answer was cut off at the token limit — raise --max-tokens"
        last = result.turns[-1] if result.turns else None
        if last is not None and last.filtered:
            return EXIT_ERROR, filtered_line(last.provider_finish_reason)
        return EXIT_OK, ""
    if result.code == "max_steps":
        return EXIT_ERROR, (
            f"the agent made {result.steps} model requests without an answer (max steps) — "
            "raise --max-steps"
        )
    last = result.turns[-1] if result.turns else None
    if last is not None and not last.ok:
        return None, ""
    return EXIT_ERROR, f"the agent run failed ({result.code})"
