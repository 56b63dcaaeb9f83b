"""rillet's transports: what carries bytes and frames in and out, and nothing else.

The frame codecs here are sans-I/O (`feed(bytes) -> frames`, `close()`); the I/O transports
(httpx streaming, WebSocket, replay files, servers and sinks) are built on them.
"""

from rillet._public import fixup_module_metadata as _fixup_module_metadata

from ._ndjson import NDJSONDecoder as NDJSONDecoder
from ._sse import DEFAULT_MAX_FRAME as DEFAULT_MAX_FRAME
from ._sse import SSEDecoder as SSEDecoder
from ._sse import SSEEvent as SSEEvent
from ._sse import encode_sse as encode_sse

__all__ = ["DEFAULT_MAX_FRAME", "NDJSONDecoder", "SSEDecoder", "SSEEvent", "encode_sse"]

_fixup_module_metadata(__name__, globals())
