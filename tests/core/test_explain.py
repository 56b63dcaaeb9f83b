"""`explain`: why a turn failed, in one line, from the error's facts; keys never shown."""

from __future__ import annotations

import errno
import json
import socket
import ssl
from pathlib import Path
from typing import Any

import pytest
import trio
from rillet import (
    AuthenticationError,
    EmptyResponseError,
    IncompleteStreamError,
    InvalidRequestError,
    Outcome,
    RateLimitError,
    RescueFailed,
    ServerError,
    StreamProtocolError,
    ToolCallArgumentParseError,
    TransportError,
    TurnRequest,
    TurnTimeout,
    run_turn,
    user,
)
from rillet._core._arguments import parse_arguments
from rillet._core._dialect import Provider, Secret
from rillet._core._explain import explain, mask_keys
from rillet.lowlevel import WireDecoder
from rillet.providers._error_body import error_from_body
from rillet.providers._gemini._dialect import GeminiDialect
from rillet.providers._ollama import OllamaDialect
from rillet.providers._openai_chat._dialect import OpenAIChatDialect
from rillet.transports.testing import Reply, open_loopback_provider, sse

KEY = "sk-proj-abcdefghijklmnop1234"
PROVIDER = Provider(OpenAIChatDialect(), "https://api.example.com/v1", "m", api_key=Secret(KEY))


