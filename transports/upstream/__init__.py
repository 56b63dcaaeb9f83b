"""Upstream transports: what carries a turn's requests to its provider.

`run_turn(upstream=...)` takes any object with rillet's `Upstream` protocol (`open(request) ->
Exchange`, `aclose()`). Here are the ones rillet ships: HTTP on httpx (the default), WebSocket
on trio-websocket (for providers that stream over a socket), and an in-memory one for tests
and in-process providers. The replay transport (`rillet.transports.replay`) is one too.
"""

from rillet._core._public import fixup_module_metadata as _fixup_module_metadata

from ._http import HttpExchange as HttpExchange
from ._http import HttpUpstream as HttpUpstream
from ._memory import MemoryExchange as MemoryExchange
from ._memory import MemoryReply as MemoryReply
from ._memory import MemoryUpstream as MemoryUpstream
from ._observed import ObservedTransport as ObservedTransport
from ._ws import SchemeUpstream as SchemeUpstream
from ._ws import WebSocketExchange as WebSocketExchange
from ._ws import WebSocketUpstream as WebSocketUpstream
from ._ws import open_websocket_upstream as open_websocket_upstream

__all__ = [
    "HttpExchange",
    "HttpUpstream",
    "MemoryExchange",
    "MemoryReply",
    "MemoryUpstream",
    "ObservedTransport",
    "SchemeUpstream",
    "WebSocketExchange",
    "WebSocketUpstream",
    "open_websocket_upstream",
]

_fixup_module_metadata(__name__, globals())
