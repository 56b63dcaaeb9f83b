"""The error shapes providers send, read into our typed errors.

An HTTP error body or an in-stream error frame: OpenAI's, Anthropic's, Gemini's, Ollama's and
TGI's, vLLM's, MiniMax's `base_resp`, a flat `{"code", "message"}`, a FastAPI `detail`, or a
page that is not JSON at all (read by its title, on one line). The provider's type, code or
status word decides the class, else the status; a code no retry or wait cures (a spent quota,
a request larger than any limit) outranks both.
"""

from __future__ import annotations

import html
import re
from typing import TYPE_CHECKING, Any

import msgspec
from rillet._core._errors import (
    CONTENT_POLICY_CODES,
    CONTEXT_FULL,
    REQUEST_TOO_LARGE,
    UNCURABLE_CODES,
    AuthenticationError,
    InvalidRequestError,
    OverloadedError,
    ProviderError,
    RateLimitError,
    ServerError,
    key_refused,
)

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = ["base_resp_error", "body_text", "error_from_body", "provider_error"]

_decode_any = msgspec.json.Decoder().decode
_encode_any = msgspec.json.encode

_REQUEST_CODES = (
    "invalid_prompt",
    "context_length_exceeded",
    "string_above_max_length",
    "content_policy_violation",
    "invalid_image",
    "invalid_image_format",
    "invalid_base64_image",
    "invalid_image_url",
    "invalid_image_mode",
    "image_too_large",
    "image_too_small",
    "image_parse_error",
    "image_content_policy_violation",
    "image_file_too_large",
    "image_file_not_found",
    "unsupported_image_media_type",
    "empty_image_file",
)
"""Error codes that name something wrong with the request itself: never cured by a retry."""

_ERROR_TYPES: dict[str, type[ProviderError]] = {
    "rate_limit_error": RateLimitError,
    "rate_limit_exceeded": RateLimitError,
    "resource_exhausted": RateLimitError,
    "overloaded_error": OverloadedError,
    "unavailable": OverloadedError,
    "api_error": ServerError,
    "server_error": ServerError,
    "internal": ServerError,
    "internal_error": ServerError,
    "invalid_request_error": InvalidRequestError,
    "invalid_argument": InvalidRequestError,
    # what the request holds, which the same request would hold again (Responses' `response.failed`
    # codes, and the codes OpenAI-style servers put on a 400, in a stream too)
    **dict.fromkeys(_REQUEST_CODES, InvalidRequestError),
    # Hugging Face TGI's `error_type` beside a string `error`
    "validation": InvalidRequestError,
    "overloaded": OverloadedError,
    "generation": ServerError,
    "incomplete_generation": ServerError,
    "authentication_error": AuthenticationError,
    # Amazon Bedrock's exception types (`x-amzn-ErrorType`, an event stream's `:exception-type`)
    "throttlingexception": RateLimitError,
    "servicequotaexceededexception": RateLimitError,
    "validationexception": InvalidRequestError,
    "resourcenotfoundexception": InvalidRequestError,
    "modelerrorexception": InvalidRequestError,
    "internalserverexception": ServerError,
    "modelstreamerrorexception": ServerError,
    "modeltimeoutexception": ServerError,
    "serviceunavailableexception": OverloadedError,
    "modelnotreadyexception": OverloadedError,
    "accessdeniedexception": AuthenticationError,
    "unrecognizedclientexception": AuthenticationError,
    "permission_error": AuthenticationError,
    "unauthenticated": AuthenticationError,
    "permission_denied": AuthenticationError,
}

_TYPE_STATUSES: dict[str, int] = {
    "not_found_error": 404,  # Anthropic's
    "not_found": 404,  # Gemini's status word
    "failed_precondition": 400,  # Gemini's: a region or a setting the request cannot pass
    "unprocessable_entity": 422,
    "conflict": 409,
}
"""Error types of no class of their own that name an HTTP status: an error sent with one of them
and no status (in a stream) is shaped as that status would be."""

