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

Streams and errors are OpenAI's, with Azure's additions read as any compatible server's are
(the prompt's `prompt_filter_results` in a chunk of no choices, a choice's
`content_filter_results`, a `content_filter` finish or error).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._openai_chat._dialect import OpenAIChatDialect
from ._openai_responses._dialect import OpenAIResponsesDialect

if TYPE_CHECKING:
    from collections.abc import Callable

    from .._core._dialect import HttpRequest, Provider
    from .._core._request import TurnRequest

__all__ = ["AzureOpenAIDialect", "AzureResponsesDialect", "azure_base_url"]


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
