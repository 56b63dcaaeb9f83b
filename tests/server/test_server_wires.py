"""The other protocols' wires piece by piece: OpenAI's request and reply mapping, the UI message
stream's request and parts (sans-I/O), and a few answers of the real server over loopback that
the SDK tests do not reach (a withheld reply streamed, a kind not routed, refusals' shapes)."""

from __future__ import annotations

import functools
import logging
from typing import Any

import httpx
import msgspec
import pytest
import trio
from rillet._core._dialect import Provider
from rillet._core._events import (
    TextDelta,
    TextDone,
    ToolCallDelta,
    ToolCallDone,
    ToolResultDone,
    UniEvent,
    UsageMetadata,
)
from rillet._core._policy import Policy
from rillet.providers._openai_chat._inbound import BadRequest, chat_request, decode_chat_body
from rillet.providers._registry import dialect_from_name
from rillet.transports.server import Limits, ServerConfig, serve
from rillet.transports.server._openai import openai_finish_reason, openai_usage
from rillet.transports.server._uistream import UiBody, UiParts, ui_request
from rillet.transports.testing import Reply, open_loopback_provider, openai_text_stream

from ..server_support import serving

# --- OpenAI: the request --------------------------------------------------------------------------


def _chat(**body: Any) -> Any:
    return chat_request(decode_chat_body(msgspec.json.encode(body)))


def test_system_and_developer_messages_are_the_system_prompt() -> None:
    request = _chat(
        messages=[
            {"role": "system", "content": "One."},
            {"role": "developer", "content": [{"type": "text", "text": "Two."}]},
            {"role": "user", "content": "hi"},
        ]
    )
    assert request.system_prompt == "One.\n\nTwo."
    assert [m.role for m in request.messages] == ["user"]


def test_consecutive_tool_messages_are_one_user_message_of_results() -> None:
    calls = [
        {"id": "a", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}},
        {"id": "b", "type": "function", "function": {"name": "g", "arguments": ""}},
    ]
    request = _chat(
        messages=[
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": None, "tool_calls": calls},
            {"role": "tool", "tool_call_id": "a", "content": "one"},
            {"role": "tool", "tool_call_id": "b", "content": "two"},
        ]
    )
    assistant, results = request.messages[1:]
    assert assistant.content_items == [
        ToolCallDone(name="f", arguments={"x": 1}, tool_call_id="a"),
        ToolCallDone(name="g", arguments={}, tool_call_id="b"),
    ]
    assert assistant.finish_reason == "tool_call"
    assert results.role == "user"
    assert results.content_items == [
        ToolResultDone(text="one", tool_call_id="a"),
        ToolResultDone(text="two", tool_call_id="b"),
    ]


def test_runs_of_tool_results_join_only_what_came_right_before() -> None:
    def tool(call: str) -> dict[str, Any]:
        return {"role": "tool", "tool_call_id": call, "content": call}

    request = _chat(
        messages=[
            {"role": "user", "content": "go"},
            tool("a"),  # after words of the user's: a message of its own
            tool("b"),
            {"role": "system", "content": "note"},  # no message: the run goes on
            tool("c"),
            {"role": "assistant", "content": "ok"},
            tool("d"),
            {"role": "user", "content": []},  # a user message of nothing: results join it
            tool("e"),
            tool("f"),
        ]
    )
    kinds = [
        [item.tool_call_id if type(item) is ToolResultDone else "said" for item in m.content_items]
        for m in request.messages
    ]
    assert kinds == [["said"], ["a", "b", "c"], ["said"], ["d"], ["e", "f"]]
    many = _chat(messages=[{"role": "user", "content": "go"}, *[tool("x")] * 2000])
    assert [len(m.content_items) for m in many.messages] == [1, 2000]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"n": 2}, "n"),
        ({"tool_choice": "sometimes"}, "tool_choice"),
        ({"reasoning_effort": "extreme"}, "reasoning_effort"),
        (
            {
                "messages": [
                    {
                        "role": "assistant",
                        "tool_calls": [
                            {"id": "a", "function": {"name": "f", "arguments": "[1, 2]"}}
                        ],
                    }
                ]
            },
            "messages[0]",
        ),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0]"),
        ({"messages": [{"role": "system", "content": "only"}]}, "messages"),
    ],
)
def test_what_cannot_run_is_a_bad_request_naming_its_parameter(
    body: dict[str, Any], param: str
) -> None:
    with pytest.raises(BadRequest) as refused:
        _chat(**{"messages": [{"role": "user", "content": "hi"}], **body})
    assert refused.value.param == param


