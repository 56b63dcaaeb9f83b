"""Anthropic's Messages wire piece by piece: the request's mapping for each upstream wire
(sans-I/O), and answers of the real server over loopback that the SDK tests do not reach (a
retry that voids blocks the client has, a reply withheld whole, refusals' shapes)."""

from __future__ import annotations

import functools
from typing import Any

import httpx
import msgspec
import pytest
import trio
from rillet._core._dialect import Provider
from rillet._core._events import (
    ImageUrlDone,
    TextDone,
    ThinkingDone,
    ToolCallDone,
    ToolResultDone,
    UniMessage,
)
from rillet._core._policy import Policy
from rillet.providers._anthropic._inbound import (
    decode_messages_body,
    messages_request,
    thinking_fidelity,
    thinking_signature,
)
from rillet.providers._openai_chat._inbound import BadRequest
from rillet.providers._registry import dialect_from_name
from rillet.transports.server import Limits, ServerConfig, serve
from rillet.transports.server._messages import anthropic_message
from rillet.transports.testing import (
    RecordedRequest,
    Reply,
    open_loopback_provider,
    openai_text_stream,
    sse,
    status_reply,
)

# --- the request ----------------------------------------------------------------------------------


def _request(dialect: str = "openai-chat", **body: Any) -> Any:
    body = {"model": "m", "max_tokens": 64, **body}
    return messages_request(decode_messages_body(msgspec.json.encode(body)), dialect)


def test_blocks_become_items_and_results_join_the_user_message() -> None:
    image = {"type": "base64", "media_type": "image/png", "data": "iVBO"}
    request = _request(
        system=[{"type": "text", "text": "One."}, {"type": "text", "text": "Two."}],
        messages=[
            {
                "role": "user",
                "content": [{"type": "image", "source": image}, {"type": "text", "text": "hi"}],
            },
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "hm", "signature": "c2ln"},
                    {"type": "tool_use", "id": "t1", "name": "f", "input": {"x": 1}},
                ],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "ok"}],
            },
        ],
    )
    assert request.system_prompt == "One.\n\nTwo."
    user, assistant, results = request.messages
    assert user.content_items == [
        ImageUrlDone(image_url="data:image/png;base64,iVBO"),
        TextDone(text="hi"),
    ]
    assert assistant.content_items == [
        ThinkingDone(thinking="hm", fidelity={"signature": "c2ln"}),
        ToolCallDone(name="f", arguments={"x": 1}, tool_call_id="t1"),
    ]
    assert assistant.finish_reason == "tool_call"
    assert results.content_items == [ToolResultDone(text="ok", tool_call_id="t1")]


def test_max_tokens_is_required() -> None:
    body = decode_messages_body(b'{"model": "m", "messages": [{"role": "user", "content": "x"}]}')
    with pytest.raises(BadRequest, match="max_tokens: Field required"):
        messages_request(body, "openai-chat")


@pytest.mark.parametrize(
    ("dialect", "field", "value"),
    [
        ("gemini", "top_k", 5),
        ("gemini", "stop_sequences", ["END"]),
        ("openai-responses", "stop_sequences", ["END"]),
        ("openai-chat", "container", "c1"),
        ("openai-chat", "thinking", {"type": "between_tools"}),
        ("openai-chat", "tools", [{"type": "web_search_20250305", "name": "web_search"}]),
        ("openai-chat", "output_config", {"format": {"type": "json_schema", "schema": {}}}),
    ],
)
def test_what_the_upstream_wire_cannot_take_is_refused(
    dialect: str, field: str, value: Any
) -> None:
    with pytest.raises(BadRequest, match="cannot be sent to this model's provider"):
        _request(dialect, messages=[{"role": "user", "content": "x"}], **{field: value})


def test_a_block_with_more_than_its_item_goes_whole_to_anthropic_and_is_refused_elsewhere() -> None:
    document = {
        "type": "document",
        "source": {"type": "text", "media_type": "text/plain", "data": "d"},
    }
    failed = {"type": "tool_result", "tool_use_id": "t1", "content": "boom", "is_error": True}
    messages = [{"role": "user", "content": [document, failed]}]
    (sent,) = _request("anthropic", messages=messages).messages
    assert [item.fidelity for item in sent.content_items] == [
        {"block": document},
        {"block": failed},
    ]
    with pytest.raises(BadRequest, match=r"messages\[0\]\.content\[0\]"):
        _request("openai-chat", messages=messages)
    # to another wire, a failed result's text goes as given
    (sent,) = _request("openai-chat", messages=[{"role": "user", "content": [failed]}]).messages
    assert sent.content_items == [ToolResultDone(text="boom", tool_call_id="t1")]


