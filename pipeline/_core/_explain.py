"""Why a turn failed, in one line a person can act on: the cause and what to do about it.

The command line prints this for every failure, whatever the output mode. It is built from the
error's facts (status, provider message, the underlying OS error) and never shows a credential:
the key in use and anything shaped like a key in a provider's message are masked (`sk-…3456`).
"""

from __future__ import annotations

import errno
import re
import ssl
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from ._codes import RUN_CODES
from ._errors import (
    MODEL_TOO_LARGE,
    NOT_TLS_REASONS,
    QUOTA_CODES,
    REDIRECT,
    REQUEST_TOO_LARGE,
    AuthenticationError,
    ConfigurationError,
    CostLimitExceeded,
    EmptyResponseError,
    FrameError,
    IncompleteStreamError,
    InvalidRequestError,
    OverloadedError,
    ProviderError,
    RateLimitError,
    RescueFailed,
    RunFailed,
    StreamError,
    ToolCallArgumentParseError,
    TransportError,
    TurnTimeout,
    causes,
    not_found,
    past_context,
)
from ._failures import cause_of
from ._finish import filtered_reason

if TYPE_CHECKING:
    from ._dialect import Provider

__all__ = ["RETRY_SAID", "explain", "filtered_line", "mask_keys"]

# a token that looks like a credential: a known key prefix, then key characters (OpenAI's own
# error messages echo the key with stars in the middle: `sk-abc1**********3456`)
_KEYISH = re.compile(r"\b(sk-ant-|sk-proj-|sk-|sk_|rk-|AIza|gsk_|xai-|key-)([A-Za-z0-9_\-*]{3,})")

_NOT_PULLED = re.compile(r"^model ['\"][^'\"]+['\"] not found")
"""Ollama's 404 for a model it has not downloaded, in newer servers' words."""

_DEADLINE_OPTION = {
    "initial-event": "--initial-timeout",
    "per-event": "--event-timeout",
    "total": "--total-timeout",
    "rescue": "--initial-timeout",
}

_OS_CAUSES = {
    errno.ECONNREFUSED: "connection refused",
    errno.ECONNRESET: "connection reset",
    errno.EHOSTUNREACH: "host unreachable",
    errno.ENETUNREACH: "network unreachable",
    errno.ETIMEDOUT: "timed out",
}

_NO_SUCH_HOST = "no such host"
_LOOKUP_FAILED = "the host name could not be looked up"
_LOOKUP_CAUSES = (_NO_SUCH_HOST, _LOOKUP_FAILED)
"""What a failed name lookup (`socket.gaierror`) says: the name has no address, or the lookup
itself failed (`Temporary failure in name resolution`)."""


_TRANSPORT_KINDS = {
    "ConnectError": "cannot connect",
    "ConnectTimeout": "timed out connecting",
    "ReadError": "the connection failed while reading",
    "WriteError": "the connection failed while sending",
    "RemoteProtocolError": "the connection broke off",
    "ReadTimeout": "timed out reading",
    "ProxyError": "the proxy failed",
    "LocalProtocolError": "the request could not be sent as it is (a header value or the URL)",
    "UnsupportedProtocol": "the base URL's scheme is not one HTTP speaks",
}


RETRY_SAID = {
    "connect_failed": "could not connect",
    "connection_lost": "the connection broke off",
    "stalled": "no data came in time",
    "overloaded": "the provider is overloaded",
    "server_error": "the provider had a server error",
    "unreadable_stream": "the stream came garbled",
    "provider_error": "the provider reported an error",
}
"""What a retry's `status` event says its cause is, for a person: one phrase per safe code
(`RETRY_REASONS`)."""


def filtered_line(provider_reason: str | None) -> str:
    """The line for an answer that came home cut short by the provider's content rules
    (`TurnResult.filtered`: Azure's `content_filter` after some text, Gemini's `SAFETY`), or
    that the model declined to give (a `refusal`: what is shown is its words, whole)."""
    if provider_reason is not None and provider_reason.lower() == "refusal":
        return (
            "the model declined to answer (refusal): what is shown is its reason, not an answer"
            " — rephrase the request"
        )
    return (
        f"the provider's content rules stopped the answer partway ({provider_reason}): what is"
        " shown is incomplete — rephrase the request"
    )


def mask_keys(text: str, provider: Provider | None = None) -> str:
    """`text` with the provider's key and anything shaped like a key masked to its last four
    characters (`sk-…3456`), so a provider message can be shown."""
    if provider is not None and provider.api_key is not None:
        secret = provider.api_key.reveal()
        if secret:
            text = text.replace(secret, provider.api_key.masked())

    def mask(match: re.Match[str]) -> str:
        tail = re.sub(r"[^A-Za-z0-9]", "", match.group(2))
        return f"{match.group(1)}…{tail[-4:]}" if len(tail) >= 8 else f"{match.group(1)}…"

    return _KEYISH.sub(mask, text)


