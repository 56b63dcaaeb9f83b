"""What every dialect is, and the pieces dialects share.

A dialect is the sans-I/O knowledge of one provider's wire: how to build its request, how each
frame it streams maps to lane events, how its non-streaming body maps to lane events (the same
stream the provider would have sent, each item in one piece: the fallback rescue uses it), and
how its error bodies map to our typed errors. No provider SDK: wire JSON is decoded once with
msgspec into typed Structs whose unknown fields are ignored.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal, Protocol

import attrs
import msgspec
from rillet._errors import (
    REQUEST_TOO_LARGE,
    UNCURABLE_CODES,
    AuthenticationError,
    ConfigurationError,
    InvalidRequestError,
    MalformedFrameError,
    OverloadedError,
    ProviderError,
    RateLimitError,
    ServerError,
)
from rillet._sse import DEFAULT_MAX_FRAME, SSEEvent

if TYPE_CHECKING:
    from rillet._lanes import LaneEvent
    from rillet._request import TurnRequest

__all__ = [
    "Dialect",
    "FramesDecoder",
    "Framing",
    "HttpRequest",
    "Provider",
    "Secret",
    "StreamDecoder",
    "ToolIds",
    "answer_tokens",
    "dumps_arguments",
    "error_from_body",
    "provider_error",
    "sse_event",
    "sse_text",
    "strict_decode",
]

Framing = Literal["sse", "ndjson", "json", "message"]
Frame = SSEEvent | str


@attrs.frozen(repr=False)
class Secret:
    """A credential. Its repr and str are masked, so it never reaches a log or an error."""

    _value: str

    def reveal(self) -> str:
        """The credential itself: only for the request header that needs it."""
        return self._value

    def masked(self) -> str:
        """A hint of which key this is: its last four characters."""
        return f"…{self._value[-4:]}" if len(self._value) >= 12 else "…"

    def __repr__(self) -> str:
        return f"Secret({self.masked()!r})"

    __str__ = __repr__


class HttpRequest(msgspec.Struct, frozen=True, kw_only=True):
    """One request, ready for any upstream transport: method, absolute URL, headers, body bytes.

    A provider that streams over a socket (`ws://`, `wss://`) opens it with the URL and headers
    and is then sent `messages`, in order, one whole message each; `body` is then empty. Its
    repr never shows header values, since one of them is usually a credential.
    """

    method: str = "POST"
    url: str
    headers: dict[str, str]
    body: bytes = b""
    messages: tuple[bytes, ...] = ()

    def __repr__(self) -> str:
        return f"HttpRequest({self.method} {self.url}, headers={sorted(self.headers)})"

    def json(self) -> Any:
        """The body, parsed (for tests and logs)."""
        return json.loads(self.body)


class StreamDecoder(Protocol):
    """One attempt's frame decoder: frames in, lane events out. Made fresh per attempt."""

    def feed(self, frame: Any) -> list[LaneEvent]:
        """Take one frame (an `SSEEvent`, or an NDJSON line's text); return its lane events."""
        ...

    def close(self) -> list[LaneEvent]:
        """End of input: lane events owed at EOF (for example a stop for a stream whose end is
        implied by its last chunk). A stream that ended early simply owes nothing."""
        ...


class FramesDecoder(StreamDecoder, Protocol):
    """A stream decoder that also takes a whole read's frames in one call.

    The wire decoder hands it every frame a read completed, so its loop (and the fast path for
    its commonest frame) runs without a call and a list per frame. What it appends must read,
    to the grammar, exactly as what `feed` returns for each frame in turn: the same lane events,
    except that consecutive fragments of one lane may come as one `PartRun`.
    """

    failed_at: int
    """Set by `feed_frames` before an exception leaves it: the index of the failing frame."""

    sse_bytes: bool
    """Whether `feed` and `feed_frames` also take an SSE event with one `data:` line as its
    data's bytes (unnamed) or as `(name, data bytes)` (named): one copy and one object fewer
    (`SSEDecoder.raw`; `sse_event` reads any of the three). Bytes that are not UTF-8 must read
    as an `SSEEvent`'s data would (`sse_text`). Optional; False when absent."""

    def feed_frames(self, frames: list[Any], out: list[LaneEvent]) -> None:
        """Append the lane events of `frames`, in order, to `out`: those of calling `feed` on
        each (runs of fragments as `PartRun`s, if it likes). If a frame raises, `out` holds the
        events of the frames before it and `failed_at` is that frame's index."""
        ...


