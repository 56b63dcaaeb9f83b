"""OpenAI Responses: the request side, the stream decoder and its output items."""

from ._dialect import OpenAIResponsesDialect as OpenAIResponsesDialect

__all__ = ["OpenAIResponsesDialect"]
