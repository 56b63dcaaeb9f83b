"""How a user gets a `Provider`: by kind, from arguments and the environment.

`provider_from_env("anthropic")` reads `ANTHROPIC_API_KEY` (and `ANTHROPIC_BASE_URL`, when set)
and picks a default model; any argument passed wins over the environment. A kind that is an
http(s) URL means an OpenAI-compatible Chat Completions server at that base URL.

Where a key may go: a key read from the environment is sent only to the endpoint it belongs to,
the kind's default base URL or the one its own override variable names (`OPENAI_BASE_URL`...).
Any other base URL passed in gets no key unless one is passed with it, so a key never leaks to
an arbitrary server. A kind whose official endpoint needs a key and has none is a
`ConfigurationError` before any request. Keys live in `Secret`s: masked in every repr, error
and log line.

Dialect classes are imported by module path when a provider is built, so the registry imports
no dialect until one is asked for.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import attrs
from rillet._core._errors import ConfigurationError

from .._core._dialect import Provider, Secret

if TYPE_CHECKING:
    from collections.abc import Mapping

    from .._core._dialect import Dialect

__all__ = [
    "DIALECT_NAMES",
    "PROVIDER_KINDS",
    "ConfigurationError",
    "bedrock_base_url",
    "describe_providers",
    "dialect_from_name",
    "ollama_base_url",
    "provider_from_env",
]

logger = logging.getLogger(__name__)


@attrs.frozen
class _Kind:
    """Where a kind's dialect, endpoint, key and model come from."""

    module: str
    cls: str
    base_url: str
    key_envs: tuple[str, ...] = ()
    base_url_env: str | None = None
    model: str | None = None
    key_required: bool = False  # at the default endpoint
    azure: bool = False  # a resource's endpoint, its deployment and API version (`_azure`)
    vertex: bool = False  # a Google Cloud project and location, with a token (`_vertex`)
    bedrock: bool = False  # an AWS region's OpenAI-compatible endpoint, a Bedrock API key
    bedrock_runtime: bool = False  # ...or its runtime root (Converse), key or AWS credentials


# OpenAI's and Gemini's endpoints and variables, shared by their chat and embedding kinds.
_OPENAI = _Kind(
    "",
    "",
    base_url="https://api.openai.com/v1",
    key_envs=("OPENAI_API_KEY",),
    base_url_env="OPENAI_BASE_URL",
    key_required=True,
)
_GEMINI = _Kind(
    "",
    "",
    base_url="https://generativelanguage.googleapis.com",
    key_envs=("GEMINI_API_KEY", "GOOGLE_API_KEY"),
    base_url_env="GEMINI_BASE_URL",
    key_required=True,
)
_P = "rillet.providers."
_BEDROCK = _Kind(
    _P + "_openai_chat",
    "OpenAIChatDialect",
    base_url="",
    key_envs=("AWS_BEARER_TOKEN_BEDROCK",),
    base_url_env="AWS_BEDROCK_BASE_URL",
    model="openai.gpt-oss-120b-1:0",
    key_required=True,
    bedrock=True,
)
_VERTEX = _Kind(
    _P + "_vertex",
    "VertexGeminiDialect",
    base_url="",
    key_envs=("GOOGLE_OAUTH_ACCESS_TOKEN",),
    base_url_env="VERTEX_BASE_URL",
    model="gemini-2.5-flash",
    key_required=True,
    vertex=True,
)
_AZURE = _Kind(
    _P + "_azure",
    "AzureOpenAIDialect",
    base_url="",
    key_envs=("AZURE_OPENAI_API_KEY", "AZURE_OPENAI_AD_TOKEN"),
    base_url_env="AZURE_OPENAI_ENDPOINT",
    key_required=True,
    azure=True,
)

