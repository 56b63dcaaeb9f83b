"""The MMSP server dialect: requests, the relayed UniEvent stream re-checked by the grammar, and
the server's errors."""

from __future__ import annotations

import base64
import json
from typing import TYPE_CHECKING, Any

import pytest
from rillet import (
    AuthenticationError,
    EmptyResponseError,
    ImageUrlDone,
    IncompleteStreamError,
    InlineDataDelta,
    InlineDataDone,
    InvalidRequestError,
    MalformedFrameError,
    OverloadedError,
    ProviderError,
    RateLimitError,
    ServerError,
    StreamProtocolError,
    TextDelta,
    TextDone,
    ThinkingDelta,
    ThinkingDone,
    ToolCallArgumentParseError,
    ToolCallDelta,
    ToolCallDone,
    ToolResultDone,
    ToolSpec,
    TurnRequest,
    UniEvent,
    UniMessage,
    UsageMetadata,
    encode_json,
    user,
)
from rillet._core._events import EmbeddingDelta, EmbeddingDone, delta_event, stop_event
from rillet.frames import SSEEvent
from rillet.lowlevel import PartStart, PartStop, WireDecoder
from rillet.providers import Provider, Secret
from rillet.providers._mmsp import (
    MMSPDialect,
    UnsupportedOperationError,
    error_from_wire,
    list_models_request,
    parse_model_list,
)

from ..wire_cases import chunkings, entry_of, error_entry, run

if TYPE_CHECKING:
    from rillet import EventItem

KEY = "mmsp-secret-key-0123456789"
BASE = "http://127.0.0.1:25752/v1"
USAGE = UsageMetadata(cached_tokens=3, prompt_tokens=10, thoughts_tokens=5, response_tokens=20)
PNG = b"\x89PNG\r\n\x1a\n\x00\xff\xfe"


def provider(key: str | None = None) -> Provider:
    return Provider(
        dialect=MMSPDialect(),
        base_url=BASE,
        model="claude-sonnet-4-5",
        api_key=Secret(key) if key else None,
    )


def delta(item: EventItem) -> UniEvent:
    return delta_event(item, 0)


def sse(*frames: UniEvent | str | dict[str, Any]) -> bytes:
    """An MMSP server's body: each event as a `data:` line; a str starting with `:` is a comment,
    any other str is sent as the data as it is."""
    out = []
    for frame in frames:
        if isinstance(frame, str):
            out.append(f"{frame}\n\n" if frame.startswith(":") else f"data: {frame}\n\n")
        elif isinstance(frame, dict):
            out.append(f"data: {json.dumps(frame)}\n\n")
        else:
            out.append(f"data: {encode_json(frame).decode()}\n\n")
    return "".join(out).encode()


SIGNATURE = {"signature": "c2lnbmF0dXJl"}
CONVERSATION = [
    delta(ThinkingDelta(thinking="Let me ")),
    delta(ThinkingDelta(thinking="think.")),
    delta(ThinkingDelta(thinking="", fidelity=SIGNATURE)),
    delta(ThinkingDone(thinking="Let me think.", fidelity=SIGNATURE)),
    delta(TextDelta(text="Hello")),
    delta(TextDelta(text=", world")),
    delta(TextDone(text="Hello, world")),
    delta(ToolCallDelta(name="get_weather", arguments='{"city": ', tool_call_id="call_1")),
    delta(ToolCallDelta(name="", arguments='"Paris"}', tool_call_id="")),
    delta(ToolCallDone(name="get_weather", arguments={"city": "Paris"}, tool_call_id="call_1")),
    delta(InlineDataDelta(data=PNG, mime_type="image/png")),
    delta(InlineDataDone(data=PNG, mime_type="image/png")),
    stop_event(USAGE, "tool_call", 0),
]


def test_a_relayed_stream_comes_out_event_for_event_in_every_chunking() -> None:
    body = sse(*CONVERSATION[:5], ": keep-alive", *CONVERSATION[5:], "[DONE]")
    want = [entry_of(e) for e in CONVERSATION]
    for name, chunks in chunkings(body):
        assert run(MMSPDialect(), chunks) == want, name


def test_inline_data_travels_as_base64_and_comes_back_as_bytes() -> None:
    body = sse(*CONVERSATION[10:], "[DONE]")
    assert base64.b64encode(PNG) in body
    events = WireDecoder(MMSPDialect(), clock=lambda: 0).feed(body)
    assert [e.content_items[0] for e in events[:-1]] == [
        InlineDataDelta(data=PNG, mime_type="image/png"),
        InlineDataDone(data=PNG, mime_type="image/png"),
    ]