_STATUSES: dict[int, type[ProviderError]] = {
    400: InvalidRequestError,
    401: AuthenticationError,
    403: AuthenticationError,
    404: InvalidRequestError,  # a model it does not know: what OpenAI's type says, for all
    422: InvalidRequestError,
    429: RateLimitError,
    500: ServerError,
    502: ServerError,
    503: OverloadedError,
    504: ServerError,
    529: OverloadedError,
}


_DECISIVE_STATUSES = frozenset({401, 403, 429, 503, 529})
_REQUEST_CLASSES = (ProviderError, InvalidRequestError)
"""The classes an error's words may make more specific: a refused request's, or none known."""


def provider_error(
    provider: str,
    *,
    status: int | None = None,
    error_types: tuple[str | None, ...] = (),
    message: str = "",
    in_stream: bool = False,
    retry_after: float | None = None,
    provider_fields: Mapping[str, str] | None = None,
    token_limit: int | None = None,
) -> ProviderError:
    """The typed error for what a provider reported: the first of `error_types` we know (the
    provider's error type, code or status word) decides, else the status, else `ProviderError`.
    `provider_fields` are kept on it as they came (`ProviderError.provider_fields`).

    A quota code (`insufficient_quota`, sent with a 429 or in the stream) is a plain
    `ProviderError` carrying the code, whatever the status: no wait or retry cures it, so it must
    not pass for a rate limit. So is a rate limit that says the request alone asks for more than
    the limit, in its message or its code (`REQUEST_TOO_LARGE`), or that the limit is 0
    (`insufficient_quota`). A rate limit on tokens keeps the limit it states (`token_limit`,
    given or read from the message) and what it says the request asked for, so the handler can
    tell one the request alone exceeds (`rillet._core._failures.past_limit`)."""
    quota = next((t for t in error_types if t and t.lower() in UNCURABLE_CODES), None)
    limited = status == 429 or any(
        t and _ERROR_TYPES.get(t.lower()) is RateLimitError for t in error_types
    )
    if quota is None and limited:
        if _too_large(message) or any(t and _TOO_LARGE.search(t) for t in error_types):
            quota = REQUEST_TOO_LARGE  # a rate limit the request alone exceeds: waiting won't do
        elif message and (_NO_QUOTA.search(message) or _NO_CREDIT.search(message)):
            quota = "insufficient_quota"  # a limit of 0 (a model the plan does not include)
    if quota is not None:
        uncured = ProviderError(
            provider,
            message,
            status=status,
            error_type=quota,
            retry_after=retry_after,
            in_stream=in_stream,
            provider_fields=provider_fields,
        )
        if quota == REQUEST_TOO_LARGE:  # the sizes it names, for the line a person reads
            uncured.token_limit = _number(_LIMIT, message)
            uncured.tokens_needed = _number(_REQUESTED, message)
        return uncured
    if status is None:  # a type that names a status (Anthropic's `not_found_error`, in stream)
        status = next(
            (_TYPE_STATUSES[t.lower()] for t in error_types if t and t.lower() in _TYPE_STATUSES),
            None,
        )
    cls: type[ProviderError] = ProviderError
    known: str | None = next((t for t in error_types if t), None)
    for error_type in error_types:
        if error_type and (found := _ERROR_TYPES.get(error_type.lower())) is not None:
            cls, known = found, error_type
            break
    else:
        if status is not None:
            cls = _STATUSES.get(status, ProviderError)
    # a content-policy refusal keeps its code, which says more than the type beside it
    known = next((t for t in error_types if t and t.lower() in CONTENT_POLICY_CODES), known)
    refused = cls in _REQUEST_CLASSES and (status is None or 400 <= status < 500)
    if refused and status in (None, 400) and message and key_refused(message):
        # a key refused in a bad request's words (Gemini's and xAI's 400): what to do next is
        # to fix the key, as for a 401 (a 404 or a 422 says something else went wrong first)
        cls = AuthenticationError
    elif refused and cls is ProviderError and message and CONTEXT_FULL.search(message):
        # an error of no known type that says the request is longer than the context window
        # (Ollama's and LM Studio's plain `{"error": "..."}`): it never fits, however often sent
        cls, known = InvalidRequestError, known or "context_length_exceeded"
    if status in _DECISIVE_STATUSES:
        # the status outranks the body: OpenAI answers a bad key with 401 and
        # `invalid_request_error`, and what a caller does next follows the status
        cls = _STATUSES[status]
    error = cls(
        provider,
        message,
        status=status,
        error_type=known,
        retry_after=retry_after,
        in_stream=in_stream,
        provider_fields=provider_fields,
    )
    if cls is RateLimitError:
        error.token_limit = token_limit if token_limit is not None else _token_limit(message)
        error.tokens_needed = _number(_REQUESTED, message)
    return error


