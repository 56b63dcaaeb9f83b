"""An MCP server's tools as an agent's tools (`rillet.mcp.mcp_tools`), against a real MCP server
(the `mcp` SDK's own, over stdio) and a provider on loopback: the model is shown the server's
tools as it states them, a call reaches the server, its text is the model's tool result, and a
server's error result is the model's tool failure."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING

import pytest
from mcp import Client, StdioServerParameters
from rillet import run_agent
from rillet.mcp import mcp_tools
from rillet.transports.testing import open_loopback_provider

from ..agent_support import QUESTION, body_of, provider_at, tool_result_in
from ..cli.test_cli_agents import tool_then_answer

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.slow

SERVER = """
from mcp.server import MCPServer

server = MCPServer("sums")


@server.tool()
def add(a: int, b: int) -> str:
    \"\"\"Add two whole numbers.\"\"\"
    return str(a + b)


@server.tool()
def divide(a: int, b: int) -> str:
    \"\"\"Divide a by b.\"\"\"
    return str(a / b)


server.run()
"""


@pytest.mark.parametrize(
    ("name", "arguments", "told"),
    [
        ("add", {"a": 2, "b": 3}, "5"),
        ("divide", {"a": 1, "b": 0}, "error: MCPToolError: "),
    ],
)
async def test_an_agent_calls_an_mcp_servers_tool_and_reads_its_answer(
    tmp_path: Path, name: str, arguments: dict[str, int], told: str
) -> None:
    script = tmp_path / "server.py"
    script.write_text(SERVER, encoding="utf-8")
    params = StdioServerParameters(command=sys.executable, args=[str(script)])
    async with (
        Client(params) as client,
        open_loopback_provider(tool_then_answer(name, arguments)) as server,
    ):
        tools = await mcp_tools(client)
        result = await run_agent(QUESTION, provider_at(server), tools=tools)
    assert result.status == "completed", result.error
    shown = {t["function"]["name"]: t["function"] for t in body_of(server, 0)["tools"]}
    assert set(shown) == {"add", "divide"}
    assert shown["add"]["description"] == "Add two whole numbers."
    assert shown["add"]["parameters"]["properties"]["a"]["type"] == "integer"
    [(_, text)] = tool_result_in(body_of(server, 1), "openai-chat")
    assert text.startswith(told)
    assert json.loads(server.requests[1].body)["messages"][-1]["role"] == "tool"
