"""Vertex AI with Application Default Credentials (the `vertex` extra): a service-account key
file, made here, that GOOGLE_APPLICATION_CREDENTIALS names, whose `token_uri` is a token server
on 127.0.0.1 that checks the signed JWT assertion as Google's does and issues access tokens; a
loopback Vertex provider that reads the Bearer each request carries. Nothing of rillet's or
google-auth's is replaced: the key is signed, posted and checked for real."""

from __future__ import annotations

import base64
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

import pytest
import trio
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from rillet._core._codes import error_code
from rillet._core._errors import (
    AuthenticationError,
    ConfigurationError,
    RescueFailed,
    ServerError,
)
from rillet._core._explain import explain
from rillet._turn._api import run_turn
from rillet.providers import VertexGeminiDialect, describe_providers, provider_from_env
from rillet.providers._vertex import vertex_base_url
from rillet.transports.testing import Reply, open_loopback_provider, refused_url, split

from ..handler_support import REQUEST

if TYPE_CHECKING:
    import subprocess
    from collections.abc import Iterator

    from rillet.transports.testing import RecordedRequest

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "real"
RECORDING = "gemini/vertex-gemini-3-flash-one-chunk-signature-flex.sse"
SCOPE = "https://www.googleapis.com/auth/cloud-platform"
EMAIL = "rillet-test@adc-project.iam.gserviceaccount.com"
KEY_ID = "0123456789abcdef"
AUDIENCE = "https://oauth2.googleapis.com/token"  # the grant's audience, wherever it is posted
JWT_BEARER = "urn:ietf:params:oauth:grant-type:jwt-bearer"
ROOT = Path(__file__).resolve().parent.parent.parent


def _b64(part: str) -> bytes:
    return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))


class TokenServer:
    """Google's OAuth token endpoint, as a service account meets it: a JWT-bearer grant whose
    assertion is signed by the account's key. Issues `tok-1`, `tok-2`... with the lifetimes
    `lifetimes` lists (3600 s once they run out); refuses a bad signature with Google's 400."""

    def __init__(self, public_key: rsa.RSAPublicKey, lifetimes: list[int]) -> None:
        self.public_key = public_key
        self.lifetimes = lifetimes
        self.hits = 0
        self.claims: list[dict[str, Any]] = []
        self.asked = threading.Event()  # a token was asked for
        self.stuck = 0  # answers the gate held past its wait
        self.gate: threading.Event | None = None  # when set: answer only once it opens
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                server.asked.set()
                if server.gate is not None and not server.gate.wait(5):
                    server.stuck += 1
                    self.send_response(503)  # no one opened it: the asker's loop was stuck
                    self.send_header("content-length", "0")
                    self.end_headers()
                    return
                body = self.rfile.read(int(self.headers["content-length"]))
                status, answer = server.answer(self.path, parse_qs(body.decode()))
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.token_uri = f"http://127.0.0.1:{self._http.server_address[1]}/token"
        self._thread = threading.Thread(target=self._http.serve_forever, daemon=True)

    def answer(self, path: str, form: dict[str, list[str]]) -> tuple[int, dict[str, Any]]:
        self.hits += 1
        if path != "/token" or form.get("grant_type") != [JWT_BEARER]:
            return 400, {"error": "unsupported_grant_type"}
        header, payload, signature = form["assertion"][0].split(".")
        try:
            self.public_key.verify(
                _b64(signature),
                f"{header}.{payload}".encode(),
                padding.PKCS1v15(),
                hashes.SHA256(),
            )
        except InvalidSignature:
            return 400, {"error": "invalid_grant", "error_description": "Invalid JWT Signature."}
        claims = json.loads(_b64(payload))
        self.claims.append(claims)
        now = time.time()
        if (
            json.loads(_b64(header)) != {"typ": "JWT", "alg": "RS256", "kid": KEY_ID}
            or claims["iss"] != EMAIL
            or claims["aud"] != AUDIENCE
            or claims["scope"] != SCOPE
            or not claims["iat"] - 60 <= now <= claims["exp"]
        ):
            return 400, {"error": "invalid_grant", "error_description": "Invalid JWT claims."}
        lifetime = self.lifetimes[self.hits - 1] if self.hits <= len(self.lifetimes) else 3600
        token = f"tok-{self.hits}"
        return 200, {"access_token": token, "expires_in": lifetime, "token_type": "Bearer"}

    def __enter__(self) -> TokenServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._http.shutdown()
        self._http.server_close()
        self._thread.join(10)


