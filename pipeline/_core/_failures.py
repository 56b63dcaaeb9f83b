"""The failure taxonomy: for every error and every HTTP status, the ladder that handles it.

One table, consulted by the handler for every attempt that fails, so that no two places can
disagree about what is retried. The failure classes (`FailureClass`, in `_policy`):

- transport (`TRANSPORT`, and `STALL` for a deadline between events): the bytes did not arrive
  whole (connect or read error, reset, EOF before the terminal marker, a frame that is not
  JSON, 408, 5xx but 503/529, an in-stream overloaded or server error). Back off and retry;
  when the budget is spent, the rescue.
- rate limit (`RATE_LIMIT`): 429, 503, 529, `RateLimitError`. Wait as the server says, unless
  the request alone exceeds the limit the provider stated (`past_limit`): then no wait helps.
- permanent (`PERMANENT`): the same request would get the same answer (400, 401, 403, 404,
  409, 413, 422, grammar breaches, invalid tool arguments, a frame over the cap, quota errors
  such as `insufficient_quota`, and every local error). One attempt, no rescue.
- wrong shape (`WRONG_SHAPE`): valid JSON of the wrong shape for a known event. The same
  streaming request would get it again, so there is no second streamed attempt; the
  non-streaming rescue asks in another wire shape and may still bring the reply home.

Lookups walk an error's class hierarchy: the most specific class with an entry decides, and an
entry for a (class, cause) pair outranks the class alone. The cause is what the error says
about itself: a provider error's code (`insufficient_quota`), whether a malformed frame was JSON
at all, which deadline blew. For an HTTP error status the status decides, a quota code in the
body outranks it, and `x-should-retry: true` sends a permanent answer down the transport ladder
(`false` keeps the shape and stops retry and rescue: the handler's `no_retry`).
"""

from __future__ import annotations

import ssl
from typing import TYPE_CHECKING

from ._budget import least_tokens
from ._errors import (
    NOT_TLS_REASONS,
    REQUEST_TOO_LARGE,
    UNCURABLE_CODES,
    AppendConflict,
    AuthenticationError,
    ConfigurationError,
    ContextWindowExceeded,
    CostLimitExceeded,
    CursorExpired,
    CursorInvalid,
    EmptyResponseError,
    EventStreamFrameError,
    FrameEncodingError,
    FrameError,
    FrameTooLarge,
    HubError,
    HubUnavailable,
    IncompleteStreamError,
    InvalidRequestError,
    MalformedFrameError,
    NoHistoryError,
    OverloadedError,
    ProviderError,
    RateLimitError,
    RescueFailed,
    RilletError,
    RunEventGap,
    RunExists,
    RunFailed,
    ServerError,
    SSEEncodeError,
    SSEErrorField,
    StreamError,
    StreamProtocolError,
    SubscriberDropped,
    ToolCallArgumentParseError,
    TransportError,
    TurnTimeout,
    UnknownRun,
    UnsupportedContentError,
    UnsupportedOperationError,
    UpstreamError,
    causes,
)
from ._policy import FailureClass

if TYPE_CHECKING:
    from collections.abc import Mapping

    from ._request import TurnRequest

__all__ = [
    "CAUSE_SHAPES",
    "ERROR_SHAPES",
    "PERMANENT_CODES",
    "RETRY_REASONS",
    "STATUS_SHAPES",
    "cause_of",
    "error_shape",
    "http_shape",
    "past_limit",
    "retry_reason",
    "status_shape",
]

T, R, P, W = (
    FailureClass.TRANSPORT,
    FailureClass.RATE_LIMIT,
    FailureClass.PERMANENT,
    FailureClass.WRONG_SHAPE,
)

