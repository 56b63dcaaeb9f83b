"""The agent's tool lines on a terminal whose spinner is up: the spinner is cleared before a
tool's line, so no frame (`⠸ waiting 1.0 s`) is left in front of it."""

from __future__ import annotations

import io

import trio
from rillet import SinkBatch
from rillet._cli._agent import AgentTerminal
from rillet._core._runevents import RunEventBuilder, ToolCompleted, ToolStarted
from rillet.transports.sinks import TerminalSink

CLEAR = "\r\x1b[K"


class _Terminal(io.StringIO):
    """A stderr that says it is a terminal (so the spinner draws), recording what it got."""

    def isatty(self) -> bool:
        return True


async def test_a_tool_line_follows_a_cleared_spinner_not_its_frame() -> None:
    err = _Terminal()
    terminal = TerminalSink(out=io.StringIO(), err=err, spinner=True)
    events = RunEventBuilder("run", trio.current_time)
    await terminal.deliver(SinkBatch([events.started("provider", "model")], []))
    assert "waiting" in err.getvalue()  # the spinner is up, on stderr's last line
    call = {"tool_call_id": "call-1", "step": 1, "name": "get_weather", "span_id": "s"}
    started = events.event(ToolStarted, arguments={"city": "Paris"}, **call)
    completed = events.event(ToolCompleted, duration_ms=20, **call)
    await AgentTerminal(terminal).deliver(SinkBatch([started, completed], []))
    shown = err.getvalue()
    line = '⚙ get_weather(city="Paris") … done 0.0 s\n'
    assert shown.endswith(line)
    before = shown[: -len(line)]
    assert before.endswith(CLEAR)  # the spinner's frame is erased, not left in front
