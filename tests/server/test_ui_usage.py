"""The AI SDK counts tokens its own way (`LanguageModelUsage`): input includes the cached
tokens and output the reasoning ones, where MMSP counts each apart; a count the provider did
not give is left out, never reported as 0."""

from __future__ import annotations

from rillet import UsageMetadata
from rillet.transports.server._uistream import ui_usage


def test_usage_is_counted_as_the_ai_sdk_counts_it() -> None:
    usage = UsageMetadata(prompt_tokens=10, cached_tokens=5, response_tokens=7, thoughts_tokens=3)
    assert ui_usage(usage) == {
        "inputTokens": 15,
        "outputTokens": 10,
        "totalTokens": 25,
        "cachedInputTokens": 5,
        "reasoningTokens": 3,
    }


def test_a_count_not_given_is_left_out() -> None:
    assert ui_usage(UsageMetadata(prompt_tokens=4)) == {"inputTokens": 4}
    assert ui_usage(None) == {}
