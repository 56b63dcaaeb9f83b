"""Vertex AI: Gemini's and Anthropic's wires as Google Cloud serves them.

The wires are the providers' own; what differs is where they live and how they are signed:

- **Where.** A project's models answer under
  `https://<location>-aiplatform.googleapis.com/v1/projects/<project>/locations/<location>`
  (`aiplatform.googleapis.com` for the `global` location): Gemini's at
  `publishers/google/models/<model>:streamGenerateContent?alt=sse`, Anthropic's at
  `publishers/anthropic/models/<model>:streamRawPredict` (`:generateContent`, `:rawPredict`
  when not streamed).
- **How.** A Google Cloud access token as `Authorization: Bearer`: one given (what `gcloud
  auth print-access-token` prints; an hour long), a host's `token_provider` (called for every
  request), or, with the `vertex` extra, one from Application Default Credentials
  (`GoogleAccessToken`: a service-account key file, gcloud's user credentials, the metadata
  server), kept and refreshed shortly before it expires.
- **Anthropic's body** names no `model` (the URL does) and carries
  `anthropic_version: vertex-2023-10-16` in place of the `anthropic-version` header.

Streams and errors are the providers' own (Vertex's error object is Google's, as Gemini's is).
"""

from __future__ import annotations

import functools
import threading
import warnings
from typing import TYPE_CHECKING, Any

import msgspec
from rillet._core._errors import AuthenticationError, ConfigurationError, ServerError

from ._anthropic._dialect import AnthropicDialect
from ._gemini._dialect import GeminiDialect

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from .._core._dialect import HttpRequest, Provider
    from .._core._request import TurnRequest

__all__ = [
    "GoogleAccessToken",
    "VertexAnthropicDialect",
    "VertexGeminiDialect",
    "application_default_token",
    "vertex_base_url",
]

ANTHROPIC_VERSION = "vertex-2023-10-16"
SCOPES = ("https://www.googleapis.com/auth/cloud-platform",)
TOKEN_TIMEOUT = 10.0
"""Seconds one call to Google's token endpoint may take: it blocks (see `GoogleAccessToken`)."""
_MESSAGE_MAX = 160  # what an error keeps of a message whole (`preview`)
NO_TOKEN = (
    "no access token: set GOOGLE_OAUTH_ACCESS_TOKEN (gcloud auth print-access-token) or pass"
    " --api-key, or pip install 'rillet[vertex]' to use Application Default Credentials"
    " (GOOGLE_APPLICATION_CREDENTIALS, gcloud auth application-default login)"
)
_NO_CREDENTIALS = (
    "set GOOGLE_APPLICATION_CREDENTIALS to a service-account key file, run gcloud auth"
    " application-default login, or set GOOGLE_OAUTH_ACCESS_TOKEN (gcloud auth"
    " print-access-token)"
)


def vertex_base_url(project: str, location: str) -> str:
    """The root of a project's models in a location (`global` has no regional host)."""
    host = "aiplatform.googleapis.com"
    if location != "global":
        host = f"{location}-{host}"
    return f"https://{host}/v1/projects/{project}/locations/{location}"