def test_hints_other_wires_have_no_field_for_are_accepted() -> None:
    cached = {"type": "ephemeral"}
    request = _request(
        "openai-chat",
        cache_control=cached,
        system=[{"type": "text", "text": "S", "cache_control": cached}],
        messages=[
            {"role": "user", "content": [{"type": "text", "text": "x", "cache_control": cached}]}
        ],
        metadata={"user_id": "u1"},
    )
    assert request.messages[0].content_items == [TextDone(text="x")]
    assert request.extra_body["openai-chat"] == {"user": "u1"}


def test_an_anthropic_upstream_gets_every_field_as_given() -> None:
    thinking = {"type": "enabled", "budget_tokens": 5000}
    request = _request(
        "anthropic",
        messages=[{"role": "user", "content": "x"}],
        thinking=thinking,
        top_k=3,
        container="c1",
        tool_choice={"type": "auto", "disable_parallel_tool_use": True},
    )
    passed = request.extra_body["anthropic"]
    assert passed["thinking"] == thinking
    assert (passed["top_k"], passed["container"]) == (3, "c1")
    assert passed["tool_choice"] == {"type": "auto", "disable_parallel_tool_use": True}
    assert request.thinking_level == "medium"


@pytest.mark.parametrize(
    ("thinking", "effort", "level"),
    [
        ({"type": "enabled", "budget_tokens": 1024}, None, "low"),
        ({"type": "enabled", "budget_tokens": 16384}, None, "high"),
        ({"type": "adaptive"}, None, "medium"),
        ({"type": "adaptive"}, "max", "max"),
        ({"type": "disabled"}, "high", None),
        (None, None, None),
    ],
)
def test_thinking_becomes_a_level(thinking: Any, effort: str | None, level: str | None) -> None:
    fields: dict[str, Any] = {"thinking": thinking} if thinking else {}
    if effort:
        fields["output_config"] = {"effort": effort}
    request = _request(messages=[{"role": "user", "content": "x"}], **fields)
    assert request.thinking_level == level


def test_a_signature_carries_any_fidelity_there_and_back() -> None:
    assert thinking_signature({"signature": "EuPi/+=="}) == "EuPi/+=="
    fidelity = {"reasoning_field": "reasoning_content"}
    signature = thinking_signature(fidelity)
    assert signature.startswith("rillet1.")
    assert thinking_fidelity(signature) == fidelity
    assert thinking_fidelity("EuPi/+==") == {"signature": "EuPi/+=="}
    assert thinking_fidelity("rillet1.!!not base64") == {"signature": "rillet1.!!not base64"}
    assert thinking_fidelity("") is None


def test_a_tool_calls_fidelity_goes_out_and_comes_back_as_its_signature() -> None:
    call = ToolCallDone(
        name="f", arguments={"x": 1}, tool_call_id="t1", fidelity={"signature": "Z2VtaW5p"}
    )
    reply = UniMessage(role="assistant", content_items=[call], finish_reason="tool_call")
    (block,) = anthropic_message(reply, "msg_1", "gemini/gemini-3-pro", "tool_use")["content"]
    assert block == {
        "type": "tool_use",
        "id": "t1",
        "name": "f",
        "signature": "Z2VtaW5p",
        "input": {"x": 1},
    }
    messages = [{"role": "user", "content": "go"}, {"role": "assistant", "content": [block]}]
    for dialect in ("gemini", "anthropic"):  # Anthropic's dialect sends no call fidelity
        assert _request(dialect, messages=messages).messages[1].content_items == [call]


# --- the server, over loopback --------------------------------------------------------------------


async def _server(nursery: trio.Nursery, url: str, dialect: str = "openai", **config: Any) -> str:
    base = f"{url}/v1" if dialect == "openai" else url
    provider = Provider(dialect_from_name(dialect), base, "loop-gpt")
    settings = ServerConfig(
        provider=provider,
        port=0,
        policy=Policy(rate_limit_retries=0, backoff_base=0.01, random=lambda: 0.0),
        **config,
    )
    served: str = await nursery.start(functools.partial(serve, settings))
    return served


def _events(text: str) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for frame in text.split("\n\n"):
        if frame.startswith("event: "):
            name, data = frame.split("\n")
            out.append((name.removeprefix("event: "), msgspec.json.decode(data[6:])))
    return out


async def _post(
    replies: list[Reply], body: dict[str, Any], **config: Any
) -> tuple[httpx.Response, list[RecordedRequest]]:
    with trio.fail_after(20):
        async with (
            open_loopback_provider(replies) as loopback,
            trio.open_nursery() as nursery,
        ):
            url = await _server(nursery, loopback.url, **config)
            async with httpx.AsyncClient(timeout=10) as http:
                answer = await http.post(f"{url}/v1/messages", json=body)
            nursery.cancel_scope.cancel()
    return answer, loopback.requests


