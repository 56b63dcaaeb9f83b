"""Output sinks a turn delivers to: a terminal, and JSON Lines files."""

from rillet._core._public import fixup_module_metadata as _fixup_module_metadata

from ._jsonl import JSONLSink as JSONLSink
from ._terminal import TerminalSink as TerminalSink

__all__ = ["JSONLSink", "TerminalSink"]

_fixup_module_metadata(__name__, globals())
