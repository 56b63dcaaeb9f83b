"""What one attempt's reply says when it is not a stream to read: the error it carries.

An error status is read into the dialect's typed error (its body bounded in time and bytes; a
redirect is named by where it points, never followed), with the wait the server directs (a
header, else the body's hint; an unusable one counts as none, D5), the token limit a rate limit
states (its body, else `x-ratelimit-limit-tokens`) and its class on the ladders (`http_shape`,
`x-should-retry`); a streamed reply of the wrong Content-Type is a frame error (one labelled
JSON may be the whole reply); a transport's failure becomes the provider's `TransportError`;
an SSE stream's `error:` line is read as the provider's own error (`reported`). Every error is
scrubbed of the turn's own credential, should a provider echo it back. The handler
(`_handler`) decides what each such failure costs: a retry, a wait, the rescue, or the end.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, TypeVar

import attrs
import trio

from .._core._errors import (
    REDIRECT,
    FrameError,
    ProviderError,
    RateLimitError,
    RilletError,
    SSEErrorField,
    TransportError,
)
from .._core._failures import http_shape
from .._core._policy import FailureClass, Policy, retry_after
from .._core._reads import read_bounded
from ..providers._error_body import body_text, error_from_body, provider_error

if TYPE_CHECKING:
    from .._core._dialect import Provider
    from .._core._errors import UpstreamError
    from .._core._upstream import Exchange

__all__ = [
    "Failure",
    "check_content_type",
    "error_from_response",
    "reported",
    "scrubbed",
    "status_failure",
    "transport_error",
    "usable_wait",
]

_E = TypeVar("_E", bound=RilletError)
_STREAM_TYPES = {
    "sse": ("text/event-stream",),
    "ndjson": ("ndjson", "json", "text/plain"),
    "eventstream": ("vnd.amazon.eventstream",),
}


@attrs.define(eq=False)
class Failure:
    """How one attempt ended, when it did not complete."""

    shape: FailureClass
    error: BaseException
    status: int | None = None
    headers: Mapping[str, str] = attrs.field(factory=dict)
    no_retry: bool = False  # x-should-retry: false


def check_content_type(provider: Provider, response: Exchange) -> bool:
    """Whether a streamed reply may be one whole JSON document instead of a stream (an SSE
    dialect's reply labelled JSON: a server that ignored `"stream": true`, or one that
    mislabels its stream; `WireDecoder.sniff` tells which from its first byte). Raises a
    `FrameError` for a Content-Type that is neither its framing's nor JSON (an HTML page,
    F21)."""
    accepted = _STREAM_TYPES.get(provider.dialect.framing)
    if accepted is None:
        return False
    ctype = response.headers.get("content-type", "").lower()
    if not ctype or any(a in ctype for a in accepted):
        return False
    if provider.dialect.framing == "sse" and "json" in ctype:
        return True
    raise FrameError(
        f"a streaming request was answered with Content-Type {ctype[:80]!r}",
        provider=provider.label,
    )


async def status_failure(
    provider: Provider, policy: Policy, response: Exchange, deadline: float
) -> Failure:
    """An error status's verdict: its typed error, the wait it directs and its shape."""
    body = b""
    with trio.move_on_at(deadline):
        body = await read_bounded(response, policy.max_body, provider.label)
    status = response.status
    headers = response.headers
    location = headers.get("location", "")
    if 300 <= status < 400 and location:  # never followed: the key must not go elsewhere
        error: ProviderError = ProviderError(
            provider.label,
            f"redirected to {location[:200]}",
            status=status,
            error_type=REDIRECT,
        )
    else:
        error = error_from_response(provider, status, headers, body)
    error = scrubbed(provider, error)
    # the wait: a header wins over the hint the dialect read from the body (Gemini's
    # `RetryInfo`), which wins over the default; an unusable hint counts as none
    told = retry_after(headers, policy.wall_clock())
    if told is None:
        told = usable_wait(error.retry_after)
    error.retry_after = told
    if isinstance(error, RateLimitError) and error.token_limit is None:
        # the limit a rate limit on tokens did not state in its body (OpenAI's and Azure's)
        limit = headers.get("x-ratelimit-limit-tokens", "").strip()
        error.token_limit = int(limit) if limit.isdigit() else None
    should = headers.get("x-should-retry", "").strip().lower()
    shape = http_shape(status, error, should)
    return Failure(shape, error, status, headers, no_retry=should == "false")


def error_from_response(
    provider: Provider, status: int, headers: Mapping[str, str], body: bytes
) -> ProviderError:
    """The dialect's typed error for an error status; a body nested too deeply for its JSON
    decoder still gives the error the status names (never a crash)."""
    try:
        return provider.dialect.error_from_response(status, headers, body)
    except RecursionError:
        return provider_error(provider.label, status=status)


def scrubbed(provider: Provider, error: _E) -> _E:
    """The error with the provider's credential masked, should a provider have echoed it."""
    key = provider.api_key
    if key is not None and key.reveal() and key.reveal() in str(error):
        secret, masked = key.reveal(), key.masked()
        error.args = tuple(
            a.replace(secret, masked) if isinstance(a, str) else a for a in error.args
        )
        if isinstance(error, ProviderError):
            error.provider_message = error.provider_message.replace(secret, masked)
    return error


def usable_wait(seconds: float | None) -> float | None:
    """A server-directed wait that can be honoured: positive and finite, else None (D5)."""
    if seconds is None or not math.isfinite(seconds) or seconds <= 0:
        return None
    return seconds


def transport_error(exc: UpstreamError, provider: str) -> TransportError:
    """The transport's failure as the provider's `TransportError` (the transport's own
    exception stays its cause)."""
    error = TransportError(provider, exc.kind)
    error.__cause__ = exc.__cause__ if exc.__cause__ is not None else exc
    return error


def reported(provider: Provider, error: RilletError) -> RilletError:
    """An SSE stream's `error:` line (`SSEErrorField`) as the typed error of what it says: its
    JSON read as any provider error body is (`{"code", "message", "type"}`, `{"detail"}`), its
    plain text by its words; any other error as it is. The provider's report is its cause, so a
    request it says can never pass (a prompt past the context) is asked for once."""
    if not isinstance(error, SSEErrorField):
        return error
    found = error_from_body(provider.label, None, error.text, in_stream=True)
    if not found.provider_message:  # not JSON, or JSON of no known shape: its words
        found = provider_error(provider.label, message=body_text(error.text), in_stream=True)
    found.__cause__ = error
    return found
