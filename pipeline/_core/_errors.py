"""Every error rillet raises, in one tree, each carrying its facts as attributes.

```
RilletError
├── FrameError                 the bytes a provider sent cannot be framed or decoded (remote)
│   ├── FrameTooLarge          one frame is over the configured cap
│   ├── FrameEncodingError     a frame is not valid UTF-8 (NDJSON, JSON bodies)
│   ├── MalformedFrameError    a frame is not JSON, has the wrong shape, or an unknown type
│   └── SSEErrorField          an SSE stream carried an `error:` line: the server's report
├── SSEEncodeError             we were asked to write an SSE field that would split a frame (local)
├── ConfigurationError         a provider cannot be configured as asked (local)
├── UnsupportedContentError    a message holds an item the provider cannot take (local)
├── UnsupportedOperationError  the provider has no such operation (local)
├── NoHistoryError             a turn that keeps no history was asked to replay it (local)
├── StreamError                MMSP's stream errors: the provider's stream breaks the grammar
│   ├── StreamProtocolError        a fragment for no open item, a second stop, two fidelities...
│   ├── IncompleteStreamError      the stream ended without its finish reason and/or usage
│   ├── EmptyResponseError         a completed reply with nothing but thinking (or nothing read)
│   └── ToolCallArgumentParseError a closed tool call whose arguments are not a JSON object
├── TransportError             the connection failed: connect, read, reset (remote)
├── TurnTimeout                a deadline blew: initial-event, per-event, total, or the rescue's
├── RescueFailed               streaming was hopeless and the rescue failed too (carries both)
├── ProviderError              an error the provider reported, in the stream or as a status
│   │                              (a quota code such as insufficient_quota: this class itself)
│   ├── RateLimitError             429, rate_limit_error, RESOURCE_EXHAUSTED
│   ├── OverloadedError            529, overloaded_error, UNAVAILABLE
│   ├── ServerError                500/502/504, api_error, server_error, INTERNAL
│   ├── InvalidRequestError        400, invalid_request_error, INVALID_ARGUMENT
│   └── AuthenticationError        401/403, authentication_error, permission_error
├── UpstreamError              a transport could not carry an exchange (remote; the handler
│                                  makes it a TransportError for the provider)
├── ContextWindowExceeded      what must be sent does not fit the context budget (local)
├── CostLimitExceeded          the run's money would not pay for its next request (local)
├── HubError                   the hub refused a subscription or an append
│   ├── UnknownRun                 no such run, or forgotten after its retention
│   ├── RunExists                  a run with this id is already open
│   ├── AppendConflict             a second producer appended to the same run
│   ├── HubUnavailable             the hub's storage (Redis) cannot be reached
│   ├── CursorInvalid              a resume cursor that is malformed or names another run
│   ├── CursorExpired              a resume cursor older than what the log keeps
│   └── SubscriberDropped          a subscriber fell further behind than its buffer
├── RunEventGap                an MCP call's run events have a gap that cannot be bridged
└── RunFailed                  a run ended without its answer and no other error says why
                                   (stopped, out of steps, every answer rejected): its code
```

The server's own refusals (`ServerConfigError`, `WorkerFailed`) derive from `RilletError` too
but live with the server (`rillet.transports.server`), since the core knows nothing of serving.

The names of the stream errors are MMSP's, so a consumer of either library catches the same
class. No error message ever contains a credential: messages are built from facts the provider
sent about the failure and from our own words.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

import msgspec

if TYPE_CHECKING:
    from collections.abc import Mapping
    from decimal import Decimal

__all__ = [
    "CONTENT_POLICY_CODES",
    "AppendConflict",
    "AuthenticationError",
    "ConfigurationError",
    "ContextWindowExceeded",
    "CostLimitExceeded",
    "CursorExpired",
    "CursorInvalid",
    "EmptyResponseError",
    "EventStreamFrameError",
    "FrameEncodingError",
    "FrameError",
    "FrameTooLarge",
    "HubError",
    "HubUnavailable",
    "IncompleteStreamError",
    "InvalidRequestError",
    "MalformedFrameError",
    "NoHistoryError",
    "OverloadedError",
    "ProviderError",
    "RateLimitError",
    "RescueFailed",
    "RilletError",
    "RunEventGap",
    "RunExists",
    "RunFailed",
    "SSEEncodeError",
    "SSEErrorField",
    "ServerError",
    "StreamError",
    "StreamProtocolError",
    "SubscriberDropped",
    "ToolCallArgumentParseError",
    "TransportError",
    "TurnTimeout",
    "UnknownRun",
    "UnsupportedContentError",
    "UnsupportedOperationError",
    "UpstreamError",
    "failure",
    "key_refused",
    "not_found",
    "past_context",
    "preview",
]

_PREVIEW_MAX = 160
_PREVIEW_EDGE = 72


def preview(raw: str | bytes | msgspec.Raw) -> str:
    """A bounded preview of untrusted text for an error message (at most about 160 characters).

    Long text keeps its head and tail, so the place a frame went wrong is usually visible. The
    text may come as its bytes, or as a part of a frame that was kept undecoded (`msgspec.Raw`:
    an Anthropic block, a Responses item, checked once its type is read).
    """
    text = raw if isinstance(raw, str) else bytes(raw).decode("utf-8", "replace")
    if len(text) <= _PREVIEW_MAX:
        return text
    return f"{text[:_PREVIEW_EDGE]}...[truncated]...{text[-_PREVIEW_EDGE:]}"


class RilletError(Exception):
    """The root of every error rillet raises on purpose.

    Attributes:
        result: the run's result (a `TurnResult` or an `AgentResult`: what it delivered, what
            it cost) when the error comes from its `raise_for_outcome()`; else None.
    """

    result: Any = None


# --- frames -------------------------------------------------------------------------------------


class FrameError(RilletError):
    """The provider's bytes could not be turned into frames (how each kind is retried is in the
    failure taxonomy, `rillet._core._failures`).

    Attributes:
        provider: the dialect name, or "" where the decoder was used on its own.
        offset: the byte offset in the stream where the offending frame started, when known.
        frame_index: the 0-based position of the offending frame in the stream, when known.
    """

    def __init__(
        self,
        message: str,
        *,
        provider: str = "",
        offset: int | None = None,
        frame_index: int | None = None,
    ) -> None:
        self.provider = provider
        self.offset = offset
        self.frame_index = frame_index
        self.reason = message
        super().__init__(message)

    def locate(self, *, provider: str, frame_index: int | None, offset: int | None) -> None:
        """Fill in where the frame was, for a decoder that did not know (the message follows)."""
        self.provider = self.provider or provider
        if self.frame_index is None:
            self.frame_index = frame_index
        if self.offset is None:
            self.offset = offset

    def __str__(self) -> str:
        where = []
        if self.provider:
            where.append(self.provider)
        if self.frame_index is not None:
            where.append(f"frame {self.frame_index}")
        if self.offset is not None:
            where.append(f"byte {self.offset}")
        return f"{self.reason} ({', '.join(where)})" if where else self.reason


class FrameTooLarge(FrameError):
    """One frame grew past the decoder's cap before it ended. Permanent: the same request would
    get the same frame back.

    Attributes:
        limit: the cap in bytes.
        size: how many bytes the frame had reached when it was refused.
    """

    def __init__(
        self, limit: int, size: int, *, provider: str = "", offset: int | None = None
    ) -> None:
        self.limit = limit
        self.size = size
        super().__init__(
            f"frame of at least {size} bytes exceeds the {limit}-byte cap",
            provider=provider,
            offset=offset,
        )


class FrameEncodingError(FrameError):
    """A frame that must be UTF-8 (an NDJSON line, a JSON body) is not."""


class EventStreamFrameError(FrameError):
    """AWS event-stream bytes that are not a message: a prelude or message CRC that does not
    match, a length no message can have, or headers that do not parse. The bytes were damaged on
    the way (or are not an event stream at all): nothing after them is read."""


class MalformedFrameError(FrameError):
    """A frame is not JSON, is JSON of the wrong shape, or names an event type we do not know.

    Attributes:
        frame_preview: a bounded preview of the offending frame.
        not_json: whether the frame is not JSON at all (cut short or corrupted on the way: worth
            another request), rather than valid JSON of the wrong shape (which the same request
            would only get back). When the raiser does not say, it is read from the decode
            error the frame error was raised from.
    """

    def __init__(
        self,
        message: str,
        frame: str | bytes | msgspec.Raw = "",
        *,
        provider: str = "",
        offset: int | None = None,
        frame_index: int | None = None,
        not_json: bool | None = None,
    ) -> None:
        self.frame_preview = preview(frame)
        self._not_json = not_json
        super().__init__(message, provider=provider, offset=offset, frame_index=frame_index)

    @property
    def not_json(self) -> bool:
        """True for bytes that are not JSON, False for JSON of the wrong shape (see the class)."""
        if self._not_json is not None:
            return self._not_json
        cause = self.__cause__ or self.__context__
        if isinstance(cause, msgspec.ValidationError):
            return False  # decoded fine, into the wrong shape
        return isinstance(cause, msgspec.DecodeError | json.JSONDecodeError)


class SSEErrorField(FrameError):
    """An SSE stream carried an `error:` line, a field the standard does not define:
    llama.cpp-family servers (llama-box, GPUStack, llama.cpp's server before its late-2025
    rewrite) end a failed stream so, with JSON (`{"code", "message", "type"}`, `{"detail"}`) or
    plain text after the colon. The handler reads it as the provider's own error
    (`rillet._turn._reply_errors.reported`); nothing of the stream after it is read.

    Attributes:
        text: what followed `error:`, bounded (4 KiB).
    """

    def __init__(self, text: str, *, offset: int | None = None) -> None:
        self.text = text[:_FIELD_MAX]
        super().__init__(f"the stream reported an error: {preview(text)}", offset=offset)


_FIELD_MAX = 4096


class SSEEncodeError(RilletError, ValueError):
    """An SSE field we were asked to write contains CR, LF or NUL and would split the frame.

    Attributes:
        field: the field name (`event` or `id`).
    """

    def __init__(self, field: str) -> None:
        self.field = field
        super().__init__(f"SSE {field} must not contain CR, LF or NUL")


# --- local: what we were asked cannot be done ----------------------------------------------


class ConfigurationError(RilletError, ValueError):
    """A provider cannot be configured as asked: no key where one is needed, an unknown kind, a
    base URL that is not one, no model where there is no default. Raised before any request.

    Attributes:
        kind: the provider kind asked for.
        env_var: the environment variable that would fix it, when one would.
    """

    def __init__(self, kind: str, env_var: str | None, message: str) -> None:
        self.kind = kind
        self.env_var = env_var
        super().__init__(message)


class UnsupportedContentError(RilletError, ValueError):
    """A message holds an item this provider cannot take (an image sent to a text embedder).

    Raised before any request is sent. Attributes:
        provider: the dialect that refused it.
        item_type: the item's type (`image_url.done`, `tool_result.done`...).
    """

    def __init__(self, provider: str, item_type: str) -> None:
        self.provider = provider
        self.item_type = item_type
        super().__init__(f"{provider} embeds text only; a message holds a {item_type} item")


class UnsupportedOperationError(RilletError, ValueError):
    """The provider has no such operation (an MMSP server has no non-streaming endpoint).

    Raised before any request is sent, or when asked to decode what cannot exist. Attributes:
        provider: the dialect.
        operation: what was asked for.
    """

    def __init__(self, provider: str, operation: str, message: str) -> None:
        self.provider = provider
        self.operation = operation
        super().__init__(message)


class NoHistoryError(RilletError, RuntimeError):
    """A turn run with `history=False` was asked for `uni_events()` or `run_events()`: it keeps
    no replay of its events (its sinks get every one).

    Attributes:
        run_id: the turn's run id.
    """

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        super().__init__(
            f"turn {run_id} keeps no history (history=False): read its events through a sink"
        )


# --- the grammar (MMSP's names) -----------------------------------------------------------------


class StreamError(RilletError):
    """The provider's stream broke the UniEvent grammar or ended without what it owed.

    Attributes:
        provider: the dialect whose stream it was.
    """

    def __init__(self, provider: str, message: str) -> None:
        self.provider = provider
        super().__init__(message)


class StreamProtocolError(StreamError):
    """The stream breaks the item contract: a fragment for no open item, a fragment of the wrong
    kind for its item, a tool call without a name, two different fidelities in one item, or a
    second stop. Permanent: retrying the same provider is not expected to help."""

    def __init__(self, provider: str, message: str) -> None:
        super().__init__(provider, f"{provider} broke the streaming protocol: {message}")


class IncompleteStreamError(StreamError):
    """The stream ended before its finish reason and/or its usage arrived; worth retrying.

    Attributes:
        missing: which of `usage_metadata` and `finish_reason` never came.
        finish_reason: the finish reason that did arrive, if any.
        usage_metadata: the usage that did arrive, if any (a `UsageMetadata`).
    """

    def __init__(
        self,
        provider: str,
        missing: tuple[str, ...],
        finish_reason: str | None = None,
        usage_metadata: Any = None,
    ) -> None:
        self.missing = missing
        self.finish_reason = finish_reason
        self.usage_metadata = usage_metadata
        super().__init__(provider, f"{provider}'s stream ended without {' and '.join(missing)}.")


class EmptyResponseError(StreamError):
    """A completed reply carried nothing but thinking, or nothing at all that is read (items of
    kinds no dialect reads, a hosted tool's output); replaying it would be refused.

    Attributes:
        finish_reason: the reply's finish reason.
        usage_metadata: what the reply still cost.
        provider_reason: the provider's own spelling of why it stopped (`SAFETY`,
            `PROHIBITED_CONTENT`, `MALFORMED_FUNCTION_CALL`, `content_filter`), when it gave one:
            what tells a filtered or blocked reply from one of reasoning only.
        thinking: whether the reply held thinking (else it held nothing read at all).
    """

    def __init__(
        self,
        provider: str,
        finish_reason: str | None,
        usage_metadata: Any = None,
        *,
        provider_reason: str | None = None,
        thinking: bool = True,
    ) -> None:
        self.finish_reason = finish_reason
        self.usage_metadata = usage_metadata
        self.provider_reason = provider_reason
        self.thinking = thinking
        what = "no content other than thinking" if thinking else "no content that is read"
        super().__init__(provider, f"{provider} returned {what} (finish_reason={finish_reason!r}).")


class ToolCallArgumentParseError(StreamError):
    """A closed tool call's joined arguments are malformed, cut short, or not a JSON object.

    Attributes:
        tool_name: the tool the model called.
        tool_call_id: the call's id.
        raw_arguments_length: the length of the joined argument text.
        raw_arguments_preview: a bounded preview of it.
        cut_short: the text ended before its JSON did (a reply stopped at its token limit
            inside the call), rather than being malformed.
    """

    def __init__(
        self,
        provider: str,
        tool_name: str,
        tool_call_id: str,
        raw_arguments: str,
        reason: str,
        *,
        cut_short: bool = False,
    ) -> None:
        self.tool_name = tool_name
        self.tool_call_id = tool_call_id
        self.cut_short = cut_short
        self.raw_arguments_length = len(raw_arguments)
        self.raw_arguments_preview = preview(raw_arguments)
        super().__init__(
            provider,
            f'Invalid streamed tool call arguments from {provider} for tool "{tool_name}" '
            f'(tool_call_id="{tool_call_id}", length={self.raw_arguments_length}, '
            f"preview={self.raw_arguments_preview!r}): {reason}",
        )


# --- the turn ---------------------------------------------------------------------------------


class TransportError(RilletError):
    """The connection to the provider failed (connect error, read error, reset, protocol error).

    Attributes:
        provider: the provider's name.
        kind: the underlying failure's class name (`ConnectError`, `ReadError`...).
    """

    def __init__(self, provider: str, kind: str) -> None:
        self.provider = provider
        self.kind = kind
        super().__init__(f"{provider}: connection failed ({kind})")


class TurnTimeout(RilletError):
    """A deadline blew while waiting on the provider.

    Attributes:
        provider: the provider's name.
        deadline: which one: `initial-event`, `per-event`, `total` or `rescue`.
        seconds: its length.
    """

    def __init__(self, provider: str, deadline: str, seconds: float) -> None:
        self.provider = provider
        self.deadline = deadline
        self.seconds = seconds
        super().__init__(f"{provider}: no event within the {deadline} deadline ({seconds:g} s)")


class RescueFailed(RilletError):
    """Streaming was hopeless and the non-streaming rescue failed too (`rillet.RescueFailed`,
    its old name, still names it for one release).

    Attributes:
        stream_outcome: the outcome streaming ended with (an `Outcome`).
        stream_error: the error that ended streaming.
        rescue_error: the error that ended the rescue.
    """

    def __init__(
        self, stream_outcome: Any, stream_error: BaseException | None, rescue_error: BaseException
    ) -> None:
        self.stream_outcome = stream_outcome
        self.stream_error = stream_error
        self.rescue_error = rescue_error
        super().__init__(
            f"streaming ended {getattr(stream_outcome, 'name', stream_outcome)} "
            f"({type(stream_error).__name__ if stream_error else 'no error'}); "
            f"the rescue failed too ({type(rescue_error).__name__})"
        )


# --- what the provider reported -----------------------------------------------------------------


class ProviderError(RilletError):
    """An error the provider reported, as an HTTP status or inside an open stream.

    Attributes:
        provider: the dialect that received it.
        status: the HTTP status (or the status code inside an in-stream error), if any.
        error_type: the provider's own error type or code (`overloaded_error`, `UNAVAILABLE`...).
        provider_message: the provider's message, bounded; never shown to end users by default.
        retry_after: seconds the provider asked us to wait, if it said.
        in_stream: whether it arrived inside a stream that had already begun.
        provider_fields: the `type`, `code` and `param` of the provider's own error object,
            those it sent as strings, as it spelt them: what a gateway in front of it passes on
            to its client.
        token_limit: for a rate limit on tokens, the limit the provider stated (tokens per
            window: OpenAI's `Limit N`, a Gemini quota's `quotaValue`, the
            `x-ratelimit-limit-tokens` header), if it stated one.
        tokens_needed: what the request needs of that limit: what the provider said it asked
            for (`Requested N`), else, for a request refused as larger than the limit, the
            least it can need (its words, one token each).
        time_left: for a rate limit not waited for, the seconds the turn had left when the
            provider asked to wait longer than that.
        wait_cap: for a rate limit not waited for, the longest wait the turn takes (the
            policy's `retry_after_max`), when the provider asked to wait longer than that.
    """

    def __init__(
        self,
        provider: str,
        provider_message: str = "",
        *,
        status: int | None = None,
        error_type: str | None = None,
        retry_after: float | None = None,
        in_stream: bool = False,
        provider_fields: Mapping[str, str] | None = None,
    ) -> None:
        self.provider = provider
        self.status = status
        self.error_type = error_type
        self.provider_fields: Mapping[str, str] = provider_fields or {}
        self.provider_message = preview(provider_message)
        self.retry_after = retry_after
        self.in_stream = in_stream
        self.token_limit: int | None = None
        self.tokens_needed: int | None = None
        self.time_left: float | None = None
        self.wait_cap: float | None = None
        facts = ", ".join(
            part
            for part in (
                f"status {status}" if status is not None else "",
                error_type or "",
                "in stream" if in_stream else "",
            )
            if part
        )
        text = f"{provider} reported an error"
        if facts:
            text += f" ({facts})"
        if self.provider_message:
            text += f": {self.provider_message}"
        super().__init__(text)


ZAI_ACCOUNT_CODES = frozenset({"1110", "1111", "1112", "1113", "1121", "1304"})
"""Z.ai's (Zhipu's) codes, sent with a 429, of an account that cannot be served until it
changes: inactive, unknown, locked, in arrears (a key of one plan on another plan's endpoint
too), locked for irregular use, or past its calls for the day."""

QUOTA_CODES = frozenset(
    {
        "insufficient_quota",
        "billing_hard_limit_reached",
        "billing_error",
        "exceeded_current_quota_error",  # Moonshot's (Kimi) 429 of a suspended account
        *ZAI_ACCOUNT_CODES,
    }
)
"""Provider error codes no wait or retry cures, the account must change first: an error with one
is a plain `ProviderError` carrying the code, never a `RateLimitError`, even sent with a 429."""

CONTENT_POLICY_CODES = frozenset(
    {"content_filter", "content_policy_violation", "image_content_policy_violation"}
)
"""Provider error codes of a request its content rules refused (OpenAI's, Azure's): an error
with one keeps it as its type, whatever other type came with it."""

REQUEST_TOO_LARGE = "request_too_large"
"""The code of a request larger than the provider takes (Anthropic's 413 type), and of a rate
limit the request alone exceeds: one that says so (OpenAI's `Request too large ... Limit 30000,
Requested 35364`, a `Request too large` code beside Azure's `exceeded token rate limit`), or
one whose stated token limit is below what the request needs (`past_limit`). The same request
would get the same answer however long it waited: it must shrink first. Like a quota code, it
is a plain `ProviderError` carrying the code, never a `RateLimitError`."""

MODEL_TOO_LARGE = "model_too_large"
"""The code of a model too large for the server's memory (Ollama's 500 `model requires more
system memory (5.5 GiB) than is available`): it fails the same way until the model changes."""

REDIRECT = "redirect"
"""The error type of a redirect answer (3xx with a `Location`): a turn never follows one, since
the request carries the key; the line a person reads names where it points."""

CONTEXT_FULL = re.compile(
    r"maximum context length|context (?:length|window|size)|prompt is too long"
    r"|input token count .* exceeds|input token count is \d+ but"
    r"|maximum prompt length|maximum allowed input length|input is too long"
    r"|model token limit|reduce the length of the messages|prompt token count of \d+ exceeds",
    re.IGNORECASE,
)
"""How providers say a request is longer than the model's context window, in words: OpenAI and
vLLM (`maximum context length`), llama.cpp (`available context size`), Anthropic (`prompt is
too long`), Gemini (`input token count (N) exceeds`), Vertex (`input token count is N but model
only supports up to M`), xAI (`maximum prompt length is N but the request contains M`),
OpenRouter's backends (`maximum allowed input length`), Bedrock (`input is too long`), Kimi
(`model token limit`), Groq (`reduce the length of the messages`), GitHub's (`prompt token count
of N exceeds`). The same request never fits, however often it is sent."""

UNCURABLE_CODES = QUOTA_CODES | {REQUEST_TOO_LARGE, MODEL_TOO_LARGE}
"""Provider error codes that no retry or wait cures."""


class RateLimitError(ProviderError):
    """The provider is rate limiting us (429, `rate_limit_error`, `RESOURCE_EXHAUSTED`)."""


class OverloadedError(ProviderError):
    """The provider is overloaded (529, `overloaded_error`, Gemini `UNAVAILABLE`)."""


class ServerError(ProviderError):
    """The provider failed on its side (500, 502, 504, `api_error`, `INTERNAL`)."""


class InvalidRequestError(ProviderError):
    """The provider refused the request as it is (400, 404, 422, `invalid_request_error`): an
    option or a message it does not take, a model it does not know, a prompt past the context
    window. Asking again unchanged gets the same answer."""


class AuthenticationError(ProviderError):
    """The provider refused our credentials or permissions (401, 403, or a key refused in a bad
    request's words: Gemini's and xAI's 400)."""


_CONTEXT_CODES = frozenset(
    {"context_length_exceeded", "exceed_context_size_error", "too_many_prompt_tokens"}
)
"""Error codes of a request longer than the model's context window (OpenAI's, llama.cpp's,
Perplexity's: `The total length of all messages is too long.`)."""
_TOO_MANY_TOKENS = re.compile(r"too many (?:input )?tokens", re.IGNORECASE)


def past_context(error: BaseException | None) -> bool:
    """Whether the provider refused a request as longer than the model's context window: by
    its code, or in its words (`CONTEXT_FULL`, "too many tokens")."""
    if not isinstance(error, InvalidRequestError):
        return False
    said = error.provider_message
    return (
        (error.error_type or "").lower() in _CONTEXT_CODES
        or CONTEXT_FULL.search(said) is not None
        or _TOO_MANY_TOKENS.search(said) is not None
    )


_KEY_REFUSED = re.compile(
    r"\bapi[ _-]?key\b[^.]*\b(?:not valid|invalid|expired|revoked)\b"
    r"|\b(?:incorrect|invalid|wrong) api[ _-]?key\b",
    re.IGNORECASE,
)
"""How a provider refuses a key in words, sent as a bad request: Gemini's 400 INVALID_ARGUMENT
(`API key not valid. Please pass a valid API key.`, `API key expired. ...`), xAI's 400
(`Incorrect API key provided: xa***bc. You can obtain an API key from ...`), the words OpenAI's
401 has too."""


def key_refused(message: str) -> bool:
    """Whether a provider's message says it refused the key (`_KEY_REFUSED`): what makes a bad
    request (a 400, or an error in the stream) an `AuthenticationError`."""
    return _KEY_REFUSED.search(message) is not None


_NOT_FOUND_TYPES = frozenset(
    {"not_found_error", "not_found", "model_not_found", "deploymentnotfound"}
)
"""Error types and codes of a model (or deployment) the provider does not know: Anthropic's,
Gemini's status word, OpenAI's code (which OpenAI's Responses API sends with a 400), Azure's."""


def not_found(error: BaseException | None) -> bool:
    """Whether the provider said it does not know what was asked for (the model, a
    deployment, the path): a 404, or a type or code that says so with another status."""
    if not isinstance(error, ProviderError):
        return False
    if error.status == 404:
        return True
    said = ((error.error_type or "").lower(), error.provider_fields.get("code", "").lower())
    return any(kind in _NOT_FOUND_TYPES for kind in said)


def causes(error: BaseException) -> list[BaseException]:
    """`error` and everything under it: causes, contexts and the members of groups (once
    each): where a transport error keeps the OS's or the TLS layer's reason."""
    found: list[BaseException] = []
    seen: set[int] = set()
    stack = [error]
    while stack:
        exc = stack.pop()
        if id(exc) in seen:
            continue
        seen.add(id(exc))
        found.append(exc)
        if isinstance(exc, BaseExceptionGroup):
            stack.extend(exc.exceptions)
        stack.extend(e for e in (exc.__cause__, exc.__context__) if e is not None)
    return found


NOT_TLS_REASONS = frozenset({"WRONG_VERSION_NUMBER", "HTTP_REQUEST", "RECORD_LAYER_FAILURE"})
"""The TLS layer's reasons for an answer to the handshake that is not TLS at all (a plain-HTTP
server on an `https://` URL)."""


# --- the transport's own failures -------------------------------------------------------------


class UpstreamError(RilletError):
    """The transport could not carry the exchange: a connection refused, reset or cut off, a
    protocol the peer broke, before any reply was read (as httpx's `TransportError` is an
    `HTTPError`). Transport-shaped: the handler retries it, as the `TransportError` it makes
    of it for the provider.

    Attributes:
        kind: what failed, short and safe to log (`ConnectError`, `ReadError`...).
    """

    def __init__(self, kind: str, detail: str = "") -> None:
        self.kind = kind
        super().__init__(f"{kind}: {detail}" if detail else kind)


# --- what a local rule refused ----------------------------------------------------------------


class ContextWindowExceeded(RilletError):
    """What must be sent (instructions, the current question and its tool evidence) does not
    fit the context budget; nothing was sent."""

    code = "context_window_exceeded"

    def __init__(self, required: int, available: int) -> None:
        super().__init__(f"the prompt needs about {required} tokens, the budget allows {available}")
        self.required = required
        self.available = available


class CostLimitExceeded(RilletError):
    """The run's money (`max_cost`) ran out: it would not pay for the next request's prompt,
    or one token of its reply (nothing was sent), or the reply was cut at the tokens it
    bought (`needed` None).

    Attributes:
        remaining: what the run had left to spend.
        needed: what the prompt alone would have cost, by its estimate; None for a cut reply.
    """

    code = "max_cost"

    def __init__(self, remaining: Decimal, needed: Decimal | None = None) -> None:
        if needed is None:
            said = f"the reply was cut at the tokens the run's remaining {remaining} buys"
        else:
            said = (
                f"the run has {remaining} left to spend; the next request's prompt alone "
                f"costs about {needed}"
            )
        super().__init__(said)
        self.remaining = remaining
        self.needed = needed


# --- the hub's refusals -----------------------------------------------------------------------


class HubError(RilletError):
    """A subscription or append the hub refused."""


class UnknownRun(HubError):
    """No such run (never existed, or forgotten after its retention)."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        super().__init__("unknown run")


class RunExists(HubError):
    """A run with this id is already open."""


class AppendConflict(HubError):
    """The log already holds these seqs: another producer is appending to the same run.

    Attributes:
        run_id: the run.
        seq: the first seq refused.
    """

    def __init__(self, run_id: str, seq: int) -> None:
        self.run_id = run_id
        self.seq = seq
        super().__init__(f"run {run_id} already has seq {seq}: a second producer for this run")


class HubUnavailable(HubError):
    """The hub's storage cannot be reached (a Redis outage): nothing was appended or read."""


class CursorInvalid(HubError):
    """A resume cursor that is malformed, names another run, or lies past the last event."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"invalid cursor: {reason}")


class CursorExpired(HubError):
    """A resume cursor older than what the log still keeps: resuming would leave a gap.

    Attributes:
        first_kept: the oldest seq still kept.
    """

    def __init__(self, first_kept: int) -> None:
        self.first_kept = first_kept
        super().__init__(f"cursor expired: the log keeps events from seq {first_kept}")


class SubscriberDropped(HubError):
    """The subscriber fell further behind than its buffer; resume from `last_seq`.

    Attributes:
        reason: a short code (`fell_behind`).
        last_seq: the last seq it was given.
    """

    def __init__(self, reason: str, last_seq: int) -> None:
        self.reason = reason
        self.last_seq = last_seq
        super().__init__(f"subscriber dropped ({reason}); resume after seq {last_seq}")


# --- MCP --------------------------------------------------------------------------------------


class RunEventGap(RilletError):
    """A call's run events have a gap the dispatcher cannot bridge.

    Attributes:
        correlation_id: the call's id.
        missing: the first `seq` that never came.
        waiting: how many later events were waiting for it.
    """

    def __init__(self, correlation_id: str, missing: int, waiting: int) -> None:
        self.correlation_id = correlation_id
        self.missing = missing
        self.waiting = waiting
        super().__init__(
            f"run events of {correlation_id}: seq {missing} never came "
            f"({waiting} later events waiting)"
        )


# --- a run's end ------------------------------------------------------------------------------


class RunFailed(RilletError):
    """A run ended without its answer, and no other error says why: it was stopped
    (`cancelled`), an agent ran out of steps (`max_steps`) or had every answer rejected
    (`answer_rejected`), or what ended it was not one of rillet's errors (`internal_error`).

    Attributes:
        code: the safe code its `run.done` carried (docs/codes.md).
    """

    def __init__(self, code: str) -> None:
        self.code = code
        super().__init__(f"the run ended without its answer ({code})")


def failure(error: BaseException | None, code: str, result: Any) -> RilletError:
    """The error a run's `raise_for_outcome()` raises: the one that ended it, or a `RunFailed`
    with its code where none of rillet's did (its cause, if any, as `__cause__`); `result`
    attached either way."""
    if isinstance(error, RilletError):
        raised = error
    else:
        raised = RunFailed(code)
        raised.__cause__ = error
    raised.result = result
    return raised