_NO_QUOTA = re.compile(r"\blimit:? 0(?!\d|[.,]\d)", re.IGNORECASE)
"""A rate limit whose limit is 0 (Gemini's `Quota exceeded for metric: ..., limit: 0, model:
gemini-2.5-pro`: the plan has no quota for it at all), a spent quota however long one waits."""
_NO_CREDIT = re.compile(
    r"used all available credits|monthly spending limit"
    r"|insufficient (?:account )?(?:balance|credits?)|credit balance is too low",
    re.IGNORECASE,
)
"""A rate limit whose message says the account has no credit left (xAI's 429 `Your team ... has
either used all available credits or reached its monthly spending limit`): no wait brings it
back. (Gemini's free tier says `check your plan and billing details` of a per-minute limit, a
wait that does end: such words are not enough.)"""
_LIMIT = re.compile(r"\bLimit:? ([\d,]+)")
_REQUESTED = re.compile(r"\bRequested:? ([\d,]+)")
_TOO_LARGE = re.compile(r"request[ _]?too[ _]?large", re.IGNORECASE)
"""A rate limit's own words (or code) for a request that alone exceeds it: OpenAI's and Groq's
`Request too large for ...`, a `RequestTooLarge` or `Request too large` code beside Azure's
`exceeded token rate limit`."""
_TOKEN_LIMITS = (
    # OpenAI's and Groq's `on tokens per min (TPM): Limit 30000, Used ..., Requested ...`
    re.compile(r"\btokens? per min\w*(?: \(TPM\))?: Limit:? ([\d,]+)", re.IGNORECASE),
    # Azure AI Foundry's `Rate limit of 50000 per 60s exceeded for UserByModelByMinuteTokens`
    re.compile(r"\brate limit of ([\d,]+) per \d+s exceeded for \w*tokens\b", re.IGNORECASE),
    # Anthropic's `the rate limit for your organization ... of 20,000 input tokens per minute`
    # (a limit on output tokens is not one on what the request sends)
    re.compile(r"\bof ([\d,]+) (?:input )?tokens per minute\b", re.IGNORECASE),
    # Gemini's `Quota exceeded for metric: ..._input_token_count, limit: 250000, model: ...`
    re.compile(r"input_token_count, limit:? ([\d,]+)", re.IGNORECASE),
)
"""How a rate limit on tokens states its limit, in words (each group: the limit)."""


def _number(pattern: re.Pattern[str], message: str) -> int | None:
    """The number `pattern`'s group finds in `message`, commas and all; None if none."""
    found = pattern.search(message) if message else None
    if found is None:
        return None
    try:
        return int(found.group(1).replace(",", ""))
    except ValueError:
        return None


def _token_limit(message: str) -> int | None:
    """The token limit a rate limit's message states (`_TOKEN_LIMITS`), if it states one."""
    for pattern in _TOKEN_LIMITS:
        limit = _number(pattern, message)
        if limit is not None:
            return limit
    return None