class GoogleAccessToken:
    """An access token from google-auth credentials, for `token_provider`: kept, and refreshed
    when it is within google-auth's threshold (a few minutes) of its expiry.

    The refresh is a blocking call to Google's token endpoint (`TOKEN_TIMEOUT` at most): in a
    turn it is made in a worker thread before the request is built (a `KeptToken`), so the
    event loop never waits on it; a direct call makes it on the caller's thread, once per token
    lifetime (about an hour), never per request. A refusal of the credentials
    (google-auth's `RefreshError`: `invalid_grant`, a revoked or deleted key) is an
    `AuthenticationError` saying what to check, which no retry cures; an endpoint that could
    not be reached, or that failed on its side, is a `ServerError`, which a retry may cure.

    Args:
        credentials: google-auth credentials (`google.auth.default()`'s), scoped for Vertex.
        provider: the dialect's name, for the errors.
    """

    def __init__(self, credentials: Any, *, provider: str = "vertex") -> None:
        self.credentials = credentials
        self.provider = provider
        self.refreshes = 0  # calls to the token endpoint: one per token lifetime
        self._lock = threading.Lock()  # one refresh at a time, whoever builds requests
        # a token just fetched is used once whatever its life: one fetched for a request
        # ahead of it (`due`) and already within google-auth's margin is not fetched again
        self._fresh = False

    def due(self) -> bool:
        """Whether the next call asks Google for a token (`KeptToken`)."""
        credentials = self.credentials
        stale = credentials.token is None or credentials.expired
        return bool(stale and not self._fresh)

    def __call__(self) -> str:
        """The token: the one kept while it is fresh, else a new one."""
        from google.auth import exceptions

        with self._lock:
            credentials = self.credentials
            if self._fresh and credentials.token is not None:
                self._fresh = False
            elif credentials.token is None or credentials.expired:
                self.refreshes += 1
                try:
                    credentials.refresh(_request())
                except exceptions.RefreshError as exc:
                    raise self._refused(exc) from None
                except exceptions.GoogleAuthError as exc:  # its TransportError: no answer
                    cause = type(exc.__cause__ or exc).__name__  # (its words hold the URL)
                    raise ServerError(
                        self.provider,
                        f"no access token: Google's token endpoint could not be reached"
                        f" ({cause}); try again shortly",
                        error_type="token_unavailable",
                    ) from None
                self._fresh = True
            return str(credentials.token)

    def _refused(self, exc: Exception) -> ServerError | AuthenticationError:
        said = _said(exc)
        if getattr(exc, "retryable", False):  # google-auth retried it already
            return ServerError(
                self.provider,
                f"Google's token endpoint failed ({said}); try again shortly",
                error_type="token_unavailable",
            )
        data = exc.args[1] if len(exc.args) > 1 and isinstance(exc.args[1], dict) else {}
        advice = (
            ": check GOOGLE_APPLICATION_CREDENTIALS, or run gcloud auth application-default login"
        )
        room = _MESSAGE_MAX - len(advice) - len("Google refused the credentials ()")
        if len(said) > room:  # a message past its bound loses its middle: keep the advice whole
            said = said[: room - 1] + "…"
        return AuthenticationError(
            self.provider,
            f"Google refused the credentials ({said}){advice}",
            error_type=str(data.get("error") or "refresh_failed"),
        )

    def __repr__(self) -> str:  # never the token
        return f"GoogleAccessToken({type(self.credentials).__name__}, refreshes={self.refreshes})"


def application_default_token(
    kind: str, env: Mapping[str, str]
) -> tuple[GoogleAccessToken, str | None]:
    """Application Default Credentials, through google-auth (the `vertex` extra): the token
    source and the project they name, if any.

    The key file `env`'s `GOOGLE_APPLICATION_CREDENTIALS` names when it names one, else
    `google.auth.default()` (the variable in the process's environment, gcloud's user
    credentials, the metadata server). Raises `ConfigurationError` saying what to set or
    install when there is no google-auth, or no credentials.

    Args:
        kind: the provider kind asked for, for the errors.
        env: the environment to read.
    """
    try:
        import google.auth
        from google.auth import exceptions
    except ImportError:
        raise ConfigurationError(kind, "GOOGLE_OAUTH_ACCESS_TOKEN", NO_TOKEN) from None
    path = env.get("GOOGLE_APPLICATION_CREDENTIALS", "").strip()
    try:
        if path:
            load: Any = google.auth.load_credentials_from_file  # untyped in google-auth
            with warnings.catch_warnings():  # the file the environment names, as default()
                warnings.simplefilter("ignore", DeprecationWarning)  # takes it: no warning
                credentials, project = load(path, scopes=SCOPES)
        else:
            credentials, project = google.auth.default(scopes=SCOPES, request=_request())
    except exceptions.GoogleAuthError as exc:
        found = f" ({_said(exc)})" if path else ""
        raise ConfigurationError(
            kind,
            "GOOGLE_APPLICATION_CREDENTIALS",
            f"no usable Google credentials{found}: {_NO_CREDENTIALS}",
        ) from None
    except ImportError:  # google-auth without its `requests` transport
        raise ConfigurationError(kind, "GOOGLE_OAUTH_ACCESS_TOKEN", NO_TOKEN) from None
    name = "vertex-anthropic" if kind == "vertex-anthropic" else "vertex-gemini"
    return GoogleAccessToken(credentials, provider=name), project or None


