"""What a handler answers instead of going on: a whole error response (`ErrorReply`), a refused
subscription (`Refused`, an HTTP status and a WebSocket close reason), or the end of the
connection (`CloseConnection`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec
import trio

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = [
    "GONE",
    "CloseConnection",
    "ErrorReply",
    "Refused",
    "error_body",
    "log_unavailable",
    "not_found",
    "to_json",
]

GONE = (trio.BrokenResourceError, trio.ClosedResourceError)


class ErrorReply(Exception):
    """A whole response to send instead of going on (an error, usually)."""

    def __init__(
        self,
        status: int,
        kind: str,
        message: str,
        *,
        headers: Sequence[tuple[str, str]] = (),
        close: bool = False,
        **fields: Any,
    ) -> None:
        super().__init__(kind)
        self.status = status
        self.body = error_body(kind, message, **fields)
        self.headers = headers
        self.close = close


def error_body(kind: str, message: str, **fields: Any) -> bytes:
    return msgspec.json.encode({"error": {"type": kind, "message": message, **fields}})


def not_found() -> ErrorReply:
    """One answer for "no such run" and "not your run": the same bytes, nothing tells them
    apart."""
    return ErrorReply(404, "not_found", "no such run")


def log_unavailable() -> Refused:
    """The shared run log (Redis) cannot be reached: retry later."""
    return Refused(
        503, "log_unavailable", "the run log is unavailable; retry shortly", retry_after=1
    )


class Refused(Exception):
    """A subscription refused: `kind` is the WebSocket close reason, `status` the HTTP one."""

    def __init__(self, status: int, kind: str, message: str, **fields: Any) -> None:
        super().__init__(kind)
        self.status = status
        self.kind = kind
        self.message = message
        self.fields = fields

    def reply(self) -> ErrorReply:
        """The same refusal as an HTTP response."""
        return ErrorReply(self.status, self.kind, self.message, **self.fields)


class CloseConnection(Exception):
    """The response is over and the connection must close (a stream cut short, a hand-over)."""


def to_json(value: Any) -> bytes:
    """JSON, as the server writes it."""
    return msgspec.json.encode(value)