class Dialect(Protocol):
    """The sans-I/O knowledge of one provider's wire.

    A dialect may also have `adapt(provider, error) -> bool`: whether a refusal names an
    optional field of its request that it will leave out from then on (Chat Completions'
    `stream_options`); the handler then asks again at once.
    """

    @property
    def name(self) -> str:
        """The dialect's name (`openai-chat`, `anthropic`...), used in errors and logs."""
        ...

    @property
    def framing(self) -> Framing:
        """How its streams are framed: `sse`, `ndjson`, one `json` body, or `message` (a
        message transport's messages, each one whole frame)."""
        ...

    def build_request(
        self, request: TurnRequest, provider: Provider, *, stream: bool = True
    ) -> HttpRequest:
        """The HTTP request for this turn (streaming unless `stream` is False)."""
        ...

    def stream_decoder(self) -> StreamDecoder:
        """A fresh decoder for one attempt's frames."""
        ...

    def decode_response(self, body: bytes) -> list[LaneEvent]:
        """A non-streaming body as the lane events of the same reply, each item in one piece."""
        ...

    def error_from_response(
        self, status: int, headers: Mapping[str, str], body: bytes
    ) -> ProviderError:
        """The typed error for an HTTP error status and its body."""
        ...


_HEADER_SAFE = re.compile(r"[\x21-\x7e]+(?:[ \t]+[\x21-\x7e]+)*")
"""A header value an HTTP/1.1 request can carry: visible ASCII, spaces only between words."""


_WHAT = {"\n": "a line break", "\r": "a line break", " ": "a space", "\t": "a tab"}


def _clean_key(key: Secret | None) -> Secret | None:
    """The key without the whitespace around it (a key pasted or read from a file with its line
    end); one that still holds what no header can carry (a line break inside, a non-ASCII
    character) is refused here, before any request: it would fail every one the same way."""
    if key is None:
        return None
    value = key.reveal()
    stripped = value.strip()
    if not stripped:
        return None
    bad = next((i for i, c in enumerate(stripped) if not "\x21" <= c <= "\x7e"), None)
    if bad is not None:
        raise ConfigurationError(
            "provider",
            None,
            f"the API key holds a character no request header can carry (at position {bad + 1}:"
            f" {_WHAT.get(stripped[bad], 'not visible ASCII')}) — copy the key again (the key"
            " alone, without `Bearer`)",
        )
    return key if stripped == value else Secret(stripped)


def _clean_base_url(url: str) -> str:
    """The base URL without the whitespace around it (pasted, or read from a file with its line
    end). One no request can go by fails its first request, once, saying why (`unsendable`)."""
    return url.strip() if isinstance(url, str) else url


