"""The error shapes of every provider map onto the typed errors: the status, the type, the
message a person reads, whether it is worth asking again."""

from __future__ import annotations

import json
from typing import Any

import pytest
from rillet import (
    AuthenticationError,
    InvalidRequestError,
    OverloadedError,
    ProviderError,
    RateLimitError,
    ServerError,
)
from rillet.providers import AnthropicDialect
from rillet.providers._error_body import error_from_body, provider_error

# --- provider error shapes --------------------------------------------------------------------

SHAPES: list[tuple[str, int | None, Any, type[ProviderError], str | None, str]] = [
    # OpenAI / Chat Completions
    (
        "openai 400",
        400,
        {
            "error": {
                "message": "Invalid 'messages'",
                "type": "invalid_request_error",
                "param": "messages",
                "code": None,
            }
        },
        InvalidRequestError,
        "invalid_request_error",
        "Invalid 'messages'",
    ),
    (
        "openai 429 code",
        429,
        {
            "error": {
                "message": "Rate limit reached",
                "type": "requests",
                "param": None,
                "code": "rate_limit_exceeded",
            }
        },
        RateLimitError,
        "rate_limit_exceeded",
        "Rate limit reached",
    ),
    (
        "openai 429 quota",  # no wait cures it: a plain (permanent) ProviderError, not a rate limit
        429,
        {"error": {"message": "quota", "type": "insufficient_quota", "code": "insufficient_quota"}},
        ProviderError,
        "insufficient_quota",
        "quota",
    ),
    (
        "openai 500",
        500,
        {"error": {"message": "The server had an error", "type": "server_error", "code": None}},
        ServerError,
        "server_error",
        "The server had an error",
    ),
    (
        "openai in stream",
        None,
        {"error": {"message": "boom", "type": "server_error"}},
        ServerError,
        "server_error",
        "boom",
    ),
    (
        "openrouter 429",
        None,
        {"error": {"code": 429, "message": "Rate limited upstream", "metadata": {}}},
        RateLimitError,
        None,
        "Rate limited upstream",
    ),
    (
        "openrouter 502",
        502,
        {"error": {"code": 502, "message": "Upstream down"}},
        ServerError,
        None,
        "Upstream down",
    ),
    # Anthropic
    (
        "anthropic 400",
        400,
        {
            "type": "error",
            "error": {"type": "invalid_request_error", "message": "max_tokens: required"},
            "request_id": "req_1",
        },
        InvalidRequestError,
        "invalid_request_error",
        "max_tokens: required",
    ),
    (
        "anthropic 401",
        401,
        {
            "type": "error",
            "error": {"type": "authentication_error", "message": "invalid x-api-key"},
        },
        AuthenticationError,
        "authentication_error",
        "invalid x-api-key",
    ),
    (
        "anthropic 403",
        403,
        {"type": "error", "error": {"type": "permission_error", "message": "no access"}},
        AuthenticationError,
        "permission_error",
        "no access",
    ),
    (
        "anthropic 429",
        429,
        {"type": "error", "error": {"type": "rate_limit_error", "message": "slow down"}},
        RateLimitError,
        "rate_limit_error",
        "slow down",
    ),
    (
        "anthropic 500",
        500,
        {"type": "error", "error": {"type": "api_error", "message": "Internal server error"}},
        ServerError,
        "api_error",
        "Internal server error",
    ),
    (
        "anthropic 529",
        529,
        {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
        OverloadedError,
        "overloaded_error",
        "Overloaded",
    ),
    (
        "anthropic in stream",
        None,
        {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
        OverloadedError,
        "overloaded_error",
        "Overloaded",
    ),
    (
        "anthropic 404",
        404,
        {"type": "error", "error": {"type": "not_found_error", "message": "model: x"}},
        InvalidRequestError,  # an unknown model is one type for every provider
        "not_found_error",
        "model: x",
    ),
    # Gemini
    (
        "gemini 400",
        400,
        {"error": {"code": 400, "message": "bad", "status": "INVALID_ARGUMENT"}},
        InvalidRequestError,
        "INVALID_ARGUMENT",
        "bad",
    ),
    (
        "gemini 401",
        401,
        {"error": {"code": 401, "message": "no key", "status": "UNAUTHENTICATED"}},
        AuthenticationError,
        "UNAUTHENTICATED",
        "no key",
    ),
    (
        "gemini 403",
        403,
        {"error": {"code": 403, "message": "denied", "status": "PERMISSION_DENIED"}},
        AuthenticationError,
        "PERMISSION_DENIED",
        "denied",
    ),
    (
        "gemini 429",
        429,
        {"error": {"code": 429, "message": "quota", "status": "RESOURCE_EXHAUSTED"}},
        RateLimitError,
        "RESOURCE_EXHAUSTED",
        "quota",
    ),
    (
        "gemini 500",
        500,
        {"error": {"code": 500, "message": "internal", "status": "INTERNAL"}},
        ServerError,
        "INTERNAL",
        "internal",
    ),
    (
        "gemini 503",
        503,
        {"error": {"code": 503, "message": "The model is overloaded.", "status": "UNAVAILABLE"}},
        OverloadedError,
        "UNAVAILABLE",
        "The model is overloaded.",
    ),
    (
        "gemini in stream",
        None,
        {"error": {"code": 503, "message": "The model is overloaded.", "status": "UNAVAILABLE"}},
        OverloadedError,
        "UNAVAILABLE",
        "The model is overloaded.",
    ),
    # Ollama
    (
        "ollama 404",
        404,
        {"error": 'model "qwen9" not found, try pulling it first'},
        InvalidRequestError,
        None,
        'model "qwen9" not found, try pulling it first',
    ),
    ("ollama 400", 400, {"error": "invalid options"}, InvalidRequestError, None, "invalid options"),
    ("ollama 500", 500, {"error": "runner crashed"}, ServerError, None, "runner crashed"),
    ("ollama in stream", None, {"error": "runner crashed"}, ProviderError, None, "runner crashed"),
    # vLLM
    (
        "vllm 400",
        400,
        {
            "object": "error",
            "message": "max_tokens too large",
            "type": "BadRequestError",
            "param": None,
            "code": 400,
        },
        InvalidRequestError,
        "BadRequestError",
        "max_tokens too large",
    ),
    (
        "vllm in stream",
        None,
        {"object": "error", "message": "engine dead", "type": "InternalServerError", "code": 500},
        ServerError,
        "InternalServerError",
        "engine dead",
    ),
    (
        "vllm nested",
        None,
        {"error": {"message": "bad", "type": "BadRequestError", "param": None, "code": 400}},
        InvalidRequestError,
        "BadRequestError",
        "bad",
    ),
]


@pytest.mark.parametrize("in_stream", [False, True], ids=["http", "stream"])
@pytest.mark.parametrize(
    ("status", "body", "cls", "error_type", "message"),
    [s[1:] for s in SHAPES],
    ids=[s[0] for s in SHAPES],
)
def test_error_shapes_map_onto_typed_errors(
    status: int | None,
    body: Any,
    cls: type[ProviderError],
    error_type: str | None,
    message: str,
    in_stream: bool,
) -> None:
    for given in (json.dumps(body).encode(), json.dumps(body), body):
        error = error_from_body("prov", status, given, in_stream=in_stream)
        assert type(error) is cls
        assert error.provider == "prov"
        assert error.provider_message == message
        assert error.in_stream is in_stream
        if error_type is not None:
            assert error.error_type == error_type
        if status is not None:
            assert error.status == status


def test_an_error_code_in_the_body_stands_for_the_status_in_a_stream() -> None:
    error = error_from_body("gemini", None, {"error": {"code": 503, "message": "m"}})
    assert type(error) is OverloadedError
    assert error.status == 503


def test_the_http_status_wins_over_a_code_in_the_body() -> None:
    error = error_from_body("x", 500, {"error": {"code": 429, "message": "m"}})
    assert error.status == 500


@pytest.mark.parametrize(
    ("status", "cls"),
    [
        (400, InvalidRequestError),
        (401, AuthenticationError),
        (403, AuthenticationError),
        (404, InvalidRequestError),
        (408, ProviderError),
        (429, RateLimitError),
        (500, ServerError),
        (502, ServerError),
        (503, OverloadedError),
        (504, ServerError),
        (529, OverloadedError),
    ],
)
def test_a_body_that_is_not_json_is_typed_by_status(status: int, cls: type[ProviderError]) -> None:
    error = error_from_body("x", status, b"<html>Bad Gateway</html>")
    assert type(error) is cls
    assert error.status == status
    assert error.provider_message == "an HTML page: Bad Gateway"  # its words, on one line


def test_a_body_of_another_shape_is_typed_by_status() -> None:
    assert type(error_from_body("x", 429, b"[1, 2]")) is RateLimitError
    assert type(error_from_body("x", 500, {"unexpected": True})) is ServerError
    assert type(error_from_body("x", None, b"\xff\xfe")) is ProviderError
    assert type(error_from_body("x", None, {"error": None})) is ProviderError


def test_openai_401_is_an_authentication_error() -> None:
    body = {
        "error": {
            "message": "Incorrect API key provided: sk-proj-****WXYZ.",
            "type": "invalid_request_error",
            "param": None,
            "code": "invalid_api_key",
        }
    }
    assert type(error_from_body("openai-chat", 401, body)) is AuthenticationError


def test_provider_error_first_known_type_decides() -> None:
    error = provider_error("x", status=500, error_types=(None, "weird", "RESOURCE_EXHAUSTED"))
    assert type(error) is RateLimitError
    assert error.error_type == "RESOURCE_EXHAUSTED"
    assert error.status == 500


@pytest.mark.parametrize(
    ("status", "cls"),
    [(401, AuthenticationError), (403, AuthenticationError), (429, RateLimitError)],
)
def test_an_auth_or_rate_limit_status_outranks_the_body_type(
    status: int, cls: type[ProviderError]
) -> None:
    body = {"error": {"message": "m", "type": "invalid_request_error"}}
    assert type(error_from_body("x", status, body)) is cls


def test_provider_error_falls_back_to_status_then_to_provider_error() -> None:
    assert type(provider_error("x", status=529, error_types=("weird",))) is OverloadedError
    assert type(provider_error("x", status=418)) is ProviderError
    assert type(provider_error("x")) is ProviderError


def test_provider_error_types_are_case_insensitive() -> None:
    assert type(provider_error("x", error_types=("Overloaded_Error",))) is OverloadedError
    assert type(provider_error("x", error_types=("unavailable",))) is OverloadedError


def test_provider_error_carries_retry_after_and_in_stream() -> None:
    error = provider_error(
        "x", status=429, message="wait", in_stream=True, retry_after=2.0, error_types=()
    )
    assert (error.retry_after, error.in_stream, error.provider_message) == (2.0, True, "wait")


def test_the_anthropic_dialect_types_an_http_error() -> None:
    body = b'{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}'
    error = AnthropicDialect().error_from_response(529, {}, body)
    assert type(error) is OverloadedError
    assert error.status == 529


def test_the_error_objects_own_type_code_and_param_are_kept_as_spelt() -> None:
    said = {
        "message": "Unsupported value: 'temperature' does not support 0.2 with this model.",
        "type": "invalid_request_error",
        "param": "temperature",
        "code": "unsupported_value",
    }
    error = error_from_body("openai-chat", 400, json.dumps({"error": said}).encode())
    assert dict(error.provider_fields) == {
        "type": "invalid_request_error",
        "code": "unsupported_value",
        "param": "temperature",
    }
    # what is not a string (Gemini's numeric code, a null param) is not the provider's word
    gemini = {"error": {"code": 400, "message": "bad", "status": "INVALID_ARGUMENT"}}
    assert dict(error_from_body("gemini", 400, json.dumps(gemini).encode()).provider_fields) == {}


# --- the token limit a rate limit states (S51) ---------------------------------------------------


def _google_quota(quota_id: str, metric: str, value: str) -> dict[str, Any]:
    violation = {"quotaId": quota_id, "quotaMetric": metric, "quotaValue": value}
    return {
        "error": {
            "code": 429,
            "message": "You exceeded your current quota.",
            "status": "RESOURCE_EXHAUSTED",
            "details": [
                {"@type": "type.googleapis.com/google.rpc.QuotaFailure", "violations": [violation]}
            ],
        }
    }


def _openai_429(message: str, code: str = "rate_limit_exceeded") -> dict[str, Any]:
    return {"error": {"message": message, "type": "tokens", "param": None, "code": code}}


@pytest.mark.parametrize(
    ("body", "limit", "asked"),
    [
        (
            _google_quota(
                "GenerateContentPaidTierInputTokensPerModelPerMinute",
                "generativelanguage.googleapis.com/generate_content_paid_tier_input_token_count",
                "1000000",
            ),
            1_000_000,
            None,
        ),
        (  # a quota on requests says nothing of tokens
            _google_quota(
                "GenerateRequestsPerMinutePerProjectPerModel-FreeTier",
                "generativelanguage.googleapis.com/generate_content_free_tier_requests",
                "5",
            ),
            None,
            None,
        ),
        (  # OpenAI's ordinary per-minute limit: the request fits, the minute is spent
            _openai_429(
                "Rate limit reached for gpt-4o in organization org-x on tokens per min (TPM):"
                " Limit 30000, Used 27000, Requested 6000. Please try again in 6s."
            ),
            30_000,
            6_000,
        ),
        (  # and on requests: no token limit
            _openai_429(
                "Rate limit reached for gpt-4o in organization org-x on requests per min (RPM):"
                " Limit 3, Used 3, Requested 1. Please try again in 20s.",
                "rate_limit_exceeded",
            ),
            None,
            1,
        ),
        (
            {
                "error": {
                    "code": "RateLimitReached",
                    "message": "Rate limit of 40000 per 60s exceeded for UserByModelByMinuteTokens."
                    " Please wait 60 seconds before retrying.",
                }
            },
            40_000,
            None,
        ),
        (
            {
                "type": "error",
                "error": {
                    "type": "rate_limit_error",
                    "message": "This request would exceed the rate limit for your organization of"
                    " 20,000 input tokens per minute.",
                },
            },
            20_000,
            None,
        ),
    ],
    ids=[
        "gemini-input-tokens",
        "gemini-requests",
        "openai-tpm",
        "openai-rpm",
        "foundry",
        "anthropic",
    ],
)
def test_a_rate_limit_keeps_the_token_limit_it_states(
    body: dict[str, Any], limit: int | None, asked: int | None
) -> None:
    error = error_from_body("x", 429, json.dumps(body).encode())
    assert type(error) is RateLimitError  # still a limit a wait may cure: the handler judges
    assert (error.token_limit, error.tokens_needed) == (limit, asked)


@pytest.mark.parametrize("code", ["RequestTooLarge", "request_too_large", "Request too large"])
def test_a_rate_limit_whose_code_says_the_request_is_too_large_is_not_waited_for(
    code: str,
) -> None:
    body = {
        "error": {
            "code": code,
            "message": "Requests to the ChatCompletions_Create Operation under Azure OpenAI API"
            " version 2024-10-21 have exceeded token rate limit of your current AIServices S0"
            " pricing tier.",
        }
    }
    error = error_from_body("x", 429, json.dumps(body).encode())
    assert type(error) is ProviderError
    assert error.error_type == "request_too_large"


def test_a_limit_on_output_tokens_is_not_one_on_what_the_request_sends() -> None:
    body = {
        "type": "error",
        "error": {
            "type": "rate_limit_error",
            "message": "This request would exceed the rate limit for your organization of 8,000"
            " output tokens per minute.",
        },
    }
    error = error_from_body("x", 429, json.dumps(body).encode())
    assert type(error) is RateLimitError
    assert error.token_limit is None
