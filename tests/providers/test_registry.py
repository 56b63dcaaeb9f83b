"""The provider registry: kinds, defaults, where keys may go, and that keys stay secret."""

from __future__ import annotations

import importlib
import logging
from typing import TYPE_CHECKING

import pytest
from rillet import TurnRequest, user
from rillet.providers._registry import (
    PROVIDER_KINDS,
    ConfigurationError,
    describe_providers,
    ollama_base_url,
    provider_from_env,
)

if TYPE_CHECKING:
    from rillet.providers import Provider

OPENAI_KEY = "sk-openai-secret-0000000000001111"
ANTHROPIC_KEY = "sk-ant-secret-0000000000002222"
GEMINI_KEY = "gemini-secret-0000000000003333"
GOOGLE_KEY = "google-secret-0000000000004444"
MMSP_KEY = "mmsp-secret-0000000000005555"
ENV = {
    "OPENAI_API_KEY": OPENAI_KEY,
    "ANTHROPIC_API_KEY": ANTHROPIC_KEY,
    "GEMINI_API_KEY": GEMINI_KEY,
    "MMSP_API_KEY": MMSP_KEY,
}
KEYS = (OPENAI_KEY, ANTHROPIC_KEY, GEMINI_KEY, GOOGLE_KEY, MMSP_KEY)

# kind -> (module, class, default base URL, default model, the key it reads)
KINDS = {
    "openai": (
        "openai_chat",
        "OpenAIChatDialect",
        "https://api.openai.com/v1",
        "gpt-4.1-mini",
        OPENAI_KEY,
    ),
    "openai-responses": (
        "openai_responses",
        "OpenAIResponsesDialect",
        "https://api.openai.com/v1",
        "gpt-4.1-mini",
        OPENAI_KEY,
    ),
    "openai-realtime": (
        "openai_realtime",
        "OpenAIRealtimeDialect",
        "https://api.openai.com/v1",
        "gpt-realtime",
        OPENAI_KEY,
    ),
    "anthropic": (
        "anthropic",
        "AnthropicDialect",
        "https://api.anthropic.com",
        "claude-sonnet-4-5",
        ANTHROPIC_KEY,
    ),
    "gemini": (
        "gemini",
        "GeminiDialect",
        "https://generativelanguage.googleapis.com",
        "gemini-2.5-flash",
        GEMINI_KEY,
    ),
    "ollama": ("ollama", "OllamaDialect", "http://127.0.0.1:11434", "llama3.2", None),
    "openai-embeddings": (
        "embeddings",
        "OpenAIEmbeddingsDialect",
        "https://api.openai.com/v1",
        "text-embedding-3-small",
        OPENAI_KEY,
    ),
    "gemini-embeddings": (
        "embeddings",
        "GeminiEmbeddingsDialect",
        "https://generativelanguage.googleapis.com",
        "gemini-embedding-001",
        GEMINI_KEY,
    ),
}


def needs(module: str) -> None:
    """Skip while a dialect module does not exist yet."""
    pytest.importorskip(f"rillet.providers._{module}")


def key_of(provider: Provider) -> str | None:
    return None if provider.api_key is None else provider.api_key.reveal()


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_each_kind_has_its_dialect_endpoint_model_and_key(kind: str) -> None:
    module, cls, base_url, model, key = KINDS[kind]
    needs(module)
    provider = provider_from_env(kind, env=ENV)
    assert type(provider.dialect).__name__ == cls
    defined = importlib.import_module(f"rillet.providers._{module}")
    assert type(provider.dialect) is getattr(defined, cls)
    assert type(provider.dialect).__module__ == "rillet.providers"  # its one public home
    assert (provider.base_url, provider.model, key_of(provider)) == (base_url, model, key)


def test_every_named_kind_is_tested() -> None:
    assert set(PROVIDER_KINDS) == {
        *KINDS,
        "mmsp",
        "azure",
        "azure-responses",
        "vertex",
        "vertex-anthropic",
        "bedrock",
        "bedrock-responses",
        "bedrock-converse",  # tests/providers/test_bedrock_converse.py
    }  # the clouds: tests/providers/test_clouds.py


