"""An MCP server's tools as an agent's tools, in one line.

`tools = await mcp_tools(client)` lists what a connected MCP client's server offers and makes
each a `Tool`: its name, description and input schema as the server states them, and a call
that goes to the server (`tools/call`) with the model's arguments. The tool's text content is
what the model reads; an error result raises, so the model is told the tool failed, as for any
tool that raises. The client (the `mcp` SDK's `Client` or `ClientSession`, over stdio or HTTP)
stays the caller's: it must stay open while the agent runs.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import attrs

from .._agent._tools import Tool

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["MCPToolError", "mcp_tools"]


class MCPToolError(Exception):
    """An MCP server answered a tool call with an error result; its text is the message."""


@attrs.frozen
class _ServerCall:
    """One MCP tool, called on its server with the model's arguments."""

    client: Any
    name: str

    async def __call__(self, **arguments: Any) -> str:
        result = await self.client.call_tool(self.name, arguments)
        texts = [c.text for c in result.content if getattr(c, "type", None) == "text"]
        text = "\n".join(texts)
        if getattr(result, "is_error", False):
            raise MCPToolError(text or f"{self.name} failed on its MCP server")
        if not text and getattr(result, "structured_content", None) is not None:
            return json.dumps(result.structured_content, ensure_ascii=False)
        return text


async def mcp_tools(
    client: Any,
    *,
    needs_approval: bool | Callable[[str], bool] = False,
    call_timeout: float | None = 60.0,
) -> list[Tool]:
    """The tools `client`'s MCP server offers, as tools an agent takes (`run_agent(...,
    tools=await mcp_tools(client))`).

    Args:
        client: a connected MCP client (the `mcp` SDK's `Client` or `ClientSession`); it must
            stay open while the agent runs.
        needs_approval: whether each call waits for the host's approval: for every tool, or
            `needs_approval(name)` for each.
        call_timeout: seconds one call may take (None: no deadline of its own).
    """
    listed = await client.list_tools()
    tools = []
    for offered in listed.tools:
        schema = getattr(offered, "input_schema", None) or getattr(offered, "inputSchema", None)
        approval = needs_approval(offered.name) if callable(needs_approval) else needs_approval
        tools.append(
            Tool(
                name=offered.name,
                description=offered.description or "",
                parameters=dict(schema or {"type": "object", "properties": {}}),
                function=_ServerCall(client, offered.name),
                needs_approval=approval,
                timeout=call_timeout,
            )
        )
    return tools