def test_settings_map_to_the_turn_request() -> None:
    request = _chat(
        messages=[{"role": "user", "content": "hi"}],
        tool_choice={"type": "function", "function": {"name": "f"}},
        reasoning_effort="minimal",
        max_completion_tokens=99,
        max_tokens=5,
        temperature=0.5,
        tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
    )
    assert request.tool_choice == ["f"]
    assert request.thinking_level == "low"
    assert request.max_tokens == 99
    assert request.temperature == 0.5
    assert request.tools[0].name == "f"
    assert request.tools[0].parameters == {"type": "object"}


# --- OpenAI: what goes back -----------------------------------------------------------------------


def test_usage_counts_cached_and_reasoning_tokens_as_openai_does() -> None:
    usage = UsageMetadata(cached_tokens=4, prompt_tokens=10, thoughts_tokens=3, response_tokens=7)
    assert openai_usage(usage) == {
        "prompt_tokens": 14,
        "completion_tokens": 10,
        "total_tokens": 24,
        "prompt_tokens_details": {"cached_tokens": 4},
        "completion_tokens_details": {"reasoning_tokens": 3},
    }
    assert openai_usage(UsageMetadata()) is None
    assert openai_usage(None) is None


@pytest.mark.parametrize(
    ("reason", "expected"),
    [("stop", "stop"), ("length", "length"), ("tool_call", "tool_calls"), ("unknown", "stop")],
)
def test_finish_reasons_in_openais_words(reason: Any, expected: str) -> None:
    assert openai_finish_reason(reason) == expected


# --- the UI message stream ------------------------------------------------------------------------


def test_a_multi_step_assistant_message_is_calls_results_and_the_next_step() -> None:
    body = msgspec.convert(
        {
            "id": "chat",
            "messages": [
                {"id": "s", "role": "system", "parts": [{"type": "text", "text": "Be kind."}]},
                {"id": "u", "role": "user", "parts": [{"type": "text", "text": "weather?"}]},
                {
                    "id": "a",
                    "role": "assistant",
                    "parts": [
                        {"type": "step-start"},
                        {"type": "reasoning", "text": "let me look"},
                        {"type": "text", "text": "Looking."},
                        {
                            "type": "tool-get_weather",
                            "toolCallId": "c1",
                            "state": "output-available",
                            "input": {"city": "Paris"},
                            "output": {"c": 18},
                        },
                        {
                            "type": "dynamic-tool",
                            "toolName": "lookup",
                            "toolCallId": "c2",
                            "state": "output-error",
                            "input": {},
                            "errorText": "offline",
                        },
                        {"type": "step-start"},
                        {"type": "text", "text": "18 °C."},
                    ],
                },
            ],
        },
        UiBody,
    )
    request = ui_request(body)
    assert request.system_prompt == "Be kind."
    user, first, results, second = request.messages
    assert user.content_items == [TextDone(text="weather?")]
    assert first.content_items == [
        TextDone(text="Looking."),
        ToolCallDone(name="get_weather", arguments={"city": "Paris"}, tool_call_id="c1"),
        ToolCallDone(name="lookup", arguments={}, tool_call_id="c2"),
    ]
    assert results.content_items == [
        ToolResultDone(text='{"c":18}', tool_call_id="c1"),
        ToolResultDone(text="offline", tool_call_id="c2"),
    ]
    assert second.content_items == [TextDone(text="18 °C.")]
    assert second.finish_reason == "stop"


@pytest.mark.parametrize("depth", [1000, 100_000])
async def test_tool_call_arguments_nested_too_deeply_are_a_refusal(
    depth: int, caplog: pytest.LogCaptureFixture
) -> None:
    # S03 for a client's own tool calls: the arguments are a JSON string the server decodes,
    # and decoding past the decoder's depth used to fail the connection without an answer
    function = {"name": "f", "arguments": "[" * depth + "]" * depth}
    call = {"id": "c", "type": "function", "function": function}
    body = {
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
        ]
    }
    with trio.fail_after(10):
        async with serving() as served:
            answer = await served.client.post("/v1/chat/completions", json=body)
            requests = len(served.loopback.requests)
    assert answer.status_code == 400
    assert answer.json()["error"]["type"] == "invalid_request_error"
    assert requests == 0
    assert not [record for record in caplog.records if record.levelno >= logging.ERROR]


