"""The Anthropic Messages dialect: wire cases no fixture covers (events, blocks and deltas of
types added later, server-tool blocks kept for the round trip, citations, anything after
`message_stop`)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio
import trio.testing
from rillet import MalformedFrameError, TextDone, ToolCallDone, TurnRequest, UniMessage, user
from rillet._core._policy import Outcome
from rillet._core._request import ToolSpec
from rillet.lowlevel import WireDecoder
from rillet.providers import Provider, Secret
from rillet.providers._anthropic._dialect import AnthropicDialect

from ..wire_cases import run, turn_over_loopback

USAGE_METADATA = {
    "cached_tokens": None,
    "prompt_tokens": 10,
    "thoughts_tokens": None,
    "response_tokens": 5,
}


@pytest.fixture
def loop_clock() -> trio.testing.MockClock:
    """Virtual time for whole turns over loopback sockets (jumps only when all is idle)."""
    return trio.testing.MockClock(autojump_threshold=0.02)


def sse(*events: dict[str, Any] | tuple[str, str]) -> bytes:
    """Events as the API frames them: `event: <type>` then the data (a tuple gives both raw)."""
    frames = []
    for event in events:
        if isinstance(event, tuple):
            name, data = event
        else:
            name, data = event["type"], json.dumps(event, ensure_ascii=False)
        frames.append(f"event: {name}\ndata: {data}\n\n")
    return "".join(frames).encode("utf-8")


def start() -> dict[str, Any]:
    message = {"id": "msg_1", "model": "claude", "content": [], "usage": {"input_tokens": 10}}
    return {"type": "message_start", "message": message}


def block_start(index: int, block: dict[str, Any]) -> dict[str, Any]:
    return {"type": "content_block_start", "index": index, "content_block": block}


def block_delta(index: int, delta: dict[str, Any]) -> dict[str, Any]:
    return {"type": "content_block_delta", "index": index, "delta": delta}


def block_stop(index: int) -> dict[str, Any]:
    return {"type": "content_block_stop", "index": index}


def text_block(index: int, *fragments: str) -> list[dict[str, Any]]:
    return [
        block_start(index, {"type": "text", "text": ""}),
        *(block_delta(index, {"type": "text_delta", "text": f}) for f in fragments),
        block_stop(index),
    ]


def end(reason: str = "end_turn") -> list[dict[str, Any]]:
    return [
        {"type": "message_delta", "delta": {"stop_reason": reason}, "usage": {"output_tokens": 5}},
        {"type": "message_stop"},
    ]


def decode(data: bytes) -> list[dict[str, Any]]:
    return [json.loads(entry) for entry in run(AnthropicDialect(), [data])]


def decode_body(data: dict[str, Any]) -> list[dict[str, Any]]:
    raw = json.dumps(data).encode("utf-8")
    return [json.loads(entry) for entry in run(AnthropicDialect(), [raw], stream=False)]


HI = [
    {"type": "text.delta", "text": "Hi"},
    {"type": "text.done", "text": "Hi"},
    {"type": "stop", "finish_reason": "stop", "usage_metadata": USAGE_METADATA},
]


# --- types added later are skipped --------------------------------------------------------------


def test_f53_unknown_event_types_are_skipped_without_reading_them() -> None:
    data = sse(
        start(),
        ("content_block_annotation", '{"type": "content_block_annotation", "index": "x"}'),
        ("message_telepathy", "not even json"),
        *text_block(0, "Hi"),
        *end(),
    )
    assert decode(data) == HI


def test_an_unnamed_frame_of_an_unknown_type_is_skipped() -> None:
    unnamed = b'data: {"type": "content_block_annotation", "index": {}}\n\n'
    assert decode(sse(start()) + unnamed + sse(*text_block(0, "Hi"), *end())) == HI


def test_unknown_block_types_are_skipped_whole_with_their_deltas() -> None:
    odd = {"type": "hologram", "text": {"not": "a string"}, "input": 5}
    data = sse(
        start(),
        block_start(0, odd),
        block_delta(0, {"type": "hologram_delta", "beam": [1, 2]}),
        block_delta(0, {"type": "text_delta", "text": "hidden"}),
        block_stop(0),
        *text_block(1, "Hi"),
        *end(),
    )
    assert decode(data) == HI
    body = {"id": "m", "model": "c", "content": [odd, {"type": "text", "text": "Hi"}]}
    assert (
        decode_body(body | {"stop_reason": "end_turn", "usage": {"input_tokens": 10}})[:2]
        == (HI[:2])
    )


def test_unknown_delta_types_are_skipped() -> None:
    data = sse(
        start(),
        block_start(0, {"type": "text", "text": ""}),
        block_delta(0, {"type": "text_delta", "text": "H"}),
        block_delta(0, {"type": "sparkle_delta", "text": 5}),
        block_delta(0, {"type": "text_delta", "text": "i"}),
        block_stop(0),
        *end(),
    )
    assert [e.get("text") for e in decode(data)] == ["H", "i", "Hi", None]


@pytest.mark.parametrize(
    "bad",
    [
        block_delta(0, {"type": "text_delta", "text": 5}),
        block_delta(0, {"type": "text_delta"}),
        block_delta(0, 5),  # type: ignore[arg-type]
        {"type": "content_block_delta", "index": "zero", "delta": {"type": "text_delta"}},
        block_start(1, {"type": "text", "text": ["x"]}),
        block_start(1, {"type": "tool_use", "id": "t", "name": 7}),
        # a block long enough that its preview is cut (the block is read undecoded first)
        block_start(1, {"type": "tool_use", "id": "t" * 200, "name": 7}),
        block_start(1, {"type": 5, "id": "t" * 200}),
        {"type": "message_delta", "delta": {"stop_reason": 1}},
    ],
)
def test_a_known_event_of_the_wrong_shape_is_still_malformed(bad: dict[str, Any]) -> None:
    decoder = WireDecoder(AnthropicDialect(), clock=lambda: 0)
    with pytest.raises(MalformedFrameError) as info:
        decoder.feed(sse(start(), block_start(0, {"type": "text", "text": ""}), bad))
    assert info.value.provider == "anthropic"
    assert info.value.frame_index == 2
    assert isinstance(info.value.frame_preview, str)
    assert len(info.value.frame_preview) < 200


# --- anything after message_stop --------------------------------------------------------------


@pytest.mark.parametrize(
    "after",
    [
        [{"type": "message_stop"}],
        [*text_block(1, "late"), *end("max_tokens")],
        [("error", '{"type": "error", "error": {"type": "overloaded_error"}}')],
        [("content_block_delta", "{broken")],
    ],
    ids=["second-stop", "a-second-reply", "an-error", "broken"],
)
def test_anything_after_message_stop_is_ignored(after: list[Any]) -> None:
    assert decode(sse(start(), *text_block(0, "Hi"), *end(), *after)) == HI


async def test_f52_events_after_message_stop_complete_in_one_request(
    loop_clock: trio.testing.MockClock,
) -> None:
    data = sse(start(), *text_block(0, "Hi"), *end(), *text_block(1, "late"), *end())
    result, requests = await turn_over_loopback(AnthropicDialect(), data)
    assert (requests, result.outcome, result.text) == (1, Outcome.COMPLETED, "Hi")


async def test_f53_unknown_events_and_blocks_complete_in_one_request(
    loop_clock: trio.testing.MockClock,
) -> None:
    data = sse(
        start(),
        ("content_block_annotation", '{"type": "content_block_annotation"}'),
        block_start(0, {"type": "hologram"}),
        block_stop(0),
        *text_block(1, "Hi"),
        *end(),
    )
    result, requests = await turn_over_loopback(AnthropicDialect(), data)
    assert (requests, result.outcome, result.text) == (1, Outcome.COMPLETED, "Hi")


# --- server tools: kept for the round trip ------------------------------------------------------

SERVER_USE = {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {}}
SEARCH_RESULT = {
    "type": "web_search_tool_result",
    "tool_use_id": "srvtoolu_1",
    "content": [
        {
            "type": "web_search_result",
            "url": "https://example.com/",
            "title": "Example",
            "encrypted_content": "EqgfCioIARgBIiQ3",
            "page_age": None,
        }
    ],
}
CITATION = {
    "type": "web_search_result_location",
    "url": "https://example.com/",
    "title": "Example",
    "encrypted_index": "Eo8BCioIAhgBIiQ",
    "cited_text": "An example.",
}


def paused_stream() -> bytes:
    return sse(
        start(),
        *text_block(0, "Let me search."),
        block_start(1, SERVER_USE),
        block_delta(1, {"type": "input_json_delta", "partial_json": ""}),
        block_delta(1, {"type": "input_json_delta", "partial_json": '{"query": '}),
        block_delta(1, {"type": "input_json_delta", "partial_json": '"example"}'}),
        block_stop(1),
        block_start(2, SEARCH_RESULT),
        block_stop(2),
        block_start(3, {"type": "text", "text": ""}),
        block_delta(3, {"type": "text_delta", "text": "It is an example."}),
        block_delta(3, {"type": "citations_delta", "citation": CITATION}),
        block_stop(3),
        *end("pause_turn"),
    )


def test_server_tool_blocks_are_kept_whole_as_fidelity() -> None:
    entries = decode(paused_stream())
    used = SERVER_USE | {"input": {"query": "example"}}
    assert entries == [
        {"type": "text.delta", "text": "Let me search."},
        {"type": "text.done", "text": "Let me search."},
        {"type": "text.delta", "text": "", "fidelity": {"block": used}},
        {"type": "text.done", "text": "", "fidelity": {"block": used}},
        {"type": "text.delta", "text": "", "fidelity": {"block": SEARCH_RESULT}},
        {"type": "text.done", "text": "", "fidelity": {"block": SEARCH_RESULT}},
        {"type": "text.delta", "text": "It is an example."},
        {"type": "text.delta", "text": "", "fidelity": {"citations": [CITATION]}},
        {
            "type": "text.done",
            "text": "It is an example.",
            "fidelity": {"citations": [CITATION]},
        },
        # a paused turn is neither finished (`stop`) nor cut by a limit (`length`)
        {"type": "stop", "finish_reason": "unknown", "usage_metadata": USAGE_METADATA},
    ]


def test_a_non_streaming_body_keeps_server_tool_blocks_and_citations() -> None:
    cited = {"type": "text", "text": "It is an example.", "citations": [CITATION]}
    used = SERVER_USE | {"input": {"query": "example"}}
    body = {
        "id": "msg_1",
        "model": "claude",
        "content": [used, SEARCH_RESULT, cited],
        "stop_reason": "end_turn",
        "usage": {"input_tokens": 10, "output_tokens": 5},
    }
    entries = decode_body(body)
    assert [e.get("fidelity") for e in entries if e["type"] == "text.done"] == [
        {"block": used},
        {"block": SEARCH_RESULT},
        {"citations": [CITATION]},
    ]


def test_a_message_that_starts_with_its_content_reads_as_the_same_body() -> None:
    # a client tool called from code execution: the whole reply is in `message_start`
    called = {
        "type": "tool_use",
        "id": "toolu_1",
        "name": "roll",
        "input": {"player": "p2"},
        "caller": {"type": "code_execution_20250825", "tool_id": "srvtoolu_1"},
    }
    message = {
        "id": "msg_1",
        "model": "claude",
        "content": [SEARCH_RESULT, called],
        "stop_reason": "tool_use",
        "usage": {"input_tokens": 10, "output_tokens": 5},
    }
    entries = decode(sse({"type": "message_start", "message": message}, {"type": "message_stop"}))
    assert entries == decode_body(message)
    assert entries[-1]["finish_reason"] == "tool_call"
    assert [e["name"] for e in entries if e["type"] == "tool_call.done"] == ["roll"]
    assert {"block": SEARCH_RESULT} in [e.get("fidelity") for e in entries]


def test_blocks_streamed_after_a_started_content_follow_it() -> None:
    message = {
        "id": "msg_1",
        "model": "claude",
        "content": [{"type": "text", "text": "Hi"}],
        "usage": {"input_tokens": 10},
    }
    data = sse({"type": "message_start", "message": message}, *text_block(1, " there"), *end())
    texts = [e["text"] for e in decode(data) if e["type"] == "text.done"]
    assert texts == ["Hi", " there"]


def test_a_paused_turn_goes_back_with_its_server_blocks_verbatim() -> None:
    entries = decode(paused_stream())
    dones = [e for e in entries if e["type"] == "text.done"]
    message = UniMessage(
        role="assistant",
        content_items=[TextDone(text=d["text"], fidelity=d.get("fidelity")) for d in dones],
    )
    request = TurnRequest(messages=[user("Search for example"), message])
    provider = Provider(AnthropicDialect(), "https://api.anthropic.com", "c", api_key=Secret("k"))
    sent = AnthropicDialect().build_request(request, provider).json()
    assert sent["messages"][1]["content"] == [
        {"type": "text", "text": "Let me search."},
        SERVER_USE | {"input": {"query": "example"}},
        SEARCH_RESULT,
        {"type": "text", "text": "It is an example.", "citations": [CITATION]},
    ]


def test_mcp_blocks_and_other_tool_results_are_kept() -> None:
    mcp_use = {"type": "mcp_tool_use", "id": "mcptoolu_1", "name": "f", "server_name": "s"}
    mcp_result = {"type": "mcp_tool_result", "tool_use_id": "mcptoolu_1", "content": []}
    code = {"type": "code_execution_tool_result", "tool_use_id": "x", "content": {"stdout": ""}}
    data = sse(
        start(),
        block_start(0, mcp_use | {"input": {}}),
        block_delta(0, {"type": "input_json_delta", "partial_json": '{"a": 1}'}),
        block_stop(0),
        block_start(1, mcp_result),
        block_stop(1),
        block_start(2, code),
        block_stop(2),
        *text_block(3, "Hi"),
        *end(),
    )
    dones = [e for e in decode(data) if e["type"] == "text.done"]
    assert [e.get("fidelity", {}).get("block") for e in dones] == [
        mcp_use | {"input": {"a": 1}},
        mcp_result,
        code,
        None,
    ]


def test_a_server_tool_input_that_does_not_parse_is_malformed() -> None:
    data = sse(
        start(),
        block_start(0, SERVER_USE),
        block_delta(0, {"type": "input_json_delta", "partial_json": '{"query": '}),
        block_stop(0),
    )
    decoder = WireDecoder(AnthropicDialect(), clock=lambda: 0)
    with pytest.raises(MalformedFrameError):
        decoder.feed(data)


def test_client_tool_calls_still_go_back_as_tool_use() -> None:
    call = ToolCallDone(name="f", arguments={"a": 1}, tool_call_id="toolu_1")
    message = UniMessage(role="assistant", content_items=[call])
    request = TurnRequest(messages=[user("x"), message])
    provider = Provider(AnthropicDialect(), "https://api.anthropic.com", "c", api_key=Secret("k"))
    sent = AnthropicDialect().build_request(request, provider).json()
    assert sent["messages"][1]["content"] == [
        {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"a": 1}}
    ]


# --- a tool call that starts with its input whole -------------------------------------------------

WHOLE_INPUT = {"city": "Paris", "days": [1, 2]}


def _tool_done(data: bytes) -> list[Any]:
    return [e["arguments"] for e in decode(data) if e["type"] == "tool_call.done"]


@pytest.mark.parametrize("deltas", [[], [""]], ids=["no-delta", "empty-delta"])
def test_a_tool_call_started_with_its_input_whole_keeps_that_input(deltas: list[str]) -> None:
    # a server of the same API may send the input in `content_block_start` (Anthropic's own is
    # `{}`, then `input_json_delta`s): the SDK then reads the input it started with
    block = {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": WHOLE_INPUT}
    data = sse(
        start(),
        block_start(0, block),
        *(block_delta(0, {"type": "input_json_delta", "partial_json": d}) for d in deltas),
        block_stop(0),
        *end("tool_use"),
    )
    assert _tool_done(data) == [WHOLE_INPUT]


def test_input_deltas_are_the_input_whatever_the_start_held() -> None:
    block = {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"stale": True}}
    parts = ['{"city": ', '"Paris", "days": [1, 2]}']
    data = sse(
        start(),
        block_start(0, block),
        *(block_delta(0, {"type": "input_json_delta", "partial_json": p}) for p in parts),
        block_stop(0),
        *end("tool_use"),
    )
    assert _tool_done(data) == [WHOLE_INPUT]
    # the same without event names, which the deltas' fast path does not take, gives the same
    unnamed = b"".join(line + b"\n" for line in data.split(b"\n") if not line.startswith(b"event:"))
    assert _tool_done(unnamed) == [WHOLE_INPUT]


TOOLS = TurnRequest(
    messages=[user("Weather?")],
    tools=[ToolSpec(name="get_weather", parameters={"type": "object"})],
)


def _tools_sent(dialect: AnthropicDialect, *, stream: bool) -> list[dict[str, Any]]:
    provider = Provider(dialect, "http://anthropic.invalid", "claude", api_key=Secret("k" * 16))
    body = json.loads(dialect.build_request(TOOLS, provider, stream=stream).body)
    tools: list[dict[str, Any]] = body["tools"]
    return tools


def test_a_streamed_request_asks_for_every_tools_input_as_it_is_written() -> None:
    (streamed,) = _tools_sent(AnthropicDialect(), stream=True)
    assert streamed["eager_input_streaming"] is True
    (whole,) = _tools_sent(AnthropicDialect(), stream=False)  # the rescue: nothing streams
    assert "eager_input_streaming" not in whole
    (buffered,) = _tools_sent(AnthropicDialect(eager_tools=False), stream=True)
    assert "eager_input_streaming" not in buffered


async def test_a_tool_input_cut_off_at_max_tokens_ends_as_malformed_arguments_once(
    loop_clock: trio.testing.MockClock,
) -> None:
    """Fine-grained tool streaming passes input on unchecked: a call cut off by the token limit
    is half a JSON object. It ends the turn as malformed arguments, asked once (the same request
    would be cut the same way), never as a call."""
    call = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {}}
    body = sse(
        start(),
        block_start(0, call),
        block_delta(0, {"type": "input_json_delta", "partial_json": '{"city": "Par'}),
        block_stop(0),
        *end("max_tokens"),
    )
    result, requests = await turn_over_loopback(AnthropicDialect(), body)
    assert not result.ok
    assert requests == 1
    assert not [i for i in result.message.content_items if isinstance(i, ToolCallDone)]
    assert result.code == "tool_arguments_invalid"


LONG = "Notes on the weather, kept for the whole conversation. " * 100  # over 1,024 tokens


def _sent(request: TurnRequest, dialect: AnthropicDialect | None = None) -> dict[str, Any]:
    dialect = dialect or AnthropicDialect()
    provider = Provider(dialect, "http://anthropic.invalid", "claude", api_key=Secret("k" * 16))
    sent: dict[str, Any] = json.loads(dialect.build_request(request, provider).body)
    return sent


def _conversation(**fields: Any) -> TurnRequest:
    history = [
        user("What is the weather in Paris?"),
        UniMessage(role="assistant", content_items=[TextDone(text="Rain, 18 °C.")]),
        user("And tomorrow?"),
    ]
    return TurnRequest(messages=history, system_prompt=LONG, **fields)


def test_a_long_prefix_is_marked_for_the_prompt_cache_at_its_stable_points() -> None:
    tools = [ToolSpec(name="a", parameters={"type": "object"}), ToolSpec(name="b")]
    body = _sent(_conversation(tools=tools))
    ephemeral = {"type": "ephemeral"}
    assert body["system"] == [{"type": "text", "text": LONG, "cache_control": ephemeral}]
    assert "cache_control" not in body["tools"][0]
    assert body["tools"][-1]["cache_control"] == ephemeral
    *earlier, last = body["messages"]
    assert last["content"][-1] == {
        "type": "text",
        "text": "And tomorrow?",
        "cache_control": ephemeral,
    }
    assert not [b for m in earlier for b in m["content"] if "cache_control" in b]
    marks = json.dumps(body).count('"cache_control"')
    assert marks == 3  # Anthropic allows four


def test_a_short_request_or_the_switch_marks_nothing() -> None:
    short = _sent(TurnRequest(messages=[user("hi")], system_prompt="Be brief."))
    assert short["system"] == "Be brief."
    assert "cache_control" not in json.dumps(short)
    off = _sent(_conversation(), AnthropicDialect(cache=False))
    assert off["system"] == LONG
    assert "cache_control" not in json.dumps(off)


def test_the_callers_own_blocks_are_not_changed_by_the_mark() -> None:
    kept = {"type": "server_tool_use", "id": "srv_1", "name": "web_search", "input": {}}
    echoed = TextDone(text="", fidelity={"block": kept})
    request = _conversation()
    last = UniMessage(role="user", content_items=[*request.messages[-1].content_items, echoed])
    _sent(TurnRequest(messages=[*request.messages[:-1], last], system_prompt=LONG))
    assert "cache_control" not in kept
