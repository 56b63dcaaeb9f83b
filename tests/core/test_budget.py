"""The context budget: the whole prompt is estimated (instructions, history, tool schemas, tool
results), 20 % of the window stays free for the answer, the oldest exchanges go first and
whole (a tool call with its result), the instructions and the current exchange always stay,
and a prompt whose required part does not fit is never sent (`context_window_exceeded`)."""

from __future__ import annotations

import re

import msgspec
import pytest
import trio
import trio.testing
from rillet import (
    ContextBudget,
    ContextWindowExceeded,
    Conversation,
    ImageUrlDone,
    InlineDataDone,
    TextDone,
    ToolCallDone,
    ToolResultDone,
    ToolSpec,
    TurnRequest,
    UniMessage,
    estimate_chars,
    run_agent,
    user,
)
from rillet._core._budget import least_tokens
from rillet.transports.testing import open_loopback_provider

from ..agent_support import LIMIT, body_of, loop_clock, provider_at, text_reply

clock = pytest.fixture(name="loop_clock")(loop_clock)


def exchange(question: str, size: int) -> list[UniMessage]:
    """A question, a tool call, its result of `size` characters, and the answer."""
    call = ToolCallDone(name="search", arguments={"q": question}, tool_call_id=f"id-{question}")
    return [
        user(question),
        UniMessage(role="assistant", content_items=[call], finish_reason="tool_call"),
        UniMessage(
            role="user",
            content_items=[ToolResultDone(text="x" * size, tool_call_id=f"id-{question}")],
        ),
        UniMessage(role="assistant", content_items=[TextDone(text=f"answer to {question}")]),
    ]


def tokens(budget: ContextBudget, messages: list[UniMessage]) -> int:
    return budget.estimate(TurnRequest(messages=messages))


def test_a_fifth_of_the_window_is_kept_for_the_answer() -> None:
    assert ContextBudget(1000).available == 800
    assert ContextBudget(1000, reserve=0.5).available == 500


def test_the_estimate_counts_instructions_history_tool_schemas_and_results() -> None:
    budget = ContextBudget(10_000)
    bare = TurnRequest(messages=[user("hi")])
    schema = {"type": "object", "properties": {"q": {"type": "string"}}}
    with_all = TurnRequest(
        messages=[user("hi"), *exchange("a", 400)],
        system_prompt="Be brief. " * 10,
        tools=[ToolSpec(name="search", description="Search the web.", parameters=schema)],
    )
    assert budget.estimate(bare) == estimate_chars(msgspec.json.encode(user("hi")).decode())
    assert budget.estimate(with_all) > budget.estimate(bare) + 100 + 25  # result + instructions


def test_a_request_that_fits_is_left_as_it_is() -> None:
    request = TurnRequest(messages=[*exchange("a", 10), user("next")])
    assert ContextBudget(10_000).fit(request) is request


def test_the_oldest_exchanges_go_first_and_whole() -> None:
    old, middle = exchange("old", 2000), exchange("middle", 200)
    current = [user("now"), *exchange("now", 300)[1:3]]  # the question and its tool evidence
    budget = ContextBudget(1000)
    request = TurnRequest(messages=[*old, *middle, *current], system_prompt="Rules.")
    fitted = budget.fit(request)
    assert fitted.messages == [*middle, *current]
    assert fitted.system_prompt == "Rules."
    assert budget.estimate(fitted) <= budget.available
    # the tool call and its result went together: no result without its call remains
    ids = {
        i.tool_call_id
        for m in fitted.messages
        for i in m.content_items
        if isinstance(i, ToolCallDone)
    }
    results = {
        i.tool_call_id
        for m in fitted.messages
        for i in m.content_items
        if isinstance(i, ToolResultDone)
    }
    assert results <= ids


def test_the_current_exchange_too_big_alone_is_never_sent() -> None:
    current = [user("now"), *exchange("now", 5000)[1:3]]
    budget = ContextBudget(1000)
    with pytest.raises(ContextWindowExceeded) as caught:
        budget.fit(TurnRequest(messages=[*exchange("old", 10), *current]))
    assert caught.value.available == 800
    assert caught.value.required > 800
    assert caught.value.code == "context_window_exceeded"


def test_the_estimator_is_pluggable() -> None:
    seen: list[str] = []

    def words(text: str) -> int:
        seen.append(text)
        return len(text.split())

    budget = ContextBudget(100, estimator=words)
    assert budget.estimate(TurnRequest(messages=[user("one two three")]))
    assert any("one two three" in text for text in seen)


async def test_an_agent_fits_each_request_and_fails_before_calling_the_model(
    loop_clock: trio.testing.MockClock,
) -> None:
    conversation = Conversation(messages=exchange("old", 3000))
    async with open_loopback_provider([text_reply("Fine.")]) as server:
        with trio.fail_after(LIMIT):
            fitted = await run_agent(
                TurnRequest(messages=[user("now?")]),
                provider_at(server),
                conversation=conversation,
                budget=ContextBudget(1000),
            )
            assert fitted.status == "completed"
            sent = body_of(server, 0)["messages"]
            assert [m["content"] for m in sent] == ["now?"]  # the old exchange left out
            assert len(conversation.messages) == 6  # the conversation itself keeps it all
            too_big = await run_agent(
                TurnRequest(messages=[user("y" * 8000)]),
                provider_at(server),
                budget=ContextBudget(1000),
            )
    assert (too_big.status, too_big.code) == ("error", "context_window_exceeded")
    assert len(server.requests) == 1  # the second run never called the model


def test_the_least_tokens_are_the_words_of_the_text_and_bytes_count_nothing() -> None:
    text = "The quick brown fox, it's said, jumps over 12,345 lazy dogs."
    plain = TurnRequest(messages=[user(text)], system_prompt="Be brief.")
    # The quick brown fox it s said jumps over 12 345 lazy dogs / Be brief
    assert least_tokens(plain) == 13 + 2
    image = "data:image/png;base64," + "A" * 100_000
    pictured = TurnRequest(
        messages=[
            user(text, ImageUrlDone(image_url=image)),
            UniMessage(
                role="assistant",
                content_items=[InlineDataDone(data=b"\0" * 100_000, mime_type="image/png")],
            ),
        ],
        system_prompt="Be brief.",
    )
    assert least_tokens(pictured) == least_tokens(plain)  # images are counted by their own rules
    called = TurnRequest(
        messages=[
            UniMessage(
                role="assistant",
                content_items=[
                    ToolCallDone(name="f", arguments={"query": "snow in Oslo"}, tool_call_id="c")
                ],
            ),
            UniMessage(
                role="user",
                content_items=[ToolResultDone(text="-4 °C, light snow", tool_call_id="c")],
            ),
        ],
        tools=[ToolSpec(name="f", description="Weather now", parameters={"type": "object"})],
    )
    # query snow in Oslo / 4 C light snow / the schema's words
    schema_words = len(re.findall(r"[^\W_]+", msgspec.json.encode(called.tools).decode()))
    assert least_tokens(called) == 4 + 4 + schema_words
    # below what the budget guesses (four characters a token), for prose and for code alike
    code = "def f(x):\n    return {'a': [x, x + 1]}\n" * 50
    for sample in (text * 50, code):
        assert least_tokens(TurnRequest(messages=[user(sample)])) < estimate_chars(sample)
