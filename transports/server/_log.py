"""The server's log lines: one per HTTP request (`rillet.transports.server.access`), one as a
run starts and one as it ends, and a WARNING naming the cause, in words, of every run a
provider failed (`rillet.transports.server`).

Each line's facts also ride on the record as `fields` (the command line's JSON format puts
them in the object). No line carries a credential: the path is logged without its query (a
run's token travels there), the cause is `explain`'s sentence without the provider's own
message (a 401 body may echo the key), and request headers are never logged.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from rillet._core._explain import explain
from rillet._core._policy import Outcome

from ._metrics import outcome_label
from ._tracing import trace_id

if TYPE_CHECKING:
    from rillet._core._dialect import Provider
    from rillet._turn._turn import TurnResult

__all__ = ["log_queued_cancel", "log_request", "log_run_end", "log_run_start"]

logger = logging.getLogger("rillet.transports.server")
access = logging.getLogger("rillet.transports.server.access")

_MAX_PATH = 200

# outcomes that are no provider's failure: nothing to explain
_QUIET = frozenset({Outcome.COMPLETED, Outcome.RESCUED, Outcome.CANCELLED})


def log_request(
    method: str, path: str, status: int | None, size: int, duration: float, client: str
) -> None:
    """The access line of one request: method, path (never its query), status, bytes sent,
    seconds. `status` None: no response went out (the client left, or the connection closed)."""
    if not access.isEnabledFor(logging.INFO):  # the hot path: nothing built for nobody
        return
    shown = status if status is not None else "-"
    if len(path) > _MAX_PATH:  # a client's path is its own text: keep a line a line's size
        path = path[:_MAX_PATH] + "…"
    fields = {
        "method": method,
        "path": path,
        "status": status,
        "bytes": size,
        "duration_s": round(duration, 3),
        "client": client,
    }
    access.info(
        "%s %s %s %d bytes %.3f s%s",
        method,
        path,
        shown,
        size,
        duration,
        _traced(fields),
        extra={"fields": fields},
    )


def _traced(fields: dict[str, Any]) -> str:
    """The line's trace id, when it belongs to one: in `fields`, and as the line's tail."""
    found = trace_id()
    if found is None:
        return ""
    fields["trace_id"] = found
    return f" trace {found}"


def log_run_start(run_id: str, provider: Provider, kind: str) -> None:
    """The line of a run starting: `kind` names what started it, the runs API (`run`) or a
    served wire (`stream`, `chat`, `ui`)."""
    fields = {"run_id": run_id, "kind": kind, "provider": provider.label, "model": provider.model}
    logger.info(
        "%s %s started: provider %s, model %s%s",
        kind,
        run_id,
        provider.label,
        provider.model,
        _traced(fields),
        extra={"fields": fields},
    )


def log_queued_cancel(run_id: str, provider: Provider) -> None:
    """The end line of a run cancelled while it waited for a slot (no provider request)."""
    fields = {
        "run_id": run_id,
        "kind": "run",
        "provider": provider.label,
        "model": provider.model,
        "outcome": "cancelled",
        "requests": 0,
        "attempts": 0,
    }
    logger.info(
        "run %s ended: outcome cancelled while queued, 0 request(s)",
        run_id,
        extra={"fields": fields},
    )


def log_run_end(run_id: str, provider: Provider, kind: str, result: TurnResult) -> None:
    """The line of a run ending (INFO): outcome, provider requests, seconds, first event; and,
    when a provider failed it, a WARNING with the cause in words (keys masked)."""
    answered = result.provider or provider
    first = result.time_to_first_event
    fields = {
        "run_id": run_id,
        "kind": kind,
        "provider": answered.label,
        "model": answered.model,
        "outcome": outcome_label(result),
        "requests": result.requests,
        "attempts": result.attempts,
        "duration_s": round(result.total_time, 3),
        "first_event_s": round(first, 3) if first is not None else None,
    }
    logger.info(
        "%s %s ended: outcome %s, %d request(s), %.3f s, first event %s%s",
        kind,
        run_id,
        fields["outcome"],
        result.requests,
        result.total_time,
        f"{first:.3f} s" if first is not None else "never",
        _traced(fields),
        extra={"fields": fields},
    )
    if result.outcome in _QUIET:
        return
    # the provider's own words stay out: its 401 body may echo the key (S13)
    cause = explain(result.error, answered, attempts=result.attempts, quote=False)
    logger.warning(
        "%s %s failed: provider %s, model %s: %s",
        kind,
        run_id,
        answered.label,
        answered.model,
        cause,
        extra={"fields": {**fields, "cause": cause}},
    )