KINDS: dict[str, _Kind] = {
    "openai": attrs.evolve(
        _OPENAI, module=_P + "_openai_chat", cls="OpenAIChatDialect", model="gpt-4.1-mini"
    ),
    "openai-responses": attrs.evolve(
        _OPENAI, module=_P + "_openai_responses", cls="OpenAIResponsesDialect", model="gpt-4.1-mini"
    ),
    # the Realtime API over a WebSocket (text mode); the base URL is http(s), spelled ws(s)
    "openai-realtime": attrs.evolve(
        _OPENAI, module=_P + "_openai_realtime", cls="OpenAIRealtimeDialect", model="gpt-realtime"
    ),
    "anthropic": _Kind(
        _P + "_anthropic",
        "AnthropicDialect",
        base_url="https://api.anthropic.com",
        key_envs=("ANTHROPIC_API_KEY",),
        base_url_env="ANTHROPIC_BASE_URL",
        model="claude-sonnet-4-5",
        key_required=True,
    ),
    "gemini": attrs.evolve(
        _GEMINI, module=_P + "_gemini", cls="GeminiDialect", model="gemini-2.5-flash"
    ),
    "ollama": _Kind(
        _P + "_ollama",
        "OllamaDialect",
        base_url="http://127.0.0.1:11434",
        base_url_env="OLLAMA_HOST",
        model="llama3.2",
    ),
    "mmsp": _Kind(
        _P + "_mmsp",
        "MMSPDialect",
        base_url="http://127.0.0.1:25752/v1",
        key_envs=("MMSP_API_KEY",),
        base_url_env="MMSP_BASE_URL",
        model=None,  # the server's own table decides; GET {base}/models lists it
    ),
    # Azure OpenAI: no default endpoint; a key (or an Entra ID token) and a deployment needed
    "azure": _AZURE,
    "azure-responses": attrs.evolve(_AZURE, cls="AzureResponsesDialect"),
    # Amazon Bedrock's OpenAI-compatible endpoint: a region and a Bedrock API key
    "bedrock": _BEDROCK,
    "bedrock-responses": attrs.evolve(
        _BEDROCK, module=_P + "_openai_responses", cls="OpenAIResponsesDialect"
    ),
    # Amazon Bedrock's ConverseStream API: a Bedrock API key, else SigV4 (`rillet[bedrock]`)
    "bedrock-converse": attrs.evolve(
        _BEDROCK,
        module=_P + "_bedrock_converse",
        cls="BedrockConverseDialect",
        model="anthropic.claude-3-5-haiku-20241022-v1:0",
        key_required=False,
        bedrock_runtime=True,
    ),
    # Vertex AI: a project (and location), and an access token
    "vertex": _VERTEX,
    "vertex-anthropic": attrs.evolve(
        _VERTEX, cls="VertexAnthropicDialect", model="claude-sonnet-4-5"
    ),
    "openai-embeddings": attrs.evolve(
        _OPENAI,
        module=_P + "_embeddings",
        cls="OpenAIEmbeddingsDialect",
        model="text-embedding-3-small",
    ),
    "gemini-embeddings": attrs.evolve(
        _GEMINI,
        module=_P + "_embeddings",
        cls="GeminiEmbeddingsDialect",
        model="gemini-embedding-001",
    ),
}
# An OpenAI-compatible server at a URL given as the kind: OpenAI's wire, OpenAI's variables (so
# OpenAI's key goes only to OpenAI's endpoints), and no default model.
COMPATIBLE = attrs.evolve(KINDS["openai"], model=None, key_required=False)

PROVIDER_KINDS = tuple(KINDS)
"""The named kinds `provider_from_env` takes (besides an http(s) URL)."""


# --- URLs -----------------------------------------------------------------------------------------


def _is_url(text: str) -> bool:
    return text[:8].lower().startswith(("http://", "https://"))


def _endpoint(url: str) -> str:
    """A URL compared as an endpoint: scheme and host case-insensitive, no trailing slash."""
    parts = urlsplit(url.strip())
    path = parts.path.rstrip("/")
    query = f"?{parts.query}" if parts.query else ""
    return f"{parts.scheme.lower()}://{parts.netloc.lower()}{path}{query}"