ERROR_SHAPES: Mapping[type[RilletError], FailureClass] = {
    RilletError: P,  # an error of ours we did not foresee: never paid for twice
    FrameError: T,  # bytes that cannot be framed (a non-stream Content-Type, F21)
    FrameTooLarge: P,  # the same frame would come back (F26)
    FrameEncodingError: T,  # invalid UTF-8 in an NDJSON line: corrupted on the way (F24)
    EventStreamFrameError: T,  # an AWS event-stream CRC or length: corrupted on the way (S54)
    MalformedFrameError: W,  # valid JSON of the wrong shape, nesting past the decoder (F54)
    SSEErrorField: T,  # a stream's `error:` line; the handler reads it as the provider's (S50)
    SSEEncodeError: P,
    ConfigurationError: P,
    UnsupportedContentError: P,
    UnsupportedOperationError: P,
    NoHistoryError: P,
    StreamError: P,
    StreamProtocolError: P,  # the grammar breached (F43)
    IncompleteStreamError: T,  # EOF before the terminal marker (F07)
    EmptyResponseError: P,  # a reply of thinking only (F45)
    ToolCallArgumentParseError: P,  # arguments that do not parse (F44)
    TransportError: T,  # connect, read, reset (F09, F10)
    TurnTimeout: FailureClass.STALL,  # a deadline between events (F03-F05)
    RescueFailed: P,  # a turn's end, never an attempt's
    ProviderError: T,  # an in-stream error of no known type
    RateLimitError: R,  # in-stream rate limits (F17)
    OverloadedError: T,  # in-stream overloaded (F17); as a status, 503/529 are rate limits
    ServerError: T,  # in-stream server errors (F17)
    InvalidRequestError: P,  # in-stream invalid request (F17)
    AuthenticationError: P,
    UpstreamError: T,  # the transport's own failure; the handler makes it a TransportError
    ContextWindowExceeded: P,  # nothing was sent: the same prompt would not fit again
    CostLimitExceeded: P,  # the run's money is spent: asking again costs more, not less
    HubError: P,  # the hub's refusals are no attempt's
    UnknownRun: P,
    RunExists: P,
    AppendConflict: P,
    HubUnavailable: P,
    CursorInvalid: P,
    CursorExpired: P,
    SubscriberDropped: P,
    RunEventGap: P,
    RunFailed: P,  # a run's end, never an attempt's
}
"""The shape of each error class (its own, before any cause)."""

PERMANENT_CODES = UNCURABLE_CODES
"""Provider error codes that no retry or wait cures: the account must change first (F55), or
the request must shrink (`request_too_large`)."""

CAUSE_SHAPES: Mapping[tuple[type[RilletError], str], FailureClass] = {
    (MalformedFrameError, "not_json"): T,  # cut short or corrupted on the way (F22)
    (TurnTimeout, "total"): FailureClass.TOTAL,  # the turn's total deadline (F06)
    (TransportError, "tls_refused"): P,  # a certificate refused, a server speaking no TLS
    (TransportError, "unsendable"): P,  # a request the client itself will not send as it is
    (TransportError, "not_http"): P,  # a server that answers in something else (TLS, SSH)
    **{(ProviderError, code): P for code in sorted(PERMANENT_CODES)},
}
"""Causes that outrank their class's shape."""

STATUS_SHAPES: Mapping[int, FailureClass] = {
    400: P,
    401: P,
    403: P,
    404: P,
    408: T,  # request timeout: the server gave up waiting, another try may pass
    409: P,
    413: P,
    422: P,
    429: R,
    500: T,
    502: T,
    503: R,
    504: T,
    529: R,
}
"""The statuses named by the rules; any other 5xx is transport-shaped, any other status
(a 3xx not followed, another 4xx) permanent (D6)."""


def status_shape(status: int) -> FailureClass:
    """The shape an HTTP error status names."""
    shape = STATUS_SHAPES.get(status)
    if shape is not None:
        return shape
    return T if 500 <= status <= 599 else P


def cause_of(error: BaseException) -> str | None:
    """What the error says about itself that can change its shape: a provider error's code, a
    malformed frame's `not_json` / `wrong_shape`, a timeout's deadline, a connection's TLS
    handshake that cannot pass (`tls_refused`), a request the client will not send
    (`unsendable`), a peer that does not speak HTTP (`not_http`)."""
    if isinstance(error, TransportError):
        if error.kind in _REQUEST_UNSENDABLE:
            return "unsendable"
        if error.kind == "RemoteProtocolError" and _not_http(error):
            return "not_http"
        return "tls_refused" if _tls_refused(error) else None
    if isinstance(error, MalformedFrameError):
        return "not_json" if error.not_json else "wrong_shape"
    if isinstance(error, TurnTimeout):
        return error.deadline
    if isinstance(error, ProviderError) and error.error_type:
        return error.error_type.lower()
    return None


_REQUEST_UNSENDABLE = frozenset({"LocalProtocolError", "UnsupportedProtocol"})
"""httpx's failures of a request it refuses to send (a header it cannot write, a URL scheme it
does not speak): the same request fails the same way, before a byte reaches the provider."""


