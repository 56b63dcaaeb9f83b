"""A turn as an MCP tool: `turn_server(provider)` is an MCP server (the `mcp` SDK's
`MCPServer`) with one tool that runs a turn and answers its text.

Progress: when the caller's request carries a progress token, every run event of the turn goes
out as a standard `notifications/progress` (`progress` is the event's `seq`, which only grows;
`message` the answer text of an `answer.delta`, else the event's type). A caller that also puts
`"dev.rillet/run_events": true` in the request's `_meta` gets the run event itself in each
notification's `_meta` under `"dev.rillet/run_event"`, beside `"dev.rillet/correlation_id"`
(the caller's own id from the request's `_meta`, else the run's id), so one client can tell
the runs it has in flight apart; the tool's result then names the last `seq` in its `_meta`.
Every notification repeats the progress token: a token over 200 characters (or digits) gets none
(the call still answers), so a request cannot make its answer hundreds of times its own size.

Cancellation is the protocol's: `notifications/cancelled` for the request cancels the tool's
task and so the turn, whose provider response is closed. A transport that merely goes away
cancels nothing on its own (on a handshake-era streamable HTTP session the turn runs to its
end); on a 2026-07-28 single-exchange HTTP request, closing the response stream is how that
protocol cancels, and the SDK cancels the tool then.

Sessions over streamable HTTP: an idle session pins `SESSION_BYTES` until the client deletes it
or it times out, and the SDK's defaults (10,000 sessions, 30 minutes idle) let one client hold
over 300 MiB. `turn_server` sizes the limit from a memory budget instead (an eighth of a
server's, `MEMORY_BUDGET`, so 910 sessions) and ends sessions idle for 5 minutes; past the
limit, a new session is refused (503, "Too many open sessions") until one ends. Both are
arguments of `turn_server`, and `streamable_http_app` / `run(transport="streamable-http")`
still take the SDK's own arguments, which win.

The tool runs on whatever the SDK runs on: under trio (`anyio.run(..., backend="trio")`, the
stdio entry point here) the turn runs in the tool's own task; under asyncio (uvicorn serving
`streamable_http_app()`) it runs in the loop's trio guest run (`rillet.asyncio`).
"""

from __future__ import annotations

import argparse
import secrets
from typing import TYPE_CHECKING, Any

import anyio
import msgspec
from mcp.server.mcpserver import Context, MCPServer
from mcp_types import (
    CallToolResult,
    ProgressNotification,
    ProgressNotificationParams,
    TextContent,
)

from .._core._events import encode_json
from .._core._request import TurnRequest, user
from .._core._runevents import AnswerDelta, RunDone, RunEvent
from .._hub._hub import MEMORY_BUDGET
from .._turn._api import open_turn
from .._turn._guest import in_trio

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Sequence

    from starlette.applications import Starlette

    from .._core._dialect import Provider
    from .._turn._turn import TurnResult

__all__ = [
    "CORRELATION_ID_KEY",
    "LAST_SEQ_KEY",
    "RUN_EVENTS_KEY",
    "RUN_EVENT_KEY",
    "SESSION_BYTES",
    "TurnServer",
    "main",
    "turn_server",
]

RUN_EVENTS_KEY = "dev.rillet/run_events"
"""Request `_meta` key: `true` opts into the run events in the progress notifications."""
RUN_EVENT_KEY = "dev.rillet/run_event"
"""Progress notification `_meta` key: the run event, as its JSON object."""
CORRELATION_ID_KEY = "dev.rillet/correlation_id"
"""Request, notification and result `_meta` key: which call the run events belong to."""
LAST_SEQ_KEY = "dev.rillet/last_seq"
"""Result `_meta` key: the `seq` of the run's last event (its `run.done`)."""

SESSION_BYTES = 36 * 1024
"""What one idle streamable HTTP session holds on the server, measured (`python -m
bench.mcp_sessions`: 35.3 KiB): the session limit is a memory budget divided by it."""
_SESSIONS_SHARE = 8  # the MCP server's sessions may take an eighth of the memory budget
_SESSION_IDLE_TIMEOUT = 300.0  # seconds: as long as a server keeps a finished run

