"""Azure OpenAI: OpenAI's Chat Completions and Responses wires as Azure serves them.

The wire is OpenAI's; what differs is where it lives and how it is signed:

- **Where.** An Azure OpenAI (or Foundry) resource answers at its endpoint,
  `https://<resource>.openai.azure.com`. Its v1 API is OpenAI's own paths under
  `<endpoint>/openai/v1`, the deployment's name as the `model`. The classic API puts the
  deployment in the path, `<endpoint>/openai/deployments/<deployment>`, and every request needs
  an `api-version` query parameter; it is chosen when an API version is configured.
- **How.** A resource key goes in an `api-key` header (both APIs take it); a Microsoft Entra ID
  token as `Authorization: Bearer`. A token expires (about an hour): a host that runs longer
  passes `token_provider`, called for every request, which its identity library refreshes.
  `EntraToken` is one: azure-identity's credential (`DefaultAzureCredential` unless given one,
  the `azure` extra), its token kept until shortly before it expires.

Streams and errors are OpenAI's, with Azure's additions read as any compatible server's are
(the prompt's `prompt_filter_results` in a chunk of no choices, a choice's
`content_filter_results`, a `content_filter` finish or error).
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

from .._core._errors import AuthenticationError, ConfigurationError, TransportError
from ._openai_chat._dialect import OpenAIChatDialect
from ._openai_responses._dialect import OpenAIResponsesDialect

if TYPE_CHECKING:
    from collections.abc import Callable

    from .._core._dialect import HttpRequest, Provider
    from .._core._request import TurnRequest

__all__ = [
    "ENTRA_SCOPE",
    "AzureOpenAIDialect",
    "AzureResponsesDialect",
    "EntraToken",
    "azure_base_url",
]

ENTRA_SCOPE = "https://cognitiveservices.azure.com/.default"
"""The Microsoft Entra ID scope of an Azure OpenAI (Cognitive Services) token."""
_REFRESH_BEFORE = 300.0  # seconds before its expiry a token is replaced (azure-identity's own)
_ENTRA = "microsoft-entra-id"  # who reported a credential's failure
_NO_IDENTITY = (
    "no API key and no azure-identity to get a Microsoft Entra ID token with: set"
    " AZURE_OPENAI_API_KEY (or AZURE_OPENAI_AD_TOKEN) or pass --api-key, or install the azure"
    " extra (pip install 'rillet[azure]') to sign in with your Azure credentials"
)
_SIGN_IN = "sign in (az login) or set AZURE_TENANT_ID, AZURE_CLIENT_ID and AZURE_CLIENT_SECRET"


def azure_base_url(endpoint: str, deployment: str, api_version: str | None) -> str:
    """The base URL for a resource's `endpoint`: the v1 API's (`<endpoint>/openai/v1`), or with
    an API version the classic one (`<endpoint>/openai/deployments/<deployment>`). An endpoint
    that already names either path is kept as it is."""
    root = endpoint.strip().rstrip("/")
    if "/openai/" in root + "/":
        return root
    if api_version:
        return f"{root}/openai/deployments/{deployment}"
    return f"{root}/openai/v1"


class EntraToken:
    """Microsoft Entra ID tokens for Azure OpenAI from an azure-identity credential: a
    `token_provider` for `AzureOpenAIDialect` and `AzureResponsesDialect`.

    A token is kept and sent with every request until shortly before it expires (five minutes
    before, or half its life when it was issued for less than ten): only then is the credential
    asked again. The credential's `get_token` is blocking I/O (an HTTP call to Entra ID or a
    managed identity endpoint, or `az` run as a subprocess): in a turn it is made in a worker
    thread before the request is built (a `KeptToken`), so the event loop never waits on it;
    a direct call makes it on the caller's thread, once per token's lifetime (about an hour).

    A credential that cannot give a token (azure-identity's `ClientAuthenticationError`,
    including no credential found) raises `AuthenticationError`, which no attempt retries; an
    identity endpoint that cannot be reached raises `TransportError`, once azure-identity's own
    retries have given up (`retry_total=0` on the credential leaves retrying to the turn).

    Args:
        credential: an azure-identity credential (anything with `get_token(*scopes)`); None
            for `DefaultAzureCredential()`, which finds one in the environment (service
            principal variables, workload or managed identity, `az login`...).
        scope: the token's scope; Azure OpenAI's by default.
        clock: the time now in seconds since the epoch, as `expires_on` counts it.
    """

    def __init__(
        self,
        credential: Any = None,
        *,
        scope: str = ENTRA_SCOPE,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if credential is None:
            try:
                from azure.identity import DefaultAzureCredential
            except ImportError:
                raise ConfigurationError("azure", "AZURE_OPENAI_API_KEY", _NO_IDENTITY) from None
            credential = DefaultAzureCredential()
        self.credential = credential
        self.scope = scope
        self._clock = clock
        self._token: str | None = None
        self._refresh_at = 0.0
        self._lock = threading.Lock()
        self._fresh = False  # fetched, and not yet used by a request

    def due(self) -> bool:
        """Whether the next call asks the credential for a token (`KeptToken`)."""
        return not self._fresh and (self._token is None or self._clock() >= self._refresh_at)

    def __call__(self) -> str:
        """The current token: the kept one, else a fresh one from the credential. A token
        just fetched is used once whatever its life, so one fetched ahead of its request and
        already near expiry is not fetched again for it."""
        token = self._token
        if token is not None and self._clock() < self._refresh_at:
            self._fresh = False
            return token
        with self._lock:  # one fetch when threads ask together
            if self._fresh and self._token is not None:
                self._fresh = False
            elif self._token is None or self._clock() >= self._refresh_at:
                self._fetch()
                self._fresh = True
            assert self._token is not None
            return self._token

    def _fetch(self) -> None:
        from azure.core.exceptions import AzureError, ClientAuthenticationError

        try:
            issued = self.credential.get_token(self.scope)
        except ClientAuthenticationError as exc:
            source = type(self.credential).__name__  # its own message lists every credential tried
            raise AuthenticationError(
                _ENTRA, f"no Microsoft Entra ID token from {source}: {_SIGN_IN}"
            ) from exc
        except AzureError as exc:
            raise TransportError(
                _ENTRA, f"no Microsoft Entra ID token: {_first_line(exc)}"
            ) from exc
        now = self._clock()
        life = max(0.0, float(issued.expires_on) - now)
        self._token = str(issued.token)
        self._refresh_at = float(issued.expires_on) - min(_REFRESH_BEFORE, life / 2)


def _first_line(error: BaseException) -> str:
    """An Azure error's first line (a long message goes on with troubleshooting links)."""
    text = str(getattr(error, "message", None) or error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _signed(
    http: HttpRequest,
    provider: Provider,
    api_version: str | None,
    token_provider: Callable[[], str] | None,
    bearer: bool,
) -> HttpRequest:
    """OpenAI's request as Azure takes it: its key in `api-key` (or a token as Bearer), the
    API version in the query."""
    headers = dict(http.headers)
    if token_provider is not None:
        headers["authorization"] = f"Bearer {token_provider()}"
    elif provider.api_key is not None and not bearer:
        del headers["authorization"]
        headers["api-key"] = provider.api_key.reveal()
    url = http.url
    if api_version:
        url += ("&" if "?" in url else "?") + f"api-version={api_version}"
    return type(http)(
        method=http.method, url=url, headers=headers, body=http.body, messages=http.messages
    )


class _AzureSigning:
    """What both of Azure's wires add to OpenAI's dialect (see the module's docstring): its
    options, and its request signed and versioned as Azure takes it."""

    def __init__(
        self,
        *,
        api_version: str | None = None,
        token_provider: Callable[[], str] | None = None,
        bearer: bool = False,
        **options: Any,
    ) -> None:
        super().__init__(**options)
        self.api_version = api_version
        self.token_provider = token_provider
        self.bearer = bearer

    def build_request(
        self, request: TurnRequest, provider: Provider, *, stream: bool = True
    ) -> HttpRequest:
        """OpenAI's request, signed and versioned as Azure takes it."""
        openai: Any = super()
        http: HttpRequest = openai.build_request(request, provider, stream=stream)
        return _signed(http, provider, self.api_version, self.token_provider, self.bearer)


class AzureOpenAIDialect(_AzureSigning, OpenAIChatDialect):
    """Chat Completions on Azure OpenAI.

    Args:
        api_version: the classic API's `api-version` (the base URL is then the deployment's);
            None for the v1 API.
        token_provider: called for each request's Microsoft Entra ID token (sent as Bearer);
            None to send the provider's key (an Entra token there with `bearer`).
        bearer: the provider's key is an Entra ID token, sent as Bearer, not a resource key.
        **options: `OpenAIChatDialect`'s.
    """

    name = "azure-openai"


class AzureResponsesDialect(_AzureSigning, OpenAIResponsesDialect):
    """The Responses API on Azure OpenAI (v1, or the classic API's preview versions).

    Args:
        api_version: as `AzureOpenAIDialect`'s.
        token_provider: as `AzureOpenAIDialect`'s.
        bearer: as `AzureOpenAIDialect`'s.
        **options: `OpenAIResponsesDialect`'s.
    """

    name = "azure-openai-responses"