def explain(
    error: BaseException | None,
    provider: Provider | None = None,
    *,
    attempts: int | None = None,
    key_hint: str | None = None,
    quote: bool = True,
) -> str:
    """Why a run failed and what to do, in the one line the command line prints:
    `authentication failed (401): ... — check OPENAI_API_KEY`, `cannot connect to
    127.0.0.1:1: connection refused (4 attempts)`. Any key in it is masked (`sk-…3456`).

    Args:
        error: the error that ended the run (`result.error`, or one `raise_for_outcome()`
            raised: the result attached to it names the provider and the attempts).
        provider: who was asked, for its address and its key's mask; by default the one of
            the result attached to `error`.
        attempts: how many attempts were made; by default the attached result's, else 1.
        key_hint: where the key came from (`OPENAI_API_KEY`, `--api-key`), for the advice on
            an authentication failure.
        quote: False leaves the provider's own message out (a server's logs: a provider's
            401 body may echo the key, and is never passed on, not even masked).
    """
    result = getattr(error, "result", None)
    if provider is None:
        provider = getattr(result, "provider", None)
    if attempts is None:
        attempts = getattr(result, "attempts", None) or 1
    if isinstance(error, RescueFailed):
        first = explain(
            error.stream_error, provider, attempts=attempts, key_hint=key_hint, quote=quote
        )
        if _same_cause(error.stream_error, error.rescue_error):
            return first
        second = explain(error.rescue_error, provider, attempts=1, key_hint=key_hint, quote=quote)
        return f"{first}; the non-streaming retry failed too: {second}"
    line = _explain_one(error, provider, attempts, key_hint, quote)
    return mask_keys(" ".join(line.split()), provider)  # one line, whatever a message held


