"""Every error carries its facts as attributes, and no message ever shows a credential held in a
`Secret` (the error shapes of every provider: `test_error_bodies`)."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from rillet import (
    AuthenticationError,
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
    SSEEncodeError,
    StreamError,
    StreamProtocolError,
    ToolCallArgumentParseError,
)
from rillet._core import _errors as errors
from rillet._core._errors import preview
from rillet.providers import AnthropicDialect, HttpRequest, Provider, Secret
from rillet.providers._error_body import error_from_body

KEY = "sk-ant-api03-TOPSECRET-0123456789abcdefWXYZ"

# --- the tree ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cls", "parent"),
    [
        (FrameError, RilletError),
        (FrameTooLarge, FrameError),
        (FrameEncodingError, FrameError),
        (MalformedFrameError, FrameError),
        (SSEEncodeError, RilletError),
        (StreamError, RilletError),
        (StreamProtocolError, StreamError),
        (IncompleteStreamError, StreamError),
        (EmptyResponseError, StreamError),
        (ToolCallArgumentParseError, StreamError),
        (ProviderError, RilletError),
        (RateLimitError, ProviderError),
        (OverloadedError, ProviderError),
        (ServerError, ProviderError),
        (InvalidRequestError, ProviderError),
        (AuthenticationError, ProviderError),
        (errors.UpstreamError, RilletError),
        (errors.ContextWindowExceeded, RilletError),
        (errors.CostLimitExceeded, RilletError),
        (errors.HubError, RilletError),
        (errors.UnknownRun, errors.HubError),
        (errors.RunExists, errors.HubError),
        (errors.AppendConflict, errors.HubError),
        (errors.HubUnavailable, errors.HubError),
        (errors.CursorInvalid, errors.HubError),
        (errors.CursorExpired, errors.HubError),
        (errors.SubscriberDropped, errors.HubError),
        (errors.RunEventGap, RilletError),
    ],
)
def test_the_error_tree(cls: type[BaseException], parent: type[BaseException]) -> None:
    assert issubclass(cls, parent)


def test_every_error_of_the_library_is_defined_in_the_errors_module() -> None:
    """One module holds the tree; only the server's own refusals live with the server."""
    import rillet.mcp
    import rillet.redis
    import rillet.transports.server

    def below(cls: type[BaseException]) -> list[type[BaseException]]:
        return [c for sub in cls.__subclasses__() for c in (sub, *below(sub))]

    server = {"ServerConfigError", "WorkerFailed"}
    # (`__module__` names the public module each is exported from: look them up in `_errors`)
    elsewhere = sorted(
        cls.__name__
        for cls in below(RilletError)
        if cls.__name__ not in server and getattr(errors, cls.__name__, None) is not cls
    )
    assert elsewhere == []
    for name in server:
        assert issubclass(getattr(rillet.transports.server, name), RilletError)


def test_every_listed_error_is_a_rillet_error() -> None:
    for name in errors.__all__:
        obj = getattr(errors, name)
        if isinstance(obj, type):
            assert issubclass(obj, RilletError), name


def test_stream_errors_have_mmsp_names() -> None:
    names = {"StreamProtocolError", "IncompleteStreamError", "EmptyResponseError"}
    names.add("ToolCallArgumentParseError")
    assert names <= set(errors.__all__)
    mmsp_errors = pytest.importorskip("mmsp.errors")
    for name in names:
        assert hasattr(mmsp_errors, name)


# --- facts as attributes ----------------------------------------------------------------------


def test_frame_error_facts_and_message() -> None:
    error = FrameError("bad frame", provider="gemini", offset=120, frame_index=3)
    assert (error.provider, error.offset, error.frame_index, error.reason) == (
        "gemini",
        120,
        3,
        "bad frame",
    )
    assert str(error) == "bad frame (gemini, frame 3, byte 120)"
    assert str(FrameError("bare")) == "bare"


def test_locate_fills_only_what_is_unknown() -> None:
    error = FrameEncodingError("not UTF-8", offset=7)
    error.locate(provider="ollama", frame_index=2, offset=999)
    assert (error.provider, error.frame_index, error.offset) == ("ollama", 2, 7)
    assert str(error) == "not UTF-8 (ollama, frame 2, byte 7)"
    error.locate(provider="other", frame_index=5, offset=None)
    assert (error.provider, error.frame_index) == ("ollama", 2)


def test_frame_too_large_facts() -> None:
    error = FrameTooLarge(100, 150, provider="openai-chat", offset=10)
    assert (error.limit, error.size, error.offset, error.provider) == (100, 150, 10, "openai-chat")
    assert "100" in str(error)
    assert "150" in str(error)


