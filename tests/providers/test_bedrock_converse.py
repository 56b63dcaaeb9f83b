"""Amazon Bedrock's ConverseStream end to end: a turn over real HTTP to a loopback provider on
127.0.0.1 that answers with AWS event-stream frames (made by the tests' own encoder) and
checks each request's SigV4 signature by computing it again with botocore from the test's
fixed credentials, so a request signed wrongly is refused (403) and the test fails."""

from __future__ import annotations

import hmac
import json
import os
import re
import sys
from pathlib import Path

import httpx
import pytest
import trio
import trio.testing
from rillet._core._dialect import Provider, Secret
from rillet._core._errors import (
    AuthenticationError,
    ConfigurationError,
    InvalidRequestError,
    OverloadedError,
    ProviderError,
    RateLimitError,
    ServerError,
    past_context,
)
from rillet._core._events import ThinkingDone, ToolCallDone, ToolResultDone, UniMessage
from rillet._core._failures import error_shape
from rillet._core._policy import FailureClass
from rillet._core._request import ToolSpec, TurnRequest, user
from rillet._core._wire import WireDecoder
from rillet._turn._api import run_turn
from rillet.providers._bedrock_converse import BedrockConverseDialect, converse_body
from rillet.providers._registry import provider_from_env
from rillet.transports.testing import RecordedRequest, Reply, open_loopback_provider

from .eventstream_frames import event, exception, text_stream

botocore = pytest.importorskip("botocore")
from botocore.auth import SigV4Auth  # noqa: E402
from botocore.awsrequest import AWSRequest  # noqa: E402
from botocore.credentials import Credentials  # noqa: E402

KEY_ID, SECRET, TOKEN, REGION = (
    "AKIDLOOPBACK0000",
    "loopback/secret/KEY",
    "session-tok",
    "us-west-2",
)
MODEL = "anthropic.claude-3-5-haiku-20241022-v1:0"
STREAM_TYPE = "application/vnd.amazon.eventstream"
REQUEST = TurnRequest(messages=[user("Say hello")], max_tokens=64)