def test_arguments_win_over_the_environment() -> None:
    provider = provider_from_env("anthropic", model="claude-x", api_key="sk-other-key", env=ENV)
    assert (provider.model, key_of(provider)) == ("claude-x", "sk-other-key")


# --- where keys go --------------------------------------------------------------------------------


def test_an_explicit_url_without_an_explicit_key_gets_no_key() -> None:
    provider = provider_from_env("anthropic", base_url="https://proxy.example/anthropic", env=ENV)
    assert provider.base_url == "https://proxy.example/anthropic"
    assert provider.api_key is None


def test_an_explicit_url_with_an_explicit_key_gets_that_key() -> None:
    provider = provider_from_env(
        "anthropic", base_url="https://proxy.example", api_key="proxy-key", env=ENV
    )
    assert key_of(provider) == "proxy-key"


def test_the_environment_key_goes_to_the_url_its_override_variable_names() -> None:
    env = {**ENV, "ANTHROPIC_BASE_URL": "https://gateway.example/anthropic/"}
    provider = provider_from_env("anthropic", env=env)
    assert (provider.base_url, key_of(provider)) == (
        "https://gateway.example/anthropic/",
        ANTHROPIC_KEY,
    )
    same = provider_from_env("anthropic", base_url="HTTPS://Gateway.example/anthropic", env=env)
    assert key_of(same) == ANTHROPIC_KEY


def test_the_environment_key_goes_to_the_default_url_passed_explicitly() -> None:
    provider = provider_from_env("anthropic", base_url="https://api.anthropic.com/", env=ENV)
    assert key_of(provider) == ANTHROPIC_KEY


def test_an_override_url_without_a_key_is_called_keyless() -> None:
    env = {"OPENAI_BASE_URL": "http://127.0.0.1:8000/v1"}
    provider = provider_from_env("openai-embeddings", env=env)
    assert (provider.base_url, provider.api_key) == ("http://127.0.0.1:8000/v1", None)


def test_a_url_kind_is_an_openai_compatible_server_that_gets_no_environment_key() -> None:
    needs("openai_chat")
    provider = provider_from_env("http://localhost:8000/v1", model="qwen", env=ENV)
    assert type(provider.dialect).__name__ == "OpenAIChatDialect"
    assert (provider.base_url, provider.model, provider.api_key) == (
        "http://localhost:8000/v1",
        "qwen",
        None,
    )
    assert provider.label == "localhost:8000"
    keyed = provider_from_env("https://llm.example/v1", model="m", api_key="k-123", env=ENV)
    assert key_of(keyed) == "k-123"


def test_a_url_kind_needs_a_model() -> None:
    with pytest.raises(ConfigurationError) as info:
        provider_from_env("http://localhost:8000/v1", env=ENV)
    assert "--model" in str(info.value)


def test_a_url_kind_and_another_base_url_conflict() -> None:
    with pytest.raises(ConfigurationError):
        provider_from_env("http://a.example/v1", model="m", base_url="http://b.example/v1")


# --- missing keys and bad configuration -----------------------------------------------------------


def test_a_missing_key_is_a_configuration_error_with_a_hint() -> None:
    with pytest.raises(ConfigurationError) as info:
        provider_from_env("openai-embeddings", env={})
    assert str(info.value) == "no API key: set OPENAI_API_KEY or pass --api-key"
    assert (info.value.kind, info.value.env_var) == ("openai-embeddings", "OPENAI_API_KEY")


def test_a_blank_key_counts_as_missing() -> None:
    with pytest.raises(ConfigurationError) as info:
        provider_from_env("anthropic", env={"ANTHROPIC_API_KEY": "  "})
    assert info.value.env_var == "ANTHROPIC_API_KEY"


