"""The command line's logging: one root handler on stderr, as text or as one JSON object a line.

Only the command line configures logging; the library logs to `rillet.*` loggers and never
adds a handler. `rillet run` logs one line per run at INFO when it ends (provider, model,
outcome, duration, time to the first event), with those facts as fields in JSON.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .._core._dialect import Provider
    from .._turn._turn import TurnResult

__all__ = ["LOG_FORMATS", "LOG_LEVELS", "configure_logging", "log_run_end"]

LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMATS = ("text", "json")

logger = logging.getLogger("rillet.cli")


class _JSONFormatter(logging.Formatter):
    """One JSON object a line: time, level, logger, message, and the record's `fields`."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            entry.update(fields)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


def configure_logging(level: str, fmt: str) -> None:
    """Send every `rillet.*` record at `level` or above (and other libraries' warnings) to
    stderr, as `fmt` (text or json)."""
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(_JSONFormatter())
    else:
        handler.setFormatter(
            logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S")
        )
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    # `level` is rillet's; other libraries (httpx, httpcore) speak at warning and above only
    chosen = logging.getLevelNamesMapping()[level.upper()]
    root.setLevel(max(chosen, logging.WARNING))
    logging.getLogger("rillet").setLevel(chosen)


def log_run_end(result: TurnResult, provider: Provider) -> None:
    """The one INFO line a finished run leaves: who answered, how it ended, how long it took."""
    first = result.time_to_first_event
    outcome = result.outcome.label.title().replace("_", "")  # as it has always been spelt here
    fields = {
        "provider": provider.label,
        "model": provider.model,
        "outcome": outcome,
        "duration_s": round(result.total_time, 3),
        "first_event_s": round(first, 3) if first is not None else None,
        "attempts": result.attempts,
    }
    logger.info(
        "run ended: provider %s, model %s, outcome %s, %.3f s, first event %s, %d attempt(s)",
        provider.label,
        provider.model,
        outcome,
        result.total_time,
        f"{first:.3f} s" if first is not None else "never",
        result.attempts,
        extra={"fields": fields},
    )