@pytest.mark.parametrize(
    "parts",
    [[{"type": "text"}], [{"type": "text", "text": 5}], [{"type": "text", "text": None}]],
    ids=["no-text", "a-number", "null"],
)
async def test_a_text_part_without_text_is_a_refusal_not_a_failed_connection(
    parts: list[dict[str, Any]], caplog: pytest.LogCaptureFixture
) -> None:
    # a part of type text without a string `text`, in a system and a user message: nothing to
    # answer (400), where its missing key used to fail the connection without an answer
    body = {
        "messages": [
            {"id": "s", "role": "system", "parts": parts},
            {"id": "u", "role": "user", "parts": parts},
        ]
    }
    with trio.fail_after(10):
        async with serving() as served:
            answer = await served.client.post("/v1/ui/chat", json=body)
            requests = len(served.loopback.requests)
    assert answer.status_code == 400
    assert answer.json()["error"]["message"] == "`messages` holds nothing to answer"
    assert requests == 0
    assert not [record for record in caplog.records if record.levelno >= logging.ERROR]


def _delta(item: Any) -> UniEvent:
    return UniEvent(event_type="delta", content_items=[item])


def test_ui_parts_open_close_and_continue_a_call_named_once() -> None:
    parts = UiParts()
    out = parts.event(_delta(TextDelta(text="a")))
    out += parts.event(_delta(ToolCallDelta(name="f", arguments="", tool_call_id="c")))
    out += parts.event(_delta(ToolCallDelta(name="", arguments='{"x":', tool_call_id="")))
    out += parts.event(_delta(ToolCallDone(name="f", arguments={"x": 1}, tool_call_id="c")))
    out += parts.event(UniEvent(event_type="stop", content_items=[], finish_reason="tool_call"))
    assert out == [
        {"type": "text-start", "id": "text-1"},
        {"type": "text-delta", "id": "text-1", "delta": "a"},
        {"type": "text-end", "id": "text-1"},
        {"type": "tool-input-start", "toolCallId": "c", "toolName": "f"},
        {"type": "tool-input-delta", "toolCallId": "c", "inputTextDelta": '{"x":'},
        {"type": "tool-input-available", "toolCallId": "c", "toolName": "f", "input": {"x": 1}},
        {"type": "finish-step"},
        {"type": "finish", "finishReason": "tool-calls"},
    ]


def test_after_a_reset_no_part_is_left_open() -> None:
    parts = UiParts()
    parts.event(_delta(TextDelta(text="voided")))
    parts.reset()
    out = parts.event(_delta(TextDelta(text="again")))
    assert out[0] == {"type": "text-start", "id": "text-2"}
    stop = parts.event(UniEvent(event_type="stop", content_items=[], finish_reason="unknown"))
    assert stop == [
        {"type": "text-end", "id": "text-2"},
        {"type": "finish-step"},
        {"type": "finish", "finishReason": "other"},
    ]


# --- the server over loopback ---------------------------------------------------------------------

FILTERED = openai_text_stream([], finish_reason="content_filter", prompt_tokens=9)


async def _server(nursery: trio.Nursery, url: str, **config: Any) -> str:
    provider = Provider(dialect_from_name("openai"), f"{url}/v1", "loop-gpt")
    policy = Policy(rate_limit_retries=0, backoff_base=0.01, random=lambda: 0.0)
    settings = ServerConfig(provider=provider, port=0, policy=policy, **config)
    served: str = await nursery.start(functools.partial(serve, settings))
    return served


async def test_a_withheld_reply_streams_as_content_filter_with_its_usage() -> None:
    async with (
        open_loopback_provider([Reply(chunks=(FILTERED,))]) as loopback,
        trio.open_nursery() as nursery,
    ):
        url = await _server(nursery, loopback.url)
        async with httpx.AsyncClient(timeout=10) as http:
            answer = await http.post(
                f"{url}/v1/chat/completions",
                json={
                    "model": "loop-gpt",
                    "messages": [{"role": "user", "content": "hi"}],
                    "stream": True,
                    "stream_options": {"include_usage": True},
                },
            )
        nursery.cancel_scope.cancel()
    assert answer.status_code == 200
    events = [line.removeprefix("data: ") for line in answer.text.split("\n\n") if line]
    assert events[-1] == "[DONE]"
    finish, usage = (msgspec.json.decode(e) for e in events[-3:-1])
    assert finish["choices"][0]["finish_reason"] == "content_filter"
    assert finish["choices"][0]["delta"] == {"role": "assistant"}
    assert usage["choices"] == []
    assert usage["usage"]["prompt_tokens"] == 9


