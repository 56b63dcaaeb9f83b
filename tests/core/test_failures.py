"""The failure taxonomy (`rillet._core._failures`): every error class and every HTTP status has its
ladder, the rules of RELIABILITY.md hold line by line, and docs/reliability.md shows the same
table the handler consults."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import msgspec
import pytest
import rillet._core._errors as errors
from rillet._core._dialect import strict_decode
from rillet._core._errors import (
    AuthenticationError,
    ConfigurationError,
    EmptyResponseError,
    FrameEncodingError,
    FrameError,
    FrameTooLarge,
    IncompleteStreamError,
    InvalidRequestError,
    MalformedFrameError,
    OverloadedError,
    ProviderError,
    RateLimitError,
    RilletError,
    ServerError,
    StreamProtocolError,
    ToolCallArgumentParseError,
    TransportError,
    TurnTimeout,
)
from rillet._core._failures import (
    CAUSE_SHAPES,
    ERROR_SHAPES,
    PERMANENT_CODES,
    STATUS_SHAPES,
    error_shape,
    http_shape,
    status_shape,
)
from rillet._core._policy import FailureClass
from rillet.providers._error_body import error_from_body

T, R, P, W = (
    FailureClass.TRANSPORT,
    FailureClass.RATE_LIMIT,
    FailureClass.PERMANENT,
    FailureClass.WRONG_SHAPE,
)
DOCS = Path(__file__).resolve().parent.parent.parent / "docs" / "reliability.md"


def error_classes() -> list[type[RilletError]]:
    """Every error class the error module defines (its public names, and any other class)."""
    named = [getattr(errors, name) for name in errors.__all__]
    others = [obj for _, obj in inspect.getmembers(errors, inspect.isclass)]
    return list(
        {obj for obj in named + others if inspect.isclass(obj) and issubclass(obj, RilletError)}
    )


def test_every_error_class_has_its_own_entry() -> None:
    classes = error_classes()
    assert len(classes) >= 20
    assert set(classes) == set(ERROR_SHAPES)


@pytest.mark.parametrize("status", range(300, 600))
def test_every_error_status_has_a_shape(status: int) -> None:
    shape = status_shape(status)
    if status in STATUS_SHAPES:
        assert shape is STATUS_SHAPES[status]
    elif 500 <= status <= 599:
        assert shape is T  # D6: other 5xx are transport-shaped
    else:
        assert shape is P  # D6: other 4xx (and a 3xx not followed) are permanent


RULE_STATUSES = {
    **dict.fromkeys([408, 500, 502, 504, 599], T),  # rule 1
    **dict.fromkeys([429, 503, 529], R),  # rule 2
    **dict.fromkeys([400, 401, 403, 404, 409, 413, 422, 418], P),  # rule 4, D6
}


@pytest.mark.parametrize(("status", "shape"), sorted(RULE_STATUSES.items()))
def test_the_statuses_follow_the_rules(status: int, shape: FailureClass) -> None:
    assert status_shape(status) is shape


def not_json() -> MalformedFrameError:
    try:
        strict_decode(msgspec.json.Decoder(dict[str, int]), b'{"a": 1', "prov")
    except MalformedFrameError as exc:
        return exc
    raise AssertionError("decoded")


def wrong_shape() -> MalformedFrameError:
    try:
        strict_decode(msgspec.json.Decoder(dict[str, int]), b'{"a": "x"}', "prov")
    except MalformedFrameError as exc:
        return exc
    raise AssertionError("decoded")


def raised_from(cause: Exception) -> MalformedFrameError:
    """A frame error raised while handling `cause`, as a dialect raises one."""
    try:
        try:
            raise cause
        except Exception:
            raise MalformedFrameError("bad frame", "{}") from None
    except MalformedFrameError as exc:
        return exc


def decode_error(decoder: msgspec.json.Decoder[object], data: bytes) -> Exception:
    try:
        decoder.decode(data)
    except msgspec.DecodeError as exc:
        return exc
    raise AssertionError("decoded")


CASES: list[tuple[str, BaseException, FailureClass]] = [
    ("connect/read error", TransportError("p", "ReadError"), T),
    ("EOF before the terminal marker", IncompleteStreamError("p", ("finish_reason",)), T),
    ("a stall", TurnTimeout("p", "per-event", 180), FailureClass.STALL),
    ("no first event", TurnTimeout("p", "initial-event", 120), FailureClass.STALL),
    ("the total deadline", TurnTimeout("p", "total", 300), FailureClass.TOTAL),
    ("in-stream overloaded", OverloadedError("p", in_stream=True), T),
    ("in-stream server error", ServerError("p", in_stream=True), T),
    ("in-stream error of no known type", ProviderError("p", in_stream=True), T),
    ("a frame that is not JSON", not_json(), T),
    ("a non-stream Content-Type", FrameError("text/html"), T),
    ("invalid UTF-8 in an NDJSON line", FrameEncodingError("bad"), T),
    ("RateLimitError", RateLimitError("p", in_stream=True), R),
    ("ToolCallArgumentParseError", ToolCallArgumentParseError("p", "f", "c", "{", "cut"), P),
    ("StreamProtocolError", StreamProtocolError("p", "a second stop"), P),
    ("EmptyResponseError", EmptyResponseError("p", "stop"), P),
    ("in-stream invalid request", InvalidRequestError("p", in_stream=True), P),
    ("authentication", AuthenticationError("p", status=401), P),
    ("FrameTooLarge", FrameTooLarge(100, 200), P),
    ("a local error", ConfigurationError("openai", None, "no key"), P),
    ("insufficient_quota in the stream", ProviderError("p", error_type="insufficient_quota"), P),
    ("a quota code on a rate limit", RateLimitError("p", error_type="insufficient_quota"), P),
    ("a quota code in capitals", ProviderError("p", error_type="INSUFFICIENT_QUOTA"), P),
    ("valid JSON of the wrong shape", wrong_shape(), W),
    ("a wrong shape the dialect noticed", raised_from(ValueError("not base64")), W),
    (
        "a dialect's not-JSON",
        raised_from(decode_error(msgspec.json.Decoder(), b"{")),
        T,
    ),
    (
        "a dialect's wrong shape",
        raised_from(decode_error(msgspec.json.Decoder(list[int]), b"5")),
        W,
    ),
    ("nesting past the decoder", raised_from(RecursionError()), W),
    ("not ours at all", ValueError("x"), T),
]


@pytest.mark.parametrize(("name", "error", "shape"), CASES, ids=[c[0] for c in CASES])
def test_every_cause_follows_the_rules(
    name: str, error: BaseException, shape: FailureClass
) -> None:
    assert error_shape(error) is shape


def test_every_quota_code_is_permanent_for_every_provider_error() -> None:
    for code in PERMANENT_CODES:
        for cls in (ProviderError, RateLimitError, OverloadedError, ServerError):
            assert error_shape(cls("p", error_type=code)) is P
            assert (ProviderError, code) in CAUSE_SHAPES


@pytest.mark.parametrize(
    ("status", "body", "should", "shape"),
    [
        (429, {"error": {"type": "rate_limit_exceeded"}}, "", R),
        (429, {"error": {"type": "insufficient_quota", "code": "insufficient_quota"}}, "", P),
        (400, {"error": {"type": "billing_hard_limit_reached"}}, "", P),
        (503, {}, "", R),
        (503, {}, "false", R),  # false keeps the shape (the handler stops retry and rescue)
        (500, {}, "", T),
        (401, {}, "true", T),  # true sends a permanent status down the transport ladder
        (404, {}, "", P),
        (404, {}, "true", T),
        (429, {}, "true", R),
    ],
)
def test_an_http_answer_takes_its_status_unless_the_body_or_the_header_says_otherwise(
    status: int, body: dict[str, object], should: str, shape: FailureClass
) -> None:
    error = error_from_body("p", status, msgspec.json.encode(body))
    assert http_shape(status, error, should) is shape


TOO_LARGE = (
    "Request too large for gpt-4o-mini in organization org-x on tokens per min (TPM): "
    "Limit 30000, Requested 35364. The input or output tokens must be reduced in order to run "
    "successfully."
)
REACHED = (
    "Rate limit reached for gpt-4o in organization org-x on tokens per min (TPM): Limit 30000, "
    "Used 29000, Requested 2,000. Please try again in 2s."
)


@pytest.mark.parametrize(
    ("status", "error", "code", "shape"),
    [
        (429, {"message": TOO_LARGE, "type": "tokens", "code": "rate_limit_exceeded"}, "too", P),
        (None, {"message": TOO_LARGE, "code": "rate_limit_exceeded"}, "too", P),  # in stream
        (429, {"message": "Limit: 1,000, Requested: 1,200", "type": "tokens"}, "too", P),
        (429, {"message": REACHED, "type": "tokens", "code": "rate_limit_exceeded"}, "", R),
        (None, {"message": REACHED, "code": "rate_limit_exceeded"}, "", R),
        (None, {"type": "request_too_large", "message": "too big"}, "too", P),  # Anthropic's
        (400, {"message": TOO_LARGE, "type": "invalid_request_error"}, "", P),  # not a limit
        (429, {"message": "Limit 10, Requested x"}, "", R),
    ],
    ids=[
        "http",
        "in-stream",
        "colons-commas",
        "reached",
        "reached-in-stream",
        "anthropic",
        "a-400",
        "unreadable-numbers",
    ],
)
def test_a_request_too_large_for_the_limit_itself_is_never_waited_for(
    status: int | None, error: dict[str, object], code: str, shape: FailureClass
) -> None:
    """A rate limit the request alone exceeds: the same request gets the same answer however
    long it waits, so it is permanent (and carries `request_too_large`), not a rate limit."""
    typed = error_from_body(
        "p", status, msgspec.json.encode({"error": error}), in_stream=status is None
    )
    assert (typed.error_type == "request_too_large") is (code == "too")
    if code == "too":
        assert type(typed) is ProviderError
    got = http_shape(status, typed) if status is not None else error_shape(typed)
    assert got is shape


GEMINI_NO_QUOTA = (
    "You exceeded your current quota, please check your plan and billing details.\n* Quota "
    "exceeded for metric: generativelanguage.googleapis.com/generate_content_free_tier_requests, "
    "limit: 0, model: gemini-2.5-pro\nPlease retry in 26.4s."
)
GEMINI_PER_MINUTE = GEMINI_NO_QUOTA.replace("limit: 0,", "limit: 5,")


@pytest.mark.parametrize(
    ("status", "message", "permanent"),
    [
        (429, GEMINI_NO_QUOTA, True),
        (None, GEMINI_NO_QUOTA, True),
        (429, GEMINI_PER_MINUTE, False),
        (429, GEMINI_NO_QUOTA.replace("limit: 0,", "limit: 0.5,"), False),
        (429, GEMINI_NO_QUOTA.replace("limit: 0,", "limit: 05,"), False),
    ],
    ids=["http", "in-stream", "per-minute", "a-fraction", "not-zero"],
)
def test_a_rate_limit_of_zero_is_a_spent_quota(
    status: int | None, message: str, permanent: bool
) -> None:
    """Gemini's free tier names a model it does not include with `limit: 0`: no wait helps."""
    body = {"error": {"code": 429, "message": message, "status": "RESOURCE_EXHAUSTED"}}
    typed = error_from_body("gemini", status, msgspec.json.encode(body), in_stream=status is None)
    if permanent:
        assert (type(typed), typed.error_type) == (ProviderError, "insufficient_quota")
        assert error_shape(typed) is P
    else:
        assert type(typed) is RateLimitError
        assert http_shape(429, typed) is R


