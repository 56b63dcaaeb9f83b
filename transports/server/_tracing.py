"""The caller's trace, continued: a request's W3C `traceparent` becomes the current context
while the server answers it, so the spans of the run it starts (`RunOptions.telemetry`) sit
under the caller's, and the server's log lines name the trace.

Only with `opentelemetry-api` installed (`rillet[otel]`); without it, or without the header,
a request costs one dictionary look-up.
"""

from __future__ import annotations

import contextlib
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterator

    from ._http11 import Request

__all__ = ["continued", "trace_id"]

_NONE = contextlib.nullcontext()


def continued(request: Request) -> contextlib.AbstractContextManager[None]:
    """The block runs in the trace the request's `traceparent` (and `tracestate`) names."""
    headers = request.headers
    if "traceparent" not in headers:
        return _NONE
    try:
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
    except ImportError:  # the `otel` extra is not installed: nothing to continue it with
        return _NONE
    return _attached(TraceContextTextMapPropagator().extract(headers))


@contextlib.contextmanager
def _attached(context: object) -> Iterator[None]:
    from opentelemetry import context as otel_context

    token = otel_context.attach(context)  # type: ignore[arg-type]
    try:
        yield
    finally:
        otel_context.detach(token)


def trace_id() -> str | None:
    """The current trace's id (32 hex digits), if there is one: for the log lines."""
    trace = sys.modules.get("opentelemetry.trace")
    if trace is None:
        return None
    span = trace.get_current_span().get_span_context()
    return format(span.trace_id, "032x") if span.is_valid else None
