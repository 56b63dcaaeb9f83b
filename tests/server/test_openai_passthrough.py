"""`POST /v1/chat/completions` passes a request through whole: every field reaches a provider of
OpenAI's wires as the client gave it, and a field no provider behind the endpoint can honour is
refused in OpenAI's shape, never dropped. A real server on loopback, in front of the recording
loopback provider; httpx as the client (the openai SDK's view is `test_openai_sdk_fidelity`)."""

from __future__ import annotations

import functools
from typing import Any

import httpx
import msgspec
import pytest
import trio
from rillet._core._dialect import Provider
from rillet._core._policy import Policy
from rillet.providers._registry import dialect_from_name
from rillet.transports.server import ServerConfig, serve
from rillet.transports.testing import Reply, fixture_reply, open_loopback_provider

from ..wire_cases import wire_path

POLICY = Policy(rate_limit_retries=0, backoff_base=0.01, random=lambda: 0.0)
STRICT_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
            "additionalProperties": False,
        },
        "strict": True,
    },
}
SETTINGS: dict[str, Any] = {
    "parallel_tool_calls": False,
    "response_format": {
        "type": "json_schema",
        "json_schema": {"name": "w", "schema": {"type": "object"}, "strict": True},
    },
    "seed": 7,
    "user": "end-user-1",
    "metadata": {"team": "a"},
    "service_tier": "flex",
    "prompt_cache_key": "conversation-9",
    "safety_identifier": "hashed-user",
    "store": False,
    "verbosity": "low",  # newer than this code: passed on all the same
    "a_field_openai_adds_next_year": {"nested": [1, 2]},
}


def _reply(dialect: str) -> Reply:
    folder = {"openai": "openai-chat", "anthropic": "anthropic-messages"}.get(
        dialect, "openai-responses"
    )
    return fixture_reply(wire_path(folder, "text"))


async def _sent(dialect: str, body: dict[str, Any]) -> tuple[httpx.Response, list[Any]]:
    """What the server answered `body`, and the bodies its provider of `dialect` was sent."""
    with trio.fail_after(20):
        async with (
            open_loopback_provider(lambda *_: _reply(dialect)) as loopback,
            trio.open_nursery() as nursery,
        ):
            provider = Provider(dialect_from_name(dialect), f"{loopback.url}/v1", "loop-gpt")
            config = ServerConfig(provider=provider, port=0, policy=POLICY)
            url = await nursery.start(functools.partial(serve, config))
            async with httpx.AsyncClient(timeout=10) as http:
                answer = await http.post(
                    f"{url}/v1/chat/completions", json={"model": "loop-gpt", **body}
                )
            nursery.cancel_scope.cancel()
    return answer, [msgspec.json.decode(r.body) for r in loopback.requests]


def _messages(*extra: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"role": "user", "content": "Weather in Paris?", "name": "ana"}, *extra]


async def test_every_field_reaches_an_openai_chat_provider_as_given() -> None:
    history = {"role": "assistant", "content": "Which unit?", "name": "forecaster"}
    body = {
        "messages": _messages(history, {"role": "user", "content": "Celsius", "name": "ana"}),
        "tools": [STRICT_TOOL],
        "reasoning_effort": "minimal",
        **SETTINGS,
    }
    answer, sent = await _sent("openai", body)
    assert answer.status_code == 200, answer.text
    assert len(sent) == 1
    upstream = sent[0]
    for name, value in SETTINGS.items():
        assert upstream[name] == value, name
    assert upstream["reasoning_effort"] == "minimal"  # not read as `low`
    assert upstream["tools"] == [STRICT_TOOL]
    assert upstream["messages"] == [
        {"role": "user", "content": "Weather in Paris?", "name": "ana"},
        {"role": "assistant", "content": "Which unit?", "name": "forecaster"},
        {"role": "user", "content": "Celsius", "name": "ana"},
    ]


async def test_reasoning_effort_none_is_sent_as_none() -> None:
    _, sent = await _sent("openai", {"messages": _messages(), "reasoning_effort": "none"})
    assert sent[0]["reasoning_effort"] == "none"


CHAT_ONLY = ("seed", "a_field_openai_adds_next_year")  # no place for them on Responses' wire


