"""The Responses stream: wire cases no fixture covers, and a stream of nothing but its ends."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest
import trio
from rillet import MalformedFrameError, ProviderError, RateLimitError
from rillet._core._failures import error_shape
from rillet._core._lanes import MessageDelta
from rillet._core._policy import FailureClass, Outcome
from rillet.lowlevel import WireDecoder
from rillet.providers._openai_responses._dialect import OpenAIResponsesDialect

from ..openai_responses_support import (
    USAGE_METADATA,
    added,
    completed,
    decode,
    decode_body,
    done,
    hi,
    message,
    response,
    sse,
    summary_delta,
    text_delta,
)
from ..wire_cases import turn_over_loopback

if TYPE_CHECKING:
    import trio.testing

# --- wire cases no fixture covers ---------------------------------------------------------------


def test_reasoning_with_encrypted_content_only_is_a_fidelity_only_group() -> None:
    reasoning = {"id": "rs_1", "type": "reasoning", "summary": [], "encrypted_content": "OLD"}
    data = sse(
        added(0, reasoning),
        done(0, reasoning | {"encrypted_content": "FINAL"}),
        added(1, message()),
        text_delta(1, "Yes."),
        done(1, message("Yes.")),
        completed(),
    )
    assert decode(data) == [
        {"type": "thinking.delta", "thinking": "", "fidelity": {"encrypted_content": "FINAL"}},
        {"type": "thinking.done", "thinking": "", "fidelity": {"encrypted_content": "FINAL"}},
        {"type": "text.delta", "text": "Yes."},
        {"type": "text.done", "text": "Yes."},
        {"type": "stop", "finish_reason": "stop", "usage_metadata": USAGE_METADATA},
    ]


def test_summary_parts_form_one_group_joined_as_they_come() -> None:
    reasoning = {"id": "rs_1", "type": "reasoning", "summary": []}
    final = reasoning | {
        "summary": [{"type": "summary_text", "text": "A"}, {"type": "summary_text", "text": "B"}]
    }
    data = sse(
        added(0, reasoning),
        summary_delta(0, "A"),
        summary_delta(0, "B", part=1),
        done(0, final),
        added(1, message()),
        text_delta(1, "ok"),
        done(1, message("ok")),
        completed(),
    )
    entries = decode(data)
    # nothing that is not on the wire is inserted between the parts (MMSP does the same)
    assert entries[:4] == [
        {"type": "thinking.delta", "thinking": "A"},
        {"type": "thinking.delta", "thinking": "B"},
        {"type": "thinking.delta", "thinking": "", "fidelity": {"channel": "summary"}},
        {"type": "thinking.done", "thinking": "AB", "fidelity": {"channel": "summary"}},
    ]


def test_summary_parts_of_a_whole_reasoning_item_are_joined_as_they_are() -> None:
    parts = [{"type": "summary_text", "text": "A."}, {"type": "summary_text", "text": "B."}]
    body = response(output=[{"id": "rs_1", "type": "reasoning", "summary": parts}, message("ok")])
    assert decode_body(body)[:2] == [
        {"type": "thinking.delta", "thinking": "A.B."},
        {"type": "thinking.delta", "thinking": "", "fidelity": {"channel": "summary"}},
    ]


def test_raw_reasoning_text_is_thinking() -> None:
    reasoning = {"id": "rs_1", "type": "reasoning", "summary": []}
    data = sse(
        added(0, reasoning),
        {"type": "response.reasoning_text.delta", "output_index": 0, "delta": "think"},
        {"type": "response.reasoning_text.done", "output_index": 0, "text": "think"},
        done(0, reasoning | {"content": [{"type": "reasoning_text", "text": "think"}]}),
        added(1, message()),
        text_delta(1, "ok"),
        done(1, message("ok")),
        completed(),
    )
    assert decode(data)[:2] == [
        {"type": "thinking.delta", "thinking": "think"},
        {"type": "thinking.done", "thinking": "think"},
    ]


def test_message_phase_rides_first_as_fidelity() -> None:
    data = sse(
        added(0, message(phase="final_answer")),
        text_delta(0, "Hi"),
        done(0, message("Hi", phase="final_answer")),
        completed(),
    )
    fidelity = {"phase": "final_answer"}
    assert decode(data)[:3] == [
        {"type": "text.delta", "text": "", "fidelity": fidelity},
        {"type": "text.delta", "text": "Hi"},
        {"type": "text.done", "text": "Hi", "fidelity": fidelity},
    ]


def test_items_without_deltas_are_whole_at_their_done() -> None:
    call = {
        "id": "fc_1",
        "type": "function_call",
        "call_id": "call_1",
        "name": "get_time",
        "arguments": "",
    }
    data = sse(
        added(0, message()),
        done(0, message("Whole text")),
        added(1, call),
        done(1, call | {"arguments": '{"zone": "UTC"}'}),
        completed(),
    )
    assert decode(data) == [
        {"type": "text.delta", "text": "Whole text"},
        {"type": "text.done", "text": "Whole text"},
        {"type": "tool_call.delta", "name": "get_time", "arguments": "", "tool_call_id": "call_1"},
        {"type": "tool_call.delta", "name": "", "arguments": '{"zone": "UTC"}', "tool_call_id": ""},
        {
            "type": "tool_call.done",
            "name": "get_time",
            "arguments": {"zone": "UTC"},
            "tool_call_id": "call_1",
        },
        {"type": "stop", "finish_reason": "tool_call", "usage_metadata": USAGE_METADATA},
    ]


def test_documented_events_we_do_not_stream_are_skipped() -> None:
    data = sse(
        {"type": "response.queued", "response": response("queued")},
        {"type": "response.in_progress", "response": response("in_progress")},
        added(0, {"id": "ws_1", "type": "web_search_call", "status": "in_progress"}),
        {"type": "response.web_search_call.searching", "output_index": 0, "item_id": "ws_1"},
        done(0, {"id": "ws_1", "type": "web_search_call", "status": "completed"}),
        added(1, message()),
        text_delta(1, "Found it."),
        {"type": "response.output_text.annotation.added", "output_index": 1, "annotation": {}},
        done(1, message("Found it.")),
        completed(),
    )
    assert decode(data) == [
        {"type": "text.delta", "text": "Found it."},
        {"type": "text.done", "text": "Found it."},
        {"type": "stop", "finish_reason": "stop", "usage_metadata": USAGE_METADATA},
    ]


OK_ENTRIES = [
    {"type": "text.delta", "text": "Hi"},
    {"type": "text.done", "text": "Hi"},
    {"type": "stop", "finish_reason": "stop", "usage_metadata": USAGE_METADATA},
]


def test_f53_unknown_event_types_are_skipped_named_or_not() -> None:
    data = (
        hi(
            ("response.telepathy.delta", '{"type": "response.telepathy.delta", "delta": 5}'),
            ("response.foo.delta", "not even json"),  # skipped by its name: its data is not read
        )
        + b""
    )
    assert decode(data) == OK_ENTRIES
    unnamed = b'data: {"type": "response.telepathy.delta", "output_index": "x"}\n\n'
    assert decode(unnamed + hi()) == OK_ENTRIES


@pytest.mark.parametrize(
    "item",
    [
        {"id": "ts_1", "type": "tool_search_call", "arguments": {}, "status": "completed"},
        {"id": "ws_1", "type": "web_search_call", "action": {"type": "search", "query": "q"}},
        {"id": "ci_1", "type": "code_interpreter_call", "code": "1+1", "outputs": [{"a": 1}]},
        {"id": "ig_1", "type": "image_generation_call", "result": "aGk=", "content": 7},
        {"id": "mcp_1", "type": "mcp_call", "arguments": {"x": 1}, "name": ["odd"]},
        {"id": "fs_1", "type": "file_search_call", "queries": ["q"], "summary": "text"},
    ],
    ids=lambda item: item["type"],
)
def test_hosted_tool_items_are_skipped_whole_whatever_their_fields(item: dict[str, Any]) -> None:
    data = sse(
        added(0, item),
        done(0, item),
        added(1, message()),
        text_delta(1, "Hi"),
        done(1, message("Hi")),
        completed([item, message("Hi")]),
    )
    assert decode(data) == OK_ENTRIES
    assert decode_body(response(output=[item, message("Hi")])) == OK_ENTRIES


@pytest.mark.parametrize(
    "call",
    [
        {"id": "fc_1", "type": "function_call", "call_id": "c", "name": "f", "arguments": {}},
        # long enough that its preview is cut (the item is read undecoded first)
        {"id": "f" * 200, "type": "function_call", "call_id": "c", "name": "f", "arguments": {}},
        {"id": "f" * 200, "type": 5},
    ],
)
def test_a_known_item_of_the_wrong_shape_is_still_malformed(call: dict[str, Any]) -> None:
    decoder = WireDecoder(OpenAIResponsesDialect(), clock=lambda: 0)
    with pytest.raises(MalformedFrameError) as info:
        decoder.feed(sse(added(0, message()), added(1, call)))
    assert info.value.provider == "openai-responses"
    assert info.value.frame_index == 1
    assert isinstance(info.value.frame_preview, str)
    assert len(info.value.frame_preview) < 200


def test_a_known_event_of_the_wrong_shape_is_still_malformed() -> None:
    decoder = WireDecoder(OpenAIResponsesDialect(), clock=lambda: 0)
    bad = {"type": "response.output_text.delta", "output_index": 0, "delta": 5}
    with pytest.raises(MalformedFrameError) as info:
        decoder.feed(sse(added(0, message()), bad))
    assert info.value.frame_index == 1
    unnamed = WireDecoder(OpenAIResponsesDialect(), clock=lambda: 0)
    with pytest.raises(MalformedFrameError):
        unnamed.feed(b"data: " + json.dumps(bad).encode() + b"\n\n")


@pytest.mark.parametrize(
    "after",
    [
        (("message", "[DONE]"),),  # OpenRouter
        (("message", "[DONE]"), ("message", "[DONE]")),
        (text_delta(0, " late"), completed()),
        (("response.output_text.delta", "{broken"),),
        ({"type": "error", "code": "server_error", "message": "late"},),
    ],
    ids=["done", "two-dones", "a-second-reply", "broken", "an-error"],
)
def test_anything_after_the_terminal_event_is_ignored(after: tuple[Any, ...]) -> None:
    assert decode(hi(after=after)) == OK_ENTRIES


async def test_f52_done_after_response_completed_completes_in_one_request(
    loop_clock: trio.testing.MockClock,
) -> None:
    data = hi(after=(("message", "[DONE]"),))
    result, requests = await turn_over_loopback(OpenAIResponsesDialect(), data)
    assert (requests, result.outcome, result.text) == (1, Outcome.COMPLETED, "Hi")


async def test_f53_unknown_events_and_hosted_tool_items_complete_in_one_request(
    loop_clock: trio.testing.MockClock,
) -> None:
    tool = {"id": "ts_1", "type": "tool_search_call", "arguments": {}}
    data = sse(
        ("response.foo.delta", '{"type": "response.foo.delta"}'),
        added(0, tool),
        done(0, tool),
        added(1, message()),
        text_delta(1, "Hi"),
        done(1, message("Hi")),
        completed([tool, message("Hi")]),
    )
    result, requests = await turn_over_loopback(OpenAIResponsesDialect(), data)
    assert (requests, result.outcome, result.text) == (1, Outcome.COMPLETED, "Hi")


def test_non_json_frame_is_malformed_with_provider_and_position() -> None:
    data = sse(added(0, message()), ("response.output_text.delta", "{oops"))
    decoder = WireDecoder(OpenAIResponsesDialect(), clock=lambda: 0)
    with pytest.raises(MalformedFrameError) as info:
        decoder.feed(data)
    assert info.value.provider == "openai-responses"
    assert info.value.frame_index == 1
    assert "{oops" in info.value.frame_preview


def test_a_delta_without_its_output_index_is_malformed() -> None:
    data = sse(added(0, message()), {"type": "response.output_text.delta", "delta": "x"})
    assert decode(data) == [{"type": "error", "error": "MalformedFrameError"}]


def _arguments(index: int, delta: str) -> dict[str, Any]:
    return {
        "type": "response.function_call_arguments.delta",
        "item_id": "fc_1",
        "output_index": index,
        "delta": delta,
    }


LOOKUP = {
    "id": "fc_1",
    "type": "function_call",
    "call_id": "call_1",
    "name": "lookup",
    "arguments": '{"q": "x"}',
    "status": "completed",
}


def test_an_arguments_delta_nothing_ever_names_breaks_the_protocol() -> None:
    # a call's lane needs the name and id its item gives; a text delta opens its own lane
    assert decode(sse(_arguments(3, "{}"), completed())) == [
        {"type": "error", "error": "StreamProtocolError"}
    ]
    assert decode(sse(_arguments(3, "{}")))[-1] == {
        "type": "error",
        "error": "IncompleteStreamError",  # no terminal event came
    }
    assert decode(sse(text_delta(3, "stray"))) == [
        {"type": "text.delta", "text": "stray"},
        {"type": "error", "error": "IncompleteStreamError"},  # and no terminal event came
    ]


@pytest.mark.parametrize("named", ["by its done item", "by the final output", "by a late added"])
def test_arguments_whose_item_never_began_are_the_call_their_item_names(named: str) -> None:
    # a gateway that sends the arguments' deltas with no `output_item.added` before them
    deltas = [_arguments(0, '{"q"'), _arguments(0, ': "x"}')]
    if named == "by its done item":
        data = sse(*deltas, done(0, LOOKUP), completed([LOOKUP]))
    elif named == "by a late added":  # the item begins after its first fragments
        begun = added(0, LOOKUP | {"arguments": "", "status": "in_progress"})
        data = sse(deltas[0], begun, deltas[1], done(0, LOOKUP), completed([LOOKUP]))
    else:
        data = sse(*deltas, completed([LOOKUP]))
    entries = decode(data)
    calls = [e for e in entries if e["type"] == "tool_call.done"]
    assert [(c["name"], c["tool_call_id"], c["arguments"]) for c in calls] == [
        ("lookup", "call_1", {"q": "x"})
    ]
    assert entries[-1]["type"] == "stop"
    assert entries[-1]["finish_reason"] == "tool_call"
    # the same unnamed (each frame through the slow path) reads the same
    unnamed = b"".join(line + b"\n" for line in data.split(b"\n") if not line.startswith(b"event:"))
    assert decode(unnamed) == entries


def test_error_event_with_a_nested_error_object() -> None:
    error = {
        "type": "error",
        "error": {"type": "invalid_request_error", "code": None, "message": "bad"},
    }
    data = sse(added(0, message()), text_delta(0, "a"), error)
    assert decode(data) == [
        {"type": "text.delta", "text": "a"},
        {"type": "error", "error": "InvalidRequestError"},
    ]


def test_error_event_carries_the_provider_facts() -> None:
    data = sse({"type": "error", "code": "rate_limit_exceeded", "message": "Slow down"})
    decoder = WireDecoder(OpenAIResponsesDialect(), clock=lambda: 0)
    with pytest.raises(RateLimitError) as info:
        decoder.feed(data)
    assert info.value.in_stream is True
    assert info.value.provider_message == "Slow down"
    assert info.value.error_type == "rate_limit_exceeded"


def test_failed_without_an_error_object_is_a_provider_error() -> None:
    data = sse({"type": "response.failed", "response": response("failed", error=None)})
    assert decode(data) == [{"type": "error", "error": "ProviderError"}]


@pytest.mark.parametrize(
    ("code", "typed"),
    [
        ("invalid_prompt", "InvalidRequestError"),
        ("context_length_exceeded", "InvalidRequestError"),
        ("image_too_large", "InvalidRequestError"),
        ("server_error", "ServerError"),
        ("vector_store_timeout", "ProviderError"),
    ],
)
def test_a_failed_response_whose_code_names_the_request_is_a_refused_request(
    code: str, typed: str
) -> None:
    """`response.failed` codes that say what is wrong with the request are never retried; the
    ones that may pass next time keep their transport shape."""
    error = {"code": code, "message": "no"}
    data = sse({"type": "response.failed", "response": response("failed", error=error)})
    assert decode(data) == [{"type": "error", "error": typed}]
    decoder = WireDecoder(OpenAIResponsesDialect(), clock=lambda: 0)
    with pytest.raises(ProviderError) as info:
        decoder.feed(data)
    permanent = error_shape(info.value) is FailureClass.PERMANENT
    assert permanent is (typed == "InvalidRequestError")


def test_incomplete_without_a_reason_is_unknown() -> None:
    data = sse(
        added(0, message()),
        text_delta(0, "cut"),
        {"type": "response.incomplete", "response": response("incomplete")},
    )
    assert decode(data)[-1]["finish_reason"] == "unknown"


def test_completed_with_a_call_in_its_output_finishes_tool_call() -> None:
    call = {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}
    data = sse(added(0, message()), text_delta(0, "x"), done(0, message("x")), completed([call]))
    assert decode(data)[-1]["finish_reason"] == "tool_call"


def test_non_streaming_function_call_is_a_header_then_its_arguments() -> None:
    call = {
        "id": "fc_1",
        "type": "function_call",
        "status": "completed",
        "call_id": "call_1",
        "name": "get_time",
        "arguments": '{"zone":"UTC"}',
    }
    assert decode_body(response("completed", [call])) == [
        {"type": "tool_call.delta", "name": "get_time", "arguments": "", "tool_call_id": "call_1"},
        {"type": "tool_call.delta", "name": "", "arguments": '{"zone":"UTC"}', "tool_call_id": ""},
        {
            "type": "tool_call.done",
            "name": "get_time",
            "arguments": {"zone": "UTC"},
            "tool_call_id": "call_1",
        },
        {"type": "stop", "finish_reason": "tool_call", "usage_metadata": USAGE_METADATA},
    ]


def test_non_streaming_failed_response_is_the_typed_error() -> None:
    failed = response("failed", error={"code": "server_error", "message": "boom"})
    assert decode_body(failed) == [{"type": "error", "error": "ServerError"}]


def test_non_streaming_incomplete_is_length() -> None:
    cut = response(
        "incomplete", [message("Once")], incomplete_details={"reason": "max_output_tokens"}
    )
    assert decode_body(cut)[-1]["finish_reason"] == "length"


# --- a stream of nothing but its ends -------------------------------------------------------------

CALL = {
    "type": "function_call",
    "id": "fc_1",
    "call_id": "call_1",
    "name": "weather",
    "arguments": '{"city": "Paris"}',
    "status": "completed",
}


def test_a_stream_of_nothing_but_its_ends_reads_the_final_output_whole() -> None:
    # a server or proxy that does not stream the output sends it whole in its last event
    created = {"type": "response.created", "response": response("in_progress")}
    entries = decode(sse(created, completed([message("Hello there."), CALL])))
    # as the same Response answered whole would read
    whole = decode_body(response("completed", [message("Hello there."), CALL]))
    assert entries == whole
    assert entries[1] == {"type": "text.done", "text": "Hello there."}
    assert entries[-2]["arguments"] == {"city": "Paris"}
    assert entries[-1]["finish_reason"] == "tool_call"


def test_a_streamed_output_is_not_read_again_from_the_final_event() -> None:
    created = {"type": "response.created", "response": response("in_progress")}
    data = sse(
        created,
        added(0, message()),
        text_delta(0, "Hello"),
        done(0, message("Hello")),
        completed([message("Hello")]),
    )
    texts = [e["text"] for e in decode(data) if e["type"] == "text.done"]
    assert texts == ["Hello"]  # once


# --- deltas whose item never said it began -------------------------------------------------------


@pytest.mark.parametrize(
    "final",
    [[message("Hello there.")], []],
    ids=["final-output", "final-output-empty"],  # LiteLLM's; the Manifest gateway's
)
def test_text_deltas_without_their_item_open_a_text_lane(final: list[Any]) -> None:
    # gateways that send the deltas but no `output_item.added` / `content_part.added`
    data = sse(text_delta(0, "Hello"), text_delta(0, " there."), completed(final))
    entries = decode(data)
    assert [e["type"] for e in entries] == ["text.delta", "text.delta", "text.done", "stop"]
    assert entries[2]["text"] == "Hello there."  # once: the final output is not read again
    # the same unnamed (each frame through the slow path) reads the same
    unnamed = b"".join(line + b"\n" for line in data.split(b"\n") if not line.startswith(b"event:"))
    assert decode(unnamed) == entries


def test_reasoning_deltas_without_their_item_open_a_thinking_lane() -> None:
    data = sse(summary_delta(0, "Thinking."), text_delta(1, "Done."), completed([]))
    types = [e["type"] for e in decode(data)]
    assert types == ["thinking.delta", "thinking.done", "text.delta", "text.done", "stop"]


def test_a_text_done_whose_item_and_deltas_never_came_is_that_text() -> None:
    # a gateway that sends `response.output_text.done` alone, then an empty final output
    done = {
        "type": "response.output_text.done",
        "item_id": "msg_1",
        "output_index": 0,
        "content_index": 0,
        "text": "Hello there.",
    }
    entries = decode(sse(done, completed([])))
    assert [e["type"] for e in entries] == ["text.delta", "text.done", "stop"]
    assert entries[1]["text"] == "Hello there."
    # after its deltas, or inside its item, the done adds nothing (OpenAI sends one per part)
    streamed = sse(added(0, message()), text_delta(0, "Hello there."), done, completed([]))
    assert [e["text"] for e in decode(streamed) if e["type"] == "text.done"] == ["Hello there."]
    alone = sse(text_delta(0, "Hello there."), done, completed([message("Hello there.")]))
    assert [e["text"] for e in decode(alone) if e["type"] == "text.done"] == ["Hello there."]


def test_the_parts_of_a_message_each_in_a_done_alone_are_its_text() -> None:
    # a message of two text parts, each sent only as its `output_text.done`
    def part(index: int, text: str) -> dict[str, Any]:
        return {
            "type": "response.output_text.done",
            "output_index": 0,
            "content_index": index,
            "text": text,
        }

    data = sse(part(0, "Hello"), part(1, " there."), part(1, " there."), completed([]))
    entries = decode(data)
    assert [e["type"] for e in entries] == ["text.delta", "text.delta", "text.done", "stop"]
    assert entries[2]["text"] == "Hello there."  # each part once, joined as an item's are
    # the message's done item ends it, its text not read again
    ended = sse(part(0, "Hello"), part(1, " there."), done(0, message("Hello there.")), completed())
    assert [e["text"] for e in decode(ended) if e["type"] == "text.done"] == ["Hello there."]


def test_a_text_done_of_no_use_is_skipped_whatever_it_holds() -> None:
    odd = {"type": "response.output_text.done", "output_index": "0", "text": {"x": 1}}
    data = sse(added(0, message()), text_delta(0, "Hi"), odd, done(0, message("Hi")), completed())
    assert [e["text"] for e in decode(data) if e["type"] == "text.done"] == ["Hi"]


# --- refusals -------------------------------------------------------------------------------------

REFUSAL = message() | {"content": [{"type": "refusal", "refusal": "I can't help."}]}


def test_a_streamed_refusal_is_the_answers_text_and_ends_it_as_refused() -> None:
    # OpenAI's shape (gpt-4o declining a json_schema format): a message item whose content part
    # is a refusal; read as nothing, the turn failed as "no content"
    part = {"type": "refusal", "refusal": ""}
    data = sse(
        added(0, message()),
        {"type": "response.content_part.added", "output_index": 0, "part": part},
        {"type": "response.refusal.delta", "output_index": 0, "delta": "I can't"},
        {"type": "response.refusal.delta", "output_index": 0, "delta": " help."},
        {"type": "response.refusal.done", "output_index": 0, "refusal": "I can't help."},
        done(0, REFUSAL),
        completed([REFUSAL]),
    )
    entries = decode(data)
    assert [e["text"] for e in entries if e["type"] == "text.done"] == ["I can't help."]
    assert entries[-1]["finish_reason"] == "unknown"  # the grammar's word for `refusal`
    decoder = OpenAIResponsesDialect().stream_decoder()
    frames = [f.split(b"\n", 1)[1][len(b"data: ") :] for f in data.split(b"\n\n") if f]
    lanes = [e for frame in frames for e in decoder.feed(frame)]
    assert [e.finish_reason for e in lanes if isinstance(e, MessageDelta)] == ["refusal"]


def test_a_whole_refusal_is_its_text_in_a_body_and_in_a_stream_of_only_its_ends() -> None:
    created = {"type": "response.created", "response": response("in_progress")}
    for entries in (
        decode_body(response("completed", [REFUSAL])),
        decode(sse(created, completed([REFUSAL]))),
    ):
        assert [e["text"] for e in entries if e["type"] == "text.done"] == ["I can't help."]
        assert entries[-1]["finish_reason"] == "unknown"