def _clean_headers(headers: Mapping[str, str]) -> Mapping[str, str]:
    """Extra headers as given; one whose name or value no request can carry is refused."""
    for name, value in headers.items():
        if not (isinstance(name, str) and re.fullmatch(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+", name)):
            raise ConfigurationError("provider", None, f"not a header name: {str(name)[:80]!r}")
        if not (isinstance(value, str) and (value == "" or _HEADER_SAFE.fullmatch(value))):
            raise ConfigurationError(
                "provider",
                None,
                f"the {name} header's value holds what no request header can carry"
                " (a line break, a control or non-ASCII character)",
            )
    return headers


@attrs.frozen
class Provider:
    """A configured provider: a dialect, where it lives, the model, and the credential.

    Attributes:
        dialect: the wire it speaks.
        base_url: the API root (`https://api.openai.com/v1`, `http://127.0.0.1:11434`...).
        model: the model id sent in the request.
        api_key: the credential, masked everywhere but the request header.
        name: what to call it in messages (defaults to the dialect's name).
        headers: extra request headers.
        max_frame: the cap on one frame of its streams, in bytes (32 MiB).
    """

    dialect: Dialect
    base_url: str = attrs.field(converter=_clean_base_url)
    model: str
    api_key: Secret | None = attrs.field(default=None, converter=_clean_key)
    name: str = ""
    headers: Mapping[str, str] = attrs.field(factory=dict, converter=_clean_headers)
    max_frame: int = DEFAULT_MAX_FRAME

    @property
    def label(self) -> str:
        """The name used in errors and logs."""
        return self.name or self.dialect.name

    def url(self, path: str) -> str:
        """`base_url` joined with a path, with exactly one slash between them."""
        return f"{self.base_url.rstrip('/')}/{path.lstrip('/')}"


# --- shared helpers ------------------------------------------------------------------------------


def answer_tokens(
    output: int | None, reasoning: int | None, total: int | None, prompt: int | None
) -> int | None:
    """The answer's own tokens from OpenAI-shaped usage, where `output` counts the reasoning
    too. Some compatible servers (xAI) count reasoning beside the output instead: their total is
    prompt + output + reasoning, and the output is then the answer alone. Never negative."""
    if output is None:
        return None
    if not reasoning:
        return output
    if total is not None and prompt is not None and total == prompt + output + reasoning:
        return output
    return max(output - reasoning, 0)


def dumps_arguments(arguments: Any) -> str:
    """A whole tool call's arguments as MMSP writes them: `json.dumps` with Python's default
    separators, keys in received order, non-ASCII kept as is."""
    return json.dumps(arguments, ensure_ascii=False)


class ToolIds:
    """Ids for whole tool calls that come without one (Gemini, Ollama): the function's name for
    its first call in a reply, then `name#2`, `name#3`... so every call has its own id."""

    __slots__ = ("_seen",)

    def __init__(self) -> None:
        self._seen: dict[str, int] = {}

    def next(self, name: str) -> str:
        """The id for the next call of `name`."""
        n = self._seen.get(name, 0) + 1
        self._seen[name] = n
        return name if n == 1 else f"{name}#{n}"


def strip_call_suffix(tool_call_id: str) -> str:
    """The function name behind an id made by `ToolIds` (`get_weather#2` -> `get_weather`)."""
    head, sep, tail = tool_call_id.rpartition("#")
    return head if sep and tail.isdigit() else tool_call_id


def strict_decode(decoder: msgspec.json.Decoder[Any], data: str | bytes, provider: str) -> Any:
    """Decode one frame; anything that is not JSON of the expected shape is a
    `MalformedFrameError` naming the provider (the caller's framer adds the position)."""
    try:
        return decoder.decode(data)
    except msgspec.ValidationError as exc:
        raise MalformedFrameError(
            f"frame has the wrong shape: {exc}", data, provider=provider, not_json=False
        ) from None
    except msgspec.DecodeError as exc:
        raise MalformedFrameError(
            f"frame is not JSON: {exc}", data, provider=provider, not_json=True
        ) from None
    except RecursionError:
        raise MalformedFrameError(
            "frame is nested too deeply to decode", data, provider=provider, not_json=False
        ) from None


def sse_event(frame: Any) -> tuple[str, str | bytes]:
    """An SSE frame's event name and data, whichever way it came (`FramesDecoder.sse_bytes`):
    an `SSEEvent`, an unnamed event's data bytes, or a named one's `(name, data bytes)`."""
    if type(frame) is bytes:
        return "message", frame
    if type(frame) is tuple:
        return frame[0], frame[1]
    return frame.event, frame.data


def sse_text(data: str | bytes) -> str:
    """An SSE event's data as the text an `SSEEvent` holds: bytes decoded with replacement
    characters, as the event-stream standard says."""
    return data if type(data) is str else data.decode("utf-8", "replace")  # type: ignore[union-attr]


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
    429: RateLimitError,
    500: ServerError,
    502: ServerError,
    503: OverloadedError,
    504: ServerError,
    529: OverloadedError,
}


_DECISIVE_STATUSES = frozenset({401, 403, 429, 503, 529})


def provider_error(
    provider: str,
    *,
    status: int | None = None,
    error_types: tuple[str | None, ...] = (),
    message: str = "",
    in_stream: bool = False,
    retry_after: float | None = None,
) -> ProviderError:
    """The typed error for what a provider reported: the first of `error_types` we know (the
    provider's error type, code or status word) decides, else the status, else `ProviderError`.

    A quota code (`insufficient_quota`, sent with a 429 or in the stream) is a plain
    `ProviderError` carrying the code, whatever the status: no wait or retry cures it, so it must
    not pass for a rate limit. So is a rate limit whose message says the request alone asks for
    more than the limit (`REQUEST_TOO_LARGE`), or that the limit is 0 (`insufficient_quota`)."""
    quota = next((t for t in error_types if t and t.lower() in UNCURABLE_CODES), None)
    limited = status == 429 or any(
        t and _ERROR_TYPES.get(t.lower()) is RateLimitError for t in error_types
    )
    if quota is None and limited and message:
        if _too_large(message):
            quota = REQUEST_TOO_LARGE  # a rate limit the request alone exceeds: waiting won't do
        elif _NO_QUOTA.search(message) or _NO_CREDIT.search(message):
            quota = "insufficient_quota"  # a limit of 0 (a model the plan does not include)
    if quota is not None:
        return ProviderError(
            provider,
            message,
            status=status,
            error_type=quota,
            retry_after=retry_after,
            in_stream=in_stream,
        )
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
    if status in _DECISIVE_STATUSES:
        # the status outranks the body: OpenAI answers a bad key with 401 and
        # `invalid_request_error`, and what a caller does next follows the status
        cls = _STATUSES[status]
    return cls(
        provider,
        message,
        status=status,
        error_type=known,
        retry_after=retry_after,
        in_stream=in_stream,
    )


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


def _too_large(message: str) -> bool:
    """Whether a rate limit's message says the request by itself exceeds the limit (OpenAI's
    `Request too large for gpt-4o in organization ... (TPM): Limit 30000, Requested 35364.`)."""
    if not message:
        return False
    if "request too large" in message.lower():
        return True
    limit, requested = _LIMIT.search(message), _REQUESTED.search(message)
    if limit is None or requested is None:
        return False
    try:
        return int(requested.group(1).replace(",", "")) > int(limit.group(1).replace(",", ""))
    except ValueError:
        return False


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
            if _zero_quota(err.get("details")):
                error_types = ("insufficient_quota", *error_types)  # no wait brings a quota of 0
        elif "detail" in data:  # FastAPI's: a string, or pydantic's list of what failed where
            detail = data["detail"]
            message = detail if isinstance(detail, str) else _encode_any(detail).decode()[:500]
        elif (said := base_resp_error(data.get("base_resp"))) is not None:  # MiniMax's
            message, error_types = said
        elif isinstance(data.get("message"), str):
            # a flat `{"code", "message"}`: SiliconFlow's, DashScope's, a gateway's
            # (`{"message": "Forbidden"}`); a string code is a type, a number one a status
            message = data["message"]
            code = data.get("code")
            error_types = tuple(v for v in (code, data.get("type")) if isinstance(v, str))
            if isinstance(code, int) and not isinstance(code, bool) and 100 <= code < 600:
                code_status = code
    elif isinstance(body, bytes | str) and status is not None:
        message = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
    return provider_error(
        provider,
        status=status if status is not None else code_status,
        error_types=error_types,
        message=message,
        in_stream=in_stream,
    )
