"""Anthropic's Messages API: the request side and the stream decoder."""

from ._dialect import AnthropicDialect as AnthropicDialect

__all__ = ["AnthropicDialect"]