def _explain_one(
    error: BaseException | None,
    provider: Provider | None,
    attempts: int,
    key_hint: str | None,
    quote: bool,
) -> str:
    tries = f" ({attempts} attempts)" if attempts > 1 else ""
    after = f" after {attempts} attempts" if attempts > 1 else ""
    where = _host(provider.base_url) if provider is not None else "the provider"
    if isinstance(error, RunFailed):
        info = RUN_CODES.get(error.code)
        return info.sentence if info is not None else str(error)
    if error is None:
        return f"the turn ended without an answer{tries}"
    if isinstance(error, TransportError):
        kind = _TRANSPORT_KINDS.get(error.kind, f"the connection failed ({error.kind})")
        cause = _os_cause(error)
        tls = _tls_cause(error)
        if tls is not None:  # the TCP connection was made; the TLS handshake on it failed
            return f"cannot connect to {where}: {tls[0]}{tries} — {tls[1]}"
        if cause_of(error) == "not_http":  # a TLS port asked in plain HTTP, an SSH banner
            plain = provider is not None and provider.base_url.startswith("http:")
            scheme = " (https:// for a TLS port?)" if plain else ""
            return (
                f"the server at {where} did not answer in HTTP{tries} — check the scheme"
                f"{scheme} and the port in --base-url"
            )
        if error.kind == "ConnectError":
            line = f"cannot connect to {where}: {cause or 'connection failed'}{tries}"
            if cause in _LOOKUP_CAUSES:  # the name never became an address
                return line + " — check the host in --base-url, and this machine's network"
            return line + " — is the server running, and is --base-url right?"
        return f"{kind} ({where}){': ' + cause if cause else ''}{tries}"
    if isinstance(error, TurnTimeout):
        option = _DEADLINE_OPTION.get(error.deadline, "--total-timeout")
        return (
            f"no answer from {where} within the {error.deadline} deadline "
            f"({error.seconds:g} s){tries} — raise {option} if the model needs longer"
        )
    if isinstance(error, ProviderError):
        return _provider_error(error, provider, after, key_hint, quote)
    if isinstance(error, IncompleteStreamError):
        words = {"finish_reason": "its finish reason", "usage_metadata": "its usage"}
        missing = " and ".join(words.get(m, m) for m in error.missing) or "its end"
        return f"the provider's stream ended early, without {missing}{tries}"
    if isinstance(error, EmptyResponseError):
        reason = (error.provider_reason or "").lower()
        if filtered_reason(reason):
            return (
                f"the provider stopped the answer before it began ({error.provider_reason}: its"
                " content rules) — rephrase the request"
            )
        if reason == "malformed_function_call":
            return "the model's tool call came out malformed, with no answer — ask again"
        if error.finish_reason == "length":  # the same request spends the limit so again
            return (
                "the model spent the whole token limit on reasoning, with no answer — raise"
                " --max-tokens (or lower --thinking)"
            )
        if not error.thinking:  # items of kinds not read (a hosted tool's output), or nothing
            return (
                "the model's reply held no text and no tool call (nothing that is read) —"
                " rephrase the request, or ask for the answer in text"
            )
        return "the model finished without an answer (nothing but reasoning) — ask again"
    if isinstance(error, ToolCallArgumentParseError) and error.cut_short:
        # the same request stops there again: a reply cut at its token limit inside the call
        return (
            f"the model's call to {error.tool_name} was cut off before its arguments ended —"
            " raise --max-tokens if the reply reached its token limit"
        )
    if isinstance(error, ToolCallArgumentParseError):
        return (
            f"the model called {error.tool_name} with arguments that are not a JSON object "
            "— ask again"
        )
    if isinstance(error, StreamError):
        return f"the provider's stream broke the protocol: {error}{tries}"
    if isinstance(error, FrameError):
        return f"the provider sent a stream that cannot be read: {error}{tries}"
    if isinstance(error, ConfigurationError):
        return str(error)
    if isinstance(error, CostLimitExceeded):
        if error.needed is None:
            return (
                "the answer was cut off at the run's spending limit (max_cost: "
                f"{error.remaining} was left for it) — raise --max-cost for a longer answer"
            )
        return (
            f"the run's spending limit would not pay for the request, so it was not sent ("
            f"{error.remaining} left to spend; the prompt alone costs about {error.needed}) — "
            "raise --max-cost (max_cost), or ask a shorter question"
        )
    text = str(error)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _provider_error(
    error: ProviderError, provider: Provider | None, after: str, key_hint: str | None, quote: bool
) -> str:
    status = f" ({error.status})" if error.status is not None else ""
    said = f": {error.provider_message}" if error.provider_message and quote else ""
    if isinstance(error, AuthenticationError):
        what = "permission denied" if error.status == 403 else "authentication failed"
        check = key_hint or "the API key (--api-key)"
        return f"{what}{status}{said} — check {check}"
    code = (error.error_type or "").lower()
    if code == REDIRECT and error.status is not None and 300 <= error.status < 400:
        where = f" to {error.provider_message.removeprefix('redirected to ')}" if quote else ""
        return (
            f"the server answered with a redirect{status}{where} — put the address it names in"
            " --base-url (a redirect is never followed: the request carries the key)"
        )
    if code == REQUEST_TOO_LARGE:
        sizes = ""
        if error.token_limit is not None and error.tokens_needed is not None:
            sizes = (
                f"; it needs at least {error.tokens_needed:,} tokens, the limit is"
                f" {error.token_limit:,}"
            )
        return (
            f"the request is larger than the provider takes{status}{_ended(said, sizes)}{sizes}"
            " — send less (a shorter conversation, fewer tools, a lower --max-tokens) or ask for"
            " a higher limit"
        )
    if code == MODEL_TOO_LARGE:
        return (
            f"the model does not fit in the server's memory{status}{said} — pick a smaller one "
            "(--model)"
        )
    if code in QUOTA_CODES:
        return f"the account cannot pay for this request{status}{said} — check its plan and billing"
    if isinstance(error, RateLimitError):
        return _rate_limited(error, status, after, said)
    if isinstance(error, OverloadedError):
        return f"the provider is overloaded{status}{after}{said} — try again shortly"
    if error.status == 404 and (
        "try pulling it" in error.provider_message
        or (error.provider == "ollama" and _NOT_PULLED.search(error.provider_message))
    ):
        # Ollama's own words for a model it has not downloaded: `model "x" not found, try
        # pulling it first`, and newer servers' `model 'x' not found` alone
        model = provider.model if provider is not None else "the model"
        return f"the model is not on the Ollama server{status}{said} — ollama pull {model}"
    if not_found(error):  # whatever its type says (Anthropic's `not_found_error`, Gemini's)
        # an unknown model, or a base URL that misses the API's path (a server's root, no /v1)
        # OpenAI-compatible servers serve the API under /v1; Ollama's own API is at its root
        if provider is None:
            return f"not found{status}{said} — check the model, and the base URL"
        if error.status != 404:  # said in the body of another status: the path was right
            return f"not found{status}{said} — check --model"
        cloud = provider.dialect.name.split("-", 1)[0]
        if cloud == "azure":  # the model is a deployment of the resource
            return (
                f"not found{status}{said} — check that the deployment {provider.model!r}"
                " exists on the resource AZURE_OPENAI_ENDPOINT names (--model, --base-url)"
            )
        if cloud == "vertex":  # the model is a publisher's, in the project's location
            return (
                f"not found{status}{said} — check --model, and that the model is offered in"
                " the project's location (GOOGLE_CLOUD_PROJECT, GOOGLE_CLOUD_LOCATION)"
            )
        openai_like = provider.dialect.name.startswith("openai")
        root = openai_like and urlsplit(provider.base_url).path in ("", "/")
        path = "; it often ends in /v1" if root else ""
        return (
            f"not found{status}{said} — check --model, and that {_shown_url(provider.base_url)}"
            f" is the API's base URL (--base-url{path})"
        )
    if past_context(error):
        return (
            f"the conversation is longer than the model takes{status}{said} — shorten it (or"
            " lower --max-tokens), or pick a model with a larger context window"
        )
    if isinstance(error, InvalidRequestError):
        return f"the provider refused the request{status}{said} — check --model and the options"
    code = f" {error.status}" if error.status is not None else ""
    kind = f" ({error.error_type})" if error.error_type and error.status is None else ""
    stream = " in the stream" if error.in_stream else ""
    return f"provider error{code}{kind}{stream}{after}{said}"