def test_thinking_fidelity_reaches_the_done_item() -> None:
    decoder = WireDecoder(MMSPDialect(), clock=lambda: 0)
    events = decoder.feed(sse(*CONVERSATION[:4]))
    assert events[-1].content_items == [ThinkingDone(thinking="Let me think.", fidelity=SIGNATURE)]


def test_each_group_gets_a_lane_of_its_own() -> None:
    stream = MMSPDialect().stream_decoder()
    lanes = []
    for event in CONVERSATION[4:10]:
        lanes += stream.feed(SSEEvent(data=encode_json(event).decode()))
    starts = [lane for lane in lanes if isinstance(lane, PartStart)]
    assert [(s.kind, s.index) for s in starts] == [("text", 0), ("tool_call", 1)]
    assert (starts[1].name, starts[1].call_id) == ("get_weather", "call_1")
    stops = [lane for lane in lanes if isinstance(lane, PartStop)]
    assert [(s.kind, s.index) for s in stops] == [("text", 0), ("tool_call", 1)]


def test_embedding_groups_are_relayed() -> None:
    events = [
        delta(EmbeddingDelta(embedding=[0.5, -1.0])),
        delta(EmbeddingDone(embedding=[0.5, -1.0])),
        stop_event(UsageMetadata(prompt_tokens=4), "stop", 0),
    ]
    assert run(MMSPDialect(), [sse(*events, "[DONE]")]) == [entry_of(e) for e in events]


def test_done_without_a_stop_is_an_incomplete_stream() -> None:
    got = run(MMSPDialect(), [sse(*CONVERSATION[4:7], "[DONE]")])
    assert got == [entry_of(e) for e in CONVERSATION[4:7]] + [
        error_entry(IncompleteStreamError("mmsp", ()))
    ]


def test_a_cut_stream_gives_no_done_for_the_open_group() -> None:
    got = run(MMSPDialect(), [sse(*CONVERSATION[4:6])])
    assert got == [entry_of(e) for e in CONVERSATION[4:6]] + [
        error_entry(IncompleteStreamError("mmsp", ()))
    ]


def test_frames_after_done_are_not_read() -> None:
    body = sse(*CONVERSATION[4:7], stop_event(USAGE, "stop", 0), "[DONE]", "not json")
    assert run(MMSPDialect(), [body])[-1] == entry_of(stop_event(USAGE, "stop", 0))


def test_a_stop_without_usage_is_a_stop_with_null_usage() -> None:
    # the stop is MMSP's terminal event: the reply is complete, usage unreported
    stop = UniEvent(event_type="stop", content_items=[], finish_reason="stop")
    got = run(MMSPDialect(), [sse(*CONVERSATION[4:7], stop, "[DONE]")])
    assert got[-1] == entry_of(stop_event(UsageMetadata(), "stop", 0))


def test_an_error_event_ends_the_stream_after_what_came_before() -> None:
    error = {"error": {"type": "RateLimitError", "message": "slow down", "status": 429}}
    decoder = WireDecoder(MMSPDialect(), clock=lambda: 0)
    out: list[UniEvent] = []
    with pytest.raises(RateLimitError) as info:
        decoder.feed(sse(*CONVERSATION[4:7], error, "[DONE]"), out)
    assert len(out) == 3
    assert info.value.status == 429
    assert info.value.in_stream is True
    assert info.value.error_type == "RateLimitError"
    assert info.value.provider_message == "slow down"


@pytest.mark.parametrize(
    ("error", "cls"),
    [
        ({"type": "OverloadedError", "message": "busy"}, OverloadedError),
        ({"type": "ServerError", "message": "boom"}, ServerError),
        ({"type": "InternalServerError", "message": "boom", "status": 500}, ServerError),
        ({"type": "AuthenticationError", "message": "no"}, AuthenticationError),
        ({"type": "APIConnectionError", "message": "gone", "status": 529}, OverloadedError),
        ({"type": "EmptyResponseError", "message": "only thinking"}, EmptyResponseError),
        ({"type": "StreamProtocolError", "message": "two stops"}, StreamProtocolError),
    ],
)
def test_error_types_map_onto_our_classes(error: dict[str, Any], cls: type[Exception]) -> None:
    assert type(error_from_wire(error, in_stream=True)) is cls


def test_an_unknown_error_type_is_a_provider_error_naming_it() -> None:
    found = error_from_wire({"type": "RoutingError", "message": "no such model"})
    assert type(found) is ProviderError
    assert found.error_type == "RoutingError"
    assert found.provider_message == "no such model"


