"""The safe codes a run ends with: one per cause, what each means, and whether retrying helps.

Every surface that tells why a run failed (the `run.done` event, the JSON Lines sink, the AI SDK
UI stream, the OpenAI-compatible endpoint's error object, MCP tool results, the command line)
reads its code from here: `done_code` for a turn's end, `error_code` for an error. A code is a
word of ours, never the provider's: a provider's message may echo the key it was sent.

`RUN_CODES` is the table: for each code, whether asking again (the same request, later) can
help, what it means and what to do. docs/codes.md prints it; a test keeps the two the same.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

from ._errors import (
    CONTENT_POLICY_CODES,
    QUOTA_CODES,
    REQUEST_TOO_LARGE,
    AuthenticationError,
    ConfigurationError,
    ContextWindowExceeded,
    CostLimitExceeded,
    EmptyResponseError,
    FrameError,
    InvalidRequestError,
    OverloadedError,
    ProviderError,
    RateLimitError,
    RescueFailed,
    RilletError,
    ServerError,
    StreamProtocolError,
    ToolCallArgumentParseError,
    TransportError,
    TurnTimeout,
    UnsupportedContentError,
    UnsupportedOperationError,
    UpstreamError,
    not_found,
    past_context,
)
from ._finish import filtered_reason
from ._policy import Outcome

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = ["RUN_CODES", "CodeInfo", "describe", "done_code", "error_code", "retryable"]


@attrs.frozen
class CodeInfo:
    """What one safe code says.

    Attributes:
        retryable: whether asking again, unchanged, can help (after `retry_after_ms`, if the
            run named one): where a page offers Retry.
        meaning: what happened, in a person's words.
        action: what to do about it.
    """

    retryable: bool
    meaning: str
    action: str

    @property
    def sentence(self) -> str:
        """What happened and what to do, as one line: `meaning — action`."""
        return f"{self.meaning} — {self.action}"


RUN_CODES: Mapping[str, CodeInfo] = {
    "completed": CodeInfo(False, "the answer came home", "nothing"),
    "authentication_failed": CodeInfo(
        False, "the provider refused the API key (401, or a key it calls invalid)", "fix the key"
    ),
    "permission_denied": CodeInfo(
        False,
        "the key is valid but may not use this model or endpoint (403)",
        "use a key or project that has access, or another model",
    ),
    "model_not_found": CodeInfo(
        False,
        "the provider does not know the model, or the base URL misses the API's path (404)",
        "check the model's name and the base URL",
    ),
    "invalid_request": CodeInfo(
        False,
        "the provider refused the request as it is (400, 422): an option or a message it"
        " does not take",
        "change the request (its options, its messages, the model)",
    ),
    "context_too_long": CodeInfo(
        False,
        "the conversation (or the request) is longer than the model or the provider takes",
        "shorten the conversation, lower max_tokens, or pick a model with a larger window",
    ),
    "quota_exceeded": CodeInfo(
        False,
        "the account has no quota or credit left for this request (billing, a spent plan)",
        "check the account's plan and billing",
    ),
    "rate_limited": CodeInfo(
        True,
        "the provider is limiting how often it is asked (429)",
        "wait (retry_after_ms, when given) and ask again",
    ),
    "provider_unavailable": CodeInfo(
        True,
        "the provider failed or is overloaded (5xx, 503, 529) and retries did not get through",
        "ask again shortly",
    ),
    "connection_failed": CodeInfo(
        True,
        "the provider could not be reached: a name that did not resolve, a refused or reset"
        " connection, a TLS handshake that failed",
        "check the base URL and the network, then ask again",
    ),
    "content_filtered": CodeInfo(
        False,
        "the provider's content rules refused the request or withheld the answer",
        "rephrase the request",
    ),
    "timeout": CodeInfo(
        True,
        "no answer within a deadline (the first event, between events, or the whole turn)",
        "ask again, or raise the deadline if the model needs longer",
    ),
    "cancelled": CodeInfo(True, "the run was stopped before it completed", "ask again if wanted"),
    "provider_error": CodeInfo(
        True,
        "the provider reported an error none of the other codes names",
        "ask again; if it persists, read the server's log for the provider's words",
    ),
    "empty_response": CodeInfo(
        True,
        "the model finished without an answer (reasoning only, or nothing that is read)",
        "ask again, or raise max_tokens",
    ),
    "provider_length": CodeInfo(
        False,
        "the answer was cut off at the token limit: the text is incomplete",
        "raise max_tokens",
    ),
    "protocol_error": CodeInfo(
        False,
        "the provider's stream broke the protocol or could not be read",
        "check that the base URL and the provider's kind match the server",
    ),
    "tool_arguments_invalid": CodeInfo(
        True,
        "the model called a tool with arguments that are not a JSON object",
        "ask again",
    ),
    "internal_error": CodeInfo(
        False,
        "rillet or the application failed (a sink, a tool runner), not the provider",
        "read the application's log",
    ),
    "max_steps": CodeInfo(
        False, "the agent reached its step limit without an answer", "raise max_steps"
    ),
    "answer_rejected": CodeInfo(
        False,
        "every candidate answer the agent drew was rejected by its validator",
        "relax the validator, or raise max_candidates",
    ),
    "circuit_open": CodeInfo(
        True,
        "every provider of the chain is resting after failing in a row",
        "ask again once the breakers' cool-down has passed",
    ),
    ContextWindowExceeded.code: CodeInfo(
        False,
        "what must be sent does not fit the context budget; nothing was sent",
        "shorten the question or raise the budget",
    ),
    CostLimitExceeded.code: CodeInfo(
        False,
        "the run reached its spending limit (max_cost): the next request was not sent, or the "
        "reply was cut at what the rest would buy",
        "raise max_cost, or ask a shorter question",
    ),
    "approval_required": CodeInfo(
        False,
        "a tool waits for a person's approval (approvals deferred)",
        "approve or deny it, then resume",
    ),
    "log_unavailable": CodeInfo(
        True,
        "the run's log could not be kept (the hub's storage was unreachable)",
        "ask again",
    ),
    "server_lost": CodeInfo(
        True,
        "the server running the run stopped while it ran (its lease in the shared hub expired)",
        "ask again",
    ),
}
"""Every code `run.done` carries, with whether retrying helps, its meaning and what to do."""


def describe(code: str) -> str:
    """The code and its sentence in one line (`rate_limited: the provider is limiting ... —
    wait ...`), for a wire that carries only text (the AI SDK UI stream's error part): a
    reader can show it whole, or key on the code before the colon."""
    info = RUN_CODES.get(code)
    return f"{code}: {info.sentence}" if info is not None else code


def retryable(code: str) -> bool:
    """Whether asking again, unchanged, can help a run that ended with `code` (an unknown code:
    no)."""
    info = RUN_CODES.get(code)
    return info is not None and info.retryable


_PERMISSION_TYPES = frozenset({"permission_error", "permission_denied"})
_LOCAL_REFUSALS = (ConfigurationError, UnsupportedContentError, UnsupportedOperationError)


def error_code(error: BaseException | None) -> str:
    """The safe code of the error that ended a run: its class and its facts (status, the
    provider's error type) decide, never its message. None (no error to read): `provider_error`.
    """
    if isinstance(error, RescueFailed):  # the stream's failure is the cause; the rescue followed
        error = error.stream_error or error.rescue_error
    if error is None:
        return "provider_error"
    # a sink's or an actor's own failure, not the provider's: a bare UpstreamError too, since
    # the handler makes a TransportError of every one a provider's transport raises
    if not isinstance(error, RilletError) or isinstance(error, UpstreamError):
        return "internal_error"
    if isinstance(error, ProviderError):
        return _provider_code(error)
    if isinstance(error, TransportError):
        return "connection_failed"
    if isinstance(error, TurnTimeout):
        return "timeout"
    if isinstance(error, EmptyResponseError):
        filtered = filtered_reason(error.provider_reason)
        return "content_filtered" if filtered else "empty_response"
    if isinstance(error, ToolCallArgumentParseError):
        return "tool_arguments_invalid"
    if isinstance(error, StreamProtocolError | FrameError):
        return "protocol_error"
    if isinstance(error, ContextWindowExceeded | CostLimitExceeded):
        return error.code
    if isinstance(error, _LOCAL_REFUSALS):
        return "invalid_request"
    return "provider_error"


def _provider_code(error: ProviderError) -> str:
    """The code of an error the provider reported: the status and the provider's error type,
    most specific first (a quota code outranks the 429 it came with)."""
    kind = (error.error_type or "").lower()
    status = error.status
    if kind in QUOTA_CODES or status == 402:  # 402 Payment Required: credits spent (OpenRouter)
        return "quota_exceeded"
    if kind == REQUEST_TOO_LARGE or past_context(error):
        return "context_too_long"
    if kind in CONTENT_POLICY_CODES:
        return "content_filtered"
    if isinstance(error, AuthenticationError) or status in (401, 403):
        denied = status == 403 or kind in _PERMISSION_TYPES
        return "permission_denied" if denied else "authentication_failed"
    if isinstance(error, RateLimitError):
        return "rate_limited"
    if isinstance(error, OverloadedError | ServerError) or (status is not None and status >= 500):
        return "provider_unavailable"
    if not_found(error):
        return "model_not_found"
    if isinstance(error, InvalidRequestError) or status in (400, 422):
        return "invalid_request"
    return "provider_error"


def done_code(outcome: Outcome, error: BaseException | None, finish_reason: str | None) -> str:
    """The code a turn's `run.done` carries: `completed`, `provider_length` for a reply cut at
    its token limit, `cancelled`, `timeout` for a blown deadline, else the error's code (a run
    that waited out its rate limit: `rate_limited`, or `provider_unavailable` when the provider
    said it was overloaded)."""
    if outcome.succeeded:
        if finish_reason != "length":
            return "completed"
        return error.code if isinstance(error, CostLimitExceeded) else "provider_length"
    if outcome is Outcome.CANCELLED:
        return "cancelled"
    if outcome in (Outcome.TOTAL_TIMEOUT, Outcome.EVENT_TIMEOUT):
        return "timeout"
    code = error_code(error)
    if outcome is Outcome.RATE_LIMITED and code not in ("provider_unavailable", "quota_exceeded"):
        return "rate_limited"
    return code
