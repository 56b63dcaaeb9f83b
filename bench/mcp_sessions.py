"""What an idle MCP session costs: `python -m bench.mcp_sessions [--sessions N]`.

The turn server's streamable HTTP app (`turn_server(...).streamable_http_app()`) runs under
uvicorn in this process; a client opens `N` sessions (an `initialize` request and the
`notifications/initialized` that follows it, as every MCP client sends) and leaves them idle.
tracemalloc's figure for what the server holds once they are open, less before, ÷ `N`: what
one idle session pins until it is deleted or times out. It sets `rillet.mcp`'s `SESSION_BYTES`
(`docs/decisions.md`, "MCP sessions within the memory budget").
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import tracemalloc
from typing import Any

import httpx
import uvicorn
from rillet.mcp import turn_server
from rillet.providers import OpenAIChatDialect, Provider

__all__ = ["main", "open_session"]

_HEADERS = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
_INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "bench", "version": "1"},
    },
}


async def open_session(client: httpx.AsyncClient, url: str) -> httpx.Response:
    """Open one session (`initialize`, then `notifications/initialized`); the first answer."""
    answer = await client.post(url, json=_INITIALIZE, headers=_HEADERS)
    session = answer.headers.get("mcp-session-id")
    if answer.status_code == 200 and session:
        note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        await client.post(url, json=note, headers={**_HEADERS, "mcp-session-id": session})
    return answer


async def measure(sessions: int) -> dict[str, Any]:
    """Open `sessions` idle sessions on a server with room for all of them."""
    provider = Provider(OpenAIChatDialect(), "http://127.0.0.1:1/v1", "gpt-test")
    app = turn_server(provider, max_sessions=sessions + 10).streamable_http_app()
    web = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    task = asyncio.create_task(web.serve())
    while not web.started:  # noqa: ASYNC110 - uvicorn has no event to wait on
        await asyncio.sleep(0.01)
    url = f"http://127.0.0.1:{web.servers[0].sockets[0].getsockname()[1]}/mcp"
    try:
        async with httpx.AsyncClient(timeout=30) as client:
            for _ in range(10):  # warm: the first sessions import and cache
                await open_session(client, url)
            gc.collect()
            tracemalloc.start()
            before = tracemalloc.get_traced_memory()[0]
            for _ in range(sessions):
                answer = await open_session(client, url)
                assert answer.status_code == 200, answer.text
            await asyncio.sleep(0.2)
            gc.collect()
            held = tracemalloc.get_traced_memory()[0] - before
            tracemalloc.stop()
    finally:
        web.should_exit = True
        await task
    return {"sessions": sessions, "bytes_per_session": round(held / sessions)}


def main(argv: list[str] | None = None) -> None:
    """Measure and print the figures as JSON."""
    parser = argparse.ArgumentParser(prog="python -m bench.mcp_sessions", description=__doc__)
    parser.add_argument("--sessions", type=int, default=500)
    args = parser.parse_args(argv)
    print(json.dumps(asyncio.run(measure(args.sessions))))


if __name__ == "__main__":
    main()