def _checked_url(kind: str, url: str, env_var: str | None) -> str:
    """A base URL, refused unless it is http(s) with a host and no credentials in it. The
    refusal never repeats the value: it may be a key pasted into the wrong place."""
    url = url.strip()
    try:
        parts = urlsplit(url)
        ok = parts.scheme.lower() in ("http", "https") and bool(parts.hostname)
        has_credentials = parts.username is not None or parts.password is not None
    except ValueError:
        ok, has_credentials = False, False
    where = env_var or ("the kind" if url == kind.strip() else "base_url")
    if _is_url(kind):
        kind = "http(s) URL"  # the kind is the URL, which must not ride on the error either
    if not ok:
        raise ConfigurationError(
            kind, env_var, f"{where} is not an http(s) base URL like https://host/v1"
        )
    if has_credentials:
        raise ConfigurationError(
            kind, env_var, f"{where} carries credentials: pass the key with --api-key instead"
        )
    return url


def ollama_base_url(host: str) -> str:
    """`OLLAMA_HOST` read as Ollama reads it: `host`, `host:port`, `:port` or a URL; the scheme
    defaults to http and the port to 11434 (80 or 443 for a URL that names its scheme but no
    port). A bind-all address (`0.0.0.0`, `::`) means this machine."""
    text = host.strip()
    scheme, sep, rest = text.partition("://")
    default_port = "11434"
    if not sep:
        scheme, rest = "http", text
    else:
        scheme = scheme.lower()
        default_port = "443" if scheme == "https" else "80"
    hostport, slash, path = rest.partition("/")
    if hostport.startswith("["):  # [v6] or [v6]:port
        name, _, port = hostport[1:].partition("]")
        port = port.removeprefix(":")
    elif hostport.count(":") == 1:
        name, _, port = hostport.partition(":")
    else:
        name, port = hostport, ""
    if name in ("", "0.0.0.0", "::"):
        name = "127.0.0.1"
    if not port.isdigit() or int(port) > 65535:
        port = default_port
    name = f"[{name}]" if ":" in name else name
    return f"{scheme}://{name}:{port}" + (f"/{path.rstrip('/')}" if slash and path else "")


def _env(env: Mapping[str, str], name: str | None) -> str | None:
    if name is None:
        return None
    value = env.get(name, "").strip()
    return value or None


def _env_base_url(spec: _Kind, env: Mapping[str, str]) -> str | None:
    value = _env(env, spec.base_url_env)
    if value is None:
        return None
    if spec.base_url_env == "OLLAMA_HOST":
        return ollama_base_url(value)
    return value


def _env_key(spec: _Kind, env: Mapping[str, str]) -> tuple[str, str] | None:
    """The first key variable of the kind that is set, and its value."""
    for name in spec.key_envs:
        value = _env(env, name)
        if value is not None:
            return name, value
    return None


def _key_hint(spec: _Kind) -> str:
    first, *others = spec.key_envs
    return first + "".join(f" (or {name})" for name in others)


# --- the registry ---------------------------------------------------------------------------------


def _load(spec: _Kind) -> Dialect:
    module = importlib.import_module(spec.module)
    return getattr(module, spec.cls)()  # type: ignore[no-any-return]


# The names a recording's folder or a `--dialect` flag may use for a kind's wire.
_WIRE_NAMES = {
    "openai-chat": "openai",
    "anthropic-messages": "anthropic",
    "ollama-chat": "ollama",
}
DIALECT_NAMES = tuple(sorted({*KINDS, *_WIRE_NAMES}))
"""The names `dialect_from_name` takes: every kind, and the wire names recordings use."""


def dialect_from_name(name: str) -> Dialect:
    """A fresh dialect for a kind (`"anthropic"`) or a wire name (`"anthropic-messages"`), with
    no endpoint or key: for reading recordings. Raises `ConfigurationError` for an unknown name."""
    spec = KINDS.get(_WIRE_NAMES.get(name, name))
    if spec is None:
        raise ConfigurationError(
            name, None, f"unknown dialect {name!r}: use one of {', '.join(DIALECT_NAMES)}"
        )
    return _load(spec)