@pytest.mark.parametrize(("value", "permanent"), [("0", True), (0, True), ("5", False)])
def test_a_google_quota_failure_of_value_zero_is_a_spent_quota(
    value: object, permanent: bool
) -> None:
    violation = {"quotaMetric": "m", "quotaId": "GenerateRequestsPerDayPerProjectPerModel-FreeTier"}
    details = [
        {
            "@type": "type.googleapis.com/google.rpc.QuotaFailure",
            "violations": [{**violation, "quotaValue": value}],
        },
        {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "26s"},
    ]
    body = {
        "error": {
            "code": 429,
            "message": "You exceeded your current quota.",
            "status": "RESOURCE_EXHAUSTED",
            "details": details,
        }
    }
    typed = error_from_body("gemini", 429, msgspec.json.encode(body))
    assert (type(typed) is ProviderError) is permanent
    assert http_shape(429, typed) is (P if permanent else R)


def test_an_http_quota_error_is_a_plain_provider_error_with_its_code() -> None:
    body = {"error": {"message": "q", "type": "insufficient_quota", "code": "insufficient_quota"}}
    error = error_from_body("p", 429, msgspec.json.encode(body))
    assert type(error) is ProviderError
    assert (error.status, error.error_type) == (429, "insufficient_quota")


# --- the page shows the same table ---------------------------------------------------------------

