"""Azure OpenAI: a resource's endpoint, deployment, API version and credential, from the
environment as Azure's own tools name them, and a turn against a loopback server standing in
for the resource (its real recorded stream), with the request's path, query and headers as
Azure takes them."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
from rillet._core._errors import ConfigurationError
from rillet._turn._api import run_turn
from rillet.providers import (
    AzureOpenAIDialect,
    AzureResponsesDialect,
    describe_providers,
    provider_from_env,
)
from rillet.transports.testing import Reply, open_loopback_provider, split

from ..handler_support import REQUEST

KEY = "0123456789abcdef0123456789abcdef"
TOKEN = "eyJ0eXAiOiJKV1QiLCJhbGciOiJSUzI1NiJ9.entra-token.signature"
ENDPOINT = "https://contoso.openai.azure.com"
REAL = Path(__file__).resolve().parent.parent / "fixtures" / "real" / "openai-chat"


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
def test_what_is_missing_is_named(env: dict[str, str], named: str) -> None:
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
