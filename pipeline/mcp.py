"""rillet as an MCP server, the client side of its run events, and MCP servers' tools as an
agent's tools.

`mcp_tools(client)` makes the tools of the server a connected MCP client speaks to an agent's
tools. `turn_server(provider)` is an MCP server (the `mcp` SDK's `MCPServer`) whose tool runs a
turn, with standard progress notifications and, opted into per request, the run events themselves in
their `_meta`; `RunEventDispatcher` puts those back in order on the client. `python -m
rillet.mcp --provider KIND` serves it over stdio.

Needs the `mcp` extra (`pip install 'rillet[mcp]'`).
"""

from ._core._public import fixup_module_metadata as _fixup_module_metadata

try:
    import mcp as _mcp  # noqa: F401
except ImportError as exc:  # pragma: no cover - the extra is installed wherever tests run
    raise ImportError(
        "rillet.mcp needs the mcp extra: pip install 'rillet[mcp]'", name=exc.name
    ) from exc

from ._core._errors import RunEventGap as RunEventGap
from ._mcp._client import RunEventDispatcher as RunEventDispatcher
from ._mcp._client import RunEvents as RunEvents
from ._mcp._server import CORRELATION_ID_KEY as CORRELATION_ID_KEY
from ._mcp._server import LAST_SEQ_KEY as LAST_SEQ_KEY
from ._mcp._server import RUN_EVENT_KEY as RUN_EVENT_KEY
from ._mcp._server import RUN_EVENTS_KEY as RUN_EVENTS_KEY
from ._mcp._server import SESSION_BYTES as SESSION_BYTES
from ._mcp._server import TurnServer as TurnServer
from ._mcp._server import main as main
from ._mcp._server import turn_server as turn_server
from ._mcp._toolset import MCPToolError as MCPToolError
from ._mcp._toolset import mcp_tools as mcp_tools

__all__ = [
    "CORRELATION_ID_KEY",
    "LAST_SEQ_KEY",
    "RUN_EVENTS_KEY",
    "RUN_EVENT_KEY",
    "SESSION_BYTES",
    "MCPToolError",
    "RunEventDispatcher",
    "RunEventGap",
    "RunEvents",
    "TurnServer",
    "main",
    "mcp_tools",
    "turn_server",
]

_fixup_module_metadata(__name__, globals())

if __name__ == "__main__":
    main()
