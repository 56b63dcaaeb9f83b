"""Azure OpenAI signed with Microsoft Entra ID tokens from azure-identity (the `azure` extra).

No key configured: `provider_from_env("azure")` asks azure-identity's `DefaultAzureCredential`,
which here finds App Service's managed identity in the environment (`IDENTITY_ENDPOINT`,
`IDENTITY_HEADER`) and fetches tokens over real HTTP from an identity endpoint on 127.0.0.1;
`rillet run --provider azure` does the same in a subprocess.
(Entra ID's own token endpoint cannot be stood in for: azure-identity and MSAL take only an https
authority, and MSAL asks login.microsoftonline.com to discover an unknown one; a managed
identity's endpoint is plain HTTP on the machine itself, as it is on Azure.) The endpoint runs in
a thread of its own: the token is fetched on the event loop's thread, blocking it.

Tokens are issued for two minutes: azure-identity (MSAL) keeps no token with less than five
minutes left, so every fetch it makes reaches the endpoint, and the endpoint's count of
requests is rillet's own count of fetches.
"""

from __future__ import annotations

import http.server
import json
import os
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

import pytest
import trio
from rillet._core._errors import AuthenticationError, ConfigurationError, TransportError
from rillet._core._explain import explain
from rillet._turn._api import run_turn
from rillet.providers import AzureOpenAIDialect, EntraToken, describe_providers, provider_from_env
from rillet.providers._azure import ENTRA_SCOPE
from rillet.transports.testing import (
    Reply,
    open_loopback_provider,
    openai_text_stream,
    refused_url,
    split,
)

from ..handler_support import REQUEST

if TYPE_CHECKING:
    import subprocess
    from collections.abc import Iterator

SECRET = "identity-header-secret"
LIFE = 120  # seconds a token is issued for
NO_TOKEN = (
    "authentication failed: no Microsoft Entra ID token from DefaultAzureCredential: sign in"
    " (az login) or set AZURE_TENANT_ID, AZURE_CLIENT_ID and AZURE_CLIENT_SECRET — check"
)


class IdentityEndpoint:
    """App Service's managed identity endpoint on 127.0.0.1: each GET answers the next of
    `lives` (a token's lifetime in seconds, or an error's HTTP status as a string), the last
    one again once they run out."""

    def __init__(self, lives: list[int | str]) -> None:
        self.lives = lives
        self.hits: list[tuple[str, dict[str, str]]] = []
        endpoint = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                endpoint.hits.append((self.path, dict(self.headers)))
                n = len(endpoint.hits)
                life = endpoint.lives[min(n, len(endpoint.lives)) - 1]
                if isinstance(life, str):
                    status = int(life)
                    body = {"error": "invalid_request", "error_description": "Identity not found"}
                else:
                    status = 200
                    body = {
                        "access_token": f"entra-token-{n}",
                        "expires_on": str(int(time.time()) + life),
                        "resource": "https://cognitiveservices.azure.com",
                        "token_type": "Bearer",
                    }
                raw = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/msi/token"