ASKED = [{"role": "user", "content": "hi"}]
SAY = {"model": "loop-gpt", "max_tokens": 64, "messages": ASKED}


async def test_a_retry_voiding_blocks_the_client_has_ends_the_stream_with_an_error_event() -> None:
    stream = openai_text_stream(["Bonjour", " tout le monde"])
    cut = stream.index(b"\n\n", stream.index(b"Bonjour")) + 2
    dropped = Reply(chunks=(stream[:cut], stream[cut:]), chunk_delay=0.2, drop_after_bytes=cut)
    answer, sent = await _post([dropped, Reply(chunks=(stream,))], {**SAY, "stream": True})
    events = _events(answer.text)
    assert len(sent) == 2  # the server did retry
    texts = [e["delta"]["text"] for name, e in events if name == "content_block_delta"]
    assert texts == ["Bonjour"]  # the retry's text is not appended to the voided one
    name, error = events[-1]
    assert name == "error"
    assert error["error"]["type"] == "api_error"
    assert "retry the request" in error["error"]["message"]


@pytest.mark.parametrize("stream", [True, False])
async def test_a_reply_withheld_whole_is_a_refusal_with_no_block(stream: bool) -> None:
    withheld = openai_text_stream([], finish_reason="content_filter")
    answer, _ = await _post([Reply(chunks=(withheld,))], {**SAY, "stream": stream})
    assert answer.status_code == 200
    if stream:
        events = _events(answer.text)
        assert [name for name, _ in events] == [
            "message_start",
            "ping",
            "message_delta",
            "message_stop",
        ]
        assert events[2][1]["delta"]["stop_reason"] == "refusal"
    else:
        assert answer.json()["content"] == []
        assert answer.json()["stop_reason"] == "refusal"


async def test_a_quiet_stream_sends_pings_the_sdk_skips() -> None:
    stream = openai_text_stream(["slow", " reply"])
    frames = tuple(f + b"\n\n" for f in stream.split(b"\n\n") if f)
    slow = Reply(chunks=frames, headers_delay=0.35, chunk_delay=0.25)
    answer, _ = await _post([slow], {**SAY, "stream": True}, limits=Limits(heartbeat=0.1))
    names = [name for name, _ in _events(answer.text)]
    assert names[:2] == ["message_start", "ping"]  # the head went out before the first text
    assert names.count("ping") >= 4
    assert ": keep-alive" not in answer.text  # a sign of life is Anthropic's own event
    texts = [e["delta"]["text"] for n, e in _events(answer.text) if n == "content_block_delta"]
    assert texts == ["slow", " reply"]


async def test_an_answer_cut_by_max_tokens_says_so() -> None:
    cut = openai_text_stream(["Half"], finish_reason="length")
    answer, _ = await _post([Reply(chunks=(cut,))], SAY)
    assert answer.json()["stop_reason"] == "max_tokens"


async def test_refusals_before_the_turn_are_anthropics_error_shape() -> None:
    with trio.fail_after(20):
        async with (
            open_loopback_provider([Reply(chunks=(openai_text_stream(["x"]),))]) as loopback,
            trio.open_nursery() as nursery,
        ):
            url = await _server(nursery, loopback.url)
            async with httpx.AsyncClient(timeout=10) as http:
                as_text = await http.post(
                    f"{url}/v1/messages", content=b"{}", headers={"content-type": "text/plain"}
                )
                broken = await http.post(
                    f"{url}/v1/messages", content=b"{", headers={"content-type": "application/json"}
                )
                huge_model = await http.post(
                    f"{url}/v1/messages", json={**SAY, "model": "m" * 100_000}
                )
                counted = await http.post(f"{url}/v1/messages/count_tokens", json=SAY)
            nursery.cancel_scope.cancel()
    for answer, status, kind in [
        (as_text, 415, "invalid_request_error"),
        (broken, 400, "invalid_request_error"),
        (huge_model, 404, "not_found_error"),
        (counted, 404, "not_found_error"),
    ]:
        assert answer.status_code == status
        assert answer.json()["type"] == "error"
        assert answer.json()["error"]["type"] == kind
        assert answer.headers["request-id"].startswith("req_")
    assert len(huge_model.content) < 300  # the name is quoted cut short
    assert loopback.requests == []


SEARCH = {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {}}
FOUND = {
    "type": "web_search_tool_result",
    "tool_use_id": "srvtoolu_1",
    "content": [{"type": "web_search_result", "url": "https://example.com", "title": "E"}],
}


