"""OpenAI Chat Completions: the dialect, its wire shapes, the stream decoder, and the
inbound request the server reads."""

from ._dialect import OpenAIChatDialect as OpenAIChatDialect

__all__ = ["OpenAIChatDialect"]