async def test_what_the_responses_wire_takes_reaches_its_provider() -> None:
    body = {"messages": [_plain()], "tools": [STRICT_TOOL], "reasoning_effort": "minimal"}
    settings = {k: v for k, v in SETTINGS.items() if k not in CHAT_ONLY}
    answer, sent = await _sent("openai-responses", {**body, **settings})
    assert answer.status_code == 200, answer.text
    upstream = sent[0]
    assert upstream["tools"][0]["strict"] is True
    assert upstream["reasoning"] == {"effort": "minimal", "summary": "auto"}
    for name in (
        "parallel_tool_calls",
        "user",
        "metadata",
        "service_tier",
        "prompt_cache_key",
        "safety_identifier",
        "store",
    ):
        assert upstream[name] == SETTINGS[name], name
    form = SETTINGS["response_format"]["json_schema"]
    assert upstream["text"] == {"format": {"type": "json_schema", **form}, "verbosity": "low"}
    assert "response_format" not in upstream


@pytest.mark.parametrize(
    ("dialect", "field", "value"),
    [
        ("openai-responses", "seed", 7),
        ("openai-responses", "a_field_openai_adds_next_year", {"nested": [1]}),
        ("openai-responses", "frequency_penalty", 0.5),
        ("anthropic", "seed", 7),
        ("anthropic", "response_format", SETTINGS["response_format"]),
        ("anthropic", "store", True),
    ],
)
async def test_a_field_the_providers_wire_cannot_take_is_refused_not_dropped(
    dialect: str, field: str, value: Any
) -> None:
    """OpenAI's 400 naming the field, and the provider never asked."""
    answer, sent = await _sent(dialect, {"messages": [_plain()], field: value})
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert (error["param"], error["code"]) == (field, "unsupported_parameter")
    assert dialect in error["message"]
    assert sent == []


async def test_a_speakers_name_is_refused_for_a_wire_without_names() -> None:
    answer, sent = await _sent("anthropic", {"messages": _messages()})
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == "messages[0].name"
    assert sent == []


async def test_hints_and_defaults_go_without_a_place_and_anthropic_gets_what_it_takes() -> None:
    hints = {k: SETTINGS[k] for k in ("metadata", "prompt_cache_key", "safety_identifier")}
    defaults = {"store": False, "parallel_tool_calls": True, "service_tier": "auto"}
    answer, sent = await _sent(
        "anthropic", {"messages": [_plain()], "top_p": 0.5, **hints, **defaults}
    )
    assert answer.status_code == 200, answer.text
    assert sent[0]["top_p"] == 0.5
    assert sent[0]["metadata"] == {"user_id": "hashed-user"}


def _plain() -> dict[str, Any]:
    return {"role": "user", "content": "Weather in Paris?"}


async def test_a_tool_not_strict_stays_as_the_client_said() -> None:
    loose = {"type": "function", "function": {**STRICT_TOOL["function"], "strict": False}}
    plain = {"type": "function", "function": {"name": "f"}}
    _, sent = await _sent("openai", {"messages": _messages(), "tools": [loose, plain]})
    assert sent[0]["tools"][0]["function"]["strict"] is False
    assert "strict" not in sent[0]["tools"][1]["function"]


@pytest.mark.parametrize(
    ("field", "param", "code"),
    [
        ({"functions": [STRICT_TOOL["function"]]}, "functions", "unsupported_parameter"),
        ({"function_call": "auto"}, "function_call", "unsupported_parameter"),
        ({"audio": {"voice": "alloy", "format": "wav"}}, "audio", "unsupported_parameter"),
        ({"modalities": ["text", "audio"]}, "modalities", "unsupported_parameter"),
        (
            {"tools": [{"type": "custom", "custom": {"name": "sql"}, "function": {"name": "x"}}]},
            "tools[0].type",
            "unsupported_value",
        ),
        (
            {"messages": [{"role": "system", "content": "Hi", "name": "s"}, *_messages()]},
            "messages[0].name",
            "unsupported_parameter",
        ),
    ],
)
async def test_a_field_that_cannot_be_honoured_is_refused_not_dropped(
    field: dict[str, Any], param: str, code: str
) -> None:
    answer, sent = await _sent("openai", {"messages": _messages(), **field})
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", param, code)
    assert sent == []


async def test_modalities_of_text_only_pass_through() -> None:
    answer, sent = await _sent("openai", {"messages": _messages(), "modalities": ["text"]})
    assert answer.status_code == 200
    assert sent[0]["modalities"] == ["text"]


async def test_a_refusal_in_the_history_goes_back_as_a_refusal() -> None:
    refused = {"role": "assistant", "content": None, "refusal": "I can't help with that."}
    messages = [*_messages(), refused, {"role": "user", "content": "Why not?"}]
    answer, sent = await _sent("openai", {"messages": messages})
    assert answer.status_code == 200, answer.text
    assert sent[0]["messages"][1] == {"role": "assistant", "refusal": "I can't help with that."}