def test_gemini_accepts_google_api_key_and_prefers_gemini_api_key() -> None:
    only_google = provider_from_env("gemini-embeddings", env={"GOOGLE_API_KEY": GOOGLE_KEY})
    assert key_of(only_google) == GOOGLE_KEY
    both = provider_from_env(
        "gemini-embeddings", env={"GOOGLE_API_KEY": GOOGLE_KEY, "GEMINI_API_KEY": GEMINI_KEY}
    )
    assert key_of(both) == GEMINI_KEY
    with pytest.raises(ConfigurationError) as info:
        provider_from_env("gemini-embeddings", env={})
    assert info.value.env_var == "GEMINI_API_KEY"
    assert "GOOGLE_API_KEY" in str(info.value)


def test_an_unknown_kind_names_the_known_ones() -> None:
    with pytest.raises(ConfigurationError) as info:
        provider_from_env("cohere", env=ENV)
    assert info.value.kind == "cohere"
    assert "anthropic" in str(info.value)


@pytest.mark.parametrize("url", ["ftp://x.example", "https://", "not a url"])
def test_a_base_url_that_is_not_http_is_refused(url: str) -> None:
    with pytest.raises(ConfigurationError):
        provider_from_env("anthropic", base_url=url, env=ENV)


def test_a_bad_override_variable_is_named_in_the_error() -> None:
    with pytest.raises(ConfigurationError) as info:
        provider_from_env("anthropic", env={**ENV, "ANTHROPIC_BASE_URL": "api.anthropic.com"})
    assert info.value.env_var == "ANTHROPIC_BASE_URL"


def test_credentials_inside_a_url_are_refused_without_repeating_them() -> None:
    with pytest.raises(ConfigurationError) as info:
        provider_from_env("http://user:hunter2@host.example/v1", model="m")
    assert "hunter2" not in f"{info.value} {info.value!r} {info.value.kind}"
    with pytest.raises(ConfigurationError) as info:
        provider_from_env("openai", base_url="https://u:hunter2@api.example/v1", env=ENV)
    assert "hunter2" not in f"{info.value} {info.value!r} {info.value.kind}"


def test_a_key_pasted_as_a_base_url_is_not_repeated() -> None:
    with pytest.raises(ConfigurationError) as info:
        provider_from_env("openai", env={**ENV, "OPENAI_BASE_URL": OPENAI_KEY})
    assert info.value.env_var == "OPENAI_BASE_URL"
    assert OPENAI_KEY not in f"{info.value} {info.value!r}"


# --- MMSP and Ollama ------------------------------------------------------------------------------


def test_mmsp_is_an_open_server_that_needs_a_model() -> None:
    provider = provider_from_env("mmsp", model="claude-sonnet-4-5", env={})
    assert type(provider.dialect).__name__ == "MMSPDialect"
    assert (provider.base_url, provider.api_key) == ("http://127.0.0.1:25752/v1", None)
    with pytest.raises(ConfigurationError) as info:
        provider_from_env("mmsp", env={})
    assert "--model" in str(info.value)


def test_mmsp_reads_its_key_and_base_url() -> None:
    env = {"MMSP_API_KEY": MMSP_KEY, "MMSP_BASE_URL": "https://mmsp.example/v1"}
    provider = provider_from_env("mmsp", model="m", env=env)
    assert (provider.base_url, key_of(provider)) == ("https://mmsp.example/v1", MMSP_KEY)
    elsewhere = provider_from_env("mmsp", model="m", base_url="http://other:1/v1", env=env)
    assert elsewhere.api_key is None


@pytest.mark.parametrize(
    ("host", "url"),
    [
        ("", "http://127.0.0.1:11434"),
        ("0.0.0.0", "http://127.0.0.1:11434"),
        ("gpu-box", "http://gpu-box:11434"),
        ("gpu-box:8080", "http://gpu-box:8080"),
        (":9999", "http://127.0.0.1:9999"),
        ("http://gpu-box", "http://gpu-box:80"),
        ("https://ollama.example/", "https://ollama.example:443"),
        ("https://ollama.example:8443/prefix", "https://ollama.example:8443/prefix"),
        ("[::1]:7000", "http://[::1]:7000"),
        ("::1", "http://[::1]:11434"),
    ],
)
def test_ollama_host_is_read_as_ollama_reads_it(host: str, url: str) -> None:
    assert ollama_base_url(host) == url