def test_malformed_frame_facts_and_bounded_preview() -> None:
    frame = '{"type": "x", "blob": "' + "A" * 5000 + '"}'
    error = MalformedFrameError("frame is not JSON", frame, provider="anthropic", frame_index=4)
    assert error.provider == "anthropic"
    assert error.frame_index == 4
    assert error.frame_preview == preview(frame)
    assert len(error.frame_preview) < 200
    assert error.frame_preview.startswith('{"type": "x"')
    assert error.frame_preview.endswith('A"}')
    assert len(str(error)) < 300
    assert MalformedFrameError("m", b"\xffab").frame_preview == "\ufffdab"


def test_sse_encode_error_facts() -> None:
    error = SSEEncodeError("id")
    assert error.field == "id"
    assert isinstance(error, ValueError)


def test_stream_protocol_error_facts() -> None:
    error = StreamProtocolError("openai-chat", "a second stop")
    assert error.provider == "openai-chat"
    assert "openai-chat" in str(error)
    assert "a second stop" in str(error)


def test_incomplete_stream_error_facts() -> None:
    usage = {"prompt_tokens": 1}
    error = IncompleteStreamError("gemini", ("usage_metadata", "finish_reason"), "stop", usage)
    assert error.provider == "gemini"
    assert error.missing == ("usage_metadata", "finish_reason")
    assert error.finish_reason == "stop"
    assert error.usage_metadata is usage
    assert "usage_metadata and finish_reason" in str(error)


def test_empty_response_error_facts() -> None:
    error = EmptyResponseError("anthropic", "stop", {"response_tokens": 0})
    assert (error.provider, error.finish_reason) == ("anthropic", "stop")
    assert error.usage_metadata == {"response_tokens": 0}
    assert "'stop'" in str(error)


def test_tool_call_argument_parse_error_facts() -> None:
    raw = '{"city": "' + "x" * 1000
    error = ToolCallArgumentParseError("openai-chat", "get_weather", "call_7", raw, "truncated")
    assert error.provider == "openai-chat"
    assert error.tool_name == "get_weather"
    assert error.tool_call_id == "call_7"
    assert error.raw_arguments_length == len(raw)
    assert error.raw_arguments_preview == preview(raw)
    assert len(error.raw_arguments_preview) < 200
    for fact in ("openai-chat", "get_weather", "call_7", str(len(raw)), "truncated"):
        assert fact in str(error)


def test_provider_error_facts() -> None:
    error = RateLimitError(
        "openai-chat",
        "Rate limit reached",
        status=429,
        error_type="rate_limit_exceeded",
        retry_after=1.5,
        in_stream=False,
    )
    assert error.provider == "openai-chat"
    assert error.status == 429
    assert error.error_type == "rate_limit_exceeded"
    assert error.retry_after == 1.5
    assert error.in_stream is False
    assert error.provider_message == "Rate limit reached"
    assert str(error) == (
        "openai-chat reported an error (status 429, rate_limit_exceeded): Rate limit reached"
    )


def test_provider_error_in_stream_and_without_facts() -> None:
    assert str(ProviderError("ollama")) == "ollama reported an error"
    error = OverloadedError(
        "anthropic", "Overloaded", error_type="overloaded_error", in_stream=True
    )
    assert error.in_stream is True
    assert error.status is None
    assert str(error) == "anthropic reported an error (overloaded_error, in stream): Overloaded"


def test_provider_message_is_bounded() -> None:
    error = ServerError("gemini", "e" * 10_000, status=500)
    assert len(error.provider_message) < 200
    assert len(str(error)) < 300


def test_turn_errors_carry_their_facts() -> None:
    transport = errors.TransportError("anthropic", "ReadError")
    assert (transport.provider, transport.kind) == ("anthropic", "ReadError")
    timeout = errors.TurnTimeout("gemini", "per-event", 2.5)
    assert (timeout.provider, timeout.deadline, timeout.seconds) == ("gemini", "per-event", 2.5)
    assert "per-event" in str(timeout)
    stream_error, rescue_error = OverloadedError("x"), ServerError("x")
    failed = errors.RescueFailed("failed", stream_error, rescue_error)
    assert failed.stream_error is stream_error
    assert failed.rescue_error is rescue_error
    assert failed.stream_outcome == "failed"


@pytest.mark.parametrize(
    ("raw", "want"),
    [
        ("", ""),
        ("short", "short"),
        ("x" * 160, "x" * 160),
        (b"bytes \xc3\xa9", "bytes é"),
    ],
)
def test_preview_keeps_short_text_whole(raw: str | bytes, want: str) -> None:
    assert preview(raw) == want