@pytest.fixture(scope="module")
def account_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _key_file(folder: Path, key: rsa.RSAPrivateKey, token_uri: str) -> Path:
    """A service-account key file as the Cloud console downloads it."""
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    info = {
        "type": "service_account",
        "project_id": "adc-project",
        "private_key_id": KEY_ID,
        "private_key": pem,
        "client_email": EMAIL,
        "client_id": "104000000000000000000",
        "auth_uri": "https://accounts.google.com/o/oauth2/auth",
        "token_uri": token_uri,
    }
    path = folder / "service-account.json"
    path.write_text(json.dumps(info))
    return path


@pytest.fixture
def token_server(account_key: rsa.RSAPrivateKey) -> Iterator[TokenServer]:
    # the first token is within minutes of its expiry when it comes: the next request refreshes
    with TokenServer(account_key.public_key(), lifetimes=[120]) as server:
        yield server


def _adc_env(monkeypatch: pytest.MonkeyPatch, key_file: Path) -> None:
    """The process's environment as a Vertex user with a key file has it: no token set."""
    monkeypatch.delenv("GOOGLE_OAUTH_ACCESS_TOKEN", raising=False)
    for name in ("GOOGLE_CLOUD_PROJECT", "GCLOUD_PROJECT", "VERTEX_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(key_file))


@pytest.fixture
def key_file_env(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    account_key: rsa.RSAPrivateKey,
    token_server: TokenServer,
) -> TokenServer:
    """The account's key file named in the environment; its token server."""
    _adc_env(monkeypatch, _key_file(tmp_path, account_key, token_server.token_uri))
    return token_server


def test_the_project_comes_from_the_credentials_when_none_is_set(
    monkeypatch: pytest.MonkeyPatch, key_file_env: TokenServer
) -> None:
    token_server = key_file_env
    provider = provider_from_env("vertex")
    assert provider.base_url == vertex_base_url("adc-project", "us-central1")
    assert provider.api_key is None
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "acme")  # a project set wins
    assert provider_from_env("vertex").base_url == vertex_base_url("acme", "us-central1")
    assert token_server.hits == 0  # configuring asks for no token


async def test_a_token_is_kept_across_requests_and_refreshed_before_it_expires(
    key_file_env: TokenServer,
) -> None:
    token_server = key_file_env
    recorded = (FIXTURES / RECORDING).read_bytes()
    expected = json.loads((FIXTURES / "EXPECTED.json").read_text())[RECORDING]["text"]
    script = [Reply(chunks=split(recorded, 61)) for _ in range(4)]
    with trio.fail_after(20):
        async with open_loopback_provider(script) as vertex:
            root = f"{vertex.url}/v1/projects/adc-project/locations/us-east5"
            provider = provider_from_env("vertex", base_url=root)
            assert type(provider.dialect) is VertexGeminiDialect
            results = [await run_turn(REQUEST, provider) for _ in range(4)]
    assert [r.text for r in results] == [expected] * 4
    bearers = [sent.headers["authorization"] for sent in vertex.requests]
    # tok-1 came with 120 s to live, inside the refresh margin: the next request refreshed it;
    # tok-2 lives an hour, so every request after it carried it without asking again
    assert bearers == ["Bearer tok-1", "Bearer tok-2", "Bearer tok-2", "Bearer tok-2"]
    assert token_server.hits == 2
    assert [c["scope"] for c in token_server.claims] == [SCOPE, SCOPE]


