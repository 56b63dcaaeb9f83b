"""Provider dialects: one module per provider wire, all sans-I/O."""

from ._base import Dialect as Dialect
from ._base import HttpRequest as HttpRequest
from ._base import Provider as Provider
from ._base import Secret as Secret
from ._base import StreamDecoder as StreamDecoder
from .anthropic import AnthropicDialect as AnthropicDialect

__all__ = [
    "AnthropicDialect",
    "Dialect",
    "HttpRequest",
    "Provider",
    "Secret",
    "StreamDecoder",
]
