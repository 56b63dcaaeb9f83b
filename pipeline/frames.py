"""Frame codecs, sans-I/O: bytes in, frames out, and the SSE encoder.

`SSEDecoder` keeps every WHATWG event-stream rule; `NDJSONDecoder` splits newline-delimited
JSON. Each takes bytes split anywhere and returns the frames they complete (`feed(bytes)`,
`close()`), holding at most one frame of `DEFAULT_MAX_FRAME` bytes. No sockets, no clock, no
trio: the dialects, the wire decoder and the I/O transports are all built on them.
"""

from ._core._ndjson import NDJSONDecoder as NDJSONDecoder
from ._core._public import fixup_module_metadata as _fixup_module_metadata
from ._core._sse import DEFAULT_MAX_FRAME as DEFAULT_MAX_FRAME
from ._core._sse import SSEDecoder as SSEDecoder
from ._core._sse import SSEEvent as SSEEvent
from ._core._sse import encode_sse as encode_sse

__all__ = ["DEFAULT_MAX_FRAME", "NDJSONDecoder", "SSEDecoder", "SSEEvent", "encode_sse"]

_fixup_module_metadata(__name__, globals())