def test_an_incomplete_stream_reported_by_the_server_keeps_its_fields() -> None:
    found = error_from_wire(
        {
            "type": "IncompleteStreamError",
            "message": "ended early",
            "missing": ["usage_metadata"],
            "finish_reason": "stop",
            "usage_metadata": None,
        }
    )
    assert isinstance(found, IncompleteStreamError)
    assert (found.missing, found.finish_reason) == (("usage_metadata",), "stop")


def test_a_tool_argument_error_keeps_the_tool_and_the_length() -> None:
    found = error_from_wire(
        {
            "type": "ToolCallArgumentParseError",
            "message": "bad arguments",
            "tool_name": "get_weather",
            "tool_call_id": "call_1",
            "raw_arguments_length": 900,
            "raw_arguments_preview": '{"city": ',
        }
    )
    assert isinstance(found, ToolCallArgumentParseError)
    assert (found.tool_name, found.tool_call_id) == ("get_weather", "call_1")
    assert found.raw_arguments_length == 900


def test_an_upstream_error_is_unwrapped_to_the_error_it_carries() -> None:
    found = error_from_wire(
        {
            "type": "UpstreamError",
            "message": "relayed",
            "status": 429,
            "error": {"type": "RateLimitError", "message": "upstream is slow"},
        }
    )
    assert type(found) is RateLimitError
    assert found.status == 429
    assert found.provider_message == "upstream is slow"


def test_a_delta_of_another_kind_before_the_done_breaks_the_protocol() -> None:
    body = sse(delta(TextDelta(text="a")), delta(ThinkingDelta(thinking="b")))
    assert run(MMSPDialect(), [body])[-1] == error_entry(StreamProtocolError("mmsp", ""))


def test_a_second_tool_call_before_the_first_is_done_breaks_the_protocol() -> None:
    body = sse(
        delta(ToolCallDelta(name="a", arguments="", tool_call_id="call_1")),
        delta(ToolCallDelta(name="b", arguments="", tool_call_id="call_2")),
    )
    assert run(MMSPDialect(), [body])[-1] == error_entry(StreamProtocolError("mmsp", ""))


def test_a_done_with_no_open_group_breaks_the_protocol() -> None:
    body = sse(delta(TextDone(text="a")))
    assert run(MMSPDialect(), [body]) == [error_entry(StreamProtocolError("mmsp", ""))]


def test_a_tool_call_without_an_id_breaks_the_protocol() -> None:
    body = sse(delta(ToolCallDelta(name="get_weather", arguments="{}", tool_call_id="")))
    assert run(MMSPDialect(), [body]) == [error_entry(StreamProtocolError("mmsp", ""))]


def test_user_items_in_the_stream_are_malformed() -> None:
    body = sse(delta(ImageUrlDone(image_url="https://example.com/a.png")))
    assert run(MMSPDialect(), [body]) == [error_entry(MalformedFrameError(""))]


def test_a_stop_with_items_is_malformed() -> None:
    stop = UniEvent(
        event_type="stop",
        content_items=[TextDone(text="x")],
        usage_metadata=USAGE,
        finish_reason="stop",
    )
    assert run(MMSPDialect(), [sse(stop)]) == [error_entry(MalformedFrameError(""))]


def test_a_done_of_another_kind_than_the_open_group_breaks_the_protocol() -> None:
    body = sse(delta(TextDelta(text="a")), delta(ThinkingDone(thinking="a")))
    assert run(MMSPDialect(), [body])[-1] == error_entry(StreamProtocolError("mmsp", ""))


@pytest.mark.parametrize("data", ["not json", '{"event_type": "delta"}', '{"error": 3}'])
def test_frames_that_are_no_event_and_no_error_are_malformed(data: str) -> None:
    with pytest.raises(MalformedFrameError) as info:
        WireDecoder(MMSPDialect()).feed(sse(data))
    assert info.value.provider == "mmsp"
    assert info.value.frame_index == 0


# --- requests -------------------------------------------------------------------------------------


