"""Vertex AI: Gemini's and Anthropic's wires as Google Cloud serves them.

The wires are the providers' own; what differs is where they live and how they are signed:

- **Where.** A project's models answer under
  `https://<location>-aiplatform.googleapis.com/v1/projects/<project>/locations/<location>`
  (`aiplatform.googleapis.com` for the `global` location): Gemini's at
  `publishers/google/models/<model>:streamGenerateContent?alt=sse`, Anthropic's at
  `publishers/anthropic/models/<model>:streamRawPredict` (`:generateContent`, `:rawPredict`
  when not streamed).
- **How.** A Google Cloud access token as `Authorization: Bearer` (what `gcloud auth
  print-access-token` prints; an hour long): a host that runs longer passes `token_provider`,
  called for every request, which its Google auth library refreshes.
- **Anthropic's body** names no `model` (the URL does) and carries
  `anthropic_version: vertex-2023-10-16` in place of the `anthropic-version` header.

Streams and errors are the providers' own (Vertex's error object is Google's, as Gemini's is).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from ._anthropic._dialect import AnthropicDialect
from ._gemini._dialect import GeminiDialect

if TYPE_CHECKING:
    from collections.abc import Callable

    from .._core._dialect import HttpRequest, Provider
    from .._core._request import TurnRequest

__all__ = ["VertexAnthropicDialect", "VertexGeminiDialect", "vertex_base_url"]

ANTHROPIC_VERSION = "vertex-2023-10-16"


def vertex_base_url(project: str, location: str) -> str:
    """The root of a project's models in a location (`global` has no regional host)."""
    host = "aiplatform.googleapis.com"
    if location != "global":
        host = f"{location}-{host}"
    return f"https://{host}/v1/projects/{project}/locations/{location}"


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
