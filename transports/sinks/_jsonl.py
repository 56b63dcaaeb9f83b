"""The JSON Lines sink: a turn's run events or its MMSP stream, one JSON object per line, written
synchronously and flushed once per batch (`rillet.transports.sinks` says why writes are not
handed to a thread)."""

from __future__ import annotations

import io
import os
from typing import IO, TYPE_CHECKING, Literal, cast

from rillet._core._encode import jsonl_lines, uni_jsonl

if TYPE_CHECKING:
    from rillet._turn._turn import SinkBatch

__all__ = ["JSONLSink"]


class JSONLSink:
    """Writes a turn as JSON Lines: one JSON object per line, flushed once per batch.

    With `kind="run"`, the run events, each exactly as msgspec encodes it (what
    `decode_run_event` reads back). With `kind="uni"`, the MMSP stream: each UniEvent exactly as
    `encode_json` writes it, and each `AttemptReset` as `{"type":"attempt.reset","attempt":n}`.

    `path_or_file` is a path (opened for appending, closed by `close`) or an open file object,
    binary or text (flushed, never closed: it belongs to the caller). A text file object must
    accept UTF-8 text, which is what the JSON holds. A `BrokenPipeError` sets `broken_pipe` and
    stops the writing.
    """

    def __init__(
        self,
        path_or_file: str | os.PathLike[str] | IO[bytes] | IO[str],
        *,
        kind: Literal["run", "uni"] = "run",
    ) -> None:
        if kind not in ("run", "uni"):
            raise ValueError(f"kind must be 'run' or 'uni', not {kind!r}")
        self.kind = kind
        self.broken_pipe = False
        self._closed = False
        self._file: IO[bytes] | IO[str]
        if isinstance(path_or_file, (str, os.PathLike)):
            self._file = open(path_or_file, "ab")  # noqa: SIM115 - closed by close()
            self._owned = True
        else:
            self._file = path_or_file
            self._owned = False
        self._text = _is_text(self._file)

    def _write(self, data: bytes) -> None:
        if self._text:
            cast("IO[str]", self._file).write(data.decode("utf-8"))
        else:
            cast("IO[bytes]", self._file).write(data)
        self._file.flush()

    def _lines(self, batch: SinkBatch) -> bytes:
        if self.kind == "run":
            if not batch.run:
                return b""
            return jsonl_lines(batch.run)
        if not batch.uni:
            return b""
        return uni_jsonl(batch.uni)

    def deliver_nowait(self, batch: SinkBatch) -> bool:
        """Write one batch's lines and flush, on the turn's task (a file write does not yield
        to trio wherever it is made)."""
        if self._closed or self.broken_pipe:
            return True
        data = self._lines(batch)
        if not data:
            return True
        try:
            self._write(data)
        except BrokenPipeError:
            self.broken_pipe = True
        return True

    async def deliver(self, batch: SinkBatch) -> None:
        """Write one batch's lines and flush."""
        self.deliver_nowait(batch)

    async def close(self) -> None:
        """Flush; close the file if the sink opened it."""
        if self._closed:
            return
        self._closed = True
        try:
            if not self.broken_pipe:
                self._file.flush()
        except BrokenPipeError:
            self.broken_pipe = True
        finally:
            if self._owned:
                try:
                    self._file.close()
                except BrokenPipeError:
                    self.broken_pipe = True


def _is_text(file: IO[bytes] | IO[str]) -> bool:
    """Whether a file object takes `str`: a text stream, or anything with an encoding that is
    not a byte stream."""
    if isinstance(file, io.TextIOBase):
        return True
    if isinstance(file, (io.RawIOBase, io.BufferedIOBase)):
        return False
    return hasattr(file, "encoding")
