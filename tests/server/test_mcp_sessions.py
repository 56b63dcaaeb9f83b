"""S33: idle MCP sessions are bounded by a memory budget, not by the SDK's 10,000 and 30 minutes.

Each idle streamable HTTP session pins about 35 KiB (`python -m bench.mcp_sessions`). The turn
server's app (`turn_server(...).streamable_http_app()`) runs under uvicorn on 127.0.0.1 and a
raw httpx client opens sessions as every MCP client does (`initialize`, then
`notifications/initialized`) and leaves them idle.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Any

import httpx
import uvicorn
from rillet._hub._hub import MEMORY_BUDGET
from rillet.mcp import SESSION_BYTES, turn_server
from rillet.providers import OpenAIChatDialect, Provider

from bench.mcp_sessions import open_session

from ..loopback_thread import WAIT

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

PROVIDER = Provider(OpenAIChatDialect(), "http://127.0.0.1:1/v1", "gpt-test")  # never asked
HEADERS = {"accept": "application/json, text/event-stream", "content-type": "application/json"}


@contextlib.asynccontextmanager
async def mcp_app(**limits: Any) -> AsyncIterator[str]:
    """The turn server's streamable HTTP app, with `limits` given to `turn_server`; its URL."""
    app = turn_server(PROVIDER, **limits).streamable_http_app()
    web = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    task = asyncio.create_task(web.serve())
    while not web.started:  # noqa: ASYNC110 - uvicorn has no event to wait on
        await asyncio.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{web.servers[0].sockets[0].getsockname()[1]}/mcp"
    finally:
        web.should_exit = True
        await task


async def tools_list(client: httpx.AsyncClient, url: str, session: str) -> httpx.Response:
    """A request on an open session: its tools."""
    body = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
    return await client.post(url, json=body, headers={**HEADERS, "mcp-session-id": session})


def test_s33_the_default_limits_come_from_the_memory_budget() -> None:
    server = turn_server(PROVIDER)
    assert server.max_sessions == MEMORY_BUDGET // 8 // SESSION_BYTES  # 910, not 10,000
    assert server.max_sessions * SESSION_BYTES <= 32 * 1024 * 1024
    assert server.session_idle_timeout == 300  # 5 minutes, not 30
    assert turn_server(PROVIDER, memory_budget=10 * SESSION_BYTES).max_sessions == 10
    assert turn_server(PROVIDER, max_sessions=7).max_sessions == 7


def test_s33_a_session_past_the_budget_is_refused_and_the_open_ones_go_on() -> None:
    async def main() -> tuple[list[int], httpx.Response, int, int, int]:
        async with (
            mcp_app(memory_budget=3 * SESSION_BYTES) as url,  # room for 3 sessions
            httpx.AsyncClient(timeout=WAIT) as client,
        ):
            opened = [await open_session(client, url) for _ in range(3)]
            refused = await open_session(client, url)
            sessions = [answer.headers["mcp-session-id"] for answer in opened]
            still = (await tools_list(client, url, sessions[0])).status_code
            ended = await client.delete(url, headers={**HEADERS, "mcp-session-id": sessions[0]})
            again = (await open_session(client, url)).status_code  # room again
        return [a.status_code for a in opened], refused, still, ended.status_code, again

    opened, refused, still, ended, again = asyncio.run(main())
    assert opened == [200, 200, 200]
    assert refused.status_code == 503
    assert refused.json()["error"]["message"] == "Too many open sessions"
    assert "mcp-session-id" not in refused.headers
    assert still == 200  # the sessions already open are unaffected
    assert ended == 200
    assert again == 200


def test_s33_an_idle_session_expires_and_frees_its_place() -> None:
    async def main() -> tuple[int, int, int]:
        async with (
            mcp_app(max_sessions=1, session_idle_timeout=0.5) as url,
            httpx.AsyncClient(timeout=WAIT) as client,
        ):
            session = (await open_session(client, url)).headers["mcp-session-id"]
            fresh = (await tools_list(client, url, session)).status_code
            async with asyncio.timeout(WAIT):  # idle: ended by the server, not by the client
                while (status := (await tools_list(client, url, session)).status_code) == 200:  # noqa: ASYNC110
                    await asyncio.sleep(
                        0.6
                    )  # (no event says it expired) a request restarts its clock
            after = (await open_session(client, url)).status_code  # its place is free
        return fresh, status, after

    fresh, expired, after = asyncio.run(main())
    assert fresh == 200
    assert expired == 404  # "Session not found": the client must initialize anew
    assert after == 200
