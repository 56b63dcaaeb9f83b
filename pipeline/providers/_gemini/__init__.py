"""Gemini's API: the request side, the stream decoder and streamed call arguments."""

from ._dialect import GeminiDialect as GeminiDialect

__all__ = ["GeminiDialect"]