def test_the_request_is_model_messages_and_the_config_keys_that_are_set() -> None:
    history = UniMessage(
        role="assistant",
        content_items=[
            ThinkingDone(thinking="hm", fidelity=SIGNATURE),
            ToolCallDone(name="get_weather", arguments={"city": "Paris"}, tool_call_id="c1"),
        ],
    )
    request = TurnRequest(
        messages=[
            user("What is the weather?"),
            history,
            UniMessage(
                role="user",
                content_items=[ToolResultDone(text="sunny", tool_call_id="c1")],
            ),
        ],
        system_prompt="Be brief.",
        tools=[ToolSpec(name="get_weather", parameters={"type": "object"}), ToolSpec(name="x")],
        tool_choice=["get_weather"],
        max_tokens=100,
        thinking_level="low",
    )
    http = MMSPDialect().build_request(request, provider())
    assert (http.method, http.url) == ("POST", f"{BASE}/stream")
    assert http.headers["accept"] == "text/event-stream"
    assert "authorization" not in http.headers
    assert http.json() == {
        "model": "claude-sonnet-4-5",
        "messages": [
            {
                "role": "user",
                "content_items": [{"type": "text.done", "text": "What is the weather?"}],
            },
            {
                "role": "assistant",
                "content_items": [
                    {"type": "thinking.done", "thinking": "hm", "fidelity": SIGNATURE},
                    {
                        "type": "tool_call.done",
                        "name": "get_weather",
                        "arguments": {"city": "Paris"},
                        "tool_call_id": "c1",
                    },
                ],
            },
            {
                "role": "user",
                "content_items": [
                    {"type": "tool_result.done", "text": "sunny", "tool_call_id": "c1"}
                ],
            },
        ],
        "config": {
            "max_tokens": 100,
            "tools": [
                {"name": "get_weather", "description": "", "parameters": {"type": "object"}},
                {"name": "x", "description": ""},
            ],
            "thinking_level": "low",
            "tool_choice": ["get_weather"],
            "system_prompt": "Be brief.",
        },
    }


def test_an_empty_turn_sends_an_empty_config() -> None:
    http = MMSPDialect().build_request(TurnRequest(messages=[user("hi")]), provider())
    assert http.json()["config"] == {}


def test_bytes_in_messages_are_sent_as_base64() -> None:
    message = UniMessage(
        role="assistant", content_items=[InlineDataDone(data=PNG, mime_type="image/png")]
    )
    http = MMSPDialect().build_request(TurnRequest(messages=[message]), provider())
    item = http.json()["messages"][0]["content_items"][0]
    assert base64.b64decode(item["data"]) == PNG


def test_the_key_goes_in_a_bearer_header_and_not_in_the_repr() -> None:
    http = MMSPDialect().build_request(TurnRequest(messages=[user("hi")]), provider(KEY))
    assert http.headers["authorization"] == f"Bearer {KEY}"
    assert KEY not in repr(http)


def test_extra_body_config_is_merged_into_the_config() -> None:
    request = TurnRequest(
        messages=[user("hi")],
        temperature=0.5,
        extra_body={"mmsp": {"config": {"fast_mode": True}, "trace": "t1"}},
    )
    body = MMSPDialect().build_request(request, provider()).json()
    assert body["config"] == {"temperature": 0.5, "fast_mode": True}
    assert body["trace"] == "t1"


def test_there_is_no_non_streaming_request_or_reply() -> None:
    dialect = MMSPDialect()
    with pytest.raises(UnsupportedOperationError) as info:
        dialect.build_request(TurnRequest(messages=[user("hi")]), provider(), stream=False)
    assert info.value.operation == "non-streaming"
    with pytest.raises(UnsupportedOperationError):
        dialect.decode_response(b"{}")


# --- HTTP errors and models -----------------------------------------------------------------------


def test_a_refused_request_is_typed_by_its_type() -> None:
    body = b'{"error": {"type": "AuthenticationError", "message": "Invalid or missing API key."}}'
    error = MMSPDialect().error_from_response(401, {}, body)
    assert type(error) is AuthenticationError
    assert (error.status, error.in_stream) == (401, False)


def test_an_unknown_model_is_an_invalid_request_with_the_servers_type() -> None:
    body = b'{"error": {"type": "NotFoundError", "message": "The model does not exist"}}'
    error = MMSPDialect().error_from_response(404, {}, body)
    assert type(error) is InvalidRequestError
    assert (error.status, error.error_type) == (404, "NotFoundError")


def test_a_body_that_is_not_json_is_typed_by_the_status() -> None:
    error = MMSPDialect().error_from_response(502, {}, b"<html>Bad Gateway</html>")
    assert type(error) is ServerError
    assert "Bad Gateway" in error.provider_message


def test_a_stream_error_class_in_an_http_body_is_still_a_provider_error() -> None:
    body = b'{"error": {"type": "IncompleteStreamError", "message": "cut"}}'
    error = MMSPDialect().error_from_response(500, {}, body)
    assert type(error) is ServerError
    assert error.error_type == "IncompleteStreamError"


def test_the_model_list_request_and_its_answer() -> None:
    http = list_models_request(provider(KEY))
    assert (http.method, http.url, http.body) == ("GET", f"{BASE}/models", b"")
    assert http.headers["authorization"] == f"Bearer {KEY}"
    body = b'{"object": "list", "data": [{"id": "a", "object": "model"}, {"id": "b"}]}'
    assert parse_model_list(body) == ["a", "b"]
    with pytest.raises(MalformedFrameError):
        parse_model_list(b'{"data": [{"name": "a"}]}')
