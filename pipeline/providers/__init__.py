"""Provider dialects: one module per provider wire, all sans-I/O, and the registry that turns a
kind and the environment into a configured `Provider`."""

from ._base import Dialect as Dialect
from ._base import HttpRequest as HttpRequest
from ._base import Provider as Provider
from ._base import Secret as Secret
from ._base import StreamDecoder as StreamDecoder
from ._registry import PROVIDER_KINDS as PROVIDER_KINDS
from ._registry import describe_providers as describe_providers
from ._registry import provider_from_env as provider_from_env
from .anthropic import AnthropicDialect as AnthropicDialect
from .embeddings import GeminiEmbeddingsDialect as GeminiEmbeddingsDialect
from .embeddings import OpenAIEmbeddingsDialect as OpenAIEmbeddingsDialect
from .gemini import GeminiDialect as GeminiDialect
from .mmsp import MMSPDialect as MMSPDialect
from .ollama import OllamaDialect as OllamaDialect
from .openai_chat import OpenAIChatDialect as OpenAIChatDialect
from .openai_responses import OpenAIResponsesDialect as OpenAIResponsesDialect

__all__ = [
    "PROVIDER_KINDS",
    "AnthropicDialect",
    "Dialect",
    "GeminiDialect",
    "GeminiEmbeddingsDialect",
    "HttpRequest",
    "MMSPDialect",
    "OllamaDialect",
    "OpenAIChatDialect",
    "OpenAIEmbeddingsDialect",
    "OpenAIResponsesDialect",
    "Provider",
    "Secret",
    "StreamDecoder",
    "describe_providers",
    "provider_from_env",
]