def _refused() -> TransportError:
    error = TransportError("openai-chat", "ConnectError")
    cause = OSError("all attempts failed")
    cause.__cause__ = ExceptionGroup(
        "attempts", [ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused")]
    )
    error.__cause__ = cause
    return error


def test_a_refused_connection_names_host_cause_and_attempts() -> None:
    line = explain(_refused(), PROVIDER, attempts=4)
    assert line.startswith("cannot connect to api.example.com:443: connection refused (4 attempts)")


def _lookup_failed(number: int, words: str) -> TransportError:
    error = TransportError("openai-chat", "ConnectError")
    error.__cause__ = socket.gaierror(number, words)
    return error


@pytest.mark.parametrize(
    ("number", "words", "cause"),
    [
        (socket.EAI_NONAME, "Name or service not known", "no such host"),
        (socket.EAI_AGAIN, "Temporary failure in name resolution", "could not be looked up"),
    ],
)
def test_a_name_that_does_not_resolve_points_at_the_host_and_the_network(
    number: int, words: str, cause: str
) -> None:
    line = explain(_lookup_failed(number, words), PROVIDER, attempts=5)
    assert line.startswith("cannot connect to api.example.com:443: ")
    assert cause in line
    assert line.endswith("— check the host in --base-url, and this machine's network")
    assert "is the server running" not in line  # a server that has no address is not down


def test_a_certificate_that_does_not_verify_says_why() -> None:
    error = TransportError("openai-chat", "ConnectError")
    refused = ssl.SSLCertVerificationError(1, "certificate verify failed")
    refused.verify_message = "self-signed certificate"
    error.__cause__ = ExceptionGroup("attempts", [refused])
    line = explain(error, PROVIDER, attempts=2)
    assert line == (
        "cannot connect to api.example.com:443: the server's TLS certificate was not accepted"
        " (self-signed certificate) (2 attempts) — check the host in --base-url, or this"
        " machine's CA certificates"
    )


def test_the_same_failure_in_stream_and_rescue_is_said_once() -> None:
    error = RescueFailed(Outcome.INIT_FAILED, _refused(), _refused())
    line = explain(error, PROVIDER, attempts=5)
    assert line.count("cannot connect") == 1
    assert "(5 attempts)" in line


def test_a_different_rescue_failure_is_said_after_the_streams() -> None:
    rescue = ServerError("openai-chat", "down for maintenance", status=503)
    line = explain(RescueFailed(Outcome.INIT_FAILED, _refused(), rescue), PROVIDER, attempts=5)
    first, second = line.split("; the non-streaming retry failed too: ")
    assert first.startswith("cannot connect to")
    assert second == "provider error 503: down for maintenance"


def test_authentication_names_the_key_to_check_and_masks_every_key() -> None:
    error = AuthenticationError(
        "openai-chat", f"key {KEY} and sk-other0000000000009999 refused", status=401
    )
    line = explain(error, PROVIDER, key_hint="OPENAI_API_KEY")
    assert KEY not in line
    assert "sk-other" not in line
    assert line == (
        "authentication failed (401): key …1234 and sk-…9999 refused — check OPENAI_API_KEY"
    )


def test_a_403_is_permission_denied() -> None:
    error = AuthenticationError("openai-chat", "not allowed", status=403)
    assert explain(error, PROVIDER).startswith("permission denied (403): not allowed")


def test_rate_limits_say_the_wait_the_provider_asked_for() -> None:
    error = RateLimitError("openai-chat", "slow down", status=429, retry_after=30)
    line = explain(error, PROVIDER, attempts=6)
    assert line == (
        "rate limited (429) after 6 attempts: slow down; the provider asked to wait 30 s"
        " — wait a little, or set --rpm"
    )


@pytest.mark.parametrize(
    ("deadline", "option"),
    [
        ("initial-event", "--initial-timeout"),
        ("per-event", "--event-timeout"),
        ("total", "--total-timeout"),
    ],
)
def test_a_timeout_names_the_option_that_sets_it(deadline: str, option: str) -> None:
    line = explain(TurnTimeout("openai-chat", deadline, 120), PROVIDER, attempts=3)
    assert line == (
        f"no answer from api.example.com:443 within the {deadline} deadline (120 s) (3 attempts)"
        f" — raise {option} if the model needs longer"
    )


def test_an_invalid_request_points_at_the_options() -> None:
    error = InvalidRequestError("openai-chat", "model 'x' does not exist", status=400)
    line = explain(error, PROVIDER)
    assert line == (
        "the provider refused the request (400): model 'x' does not exist"
        " — check --model and the options"
    )


def test_geminis_400_for_a_wrong_key_points_at_the_key() -> None:
    recorded = Path(__file__).parent.parent / "fixtures/real/gemini/400-api-key-invalid.json"
    error = error_from_body("gemini", 400, recorded.read_bytes())
    assert isinstance(error, AuthenticationError)  # a bad argument, Gemini says: the key
    assert explain(error, PROVIDER, key_hint="GEMINI_API_KEY") == (
        "authentication failed (400): API key not valid. Please pass a valid API key."
        " — check GEMINI_API_KEY"
    )


def test_a_404_points_at_the_model_and_the_base_urls_path() -> None:
    provider = Provider(OpenAIChatDialect(), "http://user:pw@localhost:8000?x=1", "m")
    error = InvalidRequestError("openai-chat", "Not Found", status=404)
    assert explain(error, provider) == (
        "not found (404): Not Found — check --model, and that http://localhost:8000 is the"
        " API's base URL (--base-url; it often ends in /v1)"
    )
    ollama = Provider(OllamaDialect(), "http://localhost:11434", "llama3.2")
    assert explain(error, ollama).endswith("localhost:11434 is the API's base URL (--base-url)")
    at_v1 = Provider(OpenAIChatDialect(), "https://api.example.com/v1", "m")
    assert explain(error, at_v1).endswith(
        "https://api.example.com/v1 is the API's base URL (--base-url)"
    )
    # whatever the type: Anthropic's `not_found_error`, as a body or in the stream
    body = {"type": "error", "error": {"type": "not_found_error", "message": "model: claude-x"}}
    for typed in (
        error_from_body("anthropic", 404, json.dumps(body).encode()),
        error_from_body("anthropic", None, body, in_stream=True),
    ):
        assert explain(typed, at_v1).startswith("not found (404): model: claude-x — check --model")


def test_a_stream_that_ended_early_says_what_never_came() -> None:
    error = IncompleteStreamError("openai-chat", ("finish_reason", "usage_metadata"))
    line = explain(error, PROVIDER, attempts=4)
    assert line == (
        "the provider's stream ended early, without its finish reason and its usage (4 attempts)"
    )


def test_a_bad_tool_call_names_the_tool() -> None:
    error = ToolCallArgumentParseError("openai-chat", "get_weather", "call_1", '{"a": ', "EOF")
    line = explain(error, PROVIDER)
    assert line.startswith("the model called get_weather with arguments that are not a JSON")


def test_a_tool_call_cut_off_inside_its_arguments_says_to_raise_the_token_limit() -> None:
    # gpt-5-mini's recorded Responses reply: max_output_tokens reached inside a forced call, its
    # arguments ending mid-string; asking again cuts it there again
    with pytest.raises(ToolCallArgumentParseError) as cut:
        parse_arguments('{"instructions": "I can', "openai-responses", "answer", "call_1")
    assert cut.value.cut_short
    assert explain(cut.value, PROVIDER) == (
        "the model's call to answer was cut off before its arguments ended — raise --max-tokens"
        " if the reply reached its token limit"
    )
    with pytest.raises(ToolCallArgumentParseError) as bad:
        parse_arguments('{"a" 1}', "openai-chat", "answer", "call_1")  # malformed, not cut
    assert not bad.value.cut_short
    assert explain(bad.value, PROVIDER).startswith("the model called answer with arguments")


def test_a_protocol_breach_says_so() -> None:
    error = StreamProtocolError("openai-chat", "a second stop")
    assert explain(error, PROVIDER).startswith("the provider's stream broke the protocol:")


def test_mask_keys_leaves_ordinary_words_alone() -> None:
    text = "the sky is blue; skip the desk-top key"
    assert mask_keys(text) == text
    assert mask_keys("use sk-abc") == "use sk-…"


@pytest.mark.parametrize(
    ("provider_name", "status", "body"),
    [
        (
            "openai-chat",
            400,
            {
                "error": {
                    "message": "This model's maximum context length is 128000 tokens. However,"
                    " your messages resulted in 130000 tokens.",
                    "type": "invalid_request_error",
                    "code": "context_length_exceeded",
                }
            },
        ),
        (
            "anthropic",
            400,
            {
                "type": "error",
                "error": {
                    "type": "invalid_request_error",
                    "message": "prompt is too long: 210000 tokens > 200000 maximum",
                },
            },
        ),
        (
            "gemini",
            400,
            {
                "error": {
                    "code": 400,
                    "message": "The input token count (1200000) exceeds the maximum number of"
                    " tokens allowed (1048576).",
                    "status": "INVALID_ARGUMENT",
                }
            },
        ),
        (
            "llama.cpp",
            400,
            {
                "error": {
                    "code": 400,
                    "message": "the request exceeds the available context size",
                    "type": "exceed_context_size_error",
                }
            },
        ),
    ],
    ids=["openai", "anthropic", "gemini", "llama.cpp"],
)
def test_a_conversation_too_long_for_the_model_says_so(
    provider_name: str, status: int, body: dict[str, object]
) -> None:
    error = error_from_body(provider_name, status, json.dumps(body).encode())
    line = explain(error, PROVIDER)
    assert line.startswith("the conversation is longer than the model takes (400): ")
    assert line.endswith(
        "— shorten it (or lower --max-tokens), or pick a model with a larger context window"
    )


def test_a_model_ollama_has_not_pulled_says_how_to_pull_it() -> None:
    ollama = Provider(OllamaDialect(), "http://localhost:11434", "llama3.2")
    body = b'{"error":"model \\"llama3.2\\" not found, try pulling it first"}'
    error = error_from_body("ollama", 404, body)
    assert explain(error, ollama) == (
        'the model is not on the Ollama server (404): model "llama3.2" not found, try pulling it'
        " first — ollama pull llama3.2"
    )


def test_a_model_a_newer_ollama_has_not_pulled_says_how_to_pull_it_too() -> None:
    # a 2026 server's words (a recorded 404): no "try pulling it first" any more
    ollama = Provider(OllamaDialect(), "http://localhost:11434", "qwen3.6")
    error = error_from_body("ollama", 404, b'{"error":"model \'qwen3.6:latest\' not found"}')
    assert explain(error, ollama) == (
        "the model is not on the Ollama server (404): model 'qwen3.6:latest' not found"
        " — ollama pull qwen3.6"
    )


@pytest.mark.parametrize("reason", ["length", "max_output_tokens"])
def test_reasoning_that_spent_the_whole_token_limit_says_to_raise_it(reason: str) -> None:
    # gpt-5-mini's recorded replies (Chat Completions, Responses): every token went to reasoning,
    # and asking again spends them so again
    error = EmptyResponseError("openai-chat", "length", provider_reason=reason)
    assert explain(error, PROVIDER) == (
        "the model spent the whole token limit on reasoning, with no answer — raise --max-tokens"
        " (or lower --thinking)"
    )


def _empty_reply(delta: dict[str, Any]) -> EmptyResponseError:
    """The error of a whole Chat Completions reply whose one delta is `delta`."""
    chunks = [
        {"id": "c1", "model": "m", "choices": [{"index": 0, "delta": delta}]},
        {"id": "c1", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
    ]
    data = b"".join(b"data: %s\n\n" % json.dumps(c).encode() for c in chunks)
    decoder = WireDecoder(OpenAIChatDialect(), clock=lambda: 0)
    with pytest.raises(EmptyResponseError) as caught:
        decoder.feed(data + b"data: [DONE]\n\n")
    return caught.value


def test_a_reply_of_nothing_read_is_not_said_to_be_reasoning() -> None:
    # a reply of items of kinds no dialect reads (a hosted tool's output) or of nothing at all
    error = _empty_reply({"role": "assistant", "content": ""})
    assert error.thinking is False
    assert "other than thinking" not in str(error)
    assert explain(error, PROVIDER) == (
        "the model's reply held no text and no tool call (nothing that is read) — rephrase the"
        " request, or ask for the answer in text"
    )
    thought = _empty_reply({"role": "assistant", "reasoning_content": "hmm"})
    assert thought.thinking is True
    assert explain(thought, PROVIDER) == (
        "the model finished without an answer (nothing but reasoning) — ask again"
    )


@pytest.mark.parametrize(
    ("chunk", "said"),
    [
        (
            {"candidates": [{"finishReason": "SAFETY"}], "usageMetadata": {"promptTokenCount": 5}},
            "the provider stopped the answer before it began (SAFETY: its content rules)"
            " — rephrase the request",
        ),
        (
            {
                "promptFeedback": {"blockReason": "PROHIBITED_CONTENT"},
                "usageMetadata": {"promptTokenCount": 5},
            },
            "the provider stopped the answer before it began (PROHIBITED_CONTENT: its content"
            " rules) — rephrase the request",
        ),
        (
            {
                "candidates": [
                    {"content": {"parts": []}, "finishReason": "MALFORMED_FUNCTION_CALL"}
                ],
                "usageMetadata": {"promptTokenCount": 5},
            },
            "the model's tool call came out malformed, with no answer — ask again",
        ),
    ],
    ids=["safety", "prompt blocked", "malformed call"],
)
async def test_a_reply_stopped_before_any_answer_says_why(chunk: dict[str, Any], said: str) -> None:
    async with open_loopback_provider([Reply(chunks=(sse(json.dumps(chunk)),))]) as server:
        provider = Provider(GeminiDialect(), server.url, "gemini-2.5-flash")
        with trio.fail_after(10):
            result = await run_turn(TurnRequest(messages=[user("hi")]), provider)
    assert result.requests == 1
    assert explain(result.error, provider) == said


def test_the_line_is_one_line_whatever_the_provider_said() -> None:
    # Gemini's messages hold line breaks; a proxy's page does too
    said = b'{"error": {"code": 400, "message": "Invalid JSON payload.\\n* contents: required\\n"}}'
    page = b"<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n</body></html>"
    provider = Provider(GeminiDialect(), "https://generativelanguage.googleapis.com", "m")
    for body, status in ((said, 400), (page, 502)):
        line = explain(error_from_body("gemini", status, body), provider, attempts=2)
        assert "\n" not in line
        assert "\r" not in line
        assert "  " not in line
    assert line.endswith("an HTML page: 502 Bad Gateway")
