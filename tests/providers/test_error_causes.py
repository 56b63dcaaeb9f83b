"""Every provider's answers to a bad key, an unknown model and a prompt past the context window
read as one error type and one code each, whatever the provider's shape (a table of real
bodies), and the line a person reads says what to do about that cause.

Most rows are recordings in the real corpus (`tests/fixtures/real/`, with their provenance in
`PROVENANCE.md`). The rest are real providers' words in the shape the provider sends them,
read from public repositories' data (never their code):

- Vertex AI's unknown model: `ddeone51-dev/vidsto1`, `VERTEX_AI_GEMINI_TROUBLESHOOTING.md`,
  commit `575c46851837aaba3c6045332e322ddc8689bc80` (its message), in Google's error shape
  (`{"error": {"code", "message", "status"}}`, as the corpus's Gemini 404 has it).
- The context-overflow messages of xAI, Groq, Vertex, Kimi, Bedrock and OpenRouter's
  backends: `badlogic/pi-mono`, `packages/ai/src/utils/overflow.ts`, commit
  `a2dbd625f144d58860073375eea5ea15cdc95610` (the provider messages its comments quote), in
  each provider's error shape (xAI's: `{"code", "error": "<text>"}`, as its refused key in the
  corpus has it).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from rillet import AuthenticationError, InvalidRequestError, ProviderError
from rillet._core._codes import error_code
from rillet._core._explain import explain
from rillet._core._failures import http_shape
from rillet._core._policy import FailureClass
from rillet.providers import Provider, dialect_from_name
from rillet.providers._error_body import error_from_body

REAL = Path(__file__).parent.parent / "fixtures" / "real"
EXPECTED: dict[str, dict[str, Any]] = json.loads((REAL / "EXPECTED.json").read_text("utf-8"))

BAD_KEY = (AuthenticationError, "authentication_failed", "— check XAI_API_KEY")
NO_MODEL = (InvalidRequestError, "model_not_found", "— check --model")
TOO_LONG = (InvalidRequestError, "context_too_long", "— shorten it")

RECORDED = {
    # a bad key
    "anthropic-messages/401-authentication-error.json": BAD_KEY,
    "gemini/400-api-key-invalid.json": BAD_KEY,
    "openai-chat/openai-401-invalid-api-key.json": BAD_KEY,
    "openai-chat/huggingface-401-invalid-credentials.json": BAD_KEY,
    "openai-chat/together-401-invalid-api-key.json": BAD_KEY,
    "openai-chat/openrouter-401-no-cookie-auth.json": BAD_KEY,
    "openai-chat/xai-400-incorrect-api-key.json": BAD_KEY,
    "openai-responses/401-invalid-api-key.json": BAD_KEY,
    "openai-responses/xai-400-incorrect-api-key.json": BAD_KEY,
    "openai-chat/azure-foundry-401-invalid-subscription-key.json": BAD_KEY,
    "openai-chat/deepseek-401-authentication-fails.json": BAD_KEY,
    "openai-chat/mistral-401-detail-invalid-api-key.json": BAD_KEY,
    "openai-chat/ollama-cloud-401-unauthorized.json": BAD_KEY,
    "openai-chat/perplexity-401-invalid-api-key.json": BAD_KEY,
    # an unknown model
    "anthropic-messages/404-model-not-found-messages.json": NO_MODEL,
    "anthropic-messages/404-not-found-error.json": NO_MODEL,
    "gemini/404-model-not-found.json": NO_MODEL,
    "openai-chat/openai-404-model-not-found.json": NO_MODEL,
    "openai-chat/groq-404-model-not-found.json": NO_MODEL,
    "openai-chat/azure-404-deployment-not-found.json": NO_MODEL,
    "ollama-chat/404-model-not-found.json": (*NO_MODEL[:2], "— ollama pull m"),  # its own words
    "openai-responses/400-model-not-found.json": NO_MODEL,  # a 400 that says so by its code
    # a prompt past the context
    "ollama-chat/400-input-exceeds-context-length.json": TOO_LONG,
    "anthropic-messages/400-prompt-too-long.json": TOO_LONG,
    "gemini/vertex-400-input-token-count-exceeds.json": TOO_LONG,
    "openai-chat/deepseek-400-maximum-context-length.json": TOO_LONG,
    "openai-chat/ollama-cloud-400-prompt-too-long.json": TOO_LONG,
    "openai-chat/openrouter-400-context-length-previous-errors.json": TOO_LONG,
    "openai-chat/perplexity-400-too-many-prompt-tokens.json": TOO_LONG,
    "openai-responses/400-context-length-exceeded.json": TOO_LONG,
}


def _gemini(status: int, word: str, message: str) -> bytes:
    return json.dumps({"error": {"code": status, "message": message, "status": word}}).encode()


def _openai(message: str, code: str | None = None) -> bytes:
    error = {"message": message, "type": "invalid_request_error", "param": None, "code": code}
    return json.dumps({"error": error}).encode()


def _xai(message: str) -> bytes:
    return json.dumps({"code": "Client specified an invalid argument", "error": message}).encode()


SAID = {
    "vertex-404-publisher-model": (
        "gemini",
        404,
        _gemini(
            404,
            "NOT_FOUND",
            "Publisher Model `projects/idyllic-now-398917/locations/us-central1/publishers/google/"
            "models/gemini-1.5-flash-001` was not found or your project does not have access to "
            "it. Please ensure you are using a valid model version.",
        ),
        NO_MODEL,
    ),
    "xai-400-maximum-prompt-length": (
        "openai-chat",
        400,
        _xai("This model's maximum prompt length is 131072 but the request contains 537812 tokens"),
        TOO_LONG,
    ),
    "openai-400-context-length-exceeded": (
        "openai-chat",
        400,
        _openai(
            "This model's maximum context length is 128000 tokens. However, your messages "
            "resulted in 142422 tokens. Please reduce the length of the messages.",
            "context_length_exceeded",
        ),
        TOO_LONG,
    ),
    "anthropic-400-prompt-too-long": (
        "anthropic-messages",
        400,
        json.dumps(
            {
                "type": "error",
                "error": {
                    "type": "invalid_request_error",
                    "message": "prompt is too long: 213462 tokens > 200000 maximum",
                },
            }
        ).encode(),
        TOO_LONG,
    ),
    "gemini-400-input-token-count": (
        "gemini",
        400,
        _gemini(
            400,
            "INVALID_ARGUMENT",
            "The input token count (1196265) exceeds the maximum number of tokens allowed "
            "(1048575).",
        ),
        TOO_LONG,
    ),
    "vertex-400-input-token-count-but": (
        "gemini",
        400,
        _gemini(
            400,
            "INVALID_ARGUMENT",
            "Unable to submit request because the input token count is 1251952 but model only "
            "supports up to 1048576. Reduce the input token count and try again.",
        ),
        TOO_LONG,
    ),
    "groq-400-reduce-the-length": (
        "openai-chat",
        400,
        _openai(
            "Please reduce the length of the messages or completion.", "context_length_exceeded"
        ),
        TOO_LONG,
    ),
    "kimi-400-model-token-limit": (
        "openai-chat",
        400,
        _openai("Your request exceeded model token limit: 262144 (requested: 300000)"),
        TOO_LONG,
    ),
    "bedrock-400-input-too-long": (
        "anthropic-messages",
        400,
        json.dumps({"message": "input is too long for requested model"}).encode(),
        TOO_LONG,
    ),
    "openrouter-400-maximum-allowed-input-length": (
        "openai-chat",
        400,
        json.dumps(
            {
                "error": {
                    "code": 400,
                    "message": "Input length 300000 exceeds the maximum allowed input length "
                    "of 262144 tokens.",
                }
            }
        ).encode(),
        TOO_LONG,
    ),
}


def _provider(dialect: str) -> Provider:
    return Provider(dialect_from_name(dialect), "https://api.example.test/v1", "m")


def _check(
    dialect: str, status: int, body: bytes, expected: tuple[type[ProviderError], str, str]
) -> None:
    cls, code, advice = expected
    error = dialect_from_name(dialect).error_from_response(status, {}, body)
    assert type(error) is cls, repr(error)
    assert error_code(error) == code
    assert http_shape(status, error) is FailureClass.PERMANENT  # asked for once
    said = explain(error, _provider(dialect), key_hint="XAI_API_KEY")
    assert advice in said, said
    if cls is AuthenticationError:
        assert "--model" not in said  # the key is what to fix, not the model


@pytest.mark.parametrize("rel", sorted(RECORDED))
def test_a_recorded_answer_reads_as_its_cause(rel: str) -> None:
    body = (REAL / rel).read_bytes()
    _check(rel.split("/")[0], EXPECTED[rel]["status"], body, RECORDED[rel])
    assert EXPECTED[rel]["error"] == RECORDED[rel][0].__name__  # the replayed turn says so too


@pytest.mark.parametrize("case", sorted(SAID))
def test_a_providers_words_read_as_their_cause(case: str) -> None:
    dialect, status, body, expected = SAID[case]
    _check(dialect, status, body, expected)


@pytest.mark.parametrize(
    "body",
    [
        _openai("Invalid value for 'temperature': must be at most 2."),
        _gemini(400, "INVALID_ARGUMENT", "Unable to submit request: thinking level unsupported"),
        _xai("Argument not supported on this model: reasoning_effort"),
    ],
    ids=["openai", "gemini", "xai"],
)
def test_a_refused_option_stays_an_invalid_request(body: bytes) -> None:
    # the contrast: words of neither a key nor a context are a refused request, to be changed
    dialect = "gemini" if b"INVALID_ARGUMENT" in body else "openai-chat"
    error = dialect_from_name(dialect).error_from_response(400, {}, body)
    assert type(error) is InvalidRequestError
    assert error_code(error) == "invalid_request"


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (
            {
                "error": "This model's maximum prompt length is 131072 but the request contains"
                " 537812 tokens"
            },
            TOO_LONG,
        ),
        ({"error": {"message": "Incorrect API key provided: xa***bc."}}, BAD_KEY),
        ({"type": "error", "error": {"type": "not_found_error", "message": "model: x"}}, NO_MODEL),
        (
            {"error": {"code": 404, "message": "models/x is not found", "status": "NOT_FOUND"}},
            NO_MODEL,
        ),
    ],
    ids=["xai-context", "key", "anthropic-model", "gemini-model"],
)
def test_the_same_words_in_a_stream_read_as_the_same_cause(
    body: dict[str, Any], expected: tuple[type[ProviderError], str, str]
) -> None:
    # after a 200, in the stream: no status to go by, the same type and code all the same
    error = error_from_body("x", None, json.dumps(body).encode(), in_stream=True)
    assert type(error) is expected[0]
    assert error_code(error) == expected[1]
