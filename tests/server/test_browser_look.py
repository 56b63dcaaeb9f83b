"""How the page is laid out and what each answer keeps, in headless chromium: the composer
stays in the window however long the conversation grows, a code block's copy button sits in a
bar above its code (covering none of it, on a phone's width too) beside its language, the code
is highlighted, and every answer of the conversation keeps its Copy button, its reasoning and
its usage once the next prompt is sent."""

from __future__ import annotations

import contextlib
import json
from typing import TYPE_CHECKING, Any

import pytest
import trio

from ..server_support import serving
from .test_browser import paced, save
from .test_browser_chat import _ended, _in_browser, chromium

if TYPE_CHECKING:
    from playwright.sync_api import Page

    from .test_browser import Browser

pytestmark = pytest.mark.slow
__all__ = ["chromium"]  # the fixture, shared

CODE = ["Here:\n\n", "```python\n", "def add(a, b):\n", "    return a + b  # the sum\n", "```\n"]
LONG = ["A long answer. " * 40 + "\n\n"] * 3


async def test_the_composer_stays_in_the_window_after_several_answers(chromium: Browser) -> None:
    def steps(page: Page) -> dict[str, Any]:
        page.set_viewport_size({"width": 1280, "height": 800})
        for prompt in ("One", "Two", "Three"):
            page.locator("#prompt").fill(prompt)
            page.locator("#start").click()
            _ended(page)
        save(page, "look-desktop.png")
        box = page.locator("#prompt").bounding_box()
        return {
            "box": box,
            "height": page.evaluate("() => window.innerHeight"),
            "scrolled": page.evaluate("() => document.documentElement.scrollHeight"),
        }

    with trio.fail_after(60):
        async with serving([paced(LONG)]) as served:
            seen = await chromium.run(_in_browser(served.url, steps))
    assert seen["errors"] == []
    assert seen["scrolled"] > 2 * seen["height"]  # the conversation is longer than the window
    assert seen["box"] is not None
    assert seen["box"]["y"] >= 0
    assert seen["box"]["y"] + seen["box"]["height"] <= seen["height"]


@pytest.mark.parametrize("width", [1280, 390])
async def test_a_code_block_has_a_bar_with_its_language_and_a_copy_button_over_no_code(
    chromium: Browser, width: int
) -> None:
    def steps(page: Page) -> dict[str, Any]:
        page.set_viewport_size({"width": width, "height": 844})
        page.locator("#prompt").fill("Code please")
        page.locator("#start").click()
        _ended(page)
        save(page, f"look-code-{width}.png")
        button = page.locator("#answer .codebar button.copy")
        button.wait_for(state="visible")  # (the answer's last render may still be under way)
        from playwright.sync_api import TimeoutError as Late

        keyword = page.locator("#answer pre code .hljs-keyword").first
        with contextlib.suppress(Late):  # highlighted once that render is done (asserted below)
            keyword.wait_for(timeout=10_000)
        copy = button.bounding_box()
        code = page.locator("#answer pre code").bounding_box()
        return {
            "copy": copy,
            "code": code,
            "language": page.locator("#answer .codebar .language").text_content(),
            "highlighted": page.locator("#answer pre code .hljs-keyword").count(),
            "text": page.locator("#answer pre code").text_content(),
        }

    with trio.fail_after(40):
        async with serving([paced(CODE)]) as served:
            seen = await chromium.run(_in_browser(served.url, steps))
    assert seen["errors"] == []
    assert seen["language"] == "python"
    assert seen["highlighted"] >= 1  # `def`, `return`
    assert seen["text"] == "def add(a, b):\n    return a + b  # the sum\n"  # the text unchanged
    copy, code = seen["copy"], seen["code"]
    assert copy["y"] + copy["height"] <= code["y"]  # above the code: it covers none of it


async def test_every_answer_keeps_its_copy_button_and_usage_after_the_next_prompt(
    chromium: Browser,
) -> None:
    def steps(page: Page) -> dict[str, Any]:
        page.context.grant_permissions(["clipboard-read", "clipboard-write"])
        for prompt in ("First", "Second"):
            page.locator("#prompt").fill(prompt)
            page.locator("#start").click()
            _ended(page)
        past = page.locator("#history .exchange")
        page.get_by_role("button", name="Copy this answer").first.click()
        page.get_by_role("button", name="Copy this answer: copied").wait_for()
        return {
            "past": past.count(),
            "copies": page.get_by_role("button", name="Copy this answer").count(),
            "meta": past.first.locator(".meta").all_text_contents(),
            "clipboard": page.evaluate("() => navigator.clipboard.readText()"),
        }

    with trio.fail_after(40):
        async with serving([paced(["The ", "answer."])]) as served:
            seen = await chromium.run(_in_browser(served.url, steps))
    assert seen["errors"] == []
    assert seen["past"] == 1
    assert seen["copies"] == 1  # the past answer's (the current one has its own Copy)
    assert seen["clipboard"] == "The answer."
    assert any("Answered in" in m and "in ·" in m for m in seen["meta"]), seen["meta"]


async def test_a_past_answer_is_regenerated_from_the_conversation_before_it(
    chromium: Browser,
) -> None:
    def steps(page: Page) -> dict[str, Any]:
        for prompt in ("First", "Second"):
            page.locator("#prompt").fill(prompt)
            page.locator("#start").click()
            page.wait_for_function(
                f"() => document.getElementById('asked').textContent === '{prompt}' && "
                "document.getElementById('outcome').textContent !== ''"
            )
        name = "Regenerate this answer (the later ones are dropped)"
        page.get_by_role("button", name=name).first.click()
        page.wait_for_function(
            "() => document.getElementById('asked').textContent === 'First' && "
            "document.getElementById('outcome').textContent !== ''"
        )
        return {"past": page.locator("#history .exchange").count()}

    with trio.fail_after(40):
        async with serving([paced(["The ", "answer."])]) as served:
            seen = await chromium.run(_in_browser(served.url, steps))
            sent = [json.loads(r.body)["messages"] for r in served.loopback.requests]
    assert seen["errors"] == []
    assert seen["past"] == 0  # "First" is asked again with nothing before it
    assert len(sent) == 3
    assert [m["content"] for m in sent[2]] == ["First"]  # the conversation before it: none
    assert len(sent[1]) == 3  # (the second prompt had the first exchange before it)