async def test_the_token_is_fetched_off_the_event_loop_while_other_tasks_run(
    key_file_env: TokenServer,
) -> None:
    """Google's token endpoint holds its answer until a task on the turn's own event loop
    opens it: a fetch made on the loop's thread would wait for a task that cannot run."""
    token_server = key_file_env
    token_server.gate = threading.Event()
    recorded = (FIXTURES / RECORDING).read_bytes()

    async def open_gate() -> None:
        await trio.to_thread.run_sync(token_server.asked.wait, abandon_on_cancel=True)
        token_server.gate.set()  # type: ignore[union-attr]

    with trio.fail_after(20):
        async with open_loopback_provider([Reply(chunks=split(recorded, 61))]) as vertex:
            root = f"{vertex.url}/v1/projects/adc-project/locations/us-east5"
            provider = provider_from_env("vertex", base_url=root)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(open_gate)
                result = await run_turn(REQUEST, provider)
    assert result.ok, result.error
    assert token_server.stuck == 0  # the loop opened the gate while the token was asked for
    assert (result.attempts, token_server.hits) == (1, 1)


async def test_refused_credentials_fail_the_turn_once_with_a_sentence(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, token_server: TokenServer
) -> None:
    # a key the account does not have (deleted, or another account's): the signature fails
    _adc_env(
        monkeypatch,
        _key_file(tmp_path, rsa.generate_private_key(65537, 2048), token_server.token_uri),
    )
    with trio.fail_after(20):
        async with open_loopback_provider([Reply(chunks=(b"",))]) as vertex:
            root = f"{vertex.url}/v1/projects/adc-project/locations/us-east5"
            provider = provider_from_env("vertex", base_url=root)
            result = await run_turn(REQUEST, provider)
    assert not result.ok
    assert isinstance(result.error, AuthenticationError)
    assert result.error.error_type == "invalid_grant"
    assert error_code(result.error) == "authentication_failed"
    said = explain(result.error, provider)
    assert "Google refused the credentials (invalid_grant: Invalid JWT Signature.)" in said
    assert "GOOGLE_APPLICATION_CREDENTIALS" in said
    assert "gcloud auth application-default login" in said
    assert vertex.requests == []  # nothing went to the provider
    assert token_server.hits == 1  # and the refusal was not asked again
    assert result.attempts == 1


async def test_an_unreachable_token_endpoint_is_retried_as_a_passing_failure(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, account_key: rsa.RSAPrivateKey
) -> None:
    _adc_env(monkeypatch, _key_file(tmp_path, account_key, refused_url() + "/token"))
    with trio.fail_after(20):
        async with open_loopback_provider([Reply(chunks=(b"",))]) as vertex:
            root = f"{vertex.url}/v1/projects/adc-project/locations/us-east5"
            provider = provider_from_env("vertex", base_url=root)
            result = await run_turn(REQUEST, provider)
    # retried, then the one non-streaming rescue: unlike a refusal, a next try may get through
    assert isinstance(result.error, RescueFailed)
    error = result.error.stream_error
    assert isinstance(error, ServerError)
    assert error.error_type == "token_unavailable"
    assert result.attempts > 2
    said = explain(result.error, provider)
    assert "Google's token endpoint could not be reached (ConnectionError)" in said, said
    assert vertex.requests == []


def test_no_token_and_no_google_auth_says_what_to_set_or_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "google.auth", None)  # as if the extra were not installed
    with pytest.raises(ConfigurationError) as raised:
        provider_from_env("vertex-anthropic", env={"GOOGLE_CLOUD_PROJECT": "acme"})
    assert str(raised.value) == (
        "no access token: set GOOGLE_OAUTH_ACCESS_TOKEN (gcloud auth print-access-token) or"
        " pass --api-key, or pip install 'rillet[vertex]' to use Application Default"
        " Credentials (GOOGLE_APPLICATION_CREDENTIALS, gcloud auth application-default login)"
    )
    assert raised.value.env_var == "GOOGLE_OAUTH_ACCESS_TOKEN"
    # a token needs no google-auth
    token = {"GOOGLE_CLOUD_PROJECT": "acme", "GOOGLE_OAUTH_ACCESS_TOKEN": "ya29.token"}
    assert provider_from_env("vertex", env=token).api_key is not None


