"""Tools, sans-I/O: the schema a tool shows the model (from its signature and docstring, or
given), how a call's arguments are checked and converted before the function runs, how a
return value becomes the text the model reads, and the run events an agent's tools emit."""

from __future__ import annotations

from typing import Any, Literal

import msgspec
import pytest
import trio
import trio.testing
from rillet import (
    ApprovalRequired,
    ApprovalResolved,
    RunDone,
    StatusEvent,
    Tool,
    ToolCallDone,
    ToolCallReady,
    ToolCallStarted,
    ToolCompleted,
    ToolStarted,
    decode_run_event,
    encode_json,
    tool,
)
from rillet._agent._tools import result_text, run_tool


async def search(query: str, limit: int = 5, mode: Literal["web", "news"] = "web") -> str:
    """Search the web.

    Looks things up.

    Args:
        query: what to look for,
            in plain words.
        limit: how many results.

    Returns:
        the results.
    """
    return f"{query}:{limit}:{mode}"


def test_the_schema_comes_from_the_signature_and_the_docstring() -> None:
    made = tool(search)
    assert isinstance(made, Tool)
    assert made.name == "search"
    assert made.description == "Search the web."
    assert made.parameters == {
        "type": "object",
        "properties": {
            "query": {"type": "string", "description": "what to look for, in plain words."},
            "limit": {"type": "integer", "default": 5, "description": "how many results."},
            "mode": {"enum": ["news", "web"], "default": "web"},
        },
        "required": ["query"],
    }
    assert made.spec.name == "search"
    assert made.spec.parameters == made.parameters
    assert made.is_async


def test_a_schema_given_explicitly_is_shown_as_it_is() -> None:
    schema = {"type": "object", "properties": {"q": {"type": "string"}}}

    @tool(name="find", description="Find it.", parameters=schema, needs_approval=True)
    def anything(q: str) -> str:
        return q

    assert (anything.name, anything.description, anything.parameters) == (
        "find",
        "Find it.",
        schema,
    )
    assert anything.needs_approval
    assert not anything.is_async


def test_a_function_taking_any_keywords_takes_any_object() -> None:
    def free(**arguments: Any) -> str:
        return ""

    made = tool(free)
    assert made.parameters == {"type": "object"}
    assert made.convert({"x": 1}) == {"x": 1}


def test_arguments_are_converted_liberally_and_checked() -> None:
    made = tool(search)
    assert made.convert({"query": "trio", "limit": "3"}) == {
        "query": "trio",
        "limit": 3,
        "mode": "web",
    }
    with pytest.raises(msgspec.ValidationError, match="missing required field `query`"):
        made.convert({})
    with pytest.raises(msgspec.ValidationError):
        made.convert({"query": "x", "mode": "video"})


def test_a_return_value_becomes_text() -> None:
    assert result_text("as is") == "as is"
    assert result_text({"a": [1, 2]}) == '{"a":[1,2]}'
    assert result_text(object()).startswith("<object object")


async def test_a_tool_runs_with_the_converted_arguments(
    autojump_clock: trio.testing.MockClock,
) -> None:
    call = ToolCallDone(name="search", arguments={"query": "q", "limit": "2"}, tool_call_id="1")
    output = await run_tool(tool(search), call)
    assert (output.text, output.status, output.reason_code) == ("q:2:web", "ok", None)
    assert output.item.tool_call_id == "1"
    assert output.item.text == "q:2:web"


async def test_a_tools_deadline_is_its_own(autojump_clock: trio.testing.MockClock) -> None:
    async def slow() -> str:
        await trio.sleep(10)
        return "late"

    call = ToolCallDone(name="slow", arguments={}, tool_call_id="1")
    assert (await run_tool(tool(slow, timeout=11), call)).text == "late"
    timed_out = await run_tool(tool(slow, timeout=2.5), call)
    assert (timed_out.status, timed_out.reason_code) == ("error", "tool_timeout")
    assert timed_out.duration == pytest.approx(2.5)


@pytest.mark.parametrize(
    "event",
    [
        ToolCallStarted(run_id="r", seq=1, elapsed_ms=0, name="f", tool_call_id="c"),
        ToolCallReady(run_id="r", seq=2, elapsed_ms=0, name="f", tool_call_id="c"),
        ToolStarted(
            run_id="r", seq=3, elapsed_ms=0, span_id="s", name="f", tool_call_id="c", step=1
        ),
        ToolCompleted(
            run_id="r",
            seq=4,
            elapsed_ms=5,
            span_id="s",
            name="f",
            tool_call_id="c",
            step=1,
            duration_ms=5,
            status="error",
            reason_code="tool_error",
        ),
        ApprovalRequired(
            run_id="r", seq=5, elapsed_ms=5, approval_id="a", name="f", tool_call_id="c", step=1
        ),
        ApprovalResolved(run_id="r", seq=6, elapsed_ms=5, approval_id="a", decision="denied"),
        StatusEvent(run_id="r", seq=7, elapsed_ms=5, phase="fallback", attempt=1, provider="p"),
        RunDone(
            run_id="r",
            seq=8,
            elapsed_ms=5,
            status="approval_required",
            code="approval_required",
            attempts=1,
            requests=1,
            retryable=False,
        ),
    ],
    ids=lambda e: str(type(e).__struct_config__.tag),
)
def test_the_new_run_events_round_trip_with_their_names(event: Any) -> None:
    data = encode_json(event)
    tag = type(event).__struct_config__.tag
    assert data.startswith(b'{"type":"' + tag.encode() + b'"')
    assert decode_run_event(data) == event


def test_a_mutable_default_is_fresh_for_every_call() -> None:
    def tag(name: str, tags: list[str] = ["new"], meta: dict[str, int] = {"n": 1}) -> str:  # noqa: B006
        tags.append(name)
        return ",".join(tags)

    made = tool(tag)
    assert made.parameters["properties"]["tags"]["default"] == ["new"]
    first = made.convert({"name": "a"})
    first["tags"].append("changed")
    assert made.convert({"name": "b"}) == {"name": "b", "tags": ["new"], "meta": {"n": 1}}


async def test_an_object_with_an_async_call_is_awaited_not_sent_to_a_thread(
    autojump_clock: trio.testing.MockClock,
) -> None:
    class Lookup:
        async def __call__(self, query: str) -> str:
            await trio.sleep(1)
            return f"found {query}"

    made = tool(Lookup(), name="lookup")
    assert made.is_async
    call = ToolCallDone(name="lookup", arguments={"query": "q"}, tool_call_id="1")
    output = await run_tool(made, call)
    assert (output.text, output.status) == ("found q", "ok")


def test_a_tool_is_named_from_a_partial_or_an_object_and_a_bad_name_is_refused() -> None:
    import functools

    class Lookup:
        def __call__(self, query: str) -> str:
            return query

    assert tool(functools.partial(search, limit=2)).name == "search"
    assert tool(Lookup()).name == "Lookup"
    with pytest.raises(ValueError, match="name="):
        tool(lambda query: query)  # "<lambda>": no provider takes it
    with pytest.raises(ValueError, match="name="):
        tool(search, name="web search")
