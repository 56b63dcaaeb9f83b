"""Provider dialects: one module per provider wire, all sans-I/O, and the registry that turns a
kind and the environment into a configured `Provider`."""

from .._core._dialect import Dialect as Dialect
from .._core._dialect import FramesDecoder as FramesDecoder
from .._core._dialect import HttpRequest as HttpRequest
from .._core._dialect import KeptToken as KeptToken
from .._core._dialect import Provider as Provider
from .._core._dialect import Secret as Secret
from .._core._dialect import StreamDecoder as StreamDecoder
from .._core._public import fixup_module_metadata as _fixup_module_metadata
from ._anthropic._dialect import AnthropicDialect as AnthropicDialect
from ._azure import AzureOpenAIDialect as AzureOpenAIDialect
from ._azure import AzureResponsesDialect as AzureResponsesDialect
from ._azure import EntraToken as EntraToken
from ._bedrock_converse import BedrockConverseDialect as BedrockConverseDialect
from ._embeddings import GeminiEmbeddingsDialect as GeminiEmbeddingsDialect
from ._embeddings import OpenAIEmbeddingsDialect as OpenAIEmbeddingsDialect
from ._gemini._dialect import GeminiDialect as GeminiDialect
from ._mmsp import MMSPDialect as MMSPDialect
from ._ollama import OllamaDialect as OllamaDialect
from ._openai_chat._dialect import OpenAIChatDialect as OpenAIChatDialect
from ._openai_realtime import OpenAIRealtimeDialect as OpenAIRealtimeDialect
from ._openai_responses._dialect import OpenAIResponsesDialect as OpenAIResponsesDialect
from ._registry import DIALECT_NAMES as DIALECT_NAMES
from ._registry import PROVIDER_KINDS as PROVIDER_KINDS
from ._registry import describe_providers as describe_providers
from ._registry import dialect_from_name as dialect_from_name
from ._registry import provider_from_env as provider_from_env
from ._vertex import GoogleAccessToken as GoogleAccessToken
from ._vertex import VertexAnthropicDialect as VertexAnthropicDialect
from ._vertex import VertexGeminiDialect as VertexGeminiDialect

__all__ = [
    "DIALECT_NAMES",
    "PROVIDER_KINDS",
    "AnthropicDialect",
    "AzureOpenAIDialect",
    "AzureResponsesDialect",
    "BedrockConverseDialect",
    "Dialect",
    "EntraToken",
    "FramesDecoder",
    "GeminiDialect",
    "GeminiEmbeddingsDialect",
    "GoogleAccessToken",
    "HttpRequest",
    "KeptToken",
    "MMSPDialect",
    "OllamaDialect",
    "OpenAIChatDialect",
    "OpenAIEmbeddingsDialect",
    "OpenAIRealtimeDialect",
    "OpenAIResponsesDialect",
    "Provider",
    "Secret",
    "StreamDecoder",
    "VertexAnthropicDialect",
    "VertexGeminiDialect",
    "describe_providers",
    "dialect_from_name",
    "provider_from_env",
]

_fixup_module_metadata(__name__, globals())