def _searched() -> bytes:
    def event(name: str, **value: Any) -> bytes:
        return sse({"type": name, **value}, event=name)

    start = {
        "id": "msg_up",
        "type": "message",
        "role": "assistant",
        "model": "claude",
        "content": [],
    }
    return b"".join(
        [
            event(
                "message_start", message={**start, "usage": {"input_tokens": 9, "output_tokens": 1}}
            ),
            event("content_block_start", index=0, content_block=SEARCH),
            event(
                "content_block_delta",
                index=0,
                delta={"type": "input_json_delta", "partial_json": '{"query": "x"}'},
            ),
            event("content_block_stop", index=0),
            event("content_block_start", index=1, content_block=FOUND),
            event("content_block_stop", index=1),
            event("content_block_start", index=2, content_block={"type": "text", "text": ""}),
            event(
                "content_block_delta", index=2, delta={"type": "text_delta", "text": "Found it."}
            ),
            event("content_block_stop", index=2),
            event("message_delta", delta={"stop_reason": "end_turn"}, usage={"output_tokens": 5}),
            event("message_stop"),
        ]
    )


@pytest.mark.parametrize("stream", [True, False])
async def test_server_tool_blocks_from_anthropic_go_out_whole_and_back_as_they_came(
    stream: bool,
) -> None:
    body = {
        **SAY,
        "stream": stream,
        "tools": [{"type": "web_search_20250305", "name": "web_search"}],
    }
    answer, _ = await _post([Reply(chunks=(_searched(),))], body, dialect="anthropic")
    searched = {**SEARCH, "input": {"query": "x"}}
    if stream:
        events = _events(answer.text)
        starts = [e["content_block"] for name, e in events if name == "content_block_start"]
        assert starts == [searched, FOUND, {"type": "text", "text": ""}]
        assert [e["index"] for name, e in events if name == "content_block_stop"] == [0, 1, 2]
        content = [*starts[:2], {"type": "text", "text": "Found it."}]
    else:
        content = answer.json()["content"]
        assert content == [searched, FOUND, {"type": "text", "text": "Found it."}]
    again = {
        **body,
        "stream": False,
        "messages": [*ASKED, {"role": "assistant", "content": content}],
    }
    answer, sent = await _post([Reply(chunks=(_searched(),))], again, dialect="anthropic")
    assert answer.status_code == 200
    upstream = msgspec.json.decode(sent[0].body)
    assert upstream["messages"][1]["content"] == content
    assert upstream["tools"] == body["tools"]


@pytest.mark.parametrize(
    ("upstream", "status", "kind"),
    [
        (500, 500, "api_error"),
        (529, 529, "overloaded_error"),
        (401, 502, "api_error"),  # the provider refused the server's key, not the client's
        (404, 404, "not_found_error"),
    ],
)
async def test_an_upstream_refusal_before_the_stream_keeps_anthropics_status_and_type(
    upstream: int, status: int, kind: str
) -> None:
    answer, _ = await _post([status_reply(upstream)], {**SAY, "stream": True})
    assert answer.status_code == status
    error = answer.json()
    assert error["type"] == "error"
    assert error["error"]["type"] == kind
    assert "openai-chat" in error["error"]["message"]  # which provider, in words


def test_bedrock_converse_takes_top_p_and_stop_sequences_in_its_inference_config() -> None:
    """What Converse has a place for goes there (`inferenceConfig`), from either wire's
    spelling; what it has none for is still refused."""
    from rillet.providers._bedrock_converse import converse_body
    from rillet.providers._openai_chat._inbound import chat_request, decode_chat_body

    messages = [{"role": "user", "content": "x"}]
    sent = _request("bedrock-converse", messages=messages, top_p=0.5, stop_sequences=["END"])
    config = converse_body(sent)["inferenceConfig"]
    assert (config["topP"], config["stopSequences"]) == (0.5, ["END"])
    chat = {"model": "m", "messages": messages, "top_p": 0.25, "stop": "DONE"}
    sent = chat_request(decode_chat_body(msgspec.json.encode(chat)), "bedrock-converse")
    config = converse_body(sent)["inferenceConfig"]
    assert (config["topP"], config["stopSequences"]) == (0.25, ["DONE"])
    with pytest.raises(BadRequest, match="seed"):
        chat_request(decode_chat_body(msgspec.json.encode({**chat, "seed": 7})), "bedrock-converse")
    with pytest.raises(BadRequest, match="cannot be sent to this model's provider"):
        _request("bedrock-converse", messages=messages, top_k=5)
