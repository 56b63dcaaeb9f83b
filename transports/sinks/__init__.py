"""Output sinks a turn delivers to: a terminal, and JSON Lines files.

Both take the turn's `SinkBatch`es (see `rillet.Sink`) and write synchronously, flushing once
per batch. Plain buffered writes are deliberate: writing and flushing a batch to a local file or
to a pipe with a reader costs 5-10 µs, against ~400 µs for a hop through
`trio.to_thread.run_sync`, and a batch holds everything that arrived together, so one flush per
batch is already the minimum number of syscalls. The one thing a thread would buy is not blocking
the event loop on a pipe whose reader has stopped reading; for a command-line turn that is the
backpressure the turn wants anyway.

A consumer that goes away (`rillet ... | head -1`) makes the next write raise `BrokenPipeError`.
The sinks catch it, set `broken_pipe = True` and stop writing, so no traceback is printed; the
command line turns the flag into exit status 141. (Python's interpreter-exit flush of `sys.stdout`
may still complain about the bytes left in its buffer: the command line should point the
descriptor at `os.devnull` before it exits, as the Python documentation on SIGPIPE advises.)
"""

from rillet._core._public import fixup_module_metadata as _fixup_module_metadata

from ._jsonl import JSONLSink as JSONLSink
from ._terminal import TerminalSink as TerminalSink

__all__ = ["JSONLSink", "TerminalSink"]

_fixup_module_metadata(__name__, globals())
