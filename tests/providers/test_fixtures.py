"""Every recorded provider fixture, fed in every chunking, yields exactly its expected events."""

from __future__ import annotations

import importlib
import json
from typing import TYPE_CHECKING

import pytest

from ..wire_cases import FIXTURES, cases, chunkings, error_entry, expected, run, wire_path

if TYPE_CHECKING:
    from rillet.providers import Dialect

# fixture folder -> (module, dialect class)
DIALECTS = {
    "anthropic-messages": ("rillet.providers._anthropic._dialect", "AnthropicDialect"),
    "openai-chat": ("rillet.providers._openai_chat._dialect", "OpenAIChatDialect"),
    "openai-responses": ("rillet.providers._openai_responses._dialect", "OpenAIResponsesDialect"),
    "gemini": ("rillet.providers._gemini._dialect", "GeminiDialect"),
    "ollama-chat": ("rillet.providers._ollama", "OllamaDialect"),
    "openai-embeddings": ("rillet.providers._embeddings", "OpenAIEmbeddingsDialect"),
}

# HTTP error bodies among the fixtures, with the status they were served with
HTTP_ERRORS = {("openai-embeddings", "error_rate_limit"): 429}


def dialect_for(folder: str) -> Dialect:
    module, cls = DIALECTS[folder]
    return getattr(importlib.import_module(module), cls)()  # type: ignore[no-any-return]


ALL_CASES = [(folder, case) for folder in sorted(DIALECTS) for case in cases(folder)]


def test_every_fixture_folder_has_a_dialect() -> None:
    assert sorted(p.name for p in FIXTURES.iterdir() if p.is_dir()) == sorted(DIALECTS)


@pytest.mark.parametrize(("folder", "case"), ALL_CASES, ids=[f"{f}/{c}" for f, c in ALL_CASES])
def test_fixture(folder: str, case: str) -> None:
    dialect = dialect_for(folder)
    path = wire_path(folder, case)
    want = expected(folder, case)
    data = path.read_bytes()
    if (folder, case) in HTTP_ERRORS:
        error = dialect.error_from_response(HTTP_ERRORS[folder, case], {}, data)
        assert [error_entry(error)] == want
        return
    stream = path.suffix != ".json" or dialect.framing == "json"
    variants = list(chunkings(data))
    if folder == "gemini":  # Gemini really frames events with CRLF
        variants += [(f"crlf-{n}", c) for n, c in chunkings(data.replace(b"\n", b"\r\n"))]
    for name, chunks in variants:
        got = run(dialect, chunks, stream=stream)
        assert got == want, f"{name}: " + json.dumps(got, ensure_ascii=False, indent=0)
