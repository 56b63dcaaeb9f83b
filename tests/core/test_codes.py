"""The safe codes: each error's code from its class and facts, the turn's code from its
outcome, and docs/codes.md in step with `RUN_CODES`."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from rillet import RUN_CODES
from rillet._core import _errors as errors
from rillet._core._codes import done_code, error_code, retryable
from rillet._core._policy import Outcome

DOC = Path(__file__).parents[2] / "docs" / "codes.md"


def provider(
    cls: type[errors.ProviderError], status: int | None, kind: str | None = None, said: str = ""
) -> errors.ProviderError:
    return cls("openai-chat", said, status=status, error_type=kind)


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (provider(errors.AuthenticationError, 401), "authentication_failed"),
        (provider(errors.AuthenticationError, 403), "permission_denied"),
        (provider(errors.AuthenticationError, None, "permission_error"), "permission_denied"),
        (
            provider(errors.AuthenticationError, 400, "invalid_argument", "API key not valid."),
            "authentication_failed",
        ),
        (provider(errors.ProviderError, 404), "model_not_found"),
        (provider(errors.ProviderError, None, "not_found_error"), "model_not_found"),
        (provider(errors.InvalidRequestError, 400), "invalid_request"),
        (provider(errors.ProviderError, 422), "invalid_request"),
        (provider(errors.InvalidRequestError, 400, "context_length_exceeded"), "context_too_long"),
        (provider(errors.ProviderError, 413, "request_too_large"), "context_too_long"),
        (provider(errors.ProviderError, 429, "insufficient_quota"), "quota_exceeded"),
        (provider(errors.ProviderError, 402), "quota_exceeded"),
        (provider(errors.RateLimitError, 429), "rate_limited"),
        (provider(errors.ServerError, 500), "provider_unavailable"),
        (provider(errors.OverloadedError, 529), "provider_unavailable"),
        (provider(errors.ProviderError, 502), "provider_unavailable"),
        (provider(errors.InvalidRequestError, 400, "content_policy_violation"), "content_filtered"),
        (provider(errors.ProviderError, 409), "provider_error"),
        (provider(errors.ProviderError, None), "provider_error"),
        (errors.TransportError("openai-chat", "ConnectError"), "connection_failed"),
        (errors.TransportError("openai-chat", "ReadError"), "connection_failed"),
        (errors.TurnTimeout("openai-chat", "total", 60), "timeout"),
        (
            errors.EmptyResponseError("gemini", "unknown", provider_reason="SAFETY"),
            "content_filtered",
        ),
        (errors.EmptyResponseError("openai-chat", "stop"), "empty_response"),
        (errors.StreamProtocolError("openai-chat", "orphan"), "protocol_error"),
        (errors.FrameTooLarge(10, 11), "protocol_error"),
        (
            errors.ToolCallArgumentParseError("openai-chat", "f", "c", "{", "cut"),
            "tool_arguments_invalid",
        ),
        (errors.ContextWindowExceeded(10, 5), "context_window_exceeded"),
        (errors.UpstreamError("ReadError"), "internal_error"),
        (RuntimeError("a sink broke"), "internal_error"),
        (None, "provider_error"),
    ],
    ids=lambda v: type(v).__name__ if not isinstance(v, str) else v,
)
def test_each_error_has_the_code_of_its_cause(error: BaseException | None, code: str) -> None:
    assert error_code(error) == code
    assert code in RUN_CODES


def test_a_failed_rescue_has_the_code_of_the_streams_failure() -> None:
    stream = provider(errors.ServerError, 500)
    both = errors.RescueFailed(Outcome.INIT_FAILED, stream, provider(errors.RateLimitError, 429))
    assert error_code(both) == "provider_unavailable"
    assert error_code(errors.RescueFailed(Outcome.INIT_FAILED, None, stream)) == (
        "provider_unavailable"
    )


def test_the_outcome_decides_before_the_error() -> None:
    auth = provider(errors.AuthenticationError, 401)
    assert done_code(Outcome.COMPLETED, None, "stop") == "completed"
    assert done_code(Outcome.RESCUED, None, "length") == "provider_length"
    assert done_code(Outcome.CANCELLED, auth, None) == "cancelled"
    assert done_code(Outcome.TOTAL_TIMEOUT, None, None) == "timeout"
    assert done_code(Outcome.INIT_FAILED, auth, None) == "authentication_failed"
    # a rate-limited end is `rate_limited`, unless the provider said it was overloaded
    assert done_code(Outcome.RATE_LIMITED, None, None) == "rate_limited"
    overloaded = provider(errors.OverloadedError, 503)
    assert done_code(Outcome.RATE_LIMITED, overloaded, None) == "provider_unavailable"


def test_retrying_helps_only_where_the_table_says() -> None:
    assert retryable("provider_unavailable")
    assert retryable("rate_limited")
    assert not retryable("authentication_failed")
    assert not retryable("quota_exceeded")
    assert not retryable("no_such_code")


def test_the_docs_table_is_the_code_table() -> None:
    rows = re.findall(r"^\| `([a-z_]+)` \| (yes|no) \| (.+?) \| (.+?) \|$", DOC.read_text(), re.M)
    documented = {code: (yes == "yes", meaning, action) for code, yes, meaning, action in rows}
    assert documented == {
        code: (info.retryable, info.meaning, info.action) for code, info in RUN_CODES.items()
    }
