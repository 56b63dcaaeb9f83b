"""The clouds: Azure OpenAI (a resource's endpoint, deployment, API version and credential) and
Vertex AI (a project, a location and an access token, for Gemini and for Anthropic's models),
from the environment as the clouds' own tools name them, and a turn against a loopback server
standing in for each (a real recorded stream of that cloud), with the request's path, query,
headers and body as the cloud takes them."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
from rillet._core._errors import ConfigurationError
from rillet._core._explain import explain
from rillet._turn._api import run_turn
from rillet.providers import (
    AzureOpenAIDialect,
    AzureResponsesDialect,
    VertexAnthropicDialect,
    VertexGeminiDialect,
    describe_providers,
    provider_from_env,
)
from rillet.providers._error_body import error_from_body
from rillet.transports.testing import Reply, open_loopback_provider, split

from ..handler_support import REQUEST

KEY = "0123456789abcdef0123456789abcdef"
TOKEN = "eyJ0eXAiOiJKV1QiLCJhbGciOiJSUzI1NiJ9.entra-token.signature"
ENDPOINT = "https://contoso.openai.azure.com"
FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "real"
REAL = FIXTURES / "openai-chat"


def test_the_v1_api_is_the_endpoints_openai_v1_with_the_deployment_as_model() -> None:
    env = {"AZURE_OPENAI_ENDPOINT": ENDPOINT + "/", "AZURE_OPENAI_API_KEY": KEY}
    provider = provider_from_env("azure", model="gpt-4o-prod", env=env)
    assert type(provider.dialect) is AzureOpenAIDialect
    assert provider.base_url == f"{ENDPOINT}/openai/v1"
    assert provider.model == "gpt-4o-prod"
    http = provider.dialect.build_request(REQUEST, provider, stream=True)
    assert http.url == f"{ENDPOINT}/openai/v1/chat/completions"
    assert http.headers["api-key"] == KEY
    assert "authorization" not in http.headers


def test_an_api_version_picks_the_classic_deployment_path_and_query() -> None:
    env = {
        "AZURE_OPENAI_ENDPOINT": ENDPOINT,
        "AZURE_OPENAI_API_KEY": KEY,
        "OPENAI_API_VERSION": "2024-10-21",
        "AZURE_OPENAI_DEPLOYMENT": "chat-prod",
    }
    provider = provider_from_env("azure", env=env)
    http = provider.dialect.build_request(REQUEST, provider, stream=True)
    url = f"{ENDPOINT}/openai/deployments/chat-prod/chat/completions?api-version=2024-10-21"
    assert http.url == url
    responses = provider_from_env("azure-responses", env=env)
    assert type(responses.dialect) is AzureResponsesDialect
    http = responses.dialect.build_request(REQUEST, responses, stream=True)
    assert http.url.endswith("/openai/deployments/chat-prod/responses?api-version=2024-10-21")


def test_an_entra_id_token_goes_as_bearer_and_a_token_provider_per_request() -> None:
    env = {"AZURE_OPENAI_ENDPOINT": ENDPOINT, "AZURE_OPENAI_AD_TOKEN": TOKEN}
    provider = provider_from_env("azure", model="d", env=env)
    http = provider.dialect.build_request(REQUEST, provider, stream=True)
    assert http.headers["authorization"] == f"Bearer {TOKEN}"
    assert "api-key" not in http.headers
    issued = iter(["token-1", "token-2"])
    refreshed = AzureOpenAIDialect(token_provider=lambda: next(issued))
    provider = provider_from_env("azure", model="d", env=env)
    provider = type(provider)(dialect=refreshed, base_url=provider.base_url, model="d")
    first = refreshed.build_request(REQUEST, provider, stream=True)
    second = refreshed.build_request(REQUEST, provider, stream=True)
    assert [first.headers["authorization"], second.headers["authorization"]] == [
        "Bearer token-1",
        "Bearer token-2",
    ]


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"AZURE_OPENAI_API_KEY": KEY}, "AZURE_OPENAI_ENDPOINT"),
        ({"AZURE_OPENAI_ENDPOINT": ENDPOINT}, "AZURE_OPENAI_API_KEY"),
    ],
)
def test_what_is_missing_is_named(
    env: dict[str, str], named: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "azure.identity", None)  # no Entra ID sign-in to fall to
    with pytest.raises(ConfigurationError, match=named):
        provider_from_env("azure", model="d", env=env)
    (row,) = [r for r in describe_providers(env) if r["kind"] == "azure"]
    assert row["ready"] is False
    assert named in row["missing"]


def test_a_deployment_is_needed_and_the_key_never_shows() -> None:
    env = {"AZURE_OPENAI_ENDPOINT": ENDPOINT, "AZURE_OPENAI_API_KEY": KEY}
    with pytest.raises(ConfigurationError, match="deployment") as raised:
        provider_from_env("azure", env=env)
    assert KEY not in str(raised.value)
    provider = provider_from_env("azure", model="d", env=env)
    assert KEY not in repr(provider)
    (row,) = [r for r in describe_providers({**env, "AZURE_OPENAI_DEPLOYMENT": "d"})
              if r["kind"] == "azure"]  # fmt: skip
    assert row["ready"] is True
    assert KEY not in str(row)


async def test_a_turn_against_the_resource_reads_its_recorded_stream() -> None:
    recorded = (REAL / "azure-content-filter-annotations.sse").read_bytes()
    with trio.fail_after(10):
        async with open_loopback_provider([Reply(chunks=split(recorded, 61))]) as server:
            env = {
                "AZURE_OPENAI_ENDPOINT": server.url,
                "AZURE_OPENAI_API_KEY": KEY,
                "AZURE_OPENAI_API_VERSION": "2025-04-01-preview",
            }
            provider = provider_from_env("azure", model="gpt-4-prod", env=env)
            result = await run_turn(REQUEST, provider)
    assert result.ok
    assert result.text == "Hello World"
    (sent,) = server.requests
    assert (
        sent.path
        == "/openai/deployments/gpt-4-prod/chat/completions?api-version=2025-04-01-preview"
    )
    assert sent.headers["api-key"] == KEY
    assert "authorization" not in sent.headers


# --- Vertex AI ----------------------------------------------------------------------------------

GOOGLE_TOKEN = "ya29.a0-access-token-0123456789"


def test_vertex_reaches_a_projects_model_in_its_location_with_a_bearer_token() -> None:
    env = {"GOOGLE_CLOUD_PROJECT": "acme", "GOOGLE_OAUTH_ACCESS_TOKEN": GOOGLE_TOKEN}
    gemini = provider_from_env("vertex", env=env)
    assert type(gemini.dialect) is VertexGeminiDialect
    http = gemini.dialect.build_request(REQUEST, gemini, stream=True)
    root = "https://us-central1-aiplatform.googleapis.com/v1/projects/acme/locations/us-central1"
    assert (
        http.url
        == f"{root}/publishers/google/models/gemini-2.5-flash:streamGenerateContent?alt=sse"
    )
    assert http.headers["authorization"] == f"Bearer {GOOGLE_TOKEN}"
    assert "x-goog-api-key" not in http.headers
    claude = provider_from_env(
        "vertex-anthropic", model="claude-sonnet-4-5@20250929",
        env={**env, "GOOGLE_CLOUD_LOCATION": "global"},
    )  # fmt: skip
    assert type(claude.dialect) is VertexAnthropicDialect
    http = claude.dialect.build_request(REQUEST, claude, stream=False)
    root = "https://aiplatform.googleapis.com/v1/projects/acme/locations/global"
    assert http.url == f"{root}/publishers/anthropic/models/claude-sonnet-4-5@20250929:rawPredict"
    body = json.loads(http.body)
    assert "model" not in body
    assert body["anthropic_version"] == "vertex-2023-10-16"
    assert "x-api-key" not in http.headers
    assert "anthropic-version" not in http.headers


def test_vertex_names_what_is_missing_and_never_shows_the_token() -> None:
    with pytest.raises(ConfigurationError, match="GOOGLE_CLOUD_PROJECT"):
        provider_from_env("vertex", env={"GOOGLE_OAUTH_ACCESS_TOKEN": GOOGLE_TOKEN})
    nowhere = "/nonexistent/key.json"  # no token, and no credentials where ADC looks
    env = {"GOOGLE_CLOUD_PROJECT": "acme", "GOOGLE_APPLICATION_CREDENTIALS": nowhere}
    with pytest.raises(ConfigurationError, match="gcloud auth print-access-token"):
        provider_from_env("vertex", env=env)
    env = {"GOOGLE_CLOUD_PROJECT": "acme", "GOOGLE_OAUTH_ACCESS_TOKEN": GOOGLE_TOKEN}
    assert GOOGLE_TOKEN not in repr(provider_from_env("vertex", env=env))
    (row,) = [r for r in describe_providers({}) if r["kind"] == "vertex"]
    assert (row["ready"], row["missing"]) == (False, "GOOGLE_CLOUD_PROJECT")


@pytest.mark.parametrize(
    ("kind", "recording", "path"),
    [
        (
            "vertex",
            "gemini/vertex-gemini-3-flash-one-chunk-signature-flex.sse",
            "/publishers/google/models/gemini-2.5-flash:streamGenerateContent?alt=sse",
        ),
        (
            "vertex-anthropic",
            "anthropic-messages/vertex-claude-37-text-padded-json.sse",
            "/publishers/anthropic/models/claude-sonnet-4-5:streamRawPredict",
        ),
    ],
)
async def test_a_turn_against_vertex_reads_its_recorded_stream(
    kind: str, recording: str, path: str
) -> None:
    recorded = (FIXTURES / recording).read_bytes()
    expected = json.loads((FIXTURES / "EXPECTED.json").read_text())[recording]["text"]
    issued = iter(["token-1"])
    with trio.fail_after(10):
        async with open_loopback_provider([Reply(chunks=split(recorded, 61))]) as server:
            root = f"{server.url}/v1/projects/acme/locations/us-east5"
            provider = provider_from_env(
                kind, base_url=root, env={"GOOGLE_OAUTH_ACCESS_TOKEN": "x"}
            )
            cls: Any = type(provider.dialect)
            dialect = cls(token_provider=lambda: next(issued))
            provider = type(provider)(dialect=dialect, base_url=root, model=provider.model)
            result = await run_turn(REQUEST, provider)
    assert result.ok
    assert result.text == expected
    (sent,) = server.requests
    assert sent.path == "/v1/projects/acme/locations/us-east5" + path
    assert sent.headers["authorization"] == "Bearer token-1"  # from the token provider


# --- Amazon Bedrock ------------------------------------------------------------------------------

BEDROCK_KEY = "ABSKQmVkcm9ja0FQSUtleS1leGFtcGxl0123456789"


def test_bedrock_is_its_regions_openai_compatible_endpoint_with_its_api_key() -> None:
    env = {"AWS_REGION": "us-west-2", "AWS_BEARER_TOKEN_BEDROCK": BEDROCK_KEY}
    provider = provider_from_env("bedrock", env=env)
    assert provider.base_url == "https://bedrock-runtime.us-west-2.amazonaws.com/openai/v1"
    http = provider.dialect.build_request(REQUEST, provider, stream=True)
    assert http.url.endswith("/openai/v1/chat/completions")
    assert http.headers["authorization"] == f"Bearer {BEDROCK_KEY}"
    (row,) = [r for r in describe_providers(env) if r["kind"] == "bedrock-responses"]
    assert row["base_url"] == provider.base_url
    assert row["ready"] is True
    with pytest.raises(ConfigurationError, match="AWS_BEARER_TOKEN_BEDROCK"):
        provider_from_env("bedrock", env={"AWS_REGION": "us-west-2"})
    # a key from the environment goes to its own endpoint only
    elsewhere = provider_from_env("bedrock", base_url="https://example.com/v1", env=env)
    assert elsewhere.api_key is None


async def test_a_turn_against_bedrock_reads_its_recorded_responses_stream() -> None:
    recording = "openai-responses/bedrock-mantle-text-after-tool-results.sse"
    recorded = (FIXTURES / recording).read_bytes()
    expected = json.loads((FIXTURES / "EXPECTED.json").read_text())[recording]["text"]
    with trio.fail_after(10):
        async with open_loopback_provider([Reply(chunks=split(recorded, 61))]) as server:
            env = {
                "AWS_BEDROCK_BASE_URL": f"{server.url}/openai/v1",
                "AWS_BEARER_TOKEN_BEDROCK": BEDROCK_KEY,
            }
            provider = provider_from_env("bedrock-responses", model="openai.gpt-oss-120b", env=env)
            result = await run_turn(REQUEST, provider)
    assert result.ok
    assert result.text == expected
    (sent,) = server.requests
    assert sent.path == "/openai/v1/responses"
    assert sent.headers["authorization"] == f"Bearer {BEDROCK_KEY}"


def test_a_clouds_404_says_what_to_check_there() -> None:
    azure_env = {"AZURE_OPENAI_ENDPOINT": ENDPOINT, "AZURE_OPENAI_API_KEY": KEY}
    azure = provider_from_env("azure", model="gpt-4o-prod", env=azure_env)
    recorded = (REAL / "azure-404-deployment-not-found.json").read_bytes()
    error = error_from_body("openai-chat", 404, recorded)
    said = explain(error, azure)
    assert "check that the deployment 'gpt-4o-prod' exists" in said
    assert "AZURE_OPENAI_ENDPOINT" in said
    vertex_env = {"GOOGLE_CLOUD_PROJECT": "acme", "GOOGLE_OAUTH_ACCESS_TOKEN": GOOGLE_TOKEN}
    vertex = provider_from_env("vertex", env=vertex_env)
    recorded = (FIXTURES / "gemini" / "404-model-not-found.json").read_bytes()
    said = explain(error_from_body("gemini", 404, recorded), vertex)
    assert "GOOGLE_CLOUD_LOCATION" in said
