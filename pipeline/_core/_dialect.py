"""What every dialect is, and the pieces dialects share.

A dialect is the sans-I/O knowledge of one provider's wire: how to build its request, how each
frame it streams maps to lane events, how its non-streaming body maps to lane events (the same
stream the provider would have sent, each item in one piece: the rescue uses it), and
how its error bodies map to our typed errors (`_error_body`). No provider SDK: wire JSON is
decoded once with msgspec into typed Structs whose unknown fields are ignored.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

import attrs
import msgspec
from rillet._core._errors import ConfigurationError, MalformedFrameError, ProviderError
from rillet._core._sse import DEFAULT_MAX_FRAME, SSEEvent

if TYPE_CHECKING:
    from ._lanes import LaneEvent
    from ._request import TurnRequest

__all__ = [
    "Dialect",
    "FramesDecoder",
    "Framing",
    "HttpRequest",
    "KeptToken",
    "Provider",
    "Secret",
    "StreamDecoder",
    "ToolIds",
    "answer_tokens",
    "dumps_arguments",
    "sse_event",
    "sse_text",
    "strict_decode",
    "uncached_tokens",
]

Framing = Literal["sse", "ndjson", "eventstream", "json", "message"]
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


@runtime_checkable
class KeptToken(Protocol):
    """A dialect's `token_provider` that keeps its token and says when its next call would
    fetch one (`GoogleAccessToken`, `EntraToken`).

    A dialect signs a request synchronously, and a cloud's identity call is blocking I/O
    (Google's token endpoint, Entra ID, a managed identity endpoint, `az` as a subprocess):
    made while the request is built, it would stop every other stream on the event loop while
    the identity service answers. So before building a request the turn calls a token that is
    `due` in a worker thread; building it then finds the token kept. A token provider of the
    host's own that says nothing of when it fetches is called as it always was."""

    def __call__(self) -> str:
        """The token: the kept one, or a new one when it is due."""
        ...

    def due(self) -> bool:
        """Whether the next call fetches a token (none yet, or the kept one near expiry)."""
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
        """How its streams are framed: `sse`, `ndjson`, `eventstream` (AWS's binary event
        stream), one `json` body, or `message` (a message transport's messages, each one whole
        frame)."""
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


def uncached_tokens(
    prompt: int | None, cached: int | None, output: int | None, total: int | None
) -> int | None:
    """The prompt's tokens not read from the cache, from usage whose `prompt` counts the cached
    ones too (OpenAI's, Gemini's). Never negative: a server that counts the cached tokens
    beside the prompt instead (its total is prompt + cached + output; an Azure AI Foundry
    stream reports 7 prompt tokens and 161 cached) has its prompt taken as the uncached part,
    and so does one whose cached tokens exceed its prompt with no total to say which: the
    provider's numbers are kept as given rather than made to go below zero."""
    if prompt is None or not cached:
        return prompt
    if cached > prompt:
        return prompt
    if total is not None and output is not None and total == prompt + cached + output:
        return prompt
    return prompt - cached


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