@pytest.fixture
def identity(monkeypatch: pytest.MonkeyPatch) -> Iterator[IdentityEndpoint]:
    """An identity endpoint serving in a thread, named in the environment as App Service
    names its own; other Azure credential variables cleared. Its `lives` are set by the test."""
    endpoint = IdentityEndpoint([LIFE])
    thread = threading.Thread(target=endpoint.server.serve_forever, daemon=True)
    thread.start()
    for name in ("AZURE_CLIENT_ID", "AZURE_TENANT_ID", "AZURE_CLIENT_SECRET", "MSI_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("IDENTITY_ENDPOINT", endpoint.url)
    monkeypatch.setenv("IDENTITY_HEADER", SECRET)
    yield endpoint
    endpoint.server.shutdown()
    endpoint.server.server_close()
    thread.join()


def _replies(n: int) -> list[Reply]:
    return [Reply(chunks=split(openai_text_stream(["Hi"]), 16)) for _ in range(n)]


async def _rillet_run(endpoint: str) -> subprocess.CompletedProcess[bytes]:
    """`rillet run --provider azure` as a person runs it: no key in its environment, the
    identity endpoint's variables (set by the fixture) in it."""
    env = {k: v for k, v in os.environ.items() if not k.endswith(("_API_KEY", "_AD_TOKEN"))}
    env["AZURE_OPENAI_ENDPOINT"] = endpoint
    cmd = [sys.executable, "-m", "rillet", "run", "hi", "--provider", "azure", "--model", "d"]
    return await trio.run_process(
        cmd, stdin=b"", capture_stdout=True, capture_stderr=True, check=False, env=env
    )


async def test_with_no_key_each_request_carries_an_entra_token_fetched_once(
    identity: IdentityEndpoint,
) -> None:
    with trio.fail_after(20):
        async with open_loopback_provider(_replies(2)) as server:
            env = {"AZURE_OPENAI_ENDPOINT": server.url}
            provider = provider_from_env("azure", model="gpt-4o-prod", env=env)
            assert provider.api_key is None
            assert identity.hits == []  # nothing is fetched before the first request
            first = await run_turn(REQUEST, provider)
            second = await run_turn(REQUEST, provider)
    assert first.ok
    assert second.ok
    assert [r.headers["authorization"] for r in server.requests] == ["Bearer entra-token-1"] * 2
    assert all("api-key" not in r.headers for r in server.requests)
    (path, headers), = identity.hits  # fmt: skip
    assert "resource=https://cognitiveservices.azure.com" in path
    assert headers["X-IDENTITY-HEADER"] == SECRET


async def test_an_expired_token_is_fetched_again_and_the_new_one_kept(
    identity: IdentityEndpoint,
) -> None:
    identity.lives = [0, LIFE]  # the first token has expired by the time it arrives
    with trio.fail_after(20):
        async with open_loopback_provider(_replies(3)) as server:
            env = {"AZURE_OPENAI_ENDPOINT": server.url, "AZURE_OPENAI_API_VERSION": "2024-10-21"}
            provider = provider_from_env("azure", model="d", env=env)
            for _ in range(3):
                assert (await run_turn(REQUEST, provider)).ok
    sent = [r.headers["authorization"] for r in server.requests]
    assert sent == ["Bearer entra-token-1", "Bearer entra-token-2", "Bearer entra-token-2"]
    assert len(identity.hits) == 2


def test_a_token_is_replaced_halfway_through_a_short_life(identity: IdentityEndpoint) -> None:
    from azure.identity import DefaultAzureCredential

    later = 0.0
    tokens = EntraToken(DefaultAzureCredential(), clock=lambda: time.time() + later)
    assert tokens.scope == ENTRA_SCOPE
    assert tokens() == "entra-token-1"
    later = LIFE / 2 - 5
    assert tokens() == "entra-token-1"
    assert len(identity.hits) == 1
    later = LIFE / 2 + 5
    assert tokens() == "entra-token-2"
    assert tokens() == "entra-token-2"
    assert len(identity.hits) == 2


async def test_a_refused_credential_is_an_authentication_error_never_retried(
    identity: IdentityEndpoint,
) -> None:
    identity.lives = ["400"]
    with trio.fail_after(20):
        async with open_loopback_provider(_replies(1)) as server:
            provider = provider_from_env(
                "azure", model="d", env={"AZURE_OPENAI_ENDPOINT": server.url}
            )
            result = await run_turn(REQUEST, provider)
    assert isinstance(result.error, AuthenticationError)
    assert result.attempts <= 1
    assert server.requests == []  # nothing reached the provider
    assert len(identity.hits) == 1
    said = explain(result.error, provider)
    assert said == f"{NO_TOKEN} the API key (--api-key)"


def test_an_identity_endpoint_out_of_reach_is_a_transport_error(
    identity: IdentityEndpoint, monkeypatch: pytest.MonkeyPatch
) -> None:
    from azure.identity import ManagedIdentityCredential

    monkeypatch.setenv("IDENTITY_ENDPOINT", refused_url() + "/msi/token")
    with pytest.raises(TransportError, match=r"no Microsoft Entra ID token: .*refused"):
        EntraToken(ManagedIdentityCredential(retry_total=0))()  # no backoff of its own


async def test_a_key_is_sent_and_no_token_fetched(identity: IdentityEndpoint) -> None:
    with trio.fail_after(20):
        async with open_loopback_provider(_replies(1)) as server:
            env = {"AZURE_OPENAI_ENDPOINT": server.url, "AZURE_OPENAI_API_KEY": "k" * 32}
            provider = provider_from_env("azure", model="d", env=env)
            assert (await run_turn(REQUEST, provider)).ok
    assert server.requests[0].headers["api-key"] == "k" * 32
    assert identity.hits == []


def test_an_entra_token_provider_is_chosen_only_without_a_key() -> None:
    env = {"AZURE_OPENAI_ENDPOINT": "https://contoso.openai.azure.com"}
    provider = provider_from_env("azure-responses", model="d", env=env)
    assert isinstance(provider.dialect.token_provider, EntraToken)  # type: ignore[attr-defined]
    (row,) = [r for r in describe_providers({**env, "AZURE_OPENAI_DEPLOYMENT": "d"})
              if r["kind"] == "azure"]  # fmt: skip
    assert row["ready"] is True
    keyed = provider_from_env("azure", model="d", env={**env, "AZURE_OPENAI_API_KEY": "k" * 32})
    assert isinstance(keyed.dialect, AzureOpenAIDialect)
    assert keyed.dialect.token_provider is None


def test_no_key_and_no_azure_identity_says_what_to_set_or_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "azure.identity", None)  # as if it were not installed
    env = {"AZURE_OPENAI_ENDPOINT": "https://contoso.openai.azure.com"}
    with pytest.raises(ConfigurationError) as raised:
        provider_from_env("azure-responses", model="d", env=env)
    assert raised.value.kind == "azure-responses"
    assert raised.value.env_var == "AZURE_OPENAI_API_KEY"
    assert str(raised.value) == (
        "no API key and no azure-identity to get a Microsoft Entra ID token with: set"
        " AZURE_OPENAI_API_KEY (or AZURE_OPENAI_AD_TOKEN) or pass --api-key, or install the"
        " azure extra (pip install 'rillet[azure]') to sign in with your Azure credentials"
    )
    (row,) = [r for r in describe_providers(env) if r["kind"] == "azure"]
    assert row["ready"] is False
    assert "pip install 'rillet[azure]'" in row["missing"]


@pytest.mark.slow
async def test_rillet_run_signs_in_with_the_environments_azure_credential(
    identity: IdentityEndpoint,
) -> None:
    with trio.fail_after(60):
        async with open_loopback_provider(_replies(1)) as server:
            done = await _rillet_run(server.url)
    assert done.returncode == 0, done.stderr
    assert done.stdout.decode() == "Hi\n"
    assert server.requests[0].headers["authorization"] == "Bearer entra-token-1"
    assert len(identity.hits) == 1


@pytest.mark.slow
async def test_rillet_run_says_when_the_credential_gives_no_token(
    identity: IdentityEndpoint,
) -> None:
    identity.lives = ["400"]
    with trio.fail_after(60):
        async with open_loopback_provider(_replies(1)) as server:
            done = await _rillet_run(server.url)
    assert done.returncode != 0
    assert done.stdout == b""
    assert server.requests == []
    assert len(identity.hits) == 1
    said = done.stderr.decode().splitlines()[-1]
    # where the token came from, not a key variable the user never set as the only advice
    assert said == f"rillet: {NO_TOKEN} the Azure sign-in (az login), or set AZURE_OPENAI_API_KEY"