@pytest.mark.parametrize(
    ("upstream", "served"), [("content_filter", "content_filter"), ("eos", "stop")]
)
async def test_a_streamed_answer_ends_with_what_its_unknown_finish_stood_for(
    upstream: str, served: str
) -> None:
    cut = openai_text_stream(["Half of ", "it"], finish_reason=upstream)
    async with (
        open_loopback_provider([Reply(chunks=(cut,))]) as loopback,
        trio.open_nursery() as nursery,
    ):
        url = await _server(nursery, loopback.url)
        body = {"model": "loop-gpt", "messages": [{"role": "user", "content": "hi"}]}
        async with httpx.AsyncClient(timeout=10) as http:
            answer = await http.post(f"{url}/v1/chat/completions", json={**body, "stream": True})
        nursery.cancel_scope.cancel()
    events = [line.removeprefix("data: ") for line in answer.text.split("\n\n") if line]
    assert events[-1] == "[DONE]"
    chunks = [msgspec.json.decode(e) for e in events[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert text == "Half of it"
    assert [c["choices"][0]["finish_reason"] for c in chunks][-1] == served


@pytest.mark.parametrize(
    ("upstream", "served"), [("content_filter", "content-filter"), ("eos", "other")]
)
async def test_a_ui_stream_ends_with_what_its_unknown_finish_stood_for(
    upstream: str, served: str
) -> None:
    cut = openai_text_stream(["Half of ", "it"], finish_reason=upstream)
    body = {"messages": [{"id": "u", "role": "user", "parts": [{"type": "text", "text": "hi"}]}]}
    async with (
        open_loopback_provider([Reply(chunks=(cut,))]) as loopback,
        trio.open_nursery() as nursery,
    ):
        url = await _server(nursery, loopback.url)
        async with httpx.AsyncClient(timeout=10) as http:
            answer = await http.post(f"{url}/v1/ui/chat", json=body)
        nursery.cancel_scope.cancel()
    events = [line.removeprefix("data: ") for line in answer.text.split("\n\n") if line]
    assert events[-1] == "[DONE]"
    parts = [msgspec.json.decode(e) for e in events[:-1] if not e.startswith(":")]
    text = "".join(p["delta"] for p in parts if p["type"] == "text-delta")
    assert text == "Half of it"
    assert [p["type"] for p in parts][-3:] == ["text-end", "finish-step", "finish"]
    assert parts[-1]["finishReason"] == served


async def test_an_answer_filtered_partway_is_answered_whole_as_content_filter() -> None:
    cut = openai_text_stream(["Half of ", "it"], finish_reason="content_filter")
    async with (
        open_loopback_provider([Reply(chunks=(cut,))]) as loopback,
        trio.open_nursery() as nursery,
    ):
        url = await _server(nursery, loopback.url)
        async with httpx.AsyncClient(timeout=10) as http:
            body = {"model": "loop-gpt", "messages": [{"role": "user", "content": "hi"}]}
            answer = await http.post(f"{url}/v1/chat/completions", json=body)
        nursery.cancel_scope.cancel()
    assert answer.status_code == 200
    choice = answer.json()["choices"][0]
    assert choice["message"]["content"] == "Half of it"
    assert choice["finish_reason"] == "content_filter"  # not `stop`: the text is cut short


async def test_a_kind_the_server_does_not_route_is_model_not_found() -> None:
    async with (
        open_loopback_provider([Reply(chunks=(FILTERED,))]) as loopback,
        trio.open_nursery() as nursery,
    ):
        url = await _server(nursery, loopback.url)
        async with httpx.AsyncClient(timeout=10) as http:
            body = {"model": "anthropic/claude-sonnet-4-5", "messages": [{"role": "user"}]}
            openai = await http.post(f"{url}/v1/chat/completions", json=body)
            ui = await http.post(
                f"{url}/v1/ui/chat",
                json={
                    "model": "anthropic/claude-sonnet-4-5",
                    "messages": [
                        {"id": "u", "role": "user", "parts": [{"type": "text", "text": "hi"}]}
                    ],
                },
            )
            text = await http.post(
                f"{url}/v1/chat/completions", content=b"{}", headers={"content-type": "text/plain"}
            )
        nursery.cancel_scope.cancel()
    assert openai.status_code == 404
    assert openai.json()["error"]["code"] == "model_not_found"
    assert ui.status_code == 404
    assert ui.json()["error"]["type"] == "model_not_found"
    assert loopback.requests == []
    assert text.status_code == 415
    assert text.json()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (
            "/v1/chat/completions",
            {"model": "loop-gpt", "messages": [{"role": "user", "content": "hi"}], "stream": True},
        ),
        (
            "/v1/ui/chat",
            {"messages": [{"id": "u", "role": "user", "parts": [{"type": "text", "text": "hi"}]}]},
        ),
    ],
)
async def test_a_client_that_leaves_mid_stream_cancels_the_turn_upstream(
    path: str, body: dict[str, Any]
) -> None:
    stream = openai_text_stream(["first", "never"])
    frames = tuple(frame + b"\n\n" for frame in stream.split(b"\n\n") if frame)
    stalled = Reply(chunks=frames, stall_after=2)  # the role chunk and "first", then silence
    # no heartbeat comes within the test's time: its failed write cannot be what tells the
    # server the client left (the client read all it was sent, then closed: the probe's reset)
    with trio.fail_after(20):
        async with (
            open_loopback_provider([stalled]) as loopback,
            trio.open_nursery() as nursery,
        ):
            url = await _server(nursery, loopback.url, limits=Limits(heartbeat=3600))
            host, port = url.removeprefix("http://").split(":")
            payload = msgspec.json.encode(body)
            head = (
                f"POST {path} HTTP/1.1\r\nhost: {host}:{port}\r\n"
                f"content-type: application/json\r\ncontent-length: {len(payload)}\r\n\r\n"
            )
            client = await trio.open_tcp_stream(host, int(port))
            await client.send_all(head.encode() + payload)
            seen = b""
            while b"first" not in seen:
                seen += await client.receive_some()
            await client.aclose()
            # the client is gone: the server cancels the turn, which closes its upstream request
            await loopback.wait_connections_closed()
            assert loopback.connections == 1
            nursery.cancel_scope.cancel()
    assert b"first" in seen


