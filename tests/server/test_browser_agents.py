"""Agent runs on the live page, in headless chromium: a tool's run shown as it happens, and an
approval answered with the page's Approve / Deny buttons (which call the server's approval
endpoint with the run's token). The browser, the server and the loopback provider are those of
`test_browser_chat.py`; each test saves a screenshot under tests/artifacts/.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
import trio

from ..cli.test_cli_agents import ANSWER, calls, tool_messages, tool_then_answer
from ..server_support import serving
from .test_browser import save
from .test_browser_chat import _ended, _in_browser, chromium

if TYPE_CHECKING:
    from playwright.sync_api import Page

    from .test_browser import Browser

pytestmark = pytest.mark.slow
__all__ = ["chromium"]  # the fixture, shared


async def test_a_tools_run_is_shown_with_its_arguments_and_time(chromium: Browser) -> None:
    def steps(page: Page) -> dict[str, Any]:
        page.locator("#prompt").fill("Weather in Paris?")
        page.locator("#start").click()
        _ended(page)
        save(page, "agent-tool.png")
        return {
            "steps": page.locator("#steps li.tool").all_text_contents(),
            "status": page.locator("#steps li.tool [data-status]").get_attribute("data-status"),
            "answer": page.locator("#answer").text_content(),
            "outcome": page.locator("#outcome").text_content(),
        }

    script = tool_then_answer("get_weather", {"city": "Paris"})
    with trio.fail_after(40):
        async with serving(script, tools="demo", tool_arguments=True) as served:
            seen = await chromium.run(_in_browser(served.url, steps))
    assert seen["errors"] == []
    assert len(seen["steps"]) == 1
    assert seen["steps"][0].startswith('⚙ get_weather(city="Paris") … done ')
    assert seen["status"] == "ok"
    assert seen["answer"] == "".join(ANSWER)
    assert seen["outcome"].startswith("Answered")


@pytest.mark.parametrize(("button", "decision"), [("approve", "approved"), ("deny", "denied")])
async def test_approve_and_deny_answer_the_waiting_call(
    chromium: Browser, button: str, decision: str
) -> None:
    def steps(page: Page) -> dict[str, Any]:
        page.locator("#prompt").fill("Tidy up")
        page.locator("#start").click()
        page.locator(f"#steps li.approval button.{button}").click()
        _ended(page)
        save(page, f"agent-{decision}.png")
        return {
            "approval": page.locator("#steps li.approval").text_content(),
            "buttons": page.locator("#steps li.approval button").count(),
            "tools": page.locator("#steps li.tool").all_text_contents(),
            "answer": page.locator("#answer").text_content(),
        }

    script = tool_then_answer("delete_file", {"path": "notes.txt"})
    with trio.fail_after(40):
        async with serving(script, tools="demo") as served:
            seen = await chromium.run(_in_browser(served.url, steps))
            requests = list(served.loopback.requests)
    assert seen["errors"] == []
    assert seen["approval"] == f"delete_file needs your approval — {decision}"
    assert seen["buttons"] == 0  # answered: the buttons are gone
    assert seen["answer"] == "".join(ANSWER)
    results = tool_messages(requests[1])
    if decision == "approved":
        assert results == ["pretended to delete notes.txt (the demo deletes nothing)"]
        assert len(seen["tools"]) == 1
        assert seen["tools"][0].startswith("⚙ delete_file() … done")
    else:
        assert results == ["denied: the user did not allow this call: denied on the page"]
        assert seen["tools"] == []  # a denied call never runs


async def test_a_reload_after_an_answer_shows_the_decision_not_the_buttons(
    chromium: Browser,
) -> None:
    def steps(page: Page) -> dict[str, Any]:
        page.locator("#prompt").fill("Tidy up")
        page.locator("#start").click()
        page.locator("#steps li.approval button.approve").click()
        page.wait_for_function(
            "() => document.querySelector('#steps li.approval')?.dataset.decision === 'approved'"
        )
        page.reload()
        _ended(page)
        return {
            "approval": page.locator("#steps li.approval").all_text_contents(),
            "buttons": page.locator("#steps li.approval button").count(),
        }

    # the answer is paced, so the reload comes while the run still goes on
    script = tool_then_answer("delete_file", {"path": "notes.txt"}, delay=0.3)
    with trio.fail_after(40):
        async with serving(script, tools="demo") as served:
            seen = await chromium.run(_in_browser(served.url, steps))
    assert seen["errors"] == []
    assert seen["approval"] == ["delete_file needs your approval — approved"]
    assert seen["buttons"] == 0


def _said_then_called(said: str, name: str, arguments: dict[str, Any]) -> Any:
    """A script: the first step says `said` and calls the tool, the next answers."""
    from rillet.transports.testing import Reply, openai_text_stream

    def reply(request: Any, n: int) -> Reply:
        del n
        if b'"role":"tool"' in request.body.replace(b" ", b""):
            return Reply(chunks=(openai_text_stream(ANSWER),))
        return Reply(chunks=(calls(name, arguments, said=said),))

    return reply


async def test_an_agents_steps_stand_apart_and_one_tool_call_is_no_retry(
    chromium: Browser,
) -> None:
    def steps(page: Page) -> dict[str, Any]:
        page.locator("#prompt").fill("Weather in Paris?")
        page.locator("#start").click()
        _ended(page)
        return {
            "paragraphs": page.locator("#answer p").all_text_contents(),
            "outcome": page.locator("#outcome").text_content(),
            "phase": page.locator("#phase").text_content(),
        }

    script = _said_then_called("Let me check.", "get_weather", {"city": "Paris"})
    with trio.fail_after(40):
        async with serving(script, tools="demo") as served:
            seen = await chromium.run(_in_browser(served.url, steps))
    assert seen["errors"] == []
    assert seen["paragraphs"] == ["Let me check.", "".join(ANSWER)]  # not glued together
    assert "retr" not in seen["outcome"]  # two steps, two attempts: no retry among them
    assert seen["outcome"].startswith("Answered in")
    assert seen["phase"] == ""


@pytest.mark.parametrize("button", ["approve", "deny"])
async def test_while_it_waits_the_page_says_so_and_marks_nothing_done(
    chromium: Browser, button: str
) -> None:
    def steps(page: Page) -> dict[str, Any]:
        page.locator("#prompt").fill("Tidy up")
        page.locator("#start").click()
        page.locator("#steps li.approval button.approve").wait_for()
        waiting = {
            "phase": page.locator("#phase").text_content(),
            "tools": page.locator("#tools li").all_text_contents(),
            "steps": page.locator("#steps li.tool").all_text_contents(),
        }
        page.locator(f"#steps li.approval button.{button}").click()
        _ended(page)
        return {
            "waiting": waiting,
            "after": page.locator("#tools li").all_text_contents()
            + page.locator("#steps li.tool").all_text_contents(),
            "phase": page.locator("#phase").text_content(),
        }

    script = tool_then_answer("delete_file", {"path": "notes.txt"})
    with trio.fail_after(40):
        async with serving(script, tools="demo") as served:
            seen = await chromium.run(_in_browser(served.url, steps))
    assert seen["errors"] == []
    assert seen["waiting"]["phase"] == "Waiting for your approval…"
    assert not any("✓" in t or "done" in t for t in seen["waiting"]["tools"])
    assert seen["waiting"]["steps"] == []  # nothing ran yet
    if button == "deny":
        assert not any("✓" in t or "done" in t for t in seen["after"])
    else:
        assert any("done" in t for t in seen["after"])
    assert seen["phase"] == ""