def _rate_limited(error: RateLimitError, status: str, after: str, said: str) -> str:
    """A rate limit's line: the wait it asked for, and, when the turn would not wait that long,
    which bound stopped it (what was left of the total deadline, the longest wait a turn
    takes) and what to do."""
    asked = error.retry_after
    if asked is None:
        return f"rate limited{status}{after}{said} — wait a little, or set --rpm"
    line = f"rate limited{status}{after}{_ended(said, ';')}; the provider asked to wait {asked:g} s"
    if error.wait_cap is not None:
        return (
            f"{line}, longer than a turn waits ({error.wait_cap:g} s) — ask again once that"
            " time has passed"
        )
    if error.time_left is not None:
        return (
            f"{line}, more than the {max(error.time_left, 0.0):.3g} s the turn had left — ask"
            " again after the wait, or raise --total-timeout"
        )
    return f"{line} — wait a little, or set --rpm"


def _ended(said: str, more: str) -> str:
    """The provider's words without their closing full stop when `more` follows them after a
    semicolon (`...before retrying; it needs ...`, not `retrying.; it needs`)."""
    return said[:-1] if more and said.endswith(".") else said


def _host(url: str) -> str:
    parts = urlsplit(url)
    host = parts.hostname or url
    if parts.port is not None:
        return f"{host}:{parts.port}"
    return f"{host}:{443 if parts.scheme == 'https' else 80}"


def _shown_url(url: str) -> str:
    """A base URL as it may be shown: scheme, host, port and path, without credentials or a
    query."""
    parts = urlsplit(url)
    if not parts.hostname:
        return url
    port = f":{parts.port}" if parts.port is not None else ""
    return f"{parts.scheme}://{parts.hostname}{port}{parts.path}"


def _os_cause(error: BaseException) -> str:
    """The operating system's reason under a transport error, in words (`connection refused`)."""
    for exc in causes(error):
        number = getattr(exc, "errno", None)
        if isinstance(exc, OSError) and isinstance(number, int) and number in _OS_CAUSES:
            return _OS_CAUSES[number]
        lookup = type(exc).__name__ == "gaierror" or "Name or service not known" in str(exc)
        if isinstance(exc, OSError) and lookup:  # (`socket.gaierror`, named: no socket here)
            temporary = "temporary failure" in str(exc).lower()
            return _LOOKUP_FAILED if temporary else _NO_SUCH_HOST
    return ""


def _tls_cause(error: BaseException) -> tuple[str, str] | None:
    """A failed TLS handshake under a transport error: what happened and what to do; None if
    the cause was not TLS. A plain-HTTP server on an `https://` URL answers the handshake with
    bytes that are not TLS (`WRONG_VERSION_NUMBER`); a certificate that does not verify says
    why (`self-signed certificate`, `Hostname mismatch`)."""
    for exc in causes(error):
        if isinstance(exc, ssl.SSLCertVerificationError):
            why = exc.verify_message or exc.reason or "not trusted"
            return (
                f"the server's TLS certificate was not accepted ({why})",
                "check the host in --base-url, or this machine's CA certificates",
            )
        if isinstance(exc, ssl.SSLError):
            if exc.reason in NOT_TLS_REASONS:
                return (
                    "the TLS handshake failed: the server does not speak TLS",
                    "if it serves plain HTTP, use an http:// URL in --base-url",
                )
            return f"the TLS handshake failed ({exc.reason or exc})", "check --base-url"
    return None


def _same_cause(a: BaseException | None, b: BaseException | None) -> bool:
    """Whether the stream and the rescue failed the same way (one line says it for both)."""
    if a is None or b is None or type(a) is not type(b):
        return False
    if isinstance(a, TransportError) and isinstance(b, TransportError):
        return a.kind == b.kind
    if isinstance(a, ProviderError) and isinstance(b, ProviderError):
        return a.status == b.status
    return str(a) == str(b)