def test_a_key_file_that_cannot_be_read_says_what_to_set(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.json"
    env = {"GOOGLE_CLOUD_PROJECT": "acme", "GOOGLE_APPLICATION_CREDENTIALS": str(missing)}
    with pytest.raises(ConfigurationError) as raised:
        provider_from_env("vertex", env=env)
    said = str(raised.value)
    assert said.startswith(f"no usable Google credentials (File {missing} was not found.")
    assert "gcloud auth application-default login" in said
    assert raised.value.env_var == "GOOGLE_APPLICATION_CREDENTIALS"


async def _rillet_run(
    key_file: Path, reply: Reply
) -> tuple[subprocess.CompletedProcess[bytes], list[RecordedRequest]]:
    """`rillet run --provider vertex` with only `key_file` for credentials, against a Vertex
    loopback answering `reply`: the process and the requests Vertex got."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("GOOGLE_", "GCLOUD_", "VERTEX_"))
    }
    env["GOOGLE_APPLICATION_CREDENTIALS"] = str(key_file)
    with trio.fail_after(30):
        async with open_loopback_provider([reply]) as vertex:
            env["VERTEX_BASE_URL"] = f"{vertex.url}/v1/projects/adc-project/locations/us-east5"
            done = await trio.run_process(
                [sys.executable, "-m", "rillet", "run", "hi", "--provider", "vertex"],
                capture_stdout=True,
                capture_stderr=True,
                check=False,
                env=env,
                cwd=ROOT,
            )
            return done, list(vertex.requests)


@pytest.mark.slow
async def test_rillet_run_answers_from_vertex_with_a_key_file(
    tmp_path: Path, account_key: rsa.RSAPrivateKey, token_server: TokenServer
) -> None:
    key_file = _key_file(tmp_path, account_key, token_server.token_uri)
    recorded = (FIXTURES / RECORDING).read_bytes()
    expected = json.loads((FIXTURES / "EXPECTED.json").read_text())[RECORDING]["text"]
    done, (sent,) = await _rillet_run(key_file, Reply(chunks=split(recorded, 61)))
    assert done.returncode == 0, done.stderr
    assert done.stdout.decode() == expected + ("" if expected.endswith("\n") else "\n")
    assert sent.headers["authorization"] == "Bearer tok-1"
    assert token_server.hits == 1


@pytest.mark.slow
async def test_rillet_run_with_refused_credentials_says_to_check_them_not_a_token(
    tmp_path: Path, token_server: TokenServer
) -> None:
    """The one line names where the credentials came from (the key file, or gcloud's sign-in),
    never a token variable the user did not set."""
    key_file = _key_file(tmp_path, rsa.generate_private_key(65537, 2048), token_server.token_uri)
    done, sent = await _rillet_run(key_file, Reply(chunks=(b"",)))
    assert sent == []
    assert done.returncode == 1
    (line,) = done.stderr.decode().splitlines()
    assert "Google refused the credentials" in line
    assert line.endswith(
        "check GOOGLE_APPLICATION_CREDENTIALS (or gcloud auth application-default login)"
    )
    assert "GOOGLE_OAUTH_ACCESS_TOKEN" not in line


def test_described_vertex_is_ready_through_application_default_credentials() -> None:
    (row,) = [
        r for r in describe_providers({"GOOGLE_CLOUD_PROJECT": "acme"}) if r["kind"] == "vertex"
    ]
    assert (row["ready"], row["missing"]) == (True, None)
    assert (row["api_key"], row["api_key_from"]) == (None, "application default credentials")