def _too_large(message: str) -> bool:
    """Whether a rate limit's message says the request by itself exceeds the limit (OpenAI's
    `Request too large for gpt-4o in organization ... (TPM): Limit 30000, Requested 35364.`)."""
    if not message:
        return False
    if _TOO_LARGE.search(message):
        return True
    limit, requested = _number(_LIMIT, message), _number(_REQUESTED, message)
    return limit is not None and requested is not None and requested > limit


def _token_quota(details: Any) -> int | None:
    """The smallest quota on input tokens a Google error's details name (`QuotaFailure`
    violations whose `quotaId` or `quotaMetric` is about input tokens, with a `quotaValue`):
    the most tokens one request can ever carry under it. Request quotas are not tokens."""
    if not isinstance(details, list):
        return None
    found: list[int] = []
    for detail in details:
        violations = detail.get("violations") if isinstance(detail, dict) else None
        for violation in violations if isinstance(violations, list) else ():
            if not isinstance(violation, dict):
                continue
            named = f"{violation.get('quotaId', '')} {violation.get('quotaMetric', '')}".lower()
            value = str(violation.get("quotaValue", ""))
            if ("inputtoken" in named or "input_token" in named) and value.isdigit():
                found.append(int(value))
    return min(found, default=None)


def _zero_quota(details: Any) -> bool:
    """Whether a Google error's details name a quota whose value is 0 (`QuotaFailure`
    violations' `quotaValue`): the plan does not include what was asked for."""
    if not isinstance(details, list):
        return False
    for detail in details:
        if isinstance(detail, dict) and isinstance(detail.get("violations"), list):
            for violation in detail["violations"]:
                if isinstance(violation, dict) and str(violation.get("quotaValue")) == "0":
                    return True
    return False


_BASE_RESP_TYPES: dict[int, str] = {
    **dict.fromkeys((1002, 1039, 1041, 2045), "rate_limit_error"),  # requests, tokens, links
    **dict.fromkeys((1004, 2049), "authentication_error"),
    **dict.fromkeys((1008, 2056), "insufficient_quota"),  # no balance left, the plan's limit
    **dict.fromkeys((1026, 1027, 1042, 2013, 20132), "invalid_request_error"),
    **dict.fromkeys((1000, 1001, 1013, 1024, 1033), "server_error"),
}
"""MiniMax's `base_resp.status_code`s (it answers errors with HTTP 200 and `{"base_resp":
{"status_code", "status_msg"}}`) by the error type they stand for: rate limits, a refused key,
a spent balance, a request it will never take (bad parameters, sensitive input or output), and
its own failures. A code not named here is a plain provider error."""


def base_resp_error(base_resp: Any) -> tuple[str, tuple[str, ...]] | None:
    """The message and error types of a MiniMax `base_resp` that reports an error; None for
    one that reports success (`status_code` 0) or is not one at all."""
    if not isinstance(base_resp, dict):
        return None
    code = base_resp.get("status_code")
    if not isinstance(code, int) or isinstance(code, bool) or code == 0:
        return None
    message = f"{base_resp.get('status_msg') or 'error'} ({code})"
    kind = _BASE_RESP_TYPES.get(code)
    return message, (kind,) if kind is not None else ()


_TITLE = re.compile(r"<title[^>]*>(.*?)</title>|<h1[^>]*>(.*?)</h1>", re.IGNORECASE | re.DOTALL)
_TAG = re.compile(r"<[^>]*>")