def provider_from_env(
    kind: str,
    *,
    model: str | None = None,
    base_url: str | None = None,
    api_key: str | None = None,
    env: Mapping[str, str] | None = None,
) -> Provider:
    """The provider of a kind (one of `PROVIDER_KINDS`, or an http(s) URL meaning an
    OpenAI-compatible server there), configured from the arguments, then the environment, then
    the kind's defaults.

    The base URL is `base_url`, else the kind's override variable, else its default. The key is
    `api_key`, else the kind's key variable, but only when the base URL is the default or the one
    the override variable names; no key at all is an error only at the kind's default endpoint
    where it needs one. `env` is `os.environ` unless given (a mapping, for tests and hosts that
    keep their settings elsewhere). Raises `ConfigurationError` for what cannot work.
    """
    if env is None:
        env = os.environ
    name = ""
    if _is_url(kind):
        url = _checked_url(kind, kind, None)
        if base_url is not None and _endpoint(base_url) != _endpoint(url):
            raise ConfigurationError(kind, None, "two base URLs: the kind is one, base_url another")
        spec = COMPATIBLE
        base_url = url
        name = urlsplit(url).netloc
    else:
        found = KINDS.get(kind)
        if found is None:
            raise ConfigurationError(
                kind,
                None,
                f"unknown provider kind {kind!r}: use one of {', '.join(PROVIDER_KINDS)}"
                " or an http(s) URL",
            )
        spec = found

    if spec.azure:
        return _azure_provider(kind, spec, model, base_url, api_key, env)
    if spec.vertex:
        return _vertex_provider(kind, spec, model, base_url, api_key, env)
    if spec.bedrock:  # the region's endpoint is the default one
        spec = attrs.evolve(spec, base_url=_default_url(spec, env))
    env_url = _env_base_url(spec, env)
    if base_url is not None:
        target = _checked_url(kind, base_url, None)
    elif env_url is not None:
        target = _checked_url(kind, env_url, spec.base_url_env)
    else:
        target = spec.base_url
    trusted = {_endpoint(spec.base_url)}
    if env_url is not None:
        trusted.add(_endpoint(env_url))

    key: Secret | None = None
    key_source = "none"
    if api_key is not None and api_key.strip():
        key, key_source = Secret(api_key.strip()), "argument"
    elif _endpoint(target) in trusted and (from_env := _env_key(spec, env)) is not None:
        key, key_source = Secret(from_env[1]), from_env[0]
    if key is None and spec.key_required and _endpoint(target) == _endpoint(spec.base_url):
        raise ConfigurationError(
            kind, spec.key_envs[0], f"no API key: set {_key_hint(spec)} or pass --api-key"
        )

    chosen = model or spec.model
    if not chosen:
        raise ConfigurationError(
            kind, None, f"no model: pass --model (GET {target}/models lists the server's models)"
        )

    provider = Provider(dialect=_load(spec), base_url=target, model=chosen, api_key=key, name=name)
    logger.debug(
        "provider %s: model %s at %s, key %s from %s",
        provider.label,
        chosen,
        target,
        key.masked() if key is not None else "none",
        key_source,
    )
    return provider


def _default_url(spec: _Kind, env: Mapping[str, str]) -> str:
    """A kind's endpoint when no override names one (Bedrock's is its region's)."""
    if spec.bedrock:
        region = _env(env, "AWS_REGION") or _env(env, "AWS_DEFAULT_REGION") or "us-east-1"
        if spec.bedrock_runtime:
            return f"https://bedrock-runtime.{region}.amazonaws.com"
        return bedrock_base_url(region)
    return spec.base_url


def bedrock_base_url(region: str) -> str:
    """Amazon Bedrock's OpenAI-compatible API in a region (its Chat Completions and
    Responses)."""
    return f"https://bedrock-runtime.{region}.amazonaws.com/openai/v1"


