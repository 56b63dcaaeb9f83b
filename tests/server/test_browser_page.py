"""The live page's manners, in headless chromium: a run that waits says how long (and why: a
queue, an overloaded provider), a wide table on a phone's width scrolls by itself rather than
the page, and the buttons are named for what they act on. The browser, the server and the
loopback provider are those of `test_browser.py`; each test saves a screenshot under
tests/artifacts/.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import pytest
import trio
from rillet.transports.server import Limits
from rillet.transports.testing import Reply, openai_text_stream, status_reply

from ..server_support import serving
from .test_browser import paced, save
from .test_browser_chat import _ended, _in_browser, chromium

if TYPE_CHECKING:
    from playwright.sync_api import Page

    from .test_browser import Browser

pytestmark = pytest.mark.slow

__all__ = ["chromium"]  # the module's browser fixture, shared with test_browser_chat.py

# every text the phase line shows, and whether the answer was busy meanwhile, from the start
_PHASES = """
window.__phases = [];
window.__busy = [];
document.addEventListener("DOMContentLoaded", () => {
  const phase = document.getElementById("phase");
  const answer = document.getElementById("answer");
  new MutationObserver(() => {
    window.__phases.push(phase.textContent);
    window.__busy.push(answer.getAttribute("aria-busy"));
  }).observe(phase, { childList: true, characterData: true, subtree: true });
});
"""


def _ask(page: Page, prompt: str) -> None:
    page.locator("#prompt").fill(prompt)
    page.locator("#prompt").press("Enter")


async def test_a_run_that_waits_says_how_long_it_has_waited(chromium: Browser) -> None:
    """The first words take 2.5 s: meanwhile the phase line counts the seconds, as the command
    line's spinner does, and it clears once the text comes."""

    def steps(page: Page) -> dict[str, Any]:
        page.add_init_script(_PHASES)
        page.reload()
        _ask(page, "Slow one")
        page.wait_for_function(
            "() => /Waiting for the model… [12] s/.test(document.getElementById('phase')"
            ".textContent)"
        )
        save(page, "page-waiting.png")
        clock = page.locator("#phase .clock")
        waiting = {
            "clock_hidden": clock.get_attribute("aria-hidden"),
            "busy": page.locator("#answer").get_attribute("aria-busy"),
        }
        _ended(page)
        return {
            **waiting,
            "phases": page.evaluate("() => window.__phases"),
            "phase_after": page.locator("#phase").text_content(),
            "busy_after": page.locator("#answer").get_attribute("aria-busy"),
            "answer": page.locator("#answer").text_content(),
        }

    with trio.fail_after(40):
        async with serving([paced(["Worth ", "the wait."], headers_delay=2.5)]) as served:
            seen = await chromium.run(_in_browser(served.url, steps))
    assert seen["errors"] == []
    waited = [p for p in seen["phases"] if p.startswith("Waiting")]
    assert all(re.fullmatch(r"Waiting for the model… \d s", p) for p in waited), waited
    assert {"Waiting for the model… 0 s", "Waiting for the model… 1 s"} <= set(waited)
    assert seen["clock_hidden"] == "true"  # a screen reader is not told every second
    assert seen["busy"] == "true"
    assert seen["phase_after"] == ""
    assert seen["busy_after"] == "false"
    assert seen["answer"] == "Worth the wait."


async def test_a_queued_run_says_it_waits_for_a_free_slot(chromium: Browser) -> None:
    def steps(page: Page) -> dict[str, Any]:
        _ask(page, "Queued")
        page.wait_for_function("() => document.getElementById('phase').textContent !== ''")
        save(page, "page-queued.png")
        return {"phase": page.locator("#phase").text_content()}

    with trio.fail_after(40):
        stalled = Reply(stall_headers=True)
        async with serving([stalled, stalled], limits=Limits(max_streams=1)) as served:
            await served.start()  # holds the only stream slot
            await served.loopback.wait_for_requests(1)
            seen = await chromium.run(_in_browser(served.url, steps))
    assert seen["errors"] == []
    assert seen["phase"] == "Waiting for a free slot on the server…"


async def test_an_overloaded_provider_is_named_while_the_page_waits(chromium: Browser) -> None:
    overloaded = status_reply(529, body={"error": {"message": "Overloaded"}}, retry_after=1)

    def steps(page: Page) -> dict[str, Any]:
        page.add_init_script(_PHASES)
        page.reload()
        _ask(page, "Busy?")
        _ended(page)
        return {
            "phases": page.evaluate("() => window.__phases"),
            "answer": page.locator("#answer").text_content(),
        }

    with trio.fail_after(40):
        async with serving([overloaded, paced(["Now ", "free."])]) as served:
            seen = await chromium.run(_in_browser(served.url, steps))
    assert seen["errors"] == []
    assert "The provider is overloaded; attempt 2 follows (1.0 s)…" in seen["phases"]
    assert not any("asked us to wait" in p for p in seen["phases"])
    assert seen["answer"] == "Now free."


WIDE = [
    "| " + " | ".join(f"column{i}" for i in range(12)) + " |\n",
    "|" + "---|" * 12 + "\n",
    "| " + " | ".join(f"value{i}" for i in range(12)) + " |\n\n",
    "After the table.",
]