_ROW = re.compile(r"^\| `(\w+)`(?: \(([^)]*)\))? \| (\w[\w -]*?) \|", re.M)
_WORDS = {
    "transport": T,
    "stall": FailureClass.STALL,
    "total": FailureClass.TOTAL,
    "rate limit": R,
    "permanent": P,
    "wrong shape": W,
}


def documented() -> dict[tuple[str, str | None], FailureClass]:
    """The rows of docs/reliability.md's failure table: (class, cause) -> shape."""
    text = DOCS.read_text(encoding="utf-8")
    start = text.index("## The failure taxonomy")
    rows = _ROW.findall(text[start : text.index("\n## ", start + 1)])
    return {(name, cause or None): _WORDS[word] for name, cause, word in rows}


def test_the_page_shows_every_class_with_its_shape() -> None:
    rows = documented()
    for cls, shape in ERROR_SHAPES.items():
        assert rows.get((cls.__name__, None)) is shape, cls.__name__


def test_the_page_shows_every_cause_with_its_shape() -> None:
    rows = documented()
    for (cls, cause), shape in CAUSE_SHAPES.items():
        assert rows.get((cls.__name__, cause)) is shape, (cls.__name__, cause)


@pytest.mark.parametrize(
    ("body", "shape"),
    [
        ({"error": {"code": 404, "message": "model 'x' not found", "type": "not_found_error"}}, P),
        ({"error": {"code": 422, "message": "Input validation error"}}, P),
        ({"error": {"code": 409, "message": "conflict"}}, P),
        ({"error": {"code": 408, "message": "timed out"}}, T),
        ({"type": "error", "error": {"type": "not_found_error", "message": "model: x"}}, P),
        ({"error": {"status": "FAILED_PRECONDITION", "message": "User location"}}, P),
        ({"error": {"status": "NOT_FOUND", "message": "models/x is not found"}}, P),
        ({"error": "Model does not support images"}, T),  # of no known kind: retried
        ({"error": {"type": "some_new_error", "message": "?"}}, T),
    ],
)
def test_an_in_stream_error_that_names_a_status_is_shaped_as_that_status(
    body: dict[str, object], shape: FailureClass
) -> None:
    error = error_from_body("p", None, body, in_stream=True)
    assert error.in_stream
    assert error_shape(error) is shape


@pytest.mark.parametrize(
    ("error_type", "cls", "shape"),
    [
        ("validation", InvalidRequestError, P),
        ("Validation", InvalidRequestError, P),
        ("overloaded", OverloadedError, T),
        ("generation", ServerError, T),
    ],
)
def test_tgis_error_type_beside_a_string_error_types_it(
    error_type: str, cls: type[ProviderError], shape: FailureClass
) -> None:
    body = {"error": "Input validation error: grammar is not supported", "error_type": error_type}
    error = error_from_body("tgi", None, body, in_stream=True)
    assert type(error) is cls
    assert error_shape(error) is shape
    assert error.provider_message == body["error"]