async def test_past_the_clients_share_the_openai_wire_answers_its_rate_limit_error() -> None:
    stream = openai_text_stream(["first", "never"])
    frames = tuple(frame + b"\n\n" for frame in stream.split(b"\n\n") if frame)
    with trio.fail_after(20):
        async with (
            open_loopback_provider([Reply(chunks=frames, stall_after=2)]) as loopback,
            trio.open_nursery() as nursery,
        ):
            url = await _server(nursery, loopback.url, limits=Limits(max_runs_per_client=1))
            body = {"model": "loop-gpt", "messages": [{"role": "user", "content": "hi"}]}
            async with httpx.AsyncClient(timeout=10) as http:
                held = await http.send(
                    http.build_request(
                        "POST",
                        f"{url}/v1/ui/chat",
                        json={
                            "messages": [
                                {
                                    "id": "u",
                                    "role": "user",
                                    "parts": [{"type": "text", "text": "x"}],
                                }
                            ]
                        },
                    ),
                    stream=True,
                )
                await loopback.wait_for_requests(1)  # the client's one run is taken
                refused = await http.post(f"{url}/v1/chat/completions", json=body)
                await held.aclose()
            nursery.cancel_scope.cancel()
    assert refused.status_code == 429
    assert refused.headers["retry-after"] == "1"
    error = refused.json()["error"]
    assert error["type"] == "rate_limit_error"
    assert error["code"] == "rate_limit_exceeded"
    assert len(loopback.requests) == 1


async def test_a_routed_kind_without_its_key_is_model_unavailable() -> None:
    async with (
        open_loopback_provider([Reply(chunks=(FILTERED,))]) as loopback,
        trio.open_nursery() as nursery,
    ):
        # anthropic is routed, but its environment holds no key for its default endpoint
        url = await _server(nursery, loopback.url, route_kinds=["anthropic"], route_env={})
        async with httpx.AsyncClient(timeout=10) as http:
            body = {"model": "anthropic/claude-sonnet-4-5", "messages": [{"role": "user"}]}
            answer = await http.post(f"{url}/v1/chat/completions", json=body)
        nursery.cancel_scope.cancel()
    assert answer.status_code == 400
    assert answer.json()["error"]["type"] == "invalid_request_error"
    assert answer.json()["error"]["code"] == "model_unavailable"
    assert loopback.requests == []


async def test_a_bug_in_a_route_is_a_500_in_json_and_the_server_serves_on(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from rillet.transports.server._runs import Runs

    async def broken(*_: object) -> None:
        raise RuntimeError("a bug of ours")

    monkeypatch.setattr(Runs, "start_run", broken)
    with trio.fail_after(10), caplog.at_level(logging.ERROR, "rillet.transports.server"):
        async with serving() as served:
            failed = await served.client.post("/v1/runs", json={"prompt": "Hi"})
            healthy = await served.client.get("/healthz")
    assert failed.status_code == 500
    assert failed.headers["content-type"].startswith("application/json")
    assert failed.headers["x-content-type-options"] == "nosniff"
    assert failed.json()["error"]["type"] == "internal_error"
    assert "a bug of ours" not in failed.text  # the log has it, not the client
    assert any("POST /v1/runs failed" in r.getMessage() for r in caplog.records)
    assert healthy.status_code == 200