def _cloud_key(
    kind: str, spec: _Kind, api_key: str | None, env: Mapping[str, str], missing: str
) -> tuple[Secret, str]:
    """A cloud kind's credential, which it always needs (there is no keyless default
    endpoint): `api_key`, else the first of its variables that is set; and where it came from.
    Raises `ConfigurationError` saying `missing` when there is none."""
    if api_key is not None and api_key.strip():
        return Secret(api_key.strip()), "argument"
    found = _env_key(spec, env)
    if found is None:
        raise ConfigurationError(kind, spec.key_envs[0], f"{missing} or pass --api-key")
    return Secret(found[1]), found[0]


_AZURE_VERSIONS = ("AZURE_OPENAI_API_VERSION", "OPENAI_API_VERSION")
_AZURE_DEPLOYMENT = "AZURE_OPENAI_DEPLOYMENT"


def _azure_provider(
    kind: str,
    spec: _Kind,
    model: str | None,
    base_url: str | None,
    api_key: str | None,
    env: Mapping[str, str],
) -> Provider:
    """An Azure OpenAI kind: the resource's endpoint (`base_url`, else
    `AZURE_OPENAI_ENDPOINT`), its deployment (`model`, else `AZURE_OPENAI_DEPLOYMENT`), its key
    (`api_key` or `AZURE_OPENAI_API_KEY`, sent as `api-key`; else an Entra ID token in
    `AZURE_OPENAI_AD_TOKEN`, sent as Bearer; else, with azure-identity installed, Entra ID
    tokens from `DefaultAzureCredential`, which reads the process's environment), and the
    classic API when an API version is set (`AZURE_OPENAI_API_VERSION` or
    `OPENAI_API_VERSION`), the v1 API otherwise."""
    endpoint = base_url if base_url is not None else _env_base_url(spec, env)
    if endpoint is None:
        raise ConfigurationError(
            kind,
            spec.base_url_env,
            "no endpoint: set AZURE_OPENAI_ENDPOINT to https://<resource>.openai.azure.com"
            " or pass --base-url",
        )
    endpoint = _checked_url(kind, endpoint, None if base_url is not None else spec.base_url_env)
    module = importlib.import_module(spec.module)
    key: Secret | None = None
    options: dict[str, Any] = {}
    if (api_key is not None and api_key.strip()) or _env_key(spec, env) is not None:
        key, source = _cloud_key(kind, spec, api_key, env, f"no API key: set {_key_hint(spec)}")
        options["bearer"] = source == "AZURE_OPENAI_AD_TOKEN"
    else:
        try:
            options["token_provider"] = module.EntraToken()
        except ConfigurationError as exc:  # no azure-identity: said for this kind
            raise ConfigurationError(kind, exc.env_var, str(exc)) from None
        source = "DefaultAzureCredential"
    deployment = model or _env(env, _AZURE_DEPLOYMENT)
    if not deployment:
        raise ConfigurationError(
            kind, _AZURE_DEPLOYMENT, "no deployment: pass --model with the deployment's name"
        )
    version = next((v for name in _AZURE_VERSIONS if (v := _env(env, name))), None)
    dialect = getattr(module, spec.cls)(api_version=version, **options)
    target = module.azure_base_url(endpoint, deployment, version)
    provider = Provider(dialect=dialect, base_url=target, model=deployment, api_key=key)
    logger.debug(
        "provider %s: deployment %s at %s, key %s from %s",
        provider.label,
        deployment,
        target,
        key.masked() if key is not None else "none (Entra ID tokens)",
        source,
    )
    return provider


def _entra_available() -> bool:
    """Whether azure-identity is installed (Azure's Entra ID sign-in), not importing it."""
    try:
        return importlib.util.find_spec("azure.identity") is not None
    except (ImportError, ValueError):
        return False


_VERTEX_PROJECT = ("GOOGLE_CLOUD_PROJECT", "GCLOUD_PROJECT")
_VERTEX_LOCATION = "GOOGLE_CLOUD_LOCATION"