async def test_a_wide_table_on_a_phone_scrolls_by_itself_not_the_page(chromium: Browser) -> None:
    def steps(page: Page) -> dict[str, Any]:
        page.set_viewport_size({"width": 360, "height": 740})
        _ask(page, "Wide")
        _ended(page)
        save(page, "page-narrow.png")
        measured: dict[str, Any] = page.evaluate(
            """() => {
              const table = document.querySelector("#answer table");
              const th = table.querySelector("th");
              const line = parseFloat(getComputedStyle(th).lineHeight) || 24;
              const right = (id) => document.getElementById(id).getBoundingClientRect().right;
              return {
                page: [document.documentElement.scrollWidth, window.innerWidth],
                table: [table.scrollWidth, table.clientWidth],
                header_lines: th.getBoundingClientRect().height / line,
                send_right: right("start"),
                prompt_right: right("prompt"),
              };
            }"""
        )
        return measured

    with trio.fail_after(40):
        async with serving([paced(WIDE)]) as served:
            seen = await chromium.run(_in_browser(served.url, steps))
    assert seen.pop("errors") == []
    scroll_width, width = seen["page"]
    assert scroll_width <= width  # the page itself never scrolls sideways
    assert seen["table"][0] > seen["table"][1]  # the table does
    assert seen["header_lines"] < 2  # `column0` on one line, not a letter per line
    assert seen["send_right"] <= width
    assert seen["prompt_right"] <= width


async def test_the_buttons_are_named_for_what_they_act_on(chromium: Browser) -> None:
    refusal = status_reply(409, body={"error": {"message": "no"}})  # retrying can help: Retry

    def steps(page: Page) -> dict[str, Any]:
        page.context.grant_permissions(["clipboard-read", "clipboard-write"])
        _ask(page, "Code")
        _ended(page)
        names = {
            name: page.get_by_role("button", name=name, exact=True).count()
            for name in ("Copy code", "Copy answer", "Regenerate answer", "Send", "Stop")
        }
        page.get_by_role("button", name="Copy code", exact=True).click()
        copied = page.get_by_role("button", name="Copy code: copied", exact=True)
        copied.wait_for()
        page.locator("#prompt").fill("Again")
        page.locator("#start").click()
        page.wait_for_function("() => !document.getElementById('failure').hidden")
        names["Retry this prompt"] = page.get_by_role("button", name="Retry this prompt").count()
        return {"names": names}

    with trio.fail_after(40):
        async with serving([paced(["```\nmake\n```\n"]), refusal]) as served:
            seen = await chromium.run(_in_browser(served.url, steps))
    assert seen["errors"] == []
    assert seen["names"] == {
        "Copy code": 1,
        "Copy answer": 1,
        "Regenerate answer": 1,
        "Send": 1,
        "Stop": 1,
        "Retry this prompt": 1,
    }


async def test_an_answer_cut_short_by_content_rules_says_so_and_keeps_its_text(
    chromium: Browser,
) -> None:
    stream = openai_text_stream(["The scene ", "opens in"], finish_reason="content_filter")
    cut = Reply(chunks=tuple(frame + b"\n\n" for frame in stream.split(b"\n\n") if frame))

    def steps(page: Page) -> dict[str, Any]:
        _ask(page, "A story?")
        _ended(page)
        seen = {
            "outcome": page.locator("#outcome").text_content(),
            "failure": page.locator("#failure-text").text_content(),
            "failure_shown": page.locator("#failure").is_visible(),
            "answer": page.locator("#answer").text_content(),
        }
        page.reload()  # the history keeps the answer and what cut it
        page.wait_for_selector("#history .exchange")
        seen["kept"] = page.locator("#history .exchange .done-bad").text_content()
        save(page, "page-cut-short.png")
        return seen

    with trio.fail_after(40):
        async with serving([cut]) as served:
            seen = await chromium.run(_in_browser(served.url, steps))
    assert seen["errors"] == []
    assert re.fullmatch(r"Cut short in [\d.]+ m?s", seen["outcome"]), seen["outcome"]
    assert seen["failure_shown"] is True
    assert "content rules stopped the answer part-way" in seen["failure"]
    assert seen["answer"] == "The scene opens in"
    assert seen["kept"] == seen["failure"]


async def test_the_usage_line_says_what_the_answer_cost_at_the_servers_prices(
    chromium: Browser,
) -> None:
    from decimal import Decimal

    from rillet import Price

    def steps(page: Page) -> dict[str, Any]:
        _ask(page, "Hello?")
        _ended(page)
        return {"usage": page.locator("#usage").text_content()}

    stream = openai_text_stream(["Hello", " there"], prompt_tokens=40)
    price = Price(input="2", output="8")
    with trio.fail_after(40):
        async with serving([Reply(chunks=(stream,))], prices=price) as served:
            seen = await chromium.run(_in_browser(served.url, steps))
    assert seen["errors"] == []
    usage = seen["usage"]
    cost = (40 * Decimal(2) + 2 * Decimal(8)) / 10**6  # 40 in, 2 out
    assert usage == f"Tokens: 40 in · 2 out · Cost: {cost}"