_MAX_CORRELATION_ID = 200  # characters; a longer id from a caller is replaced by the run's id
# characters; every notification repeats the token, so a longer one would make the answer
# hundreds of times the request: such a call runs without progress notifications
_MAX_PROGRESS_TOKEN = 200
_DESCRIPTION = (
    "Ask the model: runs one turn with the prompt (and an optional system prompt) and answers "
    "the reply's text. Streams progress while it runs."
)


class TurnServer(MCPServer):
    """The SDK's `MCPServer` with session limits of its own over streamable HTTP:
    `streamable_http_app()` and `run_streamable_http_async()` open at most `max_sessions`
    sessions and end those idle for `session_idle_timeout` seconds, unless told otherwise
    (the SDK's arguments of the same names win)."""

    def __init__(
        self, name: str, *, max_sessions: int | None, session_idle_timeout: float | None
    ) -> None:
        # the SDK configures the root logger when none is (basicConfig): at WARNING, so a
        # stdio server's stderr does not carry a line per provider request
        super().__init__(name, log_level="WARNING")
        self.max_sessions = max_sessions
        self.session_idle_timeout = session_idle_timeout

    def _limits(self, options: dict[str, Any]) -> dict[str, Any]:
        options.setdefault("max_sessions", self.max_sessions)
        options.setdefault("session_idle_timeout", self.session_idle_timeout)
        return options

    def streamable_http_app(self, **options: Any) -> Starlette:
        """The SDK's streamable HTTP app (its arguments), within this server's limits."""
        return super().streamable_http_app(**self._limits(options))

    async def run_streamable_http_async(self, **options: Any) -> None:
        """Serve over streamable HTTP with uvicorn (the SDK's arguments), within the limits."""
        await super().run_streamable_http_async(**self._limits(options))


