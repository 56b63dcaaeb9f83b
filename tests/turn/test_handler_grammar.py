"""The stream handler, F43-F45: what the grammar refuses (the harness: `handler_support`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

import attrs
import msgspec
import pytest
import trio
from rillet import (
    EmptyResponseError,
    ProviderError,
    StreamProtocolError,
    ToolCallArgumentParseError,
)
from rillet._core._events import UniEvent
from rillet._core._lanes import LaneEvent, MessageStart, PartDelta
from rillet._core._policy import Outcome
from rillet.providers._anthropic._dialect import AnthropicDialect
from rillet.providers._openai_chat._dialect import OpenAIChatDialect
from rillet.transports.testing import sse

from ..handler_support import (
    DONE,
    END_OK,
    OK,
    ROLE,
    USAGE,
    Answer,
    anthropic_events,
    check,
    expect,
    ok,
    openai_chunk,
    play,
    rescue_ok,
    tool_stream,
)

pytestmark = pytest.mark.usefixtures("graph")  # every turn here runs under both graphs

if TYPE_CHECKING:
    from collections.abc import Mapping

    import trio.testing
    from rillet._core._dialect import HttpRequest, Provider, StreamDecoder
    from rillet._core._request import TurnRequest
    from rillet.frames import SSEEvent

# --- F43-F45: what the grammar refuses ------------------------------------------------------------


class _WithExtraFrames:
    """A Chat Completions stream decoder that also understands two frames no real wire sends:
    `!orphan` (a delta for a lane never opened) and `!restart` (a second message start)."""

    def __init__(self, inner: StreamDecoder) -> None:
        self._inner = inner

    def feed(self, frame: SSEEvent) -> list[LaneEvent]:
        if frame.data == "!orphan":
            return [PartDelta(9, "text", "x")]
        if frame.data == "!restart":
            return [MessageStart("again", "test-model")]
        return self._inner.feed(frame)

    def close(self) -> list[LaneEvent]:
        return self._inner.close()


@attrs.frozen
class ExtraFramesDialect:
    """OpenAI Chat with `_WithExtraFrames`: lane events no real dialect can be made to emit."""

    inner: OpenAIChatDialect = attrs.field(factory=OpenAIChatDialect)
    name: str = "openai-chat"
    framing: Literal["sse"] = "sse"

    def build_request(
        self, request: TurnRequest, provider: Provider, *, stream: bool = True
    ) -> HttpRequest:
        return self.inner.build_request(request, provider, stream=stream)

    def stream_decoder(self) -> StreamDecoder:
        return _WithExtraFrames(self.inner.stream_decoder())

    def decode_response(self, body: bytes) -> list[LaneEvent]:
        return self.inner.decode_response(body)

    def error_from_response(
        self, status: int, headers: Mapping[str, str], body: bytes
    ) -> ProviderError:
        return self.inner.error_from_response(status, headers, body)


async def test_f43_a_delta_for_a_lane_never_opened_is_a_protocol_error(
    autojump_clock: trio.testing.MockClock,
) -> None:
    broken = Answer(body=[ROLE, OK[1], sse("!orphan"), *OK[2:]])
    run = await play([broken, ok()], rescue=rescue_ok(), dialect=ExtraFramesDialect())
    check(
        run,
        at=[0.0],
        outcome=Outcome.FAILED,
        saw=expect("start", "D", "end(error, protocol_error)"),
        text="The ",
    )
    assert isinstance(run.result.error, StreamProtocolError)


async def test_f43_a_second_message_start_is_a_protocol_error(
    autojump_clock: trio.testing.MockClock,
) -> None:
    broken = Answer(body=[ROLE, OK[1], sse("!restart"), *OK[2:]])
    run = await play([broken, ok()], rescue=rescue_ok(), dialect=ExtraFramesDialect())
    check(
        run,
        at=[0.0],
        outcome=Outcome.FAILED,
        saw=expect("start", "D", "end(error, protocol_error)"),
        text="The ",
    )


async def test_f43_anthropic_delta_for_a_block_never_started_is_a_protocol_error(
    autojump_clock: trio.testing.MockClock,
) -> None:
    events = anthropic_events()
    orphan = sse(
        {"type": "content_block_delta", "index": 7, "delta": {"type": "text_delta", "text": "x"}},
        event="content_block_delta",
    )
    broken = Answer(body=[*events[:3], orphan, *events[3:]])
    run = await play([broken, Answer(body=events)], dialect=AnthropicDialect())
    check(
        run,
        at=[0.0],
        outcome=Outcome.FAILED,
        saw=expect("start", "D", "end(error, protocol_error)"),
        text="The ",
    )


async def test_f44_tool_arguments_that_do_not_parse_fail_the_turn(
    autojump_clock: trio.testing.MockClock,
) -> None:
    run = await play([tool_stream(['{"city": ', '"Par']), ok()], rescue=rescue_ok())
    check(
        run,
        at=[0.0],
        outcome=Outcome.FAILED,
        saw=expect("start", "tool", "end(error, tool_arguments_invalid)"),
        text="",
    )
    error = run.result.error
    assert isinstance(error, ToolCallArgumentParseError)
    assert error.tool_name == "get_weather"
    kinds = [type(i.content_items[0]).__name__ for i in run.uni if isinstance(i, UniEvent)]
    assert kinds == ["ToolCallDelta", "ToolCallDelta", "ToolCallDelta"]  # no tool_call.done
    assert b"Par" not in msgspec.json.encode(run.events)


async def test_f44_whole_tool_arguments_complete_the_turn(
    autojump_clock: trio.testing.MockClock,
) -> None:
    run = await play([tool_stream(['{"city": ', '"Paris"}'])])
    check(
        run,
        at=[0.0],
        outcome=Outcome.COMPLETED,
        saw=expect("start", "tool", "tool.done", "usage", "done", END_OK),
        text="",
    )


async def test_f45_thinking_only_is_an_empty_response_not_retried(
    autojump_clock: trio.testing.MockClock,
) -> None:
    thinking = Answer(
        body=[
            ROLE,
            openai_chunk({"reasoning_content": "Let me think."}),
            openai_chunk({}, finish="stop"),
            USAGE,
            DONE,
        ]
    )
    run = await play([thinking, ok()], rescue=rescue_ok())
    check(
        run,
        at=[0.0],
        outcome=Outcome.FAILED,
        saw=expect("start", "end(error, empty_response)"),
        text="",
    )
    assert isinstance(run.result.error, EmptyResponseError)