def test_ollama_takes_its_base_url_from_ollama_host() -> None:
    needs("ollama")
    provider = provider_from_env("ollama", env={"OLLAMA_HOST": "gpu-box:8080"})
    assert (provider.base_url, provider.api_key) == ("http://gpu-box:8080", None)


# --- secrecy --------------------------------------------------------------------------------------


def test_keys_never_appear_in_the_providers_repr_or_str() -> None:
    provider = provider_from_env("anthropic", env=ENV)
    assert ANTHROPIC_KEY not in repr(provider)
    assert ANTHROPIC_KEY not in str(provider)
    assert "…2222" in repr(provider)  # the masked hint says which key it is


def test_keys_never_appear_in_configuration_errors() -> None:
    errors = []
    for kind, env in [
        ("openai", {"ANTHROPIC_API_KEY": ANTHROPIC_KEY}),
        ("mmsp", ENV),
        ("nope", ENV),
        ("http://x.example", ENV),
    ]:
        with pytest.raises(ConfigurationError) as info:
            provider_from_env(kind, env=env)
        errors.append(f"{info.value} {info.value!r}")
    assert not [key for key in KEYS for text in errors if key in text]


def test_keys_never_appear_in_logs(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="rillet.providers._registry"):
        provider_from_env("anthropic", env=ENV)
        provider_from_env("mmsp", model="m", env=ENV)
    assert caplog.records, "building a provider logs what it chose"
    assert not [key for key in KEYS if key in caplog.text]
    assert "…2222" in caplog.text


def test_the_key_reaches_only_the_request_header() -> None:
    provider = provider_from_env("anthropic", env=ENV)
    http = provider.dialect.build_request(TurnRequest(messages=[user("hi")]), provider)
    assert http.headers["x-api-key"] == ANTHROPIC_KEY
    assert ANTHROPIC_KEY not in repr(http)


def test_describe_providers_masks_keys_and_says_what_is_missing() -> None:
    env = {"ANTHROPIC_API_KEY": ANTHROPIC_KEY, "OLLAMA_HOST": "gpu-box"}
    described = {entry["kind"]: entry for entry in describe_providers(env)}
    assert list(described) == list(PROVIDER_KINDS)
    assert described["anthropic"] == {
        "kind": "anthropic",
        "base_url": "https://api.anthropic.com",
        "base_url_from": None,
        "model": "claude-sonnet-4-5",
        "api_key": "…2222",
        "api_key_from": "ANTHROPIC_API_KEY",
        "ready": True,
        "missing": None,
    }
    assert (described["openai"]["ready"], described["openai"]["missing"]) == (
        False,
        "OPENAI_API_KEY or --api-key",
    )
    assert described["ollama"]["base_url"] == "http://gpu-box:11434"
    assert described["ollama"]["base_url_from"] == "OLLAMA_HOST"
    assert described["mmsp"]["missing"] == "--model"
    assert ANTHROPIC_KEY not in repr(described)


@pytest.mark.parametrize(
    "name", ["openai-chat", "anthropic-messages", "ollama-chat", *sorted(KINDS)]
)
def test_a_dialect_comes_by_kind_or_wire_name(name: str) -> None:
    from rillet.providers import DIALECT_NAMES, dialect_from_name

    assert name in DIALECT_NAMES
    dialect = dialect_from_name(name)
    assert dialect is not dialect_from_name(name)  # a fresh one each time


def test_an_unknown_dialect_name_is_a_configuration_error() -> None:
    from rillet.providers import dialect_from_name

    with pytest.raises(ConfigurationError, match="unknown dialect 'nope'"):
        dialect_from_name("nope")