def test_preview_of_an_undecoded_part_of_a_frame_is_text() -> None:
    # a dialect reads some parts of a frame only once their type is known (`msgspec.Raw`)
    short = msgspec.json.decode(b'{"a": {"b": 1}}', type=dict[str, msgspec.Raw])["a"]
    long = msgspec.json.decode(b'{"a": ["HEAD%sTAIL"]}' % (b"m" * 500), type=dict[str, msgspec.Raw])
    assert preview(short) == '{"b": 1}'
    assert preview(long["a"]).startswith('["HEAD')
    assert preview(long["a"]).endswith('TAIL"]')


def test_preview_of_long_text_keeps_head_and_tail() -> None:
    text = "HEAD" + "m" * 10_000 + "TAIL"
    out = preview(text)
    assert out.startswith("HEAD")
    assert out.endswith("TAIL")
    assert "truncated" in out
    assert len(out) <= 170


# --- secrets ----------------------------------------------------------------------------------


def test_a_secret_is_masked_everywhere_but_reveal() -> None:
    secret = Secret(KEY)
    assert secret.reveal() == KEY
    for shown in (repr(secret), str(secret), f"{secret}", f"{secret!s:>80}", f"{secret!r}"):
        assert KEY not in shown
        assert "TOPSECRET" not in shown
    assert secret.masked() == "…WXYZ"
    assert Secret("short").masked() == "…"


def test_no_error_message_contains_a_secret() -> None:
    secret = Secret(KEY)
    raised: list[BaseException] = [
        ProviderError("openai-chat", f"bad key {secret}", status=401),
        error_from_body("anthropic", 401, {"error": f"key {secret} refused"}),
        MalformedFrameError(f"frame with {secret}", f"{secret!r}"),
        StreamProtocolError(f"{secret}", "x"),
        ToolCallArgumentParseError("p", "t", "c", f"{secret}", f"{secret}"),
        errors.TransportError(f"{secret}", "ReadError"),
    ]
    for error in raised:
        assert KEY not in str(error)
        assert KEY not in repr(error)


def test_provider_and_request_reprs_hide_the_key() -> None:
    provider = Provider(AnthropicDialect(), "https://api.example.com", "m", api_key=Secret(KEY))
    assert KEY not in repr(provider)
    assert KEY not in str(provider)
    request = HttpRequest(url="https://api.example.com/v1", headers={"x-api-key": KEY}, body=b"{}")
    assert KEY not in repr(request)
    assert "x-api-key" in repr(request)


@pytest.mark.parametrize(
    ("body", "status", "cls", "said", "error_type"),
    [
        (  # SiliconFlow: a numeric code of its own
            {"code": 20015, "message": "The parameter is invalid.", "data": None},
            400,
            errors.InvalidRequestError,
            "The parameter is invalid.",
            None,
        ),
        (  # DashScope: a code word
            {"code": "InvalidApiKey", "message": "Invalid API-key provided.", "request_id": "r"},
            401,
            errors.AuthenticationError,
            "Invalid API-key provided.",
            "InvalidApiKey",
        ),
        ({"message": "Forbidden"}, 403, errors.AuthenticationError, "Forbidden", None),  # a gateway
        (  # a code that is an HTTP status names it when the answer has none
            {"code": 429, "message": "Too many requests"},
            None,
            errors.RateLimitError,
            "Too many requests",
            None,
        ),
    ],
    ids=["siliconflow", "dashscope", "gateway", "status-code"],
)
def test_a_flat_code_and_message_body_gives_its_message(
    body: dict[str, Any],
    status: int | None,
    cls: type[Exception],
    said: str,
    error_type: str | None,
) -> None:
    error = error_from_body("p", status, msgspec.json.encode(body))
    assert type(error) is cls
    assert error.provider_message == said
    assert error.error_type == error_type


def test_a_bare_upstream_error_ends_a_run_as_its_own_failure() -> None:
    """An UpstreamError is a RilletError now, yet one that reaches the end of a run unconverted
    (a sink's own transport failing) is the run's own failure, as any other exception is: the
    handler makes every one a provider's transport raises a TransportError."""
    from rillet._core._codes import done_code
    from rillet._core._policy import Outcome

    upstream = errors.UpstreamError("ReadError", "reset")
    assert done_code(Outcome.FAILED, upstream, None) == "internal_error"
    assert done_code(Outcome.FAILED, RuntimeError("sink"), None) == "internal_error"
    transport = errors.TransportError("openai", "ReadError")
    assert done_code(Outcome.INIT_FAILED, transport, None) == "connection_failed"


def test_rillet_exports_every_error() -> None:
    """Every error of the tree is public from `rillet` (the MCP client's from `rillet.mcp`, the
    `mcp` extra's module)."""
    import rillet
    import rillet.mcp

    public = {*rillet.__all__, *rillet.mcp.__all__}
    missing = [
        name
        for name in errors.__all__
        if isinstance(getattr(errors, name), type)
        and issubclass(getattr(errors, name), RilletError)
        and name not in public
    ]
    assert missing == []