def _vertex_provider(
    kind: str,
    spec: _Kind,
    model: str | None,
    base_url: str | None,
    api_key: str | None,
    env: Mapping[str, str],
) -> Provider:
    """A Vertex AI kind: the project (`GOOGLE_CLOUD_PROJECT`, else the one Application Default
    Credentials name) and location (`GOOGLE_CLOUD_LOCATION`, `us-central1` by default), or a
    base URL naming both (`base_url`, else `VERTEX_BASE_URL`); the access token (`api_key`,
    else `GOOGLE_OAUTH_ACCESS_TOKEN`) sent as Bearer, else, with the `vertex` extra, a token
    from Application Default Credentials, kept and refreshed before it expires."""
    root = base_url if base_url is not None else _env_base_url(spec, env)
    module = importlib.import_module(spec.module)
    project = next((p for name in _VERTEX_PROJECT if (p := _env(env, name))), None)
    given = api_key is not None and api_key.strip()
    key: Secret | None = None
    adc = None
    if given or _env_key(spec, env) is not None:
        key, source = _cloud_key(kind, spec, api_key, env, module.NO_TOKEN)
    else:  # no token given: Application Default Credentials, which may name the project
        adc, adc_project = module.application_default_token(kind, env)
        project, source = project or adc_project, "application default credentials"
    if root is not None:
        root = _checked_url(kind, root, None if base_url is not None else spec.base_url_env)
    else:
        if project is None:
            raise ConfigurationError(
                kind, _VERTEX_PROJECT[0], "no project: set GOOGLE_CLOUD_PROJECT"
            )
        location = _env(env, _VERTEX_LOCATION) or "us-central1"
        root = module.vertex_base_url(project, location)
    chosen = model or spec.model or ""
    dialect = getattr(module, spec.cls)(token_provider=adc)
    provider = Provider(dialect, base_url=root, model=chosen, api_key=key)
    logger.debug(
        "provider %s: model %s at %s, token %s from %s",
        provider.label,
        chosen,
        root,
        key.masked() if key is not None else "refreshed",
        source,
    )
    return provider


def describe_providers(env: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """What each named kind would be configured as from `env` alone, keys masked (`…abcd`).

    Each entry: `kind`; `base_url` and `base_url_from` (its variable, or None for the default);
    `model` (the default, None when the kind has none); `api_key` (masked, or None) and
    `api_key_from`; `ready` (whether `provider_from_env(kind)` would succeed without arguments)
    and `missing` (what to set or pass when it would not). Dialect modules are not imported.
    `env` is `os.environ` unless given.
    """
    if env is None:
        env = os.environ
    out: list[dict[str, Any]] = []
    for kind, spec in KINDS.items():
        env_url = _env_base_url(spec, env)
        found = _env_key(spec, env)
        at_default = spec.azure or env_url is None or _endpoint(env_url) == _endpoint(spec.base_url)
        model = _env(env, _AZURE_DEPLOYMENT) if spec.azure else spec.model
        missing: str | None = None
        if spec.azure and env_url is None:
            missing = "AZURE_OPENAI_ENDPOINT or --base-url"
        elif spec.vertex and env_url is None and not any(_env(env, n) for n in _VERTEX_PROJECT):
            missing = "GOOGLE_CLOUD_PROJECT"
        elif spec.vertex and found is None and importlib.util.find_spec("google.auth"):
            found = ("application default credentials", "")  # tried when the run starts
        elif found is None and spec.key_required and at_default:
            if spec.azure and _entra_available():  # Entra ID tokens from the environment
                missing = None if model is not None else "--model"
            else:
                missing = f"{_key_hint(spec)} or --api-key"
                if spec.azure:
                    missing += ", or pip install 'rillet[azure]'"
        elif model is None:
            missing = "--model"
        out.append(
            {
                "kind": kind,
                "base_url": env_url or _default_url(spec, env),
                "base_url_from": spec.base_url_env if env_url is not None else None,
                "model": model,
                "api_key": Secret(found[1]).masked() if found is not None and found[1] else None,
                "api_key_from": found[0] if found is not None else None,
                "ready": missing is None,
                "missing": missing,
            }
        )
    return out
