"""Tool-call arguments as the grammar parses them once a call's fragments are joined: one JSON
object, nested no deeper than every encoder downstream can write back. Pure."""

from __future__ import annotations

from typing import Any

import msgspec

from ._errors import ToolCallArgumentParseError

__all__ = ["MAX_ARGUMENT_DEPTH", "parse_arguments"]

_decode_arguments = msgspec.json.Decoder().decode

_CUT_SHORT = "Input data was truncated"
"""msgspec's words for JSON text that ends before its value does."""
_TOO_DEEP = object()
MAX_ARGUMENT_DEPTH = 128
"""Tool arguments nested deeper than this are refused (`ToolCallArgumentParseError`): every
JSON encoder downstream (the MMSP endpoint, JSONL, run events) must be able to write them back
without running out of stack."""


def _too_deep(raw: str, parsed: Any) -> bool:
    """Whether parsed tool arguments nest deeper than `MAX_ARGUMENT_DEPTH`. The text is counted
    first (in C): arguments with fewer brackets than the limit cannot be that deep."""
    if raw.count("{") + raw.count("[") <= MAX_ARGUMENT_DEPTH:
        return False
    level: list[Any] = [parsed] if isinstance(parsed, dict | list) else []
    for _ in range(MAX_ARGUMENT_DEPTH):  # after n rounds: the containers n levels down
        level = [
            child
            for node in level
            for child in (node.values() if isinstance(node, dict) else node)
            if isinstance(child, dict | list)
        ]
        if not level:
            return False
    return True


def parse_arguments(raw: str, provider: str, name: str, call_id: str) -> dict[str, Any]:
    """The joined arguments `raw` of call `call_id` (tool `name`) as a JSON object (`""` is
    `{}`); raises `ToolCallArgumentParseError` for anything else, or for one nested too deep."""
    try:
        parsed = _decode_arguments(raw or "{}")
    except msgspec.DecodeError as exc:
        cut = str(exc) == _CUT_SHORT  # the text ended inside the JSON, not malformed
        raise ToolCallArgumentParseError(
            provider, name, call_id, raw, str(exc), cut_short=cut
        ) from None
    except RecursionError:
        parsed = _TOO_DEEP  # nested past what the decoder can follow: refused below
    if parsed is _TOO_DEEP or _too_deep(raw, parsed):
        raise ToolCallArgumentParseError(
            provider, name, call_id, raw, f"Nested deeper than {MAX_ARGUMENT_DEPTH} levels."
        )
    if not isinstance(parsed, dict):
        raise ToolCallArgumentParseError(provider, name, call_id, raw, "Expected a JSON object.")
    return parsed