@functools.cache
def _bounded() -> type[Any]:
    from google.auth.transport.requests import Request

    class Bounded(Request):
        """google-auth's `requests` transport, whose calls without a timeout get ours (its
        own is two minutes)."""

        def __call__(
            self,
            url: Any,
            method: Any = "GET",
            body: Any = None,
            headers: Any = None,
            timeout: Any = None,
            **kwargs: Any,
        ) -> Any:
            call: Any = super().__call__  # google-auth's transports are untyped
            return call(url, method, body, headers, timeout or TOKEN_TIMEOUT, **kwargs)

    return Bounded


def _request() -> Any:
    """google-auth's HTTP transport (`requests`), bounded by `TOKEN_TIMEOUT`."""
    return _bounded()()


def _said(exc: BaseException) -> str:
    """google-auth's own words for a failure, first argument only, bounded."""
    text = str(exc.args[0]) if exc.args else type(exc).__name__
    return " ".join(text.split())[:300]


class _VertexSigning:
    """What both of Vertex's wires share: the token, as Bearer."""

    def __init__(self, *, token_provider: Callable[[], str] | None = None, **options: Any) -> None:
        super().__init__(**options)
        self.token_provider = token_provider

    def _signed(
        self, http: HttpRequest, provider: Provider, path: str, body: bytes, drop: tuple[str, ...]
    ) -> HttpRequest:
        headers = {k: v for k, v in http.headers.items() if k not in drop}
        token = self.token_provider() if self.token_provider is not None else None
        if token is None and provider.api_key is not None:
            token = provider.api_key.reveal()
        if token is not None:
            headers["authorization"] = f"Bearer {token}"
        return type(http)(method=http.method, url=provider.url(path), headers=headers, body=body)


class VertexGeminiDialect(_VertexSigning, GeminiDialect):
    """Gemini on Vertex AI.

    Args:
        token_provider: called for each request's access token; None to send the provider's
            key (an access token) as Bearer.
        **options: `GeminiDialect`'s.
    """

    name = "vertex-gemini"

    def build_request(
        self, request: TurnRequest, provider: Provider, *, stream: bool = True
    ) -> HttpRequest:
        """Gemini's request at the project's model, signed with the token."""
        http = super().build_request(request, provider, stream=stream)
        method = "streamGenerateContent?alt=sse" if stream else "generateContent"
        path = f"publishers/google/models/{provider.model}:{method}"
        return self._signed(http, provider, path, http.body, ("x-goog-api-key",))


class VertexAnthropicDialect(_VertexSigning, AnthropicDialect):
    """Anthropic's models on Vertex AI.

    Args:
        token_provider: as `VertexGeminiDialect`'s.
        **options: `AnthropicDialect`'s.
    """

    name = "vertex-anthropic"

    def build_request(
        self, request: TurnRequest, provider: Provider, *, stream: bool = True
    ) -> HttpRequest:
        """Anthropic's request at the project's model: its body without `model`, with
        Vertex's `anthropic_version`; signed with the token."""
        http = super().build_request(request, provider, stream=stream)
        body: dict[str, Any] = msgspec.json.decode(http.body)
        body.pop("model", None)
        body["anthropic_version"] = ANTHROPIC_VERSION
        method = "streamRawPredict" if stream else "rawPredict"
        path = f"publishers/anthropic/models/{provider.model}:{method}"
        drop = ("x-api-key", "anthropic-version")
        return self._signed(http, provider, path, msgspec.json.encode(body), drop)
