"""Bedrock ConverseStream's sampling settings: a turn's `top_p` and stop sequences, however
another wire spells them in the turn's `extra_body`, reach the provider in `inferenceConfig`
as `topP` and `stopSequences`, the only place Converse reads them; over real HTTP to a
loopback provider answering in AWS event-stream frames."""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio
from rillet._core._dialect import Provider, Secret
from rillet._core._request import TurnRequest, user
from rillet._turn._api import run_turn
from rillet.providers._bedrock_converse import BedrockConverseDialect, converse_body
from rillet.transports.testing import Reply, open_loopback_provider

from .eventstream_frames import text_stream

MODEL = "anthropic.claude-3-5-haiku-20241022-v1:0"


def _request(**settings: Any) -> TurnRequest:
    return TurnRequest(
        messages=[user("Count to ten")],
        max_tokens=64,
        temperature=0.2,
        extra_body={"bedrock-converse": settings},
    )


async def test_top_p_and_stop_sequences_go_in_the_inference_config() -> None:
    request = _request(top_p=0.9, stop_sequences=["five"], guardrailConfig={"trace": "enabled"})
    reply = Reply(
        chunks=tuple(text_stream(["one two"])), content_type="application/vnd.amazon.eventstream"
    )
    with trio.fail_after(10):
        async with open_loopback_provider([reply]) as server:
            provider = Provider(
                dialect=BedrockConverseDialect(),
                base_url=server.url,
                model=MODEL,
                api_key=Secret("bedrock-api-key-0000"),
            )
            result = await run_turn(request, provider)
    assert result.ok, result.error
    assert result.text == "one two"
    (sent,) = server.requests
    body = json.loads(sent.body)
    assert body["inferenceConfig"] == {
        "maxTokens": 64,
        "temperature": 0.2,
        "topP": 0.9,
        "stopSequences": ["five"],
    }
    assert "top_p" not in body
    assert "stop_sequences" not in body
    assert body["guardrailConfig"] == {"trace": "enabled"}  # the rest still goes as given


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        ({"top_p": 0.5, "stop": "END"}, {"topP": 0.5, "stopSequences": ["END"]}),  # OpenAI's
        ({"stop": ["a", "b"]}, {"stopSequences": ["a", "b"]}),
        ({"topP": 0.7, "stopSequences": ["x"]}, {"topP": 0.7, "stopSequences": ["x"]}),
        ({"top_p": None, "stop_sequences": None}, {}),  # unset, as a wire's null says
        # Converse's own `inferenceConfig`, given whole, has the last word
        ({"top_p": 0.5, "inferenceConfig": {"topP": 0.25}}, {"topP": 0.25}),
    ],
)
def test_every_spelling_lands_in_the_inference_config(
    settings: dict[str, Any], expected: dict[str, Any]
) -> None:
    body = converse_body(_request(**settings))
    assert body["inferenceConfig"] == {"maxTokens": 64, "temperature": 0.2, **expected}
    assert set(body) == {"messages", "inferenceConfig"}