@pytest.fixture
def loop_clock() -> trio.testing.MockClock:
    """Virtual time that jumps only once every task has waited 20 ms of real time, so bytes in
    flight on loopback are not mistaken for idleness."""
    return trio.testing.MockClock(autojump_threshold=0.02)


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fixed AWS credentials in the environment, and no file or metadata service to find
    others in."""
    for name, value in {
        "AWS_ACCESS_KEY_ID": KEY_ID,
        "AWS_SECRET_ACCESS_KEY": SECRET,
        "AWS_SESSION_TOKEN": TOKEN,
        "AWS_REGION": REGION,
        "AWS_CONFIG_FILE": "/nonexistent/config",
        "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/credentials",
        "AWS_EC2_METADATA_DISABLED": "true",
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.delenv("AWS_BEARER_TOKEN_BEDROCK", raising=False)


def signed_rightly(request: RecordedRequest, base: str, secret: str = SECRET) -> bool:
    """Whether the request's SigV4 signature is the one botocore computes for it from the fixed
    credentials: the canonical request from the headers it says it signed, at its own time."""
    auth = request.headers.get("authorization", "")
    found = re.search(r"Credential=([^/]+)/\d{8}/([^/]+)/bedrock/aws4_request", auth)
    names = re.search(r"SignedHeaders=([^,]+)", auth)
    given = re.search(r"Signature=([0-9a-f]{64})", auth)
    if not (auth.startswith("AWS4-HMAC-SHA256 ") and found and names and given):
        return False
    if found.groups() != (KEY_ID, REGION) or request.headers.get("x-amz-security-token") != TOKEN:
        return False
    headers = {name: request.headers[name] for name in names.group(1).split(";")}
    aws = AWSRequest(method=request.method, url=base + request.path, data=request.body)
    for name, value in headers.items():
        aws.headers[name] = value
    aws.context["timestamp"] = request.headers["x-amz-date"]
    signer = SigV4Auth(Credentials(KEY_ID, secret, TOKEN), "bedrock", REGION)
    expected = signer.signature(signer.string_to_sign(aws, signer.canonical_request(aws)), aws)
    return hmac.compare_digest(expected, given.group(1))


def checked(replies: list[Reply], base: list[str]) -> object:
    """A script that answers 403 to a request whose signature is wrong, else the next reply."""

    def script(request: RecordedRequest, n: int) -> Reply:
        if not signed_rightly(request, base[0]):
            return Reply(
                status=403,
                content_type="application/json",
                headers=(("x-amzn-ErrorType", "InvalidSignatureException:http://internal/"),),
                chunks=(b'{"message": "The request signature we calculated does not match"}',),
            )
        return replies[min(n, len(replies) - 1)]

    return script


def stream_reply(frames: list[bytes], **fields: object) -> Reply:
    return Reply(chunks=tuple(frames), content_type=STREAM_TYPE, **fields)  # type: ignore[arg-type]


def _provider(url: str, key: str | None = None) -> Provider:
    return Provider(
        dialect=BedrockConverseDialect(),
        base_url=url,
        model=MODEL,
        api_key=Secret(key) if key else None,
    )


async def test_a_signed_turn_streams_text_and_usage(
    aws_env: None, loop_clock: trio.testing.MockClock
) -> None:
    base: list[str] = []
    reply = stream_reply(text_stream(["Hel", "lo"]))
    async with open_loopback_provider(checked([reply], base)) as server:  # type: ignore[arg-type]
        base.append(server.url)
        async with httpx.AsyncClient() as client:
            result = await run_turn(REQUEST, _provider(server.url), client=client)
    assert result.ok, result.error
    assert result.text == "Hello"
    assert result.provider_finish_reason == "end_turn"
    usage = result.message.usage_metadata
    assert usage is not None
    assert (usage.prompt_tokens, usage.cached_tokens, usage.response_tokens) == (12, 3, 5)
    assert result.cache_write_tokens == 2
    (sent,) = server.requests
    assert sent.path == "/model/anthropic.claude-3-5-haiku-20241022-v1%3A0/converse-stream"
    assert signed_rightly(sent, server.url)
    assert not signed_rightly(sent, server.url, secret="another/secret")  # the check checks
    body = json.loads(sent.body)
    assert body["messages"] == [{"role": "user", "content": [{"text": "Say hello"}]}]
    assert body["inferenceConfig"] == {"maxTokens": 64}


async def test_a_bedrock_api_key_goes_as_a_bearer_token_without_signing(
    loop_clock: trio.testing.MockClock,
) -> None:
    async with (
        open_loopback_provider([stream_reply(text_stream(["ok"]))]) as server,
        httpx.AsyncClient() as client,
    ):
        result = await run_turn(
            REQUEST, _provider(server.url, "bedrock-api-key-0000"), client=client
        )
    assert result.ok
    assert result.text == "ok"
    (sent,) = server.requests
    assert sent.headers["authorization"] == "Bearer bedrock-api-key-0000"
    assert "x-amz-date" not in sent.headers


async def test_a_tool_call_and_reasoning_stream_and_go_back(
    aws_env: None, loop_clock: trio.testing.MockClock
) -> None:
    frames = [
        event("messageStart", {"role": "assistant"}),
        event(
            "contentBlockDelta",
            {"contentBlockIndex": 0, "delta": {"reasoningContent": {"text": "Think"}}},
        ),
        event(
            "contentBlockDelta",
            {"contentBlockIndex": 0, "delta": {"reasoningContent": {"signature": "sig=="}}},
        ),
        event("contentBlockStop", {"contentBlockIndex": 0}),
        event(
            "contentBlockStart",
            {"contentBlockIndex": 1, "start": {"toolUse": {"toolUseId": "t1", "name": "add"}}},
        ),
        event(
            "contentBlockDelta", {"contentBlockIndex": 1, "delta": {"toolUse": {"input": '{"a"'}}}
        ),
        event(
            "contentBlockDelta", {"contentBlockIndex": 1, "delta": {"toolUse": {"input": ": 2}"}}}
        ),
        event("contentBlockStop", {"contentBlockIndex": 1}),
        event("messageStop", {"stopReason": "tool_use"}),
        event("metadata", {"usage": {"inputTokens": 7, "outputTokens": 9}}),
    ]
    base: list[str] = []
    request = TurnRequest(
        messages=[user("add")],
        tools=[ToolSpec(name="add", description="Adds", parameters={"type": "object"})],
        thinking_level="low",
    )
    async with open_loopback_provider(checked([stream_reply(frames)], base)) as server:  # type: ignore[arg-type]
        base.append(server.url)
        async with httpx.AsyncClient() as client:
            result = await run_turn(request, _provider(server.url), client=client, reasoning=True)
    assert result.ok, result.error
    assert result.message.finish_reason == "tool_call"
    items = result.message.content_items
    thinking = [i for i in items if type(i) is ThinkingDone]
    calls = [i for i in items if type(i) is ToolCallDone]
    assert thinking[0].thinking == "Think"
    assert (thinking[0].fidelity or {}).get("signature") == "sig=="
    assert (calls[0].name, calls[0].tool_call_id, calls[0].arguments) == ("add", "t1", {"a": 2})
    body = json.loads(server.requests[0].body)
    assert body["toolConfig"]["tools"][0]["toolSpec"]["inputSchema"] == {"json": {"type": "object"}}
    assert body["additionalModelRequestFields"]["thinking"]["budget_tokens"] == 1024
    # the round trip: the reply and a tool result, as Converse takes them back
    back = converse_body(
        TurnRequest(
            messages=[
                user("add"),
                UniMessage(role="assistant", content_items=items),
                UniMessage(
                    role="user", content_items=[ToolResultDone(text="2", tool_call_id="t1")]
                ),
            ]
        )
    )
    assert back["messages"][1] == {
        "role": "assistant",
        "content": [
            {"reasoningContent": {"reasoningText": {"text": "Think", "signature": "sig=="}}},
            {"toolUse": {"toolUseId": "t1", "name": "add", "input": {"a": 2}}},
        ],
    }
    assert back["messages"][2] == {
        "role": "user",
        "content": [{"toolResult": {"toolUseId": "t1", "content": [{"text": "2"}]}}],
    }


@pytest.mark.parametrize(
    ("kind", "message", "error", "retried"),
    [
        ("throttlingException", "Too many requests", RateLimitError, True),
        ("serviceUnavailableException", "busy", OverloadedError, True),
        ("modelStreamErrorException", "model broke", ServerError, True),
        ("validationException", "Malformed input request", InvalidRequestError, False),
        (
            "validationException",
            "Input is too long for requested model.",
            InvalidRequestError,
            False,
        ),
    ],
)
def test_an_exception_frame_is_the_typed_error(
    kind: str, message: str, error: type[Exception], retried: bool
) -> None:
    decoder = WireDecoder(BedrockConverseDialect())
    frames = [event("messageStart", {"role": "assistant"}), exception(kind, message)]
    with pytest.raises(error) as caught:
        decoder.feed(b"".join(frames))
    assert isinstance(caught.value, ProviderError)
    assert caught.value.error_type == kind
    assert message in str(caught.value)
    assert past_context(caught.value) == ("too long" in message)
    assert (error_shape(caught.value) is not FailureClass.PERMANENT) == retried


@pytest.mark.parametrize(
    ("status", "kind", "message", "error", "requests"),
    [
        (
            400,
            "ValidationException",
            "The model returned the following errors: bad",
            InvalidRequestError,
            1,
        ),
        (
            400,
            "ValidationException",
            "Input is too long for requested model.",
            InvalidRequestError,
            1,
        ),
        (
            403,
            "AccessDeniedException",
            "You don't have access to the model",
            AuthenticationError,
            1,
        ),
        (
            404,
            "ResourceNotFoundException",
            "Could not resolve the foundation model",
            InvalidRequestError,
            1,
        ),
    ],
)
async def test_a_deterministic_http_error_is_sent_exactly_once(
    aws_env: None,
    loop_clock: trio.testing.MockClock,
    status: int,
    kind: str,
    message: str,
    error: type[Exception],
    requests: int,
) -> None:
    refusal = Reply(
        status=status,
        content_type="application/json",
        headers=(
            ("x-amzn-ErrorType", f"{kind}:http://internal.amazon.com/coral/com.amazon.bedrock/"),
        ),
        chunks=(json.dumps({"message": message}).encode(),),
    )
    base: list[str] = []
    async with open_loopback_provider(checked([refusal], base)) as server:  # type: ignore[arg-type]
        base.append(server.url)
        async with httpx.AsyncClient() as client:
            result = await run_turn(REQUEST, _provider(server.url), client=client)
    assert not result.ok
    assert isinstance(result.error, error), result.error
    assert isinstance(result.error, ProviderError)
    assert result.error.error_type == kind
    assert len(server.requests) == requests
    assert past_context(result.error) == ("too long" in message)


async def test_a_validation_exception_in_the_stream_is_sent_exactly_once(
    aws_env: None, loop_clock: trio.testing.MockClock
) -> None:
    frames = [event("messageStart", {"role": "assistant"}), exception("validationException", "bad")]
    base: list[str] = []
    async with open_loopback_provider(checked([stream_reply(frames)], base)) as server:  # type: ignore[arg-type]
        base.append(server.url)
        async with httpx.AsyncClient() as client:
            result = await run_turn(REQUEST, _provider(server.url), client=client)
    assert isinstance(result.error, InvalidRequestError)
    assert len(server.requests) == 1


async def test_a_throttled_stream_is_retried_and_then_answers(
    aws_env: None, loop_clock: trio.testing.MockClock
) -> None:
    throttled = stream_reply([exception("throttlingException", "Too many requests")])
    base: list[str] = []
    replies = [throttled, stream_reply(text_stream(["fine"]))]
    async with open_loopback_provider(checked(replies, base)) as server:  # type: ignore[arg-type]
        base.append(server.url)
        async with httpx.AsyncClient() as client:
            result = await run_turn(REQUEST, _provider(server.url), client=client)
    assert result.ok, result.error
    assert result.text == "fine"
    assert len(server.requests) == 2
    assert all(signed_rightly(r, server.url) for r in server.requests)  # each signed anew


async def test_without_a_key_or_botocore_the_error_says_what_to_do(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import builtins

    real = builtins.__import__

    def no_botocore(name: str, *args: object, **kwargs: object) -> object:
        if name.startswith("botocore"):
            raise ImportError(name)
        return real(name, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(builtins, "__import__", no_botocore)
    with pytest.raises(ConfigurationError, match=r"AWS_BEARER_TOKEN_BEDROCK.*rillet\[bedrock\]"):
        BedrockConverseDialect().build_request(REQUEST, _provider("https://x.example"))
    async with open_loopback_provider([stream_reply(text_stream(["never"]))]) as server:
        result = await run_turn(REQUEST, _provider(server.url))
    assert isinstance(result.error, ConfigurationError)
    assert "install rillet[bedrock]" in str(result.error)
    assert result.requests == 0
    assert server.requests == []  # nothing went out unsigned


def test_the_registry_knows_the_kind() -> None:
    env = {"AWS_REGION": "eu-west-3", "AWS_BEARER_TOKEN_BEDROCK": "bedrock-key-000000"}
    provider = provider_from_env("bedrock-converse", env=env)
    assert provider.base_url == "https://bedrock-runtime.eu-west-3.amazonaws.com"
    assert provider.api_key is not None
    assert provider.api_key.reveal() == "bedrock-key-000000"
    sent = provider.dialect.build_request(REQUEST, provider)
    assert sent.url == (
        "https://bedrock-runtime.eu-west-3.amazonaws.com/model/"
        "anthropic.claude-3-5-haiku-20241022-v1%3A0/converse-stream"
    )
    keyless = provider_from_env("bedrock-converse", env={"AWS_REGION": "eu-west-3"})
    assert keyless.api_key is None  # signed with AWS credentials instead


RECORDED = Path(__file__).parent.parent / "fixtures" / "bedrock-converse"
EXPECTED = json.loads((RECORDED / "EXPECTED.json").read_text("utf-8"))


@pytest.mark.parametrize("name", sorted(EXPECTED))
@pytest.mark.parametrize("size", [0, 7])
async def test_a_real_recorded_stream_replays_to_what_it_carries(
    name: str, size: int, loop_clock: trio.testing.MockClock
) -> None:
    body = (RECORDED / name).read_bytes()
    chunks = [body] if not size else [body[i : i + size] for i in range(0, len(body), size)]
    expected = EXPECTED[name]
    async with (
        open_loopback_provider([stream_reply(chunks)]) as server,
        httpx.AsyncClient() as client,
    ):
        result = await run_turn(
            REQUEST, _provider(server.url, "bedrock-api-key-0000"), client=client, reasoning=True
        )
    assert result.ok, result.error
    assert len(server.requests) == 1
    assert result.text == expected["text"]
    assert result.provider_finish_reason == expected["stop"]
    usage = result.message.usage_metadata
    assert usage is not None
    assert (usage.prompt_tokens, usage.response_tokens) == (
        expected["input_tokens"],
        expected["output_tokens"],
    )
    items = result.message.content_items
    thinking = [i for i in items if type(i) is ThinkingDone]
    assert len(thinking) == expected["thinking"]
    assert sum(bool((t.fidelity or {}).get("signature")) for t in thinking) == (
        expected["signatures"] + expected["redacted"]
    )
    assert sum(t.thinking == "_REDACTED_THINKING" for t in thinking) == expected["redacted"]
    calls = [
        {"name": c.name, "id": c.tool_call_id, "arguments": c.arguments}
        for c in items
        if type(c) is ToolCallDone
    ]
    assert calls == expected["tool_calls"]


async def test_a_400_without_an_error_type_header_is_typed_by_its_status(
    aws_env: None, loop_clock: trio.testing.MockClock
) -> None:
    # the body and status a real Bedrock sent for an unknown model (a recorded cassette kept no
    # x-amzn-ErrorType header: pydantic/pydantic-ai, test_bedrock_streaming_error.yaml)
    refusal = Reply(
        status=400,
        content_type="application/json",
        chunks=(b'{"message":"The provided model identifier is invalid."}',),
    )
    base: list[str] = []
    async with open_loopback_provider(checked([refusal], base)) as server:  # type: ignore[arg-type]
        base.append(server.url)
        async with httpx.AsyncClient() as client:
            result = await run_turn(REQUEST, _provider(server.url), client=client)
    assert isinstance(result.error, InvalidRequestError)
    assert "model identifier is invalid" in str(result.error)
    assert len(server.requests) == 1


async def test_a_corrupted_frame_is_a_framing_error_that_is_retried(
    aws_env: None, loop_clock: trio.testing.MockClock
) -> None:
    good = b"".join(text_stream(["fine"]))
    broken = bytearray(good)
    broken[40] ^= 0xFF  # inside the first message: its CRC no longer matches
    base: list[str] = []
    replies = [stream_reply([bytes(broken)]), stream_reply([good])]
    async with open_loopback_provider(checked(replies, base)) as server:  # type: ignore[arg-type]
        base.append(server.url)
        async with httpx.AsyncClient() as client:
            with trio.fail_after(60):
                result = await run_turn(REQUEST, _provider(server.url), client=client)
    assert result.ok, result.error
    assert result.text == "fine"
    assert len(server.requests) == 2


async def test_rillet_run_with_the_bedrock_converse_kind_signs_and_streams() -> None:
    """The command line: `rillet run --provider bedrock-converse`, its endpoint and AWS
    credentials from the environment only, against the checking loopback server."""
    base: list[str] = []
    reply = stream_reply(text_stream(["Hel", "lo"]))
    async with open_loopback_provider(checked([reply], base)) as server:  # type: ignore[arg-type]
        base.append(server.url)
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("AWS_") and not k.endswith("_API_KEY")
        }
        env.update(
            AWS_ACCESS_KEY_ID=KEY_ID,
            AWS_SECRET_ACCESS_KEY=SECRET,
            AWS_SESSION_TOKEN=TOKEN,
            AWS_REGION=REGION,
            AWS_BEDROCK_BASE_URL=server.url,
            AWS_CONFIG_FILE="/nonexistent/config",
            AWS_SHARED_CREDENTIALS_FILE="/nonexistent/credentials",
            AWS_EC2_METADATA_DISABLED="true",
        )
        cmd = [sys.executable, "-m", "rillet", "run", "hi", "--provider", "bedrock-converse"]
        with trio.fail_after(60):
            done = await trio.run_process(
                cmd, capture_stdout=True, capture_stderr=True, check=False, env=env
            )
    assert done.returncode == 0, done.stderr
    assert done.stdout.decode() == "Hello\n"
    (sent,) = server.requests
    assert signed_rightly(sent, server.url)
    assert sent.path.startswith("/model/anthropic.claude-3-5-haiku-20241022-v1%3A0/")