def turn_server(
    provider: Provider,
    *,
    name: str = "rillet",
    tool_name: str = "run_turn",
    description: str = _DESCRIPTION,
    memory_budget: int = MEMORY_BUDGET // _SESSIONS_SHARE,
    max_sessions: int | None = None,
    session_idle_timeout: float | None = _SESSION_IDLE_TIMEOUT,
    **options: Any,
) -> TurnServer:
    """An MCP server with one tool, `tool_name`, that runs a turn against `provider`.

    The tool takes `prompt`, and optionally `system` and `max_tokens`; it answers the text, and
    as structured content the run's id, outcome, safe error code and attempts (and `filtered`
    when the provider's content rules cut the answer partway). A turn that
    fails answers `isError` with its safe code, never exception text.

    Args:
        provider: what the tool's turns run against.
        name: the server's name, as clients see it.
        tool_name: the tool's name.
        description: the tool's description, as the model reads it.
        memory_budget: bytes the idle streamable HTTP sessions may hold: the session limit is
            this over `SESSION_BYTES` (32 MiB, an eighth of a server's `MEMORY_BUDGET`: 910
            sessions). A new session past the limit is refused (503) until one ends.
        max_sessions: the session limit itself, instead of the budget's (None: the budget's).
        session_idle_timeout: seconds a session may be idle (no request in flight) before it
            is ended (5 minutes; None: never).
        **options: `run_turn`'s (`policy`, `limiter`, `reasoning`...).
    """
    if max_sessions is None:
        max_sessions = max(memory_budget // SESSION_BYTES, 1)
    server = TurnServer(name, max_sessions=max_sessions, session_idle_timeout=session_idle_timeout)

    async def run_turn_tool(
        prompt: str,
        ctx: Context,
        system: str | None = None,
        max_tokens: int | None = None,
    ) -> CallToolResult:
        request = TurnRequest(
            messages=[user(prompt)],
            system_prompt=system,
            max_tokens=max_tokens,
        )
        return await _serve_turn(ctx, request, provider, options)

    server.add_tool(run_turn_tool, name=tool_name, description=description)
    return server


async def _serve_turn(
    ctx: Context, request: TurnRequest, provider: Provider, options: dict[str, Any]
) -> CallToolResult:
    meta: dict[str, Any] = dict(ctx.request_context.meta or {})
    token = meta.get("progressToken", meta.get("progress_token"))
    usable = isinstance(token, str | int) and not isinstance(token, bool)
    if not usable or len(str(token)) > _MAX_PROGRESS_TOKEN:
        token = None
    run_id = str(options.get("run_id") or secrets.token_hex(8))
    correlation = meta.get(CORRELATION_ID_KEY)
    if not isinstance(correlation, str) or not 0 < len(correlation) <= _MAX_CORRELATION_ID:
        correlation = run_id
    detailed = meta.get(RUN_EVENTS_KEY) is True
    session = ctx.request_context.session
    last: list[RunEvent] = []

    async def on_event(event: RunEvent) -> None:
        last[:] = [event]
        if token is None:
            return
        text = event.delta if isinstance(event, AnswerDelta) else event.__struct_config__.tag
        extra = None
        if detailed:
            extra = {
                RUN_EVENT_KEY: msgspec.json.decode(encode_json(event)),
                CORRELATION_ID_KEY: correlation,
            }
        params = ProgressNotificationParams(
            progress_token=token,
            progress=float(event.seq),
            message=str(text),
            _meta=extra,
        )
        await session.send_notification(
            ProgressNotification(params=params), related_request_id=ctx.request_id
        )

    result = await _each_run_event(request, provider, {**options, "run_id": run_id}, on_event)
    done = last[0] if last and isinstance(last[0], RunDone) else None
    code = done.code if done is not None else "unknown"
    structured: dict[str, Any] = {
        "run_id": run_id,
        "correlation_id": correlation,
        "outcome": result.outcome.label,
        "code": code,
        "attempts": result.attempts,
    }
    if result.filtered:  # the text stands, cut short: as `answer.done` says it
        structured["filtered"] = True
    answer = result.text if result.ok else f"The turn ended without a reply ({code})."
    result_meta: dict[str, Any] = {CORRELATION_ID_KEY: correlation}
    if done is not None:
        result_meta[LAST_SEQ_KEY] = done.seq
    return CallToolResult(
        content=[TextContent(type="text", text=answer)],
        structured_content=structured,
        is_error=not result.ok,
        _meta=result_meta,
    )


async def _each_run_event(
    request: TurnRequest,
    provider: Provider,
    options: dict[str, Any],
    on_event: Callable[[RunEvent], Awaitable[None]],
) -> TurnResult:
    """Run the turn on the running event loop, trio's or asyncio's; `on_event` for each run
    event, in order; the result."""
    if in_trio():
        async with open_turn(request, provider, **options) as turn:
            async for event in turn.run_events():
                await on_event(event)
            return await turn.result()
    from ..asyncio import stream_turn

    async with stream_turn(request, provider, events="run", **options) as stream:
        async for event in stream:
            await on_event(event)
        return await stream.result()


def main(argv: Sequence[str] | None = None) -> None:
    """`python -m rillet.mcp`: serve the turn tool over stdio, on trio, for an MCP client that
    starts this process; the provider as `rillet run` names it (a kind or an OpenAI-compatible
    URL, with its key from the environment)."""
    from ..providers._registry import provider_from_env

    parser = argparse.ArgumentParser(prog="python -m rillet.mcp", description=main.__doc__)
    parser.add_argument("--provider", default="openai", help="a provider kind, or a base URL")
    parser.add_argument("--model", default=None, help="the model (the kind's default if unset)")
    parser.add_argument("--name", default="rillet", help="the server's name")
    parser.add_argument("--tool", default="run_turn", help="the tool's name")
    args = parser.parse_args(argv)
    server = turn_server(
        provider_from_env(args.provider, model=args.model), name=args.name, tool_name=args.tool
    )
    anyio.run(server.run_stdio_async, backend="trio")