_NOT_HTTP = ("illegal status line", "illegal request line")
"""What h11 says of a reply whose first line is no HTTP status line: a TLS server's alert (an
`http://` URL for an `https://` port), an SSH or Redis banner. It answers every try the same."""


def _not_http(error: BaseException) -> bool:
    """Whether the connection's peer answered in something other than HTTP."""
    return any(any(said in str(exc) for said in _NOT_HTTP) for exc in causes(error))


def _tls_refused(error: BaseException) -> bool:
    """Whether a connection failed on a TLS handshake the same request would fail again: a
    certificate that does not verify, or a server that does not speak TLS (a plain-HTTP one on
    an `https://` URL). A handshake cut off by a reset may pass next time, so it is not one."""
    return any(
        isinstance(exc, ssl.SSLCertVerificationError)
        or (isinstance(exc, ssl.SSLError) and exc.reason in NOT_TLS_REASONS)
        for exc in causes(error)
    )


def error_shape(error: BaseException) -> FailureClass:
    """The shape of an attempt that ended with `error` (raised while streaming or sending)."""
    if not isinstance(error, RilletError):
        return T
    cause = cause_of(error)
    mro = type(error).__mro__
    if cause is not None:
        for cls in mro:
            shape = CAUSE_SHAPES.get((cls, cause))
            if shape is not None:
                return shape
    if type(error) is ProviderError and error.status is not None:
        # an error of no known type that names a status (an in-stream `"code": 404`, or a type
        # that implies one): shaped as that status is, so a missing model is asked for once
        return status_shape(error.status)
    for cls in mro:
        shape = ERROR_SHAPES.get(cls)
        if shape is not None:
            return shape
    return P  # not reached: every RilletError has RilletError in its hierarchy


def http_shape(status: int, error: ProviderError, should_retry: str = "") -> FailureClass:
    """The shape of an HTTP error answer: its status, unless the body's code is a permanent one;
    then `x-should-retry: true` sends a permanent one down the transport ladder."""
    cause = cause_of(error)
    if cause is not None and (ProviderError, cause) in CAUSE_SHAPES:
        shape = CAUSE_SHAPES[ProviderError, cause]
    else:
        shape = status_shape(status)
    if should_retry == "true" and shape is FailureClass.PERMANENT:
        shape = FailureClass.TRANSPORT
    return shape


def past_limit(error: BaseException | None, request: TurnRequest) -> ProviderError | None:
    """A rate limit the request alone exceeds, which no wait can cure: its stated token limit
    (`ProviderError.token_limit`) below what the request needs (what the provider said it asked
    for, else the least the request can take: `rillet._core._budget.least_tokens`). It comes
    back as the plain `ProviderError` carrying `request_too_large` that is asked for once (a
    code no retry or wait cures); None for any other error."""
    if not isinstance(error, RateLimitError) or error.token_limit is None:
        return None
    asked = error.tokens_needed
    if asked is None:
        asked = least_tokens(request)
    if asked <= error.token_limit:
        return None
    refused = ProviderError(
        error.provider,
        error.provider_message,
        status=error.status,
        error_type=REQUEST_TOO_LARGE,
        in_stream=error.in_stream,
        provider_fields=error.provider_fields,
    )
    refused.token_limit, refused.tokens_needed = error.token_limit, asked
    refused.__cause__ = error
    return refused


RETRY_REASONS = (
    "connect_failed",
    "connection_lost",
    "stalled",
    "overloaded",
    "server_error",
    "unreadable_stream",
    "provider_error",
)
"""The safe codes a retry's `status` event names its cause with (`retry_reason`)."""


def retry_reason(error: BaseException | None) -> str:
    """Why an attempt is retried, as a safe code (`RETRY_REASONS`): what a person waiting on the
    retry is told, never the provider's own words."""
    if isinstance(error, TransportError):
        return "connect_failed" if error.kind.startswith("Connect") else "connection_lost"
    if isinstance(error, IncompleteStreamError):
        return "connection_lost"  # the bytes stopped before the reply's end
    if isinstance(error, TurnTimeout):
        return "stalled"
    if isinstance(error, OverloadedError):
        return "overloaded"
    if isinstance(error, ProviderError) and (
        isinstance(error, ServerError) or (error.status is not None and error.status >= 500)
    ):
        return "server_error"
    if isinstance(error, FrameError):
        return "unreadable_stream"  # not JSON, bad UTF-8: corrupted on the way
    return "provider_error"