def body_text(text: str) -> str:
    """What a body that is not JSON says, on one line: an HTML page (a proxy's `502 Bad
    Gateway`, a bot challenge) by its title or first heading, other text with its white space
    collapsed."""
    if not text.lstrip().startswith("<"):
        return " ".join(text.split())
    found = _TITLE.search(text)
    if found is not None:
        title = " ".join(html.unescape(_TAG.sub("", found.group(1) or found.group(2))).split())
        if title:
            return f"an HTML page: {title[:120]}"
    kind = "an XML document" if text.lstrip().startswith("<?xml") else "an HTML page"
    said = " ".join(html.unescape(_TAG.sub(" ", text)).split())  # markup of no title: its words
    return f"{kind}: {said[:200]}" if said else kind


_FIELDS = ("type", "code", "param")
"""The fields of a provider's error object kept as it spelt them (OpenAI's shape)."""


def error_from_body(
    provider: str, status: int | None, body: bytes | str | Any, *, in_stream: bool = False
) -> ProviderError:
    """The typed error for any of the error shapes providers send, as an HTTP body or in-stream:
    OpenAI `{"error": {"message", "type", "code"}}`, Anthropic `{"type": "error", "error":
    {"type", "message"}}`, Gemini `{"error": {"code", "message", "status"}}`, Ollama
    `{"error": "..."}` (with TGI's `error_type` beside it), vLLM `{"object": "error", "message",
    "type"}`, MiniMax `{"base_resp": {"status_code", "status_msg"}}`, a flat `{"code",
    "message"}` (SiliconFlow, DashScope, API gateways). `body` may be raw bytes
    or already-parsed JSON; a body that is none of these still gives an error typed by status."""
    data: Any = body
    if isinstance(body, bytes | str):
        try:  # strict, as every frame is: no lone surrogates, NaN, huge numbers or deep nesting
            data = _decode_any(body)
        except (msgspec.DecodeError, RecursionError):
            data = None
    error_types: tuple[str | None, ...] = ()
    message = ""
    code_status: int | None = None
    token_limit: int | None = None
    fields: dict[str, str] = {}  # the error object's own `type`, `code` and `param`
    if isinstance(data, dict):
        err = data.get("error", data if data.get("object") == "error" else None)
        if isinstance(err, str):
            message = err
            kind = data.get("error_type")  # Hugging Face TGI's and TEI's: `validation`...
            if isinstance(kind, str):
                error_types = (kind,)
        elif isinstance(err, dict):
            message = str(err.get("message") or "")
            code = err.get("code")
            if isinstance(code, int) and not isinstance(code, bool):
                code_status = code
            error_types = tuple(
                str(v) for v in (err.get("type"), err.get("status"), code) if isinstance(v, str)
            )
            fields = {k: v for k in _FIELDS if isinstance(v := err.get(k), str)}
            if _zero_quota(err.get("details")):
                error_types = ("insufficient_quota", *error_types)  # no wait brings a quota of 0
            token_limit = _token_quota(err.get("details"))
        elif "detail" in data:  # FastAPI's: a string, or pydantic's list of what failed where
            detail = data["detail"]
            message = detail if isinstance(detail, str) else _encode_any(detail).decode()[:500]
        elif (said := base_resp_error(data.get("base_resp"))) is not None:  # MiniMax's
            message, error_types = said
        elif isinstance(said := data.get("message", data.get("details")), str):
            # a flat `{"code", "message"}`: SiliconFlow's, DashScope's, a gateway's
            # (`{"message": "Forbidden"}`), vLLM's in-stream `{"code", "details"}`; a string
            # code is a type, a number one a status
            message = said
            code = data.get("code")
            error_types = tuple(v for v in (code, data.get("type")) if isinstance(v, str))
            if isinstance(code, int) and not isinstance(code, bool) and 100 <= code < 600:
                code_status = code
    elif isinstance(body, bytes | str) and status is not None:
        message = body_text(body.decode("utf-8", "replace") if isinstance(body, bytes) else body)
    return provider_error(
        provider,
        status=status if status is not None else code_status,
        error_types=error_types,
        message=message,
        in_stream=in_stream,
        provider_fields=fields,
        token_limit=token_limit,
    )
