"""rillet's I/O transports: what carries bytes and frames in and out, and nothing else.

Upstream (`rillet.transports.upstream`: HTTP on httpx, WebSocket, in memory; `replay`), the
sinks (`sinks`), the HTTP/SSE/WebSocket server (`server`) and the loopback test providers
(`testing`). The sans-I/O frame codecs they are built on live in the core: `rillet.frames`.
"""

from typing import Any

__all__: list[str] = []


def __getattr__(name: str) -> Any:
    """The frame codecs' names, still importable from here (their home is `rillet.frames`)."""
    import rillet.frames

    if name in rillet.frames.__all__:
        return getattr(rillet.frames, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
