"""The live page as a chat, in headless chromium: markdown as it streams, a malicious answer that
never runs, reloads mid-run, Enter and Shift+Enter, a conversation's history, errors as
sentences with a retry button, and the icon. The browser, the server and the loopback provider
are those of `test_browser.py`; each test saves a screenshot under tests/artifacts/.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import httpx
import msgspec
import pytest
import trio
from rillet.transports.testing import Reply, openai_text_stream, sse, status_reply

from ..server_support import serving
from .test_browser import Browser, _chromium, broken_after, paced, save

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from playwright.sync_api import Browser as PlaywrightBrowser
    from playwright.sync_api import Page

pytestmark = pytest.mark.slow

# counts animation frames, and records the frame of every repaint of the answer (a
# MutationObserver added before the page's own script runs)
_FRAMES = """
window.__frame = 0;
window.__paints = [];
window.__shown = [];
const tick = () => { window.__frame += 1; requestAnimationFrame(tick); };
requestAnimationFrame(tick);
document.addEventListener("DOMContentLoaded", () => {
  const answer = document.getElementById("answer");
  new MutationObserver(() => {
    window.__paints.push(window.__frame);
    window.__shown.push(answer.textContent);
  }).observe(answer, { childList: true, characterData: true, subtree: true });
});
"""

MARKDOWN = [
    "## Three ",
    "things\n\n",
    "Some *emphasis* and **strong** text.\n\n",
    "- one\n- two\n",
    "- three\n\n",
    "| name | value |\n|---|---|\n| a | 1 |\n",
    "| b | 2 |\n\n",
    "```python\nprint('hi')\n",
    "x = 1\n```\n",
]
EVIL = [
    "Careful: <script>window.__pwned = 'script'</script>",
    ' <img src="x" onerror="window.__pwned = \'onerror\'">',
    " [link](javascript:window.__pwned='href')",
    ' <a href="#" onclick="window.__pwned=\'onclick\'">click</a>',
    " <svg onload=\"window.__pwned='svg'\"></svg> done.",
]
LONG = [f"word{i} " for i in range(60)]


@pytest.fixture(scope="module")
def chromium() -> Iterator[Browser]:
    """Headless chromium, as `test_browser.py` starts it (skipped where there is none)."""
    pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    executable = _chromium()
    if executable is None:
        pytest.skip("no chromium found (make deps installs Debian's chromium when run as root)")
    try:
        launched = Browser(executable)
    except Exception as exc:  # a browser that cannot start here is an environment problem
        pytest.skip(f"chromium at {executable} did not start: {exc}")
    yield launched
    launched.close()


def _page(browser: PlaywrightBrowser, errors: list[str]) -> Any:
    context = browser.new_context(viewport={"width": 900, "height": 700})
    page = context.new_page()
    page.set_default_timeout(15_000)
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on(
        "console",
        lambda msg: errors.append(msg.text) if "Content Security Policy" in msg.text else None,
    )
    page.add_init_script(_FRAMES)
    return context, page


def _ended(page: Page) -> None:
    page.wait_for_function("() => document.getElementById('outcome').textContent !== ''")


def _in_browser(
    url: str, steps: Callable[[Page], dict[str, Any]]
) -> Callable[[PlaywrightBrowser], dict[str, Any]]:
    def drive(browser: PlaywrightBrowser) -> dict[str, Any]:
        errors: list[str] = []
        context, page = _page(browser, errors)
        try:
            page.goto(url + "/")
            seen = steps(page)
            seen["errors"] = errors
            return seen
        finally:
            context.close()

    return drive


def _sent(served: Any, index: int) -> Any:
    return msgspec.json.decode(served.loopback.requests[index].body)


async def test_markdown_renders_as_it_streams_with_code_and_a_copy_button(
    chromium: Browser,
) -> None:
    def steps(page: Page) -> dict[str, Any]:
        page.locator("#prompt").fill("Show markdown")
        page.locator("#prompt").press("Enter")
        _ended(page)
        page.wait_for_timeout(100)
        save(page, "chat-markdown.png")
        answer = page.locator("#answer")
        return {
            "h2": answer.locator("h2").all_text_contents(),
            "em": answer.locator("em").all_text_contents(),
            "strong": answer.locator("strong").all_text_contents(),
            "li": answer.locator("li").all_text_contents(),
            "cells": answer.locator("td").all_text_contents(),
            "heads": answer.locator("th").all_text_contents(),
            "code": answer.locator("pre code").all_text_contents(),
            "font": answer.locator("pre code").evaluate("e => getComputedStyle(e).fontFamily"),
            "copy": answer.locator(".codebar button.copy").count(),
            "paints": page.evaluate("window.__paints"),
            "outcome": page.locator("#outcome").text_content(),
        }

    with trio.fail_after(40):
        async with serving([paced(MARKDOWN)]) as served:
            seen = await chromium.run(_in_browser(served.url, steps))
    assert seen["errors"] == []
    assert re.fullmatch(r"Answered in [\d.]+ m?s", seen["outcome"]), seen["outcome"]
    assert seen["h2"] == ["Three things"]
    assert seen["em"] == ["emphasis"]
    assert seen["strong"] == ["strong"]
    assert seen["li"] == ["one", "two", "three"]
    assert seen["heads"] == ["name", "value"]
    assert seen["cells"] == ["a", "1", "b", "2"]
    assert seen["code"] == ["print('hi')\nx = 1\n"]
    assert "monospace" in seen["font"]
    assert seen["copy"] == 1
    # repainted as it streamed, never twice in one animation frame
    paints = seen["paints"]
    assert len(paints) >= 4
    assert len(paints) == len(set(paints))


async def test_a_burst_of_deltas_is_painted_once_per_frame(chromium: Browser) -> None:
    stream = openai_text_stream(LONG)  # every delta in one chunk: one burst
    expected = "".join(LONG)

    def steps(page: Page) -> dict[str, Any]:
        page.locator("#prompt").fill("Burst")
        page.locator("#start").click()
        _ended(page)
        page.wait_for_timeout(100)
        return {
            "paints": page.evaluate("window.__paints"),
            "answer": page.locator("#answer").text_content(),
        }

    with trio.fail_after(40):
        async with serving([Reply(chunks=(stream,))]) as served:
            seen = await chromium.run(_in_browser(served.url, steps))
    assert seen["errors"] == []
    assert seen["answer"] == expected
    assert len(seen["paints"]) == len(set(seen["paints"]))
    assert len(seen["paints"]) < len(LONG) / 2  # coalesced, not one paint per delta


async def test_a_malicious_answer_never_runs(chromium: Browser) -> None:
    def steps(page: Page) -> dict[str, Any]:
        page.locator("#prompt").fill("Be evil")
        page.locator("#start").click()
        _ended(page)
        page.wait_for_timeout(300)  # time for an image error or a load handler to fire
        links = page.locator("#answer a")
        for i in range(links.count()):
            links.nth(i).click(modifiers=["Control"])  # a new tab, if anything at all
        page.wait_for_timeout(200)
        save(page, "chat-malicious.png")
        return {
            "pwned": page.evaluate("window.__pwned === undefined ? null : window.__pwned"),
            "scripts": page.locator("#answer script, #answer img, #answer svg").count(),
            "handlers": page.evaluate(
                "[...document.querySelectorAll('#answer *')].flatMap(e => [...e.attributes])"
                ".map(a => a.name + '=' + a.value)"
                ".filter(a => a.startsWith('on') || a.includes('javascript'))"
            ),
            "text": page.locator("#answer").text_content(),
            "outcome": page.locator("#outcome").text_content(),
        }

    with trio.fail_after(40):
        async with serving([paced(EVIL)]) as served:
            seen = await chromium.run(_in_browser(served.url, steps))
    assert re.fullmatch(r"Answered in [\d.]+ m?s", seen["outcome"]), seen["outcome"]
    assert seen["pwned"] is None
    assert seen["scripts"] == 0
    assert seen["handlers"] == []
    assert seen["errors"] == []  # nothing was even blocked: it never reached the page
    assert "Careful:" in seen["text"]
    assert "<script>window.__pwned = 'script'</script>" in seen["text"]  # shown as text
    assert "done." in seen["text"]


async def test_two_reloads_mid_run_resume_with_the_text_exactly_once(chromium: Browser) -> None:
    expected = "".join(LONG)

    def steps(page: Page) -> dict[str, Any]:
        page.locator("#prompt").fill("Count slowly")
        page.locator("#start").click()
        page.wait_for_function("() => document.getElementById('answer').textContent.length > 20")
        page.reload()
        page.wait_for_function("() => document.getElementById('answer').textContent.length > 0")
        mid = page.locator("#answer").text_content()
        page.reload()
        page.wait_for_function("() => document.getElementById('conn').textContent === 'live'")
        still_running = page.locator("#outcome").text_content() == ""
        _ended(page)
        page.wait_for_timeout(150)
        save(page, "chat-reloaded.png")
        return {
            "mid": mid,
            "still_running": still_running,
            "answer": page.locator("#answer").text_content(),
            "shown": page.evaluate("window.__shown"),
            "asked": page.locator("#asked").text_content(),
            "notes": page.locator("#events li").all_text_contents(),
            "outcome": page.locator("#outcome").text_content(),
        }

    with trio.fail_after(60):
        async with serving([paced(LONG, chunk_delay=0.1)]) as served:
            seen = await chromium.run(_in_browser(served.url, steps))
            runs = len(served.loopback.requests)
    assert seen["errors"] == []
    assert runs == 1  # resumed, not asked again
    assert seen["still_running"]  # the second reload came while the run was still going
    assert seen["asked"] == "Count slowly"
    assert re.fullmatch(r"Answered in [\d.]+ m?s", seen["outcome"]), seen["outcome"]
    assert seen["answer"] == expected
    assert "answer verified (sha256)" in seen["notes"]
    assert expected.startswith(seen["mid"])
    # after the last reload, every painted text was a prefix of the answer: nothing twice
    assert all(expected.startswith(shown) for shown in seen["shown"])


async def test_enter_sends_and_shift_enter_breaks_the_line(chromium: Browser) -> None:
    def steps(page: Page) -> dict[str, Any]:
        prompt = page.locator("#prompt")
        prompt.press_sequentially("line one")
        prompt.press("Shift+Enter")
        prompt.press_sequentially("line two")
        before = prompt.input_value()
        runs_before = page.evaluate("document.getElementById('run').hidden")
        prompt.press("Enter")
        _ended(page)
        return {
            "before": before,
            "hidden_before": runs_before,
            "asked": page.locator("#asked").text_content(),
            "after": prompt.input_value(),
        }

    with trio.fail_after(40):
        async with serving([paced(["Got ", "it."])]) as served:
            seen = await chromium.run(_in_browser(served.url, steps))
            sent = _sent(served, 0)
            runs = len(served.loopback.requests)
    assert seen["errors"] == []
    assert seen["before"] == "line one\nline two"  # Shift+Enter broke the line, sent nothing
    assert seen["hidden_before"] is True
    assert runs == 1
    assert sent["messages"][-1]["content"] in (
        "line one\nline two",
        [{"type": "text", "text": "line one\nline two"}],
    )
    assert seen["asked"] == "line one\nline two"
    assert seen["after"] == ""


async def test_each_prompt_is_sent_with_the_conversation_so_far(chromium: Browser) -> None:
    def steps(page: Page) -> dict[str, Any]:
        for prompt in ("What is 2+2?", "And times 3?"):
            page.locator("#prompt").fill(prompt)
            page.locator("#prompt").press("Enter")
            page.wait_for_function(
                "(p) => document.getElementById('asked').textContent === p "
                "&& document.getElementById('outcome').textContent !== ''",
                arg=prompt,
            )
        page.wait_for_timeout(100)
        save(page, "chat-conversation.png")
        return {
            "history": page.locator("#history .asked").all_text_contents(),
            "answers": page.locator("#history .answer").all_text_contents(),
            "answer": page.locator("#answer").text_content(),
        }

    script = [paced(["2+2 ", "is 4."]), paced(["4 times 3 ", "is 12."])]
    with trio.fail_after(40):
        async with serving(script) as served:
            seen = await chromium.run(_in_browser(served.url, steps))
            first, second = _sent(served, 0), _sent(served, 1)
    assert seen["errors"] == []
    assert seen["history"] == ["What is 2+2?"]
    assert seen["answers"] == ["2+2 is 4."]
    assert seen["answer"] == "4 times 3 is 12."
    assert [m["role"] for m in first["messages"]] == ["user"]
    assert [m["role"] for m in second["messages"]] == ["user", "assistant", "user"]
    assert "What is 2+2?" in str(second["messages"][0])
    assert "2+2 is 4." in str(second["messages"][1])
    assert "And times 3?" in str(second["messages"][2])


async def test_an_error_is_a_sentence_with_a_retry_button(chromium: Browser) -> None:
    # a status no other code names: `provider_error`, which asking again may cure
    refusal = Reply(
        status=409,
        chunks=(b'{"error": {"message": "secret provider detail sk-live-99887766"}}',),
        content_type="application/json",
    )

    def steps(page: Page) -> dict[str, Any]:
        page.locator("#prompt").fill("Try me")
        page.locator("#start").click()
        _ended(page)
        save(page, "chat-error.png")
        failed = {
            "sentence": page.locator("#failure-text").text_content(),
            "retry_visible": page.locator("#retry").is_visible(),
            "pill": page.locator("#conn").text_content(),
            "outcome": page.locator("#outcome").text_content(),
            "body": page.locator("body").inner_text(),
        }
        page.locator("#retry").click()
        page.wait_for_function(
            "() => document.getElementById('outcome').textContent.startsWith('Answered')"
        )
        return {
            **failed,
            "answer": page.locator("#answer").text_content(),
            "pill_after": page.locator("#conn").text_content(),
            "retry_after": page.locator("#retry").is_visible(),
        }

    with trio.fail_after(40):
        async with serving([refusal, paced(["Second ", "time lucky."])]) as served:
            seen = await chromium.run(_in_browser(served.url, steps))
            second = _sent(served, 1)
    assert seen["errors"] == []
    assert seen["sentence"] == ("The provider could not answer. Retry in a moment.")
    assert seen["retry_visible"]
    assert seen["pill"] == "failed"
    assert seen["outcome"].startswith("Failed")
    assert "done" not in seen["pill"]
    assert "secret provider detail" not in seen["body"]
    assert "sk-live" not in seen["body"]
    assert seen["answer"] == "Second time lucky."
    assert seen["pill_after"] == "done"
    assert not seen["retry_after"]
    assert "Try me" in str(second["messages"][-1])  # the same prompt, asked again


async def test_a_retry_says_why_while_the_page_waits(chromium: Browser) -> None:
    """A 502, then a stream cut off: while each retry waits, the page says what went wrong."""
    bad_gateway = Reply(
        status=502,
        chunks=(b'{"error": {"message": "upstream detail"}}',),
        content_type="application/json",
    )
    cut = broken_after(["Lost ", "words "], kept=1, pace=0.05)

    def steps(page: Page) -> dict[str, Any]:
        page.evaluate(
            """() => {
              window.__phases = [];
              const phase = document.getElementById("phase");
              new MutationObserver(() => window.__phases.push(phase.textContent))
                .observe(phase, { childList: true, characterData: true, subtree: true });
            }"""
        )
        page.locator("#prompt").fill("Again")
        page.locator("#start").click()
        page.wait_for_function(
            "() => document.getElementById('outcome').textContent.startsWith('Answered')"
        )
        return {
            "phases": page.evaluate("() => window.__phases.filter((t) => t)"),
            "answer": page.locator("#answer").text_content(),
        }

    with trio.fail_after(40):
        async with serving([bad_gateway, cut, paced(["Third ", "time."])]) as served:
            seen = await chromium.run(_in_browser(served.url, steps))
    assert seen["errors"] == []
    failed = [t for t in seen["phases"] if t.startswith("That attempt failed")]
    assert failed[0].startswith("That attempt failed (the provider had a server error); attempt 2")
    assert failed[1].startswith("That attempt failed (the connection broke off); attempt 3")
    assert seen["answer"] == "Third time."


async def test_the_page_has_an_icon() -> None:
    with trio.fail_after(20):
        async with serving() as served:
            icon = await served.client.get("/favicon.ico")
            page = await served.client.get("/")
    assert icon.status_code == 200
    assert icon.headers["content-type"] == "image/svg+xml"
    assert icon.content.startswith(b"<svg")
    assert b'rel="icon" href="/favicon.ico"' in page.content
    assert isinstance(served.client, httpx.AsyncClient)


def _chat_frames(deltas: list[dict[str, Any]], finish: str) -> tuple[bytes, ...]:
    """An OpenAI Chat stream of these deltas, one SSE frame per chunk."""
    head = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    frames = [{**head, "choices": [{"index": 0, "delta": {"role": "assistant"}}]}]
    frames += [{**head, "choices": [{"index": 0, "delta": d}]} for d in deltas]
    frames.append({**head, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
    usage = {"prompt_tokens": 5, "completion_tokens": 9, "total_tokens": 14}
    frames.append({**head, "choices": [], "usage": usage})
    return (*(sse(frame) for frame in frames), sse("[DONE]"))


async def test_reasoning_shows_while_it_streams_and_folds_when_the_answer_starts(
    chromium: Browser,
) -> None:
    thoughts = ["Let me ", "think about ", "this ", "carefully."]
    words = ["The ", "answer ", "is 42."]
    deltas = [{"reasoning_content": t} for t in thoughts] + [{"content": w} for w in words]
    reply = Reply(chunks=_chat_frames(deltas, "stop"), chunk_delay=0.15)

    def steps(page: Page) -> dict[str, Any]:
        page.locator("#prompt").fill("Think first")
        page.locator("#start").click()
        page.wait_for_function("() => document.getElementById('reasoning').textContent.length > 0")
        page.wait_for_timeout(50)
        during = page.evaluate(
            "() => ({open: document.getElementById('reasoning-pane').open,"
            " visible: !document.getElementById('reasoning-pane').hidden,"
            " answer: document.getElementById('answer').textContent})"
        )
        save(page, "chat-reasoning.png")
        _ended(page)
        page.wait_for_timeout(100)
        return {
            "during": during,
            "open_after": page.evaluate("document.getElementById('reasoning-pane').open"),
            "reasoning": page.locator("#reasoning").text_content(),
            "answer": page.locator("#answer").text_content(),
        }

    with trio.fail_after(40):
        async with serving([reply], reasoning=True) as served:
            seen = await chromium.run(_in_browser(served.url, steps))
    assert seen["errors"] == []
    assert seen["during"] == {"open": True, "visible": True, "answer": ""}
    assert seen["open_after"] is False
    assert seen["reasoning"] == "".join(thoughts)
    assert seen["answer"] == "".join(words)


async def test_tool_calls_show_their_arguments_when_the_server_opts_in(chromium: Browser) -> None:
    call = {"index": 0, "id": "call_1", "type": "function"}
    deltas = [
        {"tool_calls": [{**call, "function": {"name": "get_weather", "arguments": ""}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": '{"city": '}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]},
    ]
    reply = Reply(chunks=_chat_frames(deltas, "tool_calls"))

    def steps(page: Page) -> dict[str, Any]:
        page.locator("#prompt").fill("Weather?")
        page.locator("#start").click()
        _ended(page)
        return {
            "tools": page.locator("#tools li").all_text_contents(),
            "arguments": page.locator("#tools li pre").all_text_contents(),
        }

    with trio.fail_after(40):
        async with serving([reply], tool_arguments=True) as served:
            seen = await chromium.run(_in_browser(served.url, steps))
    assert seen["errors"] == []
    assert len(seen["tools"]) == 1
    assert seen["tools"][0].startswith("get_weather requested")  # not ✓: it has not run
    assert [msgspec.json.decode(a) for a in seen["arguments"]] == [{"city": "Paris"}]


async def test_a_reload_after_the_answer_keeps_the_conversation(chromium: Browser) -> None:
    def steps(page: Page) -> dict[str, Any]:
        page.locator("#prompt").fill("Say hi")
        page.locator("#prompt").press("Enter")
        _ended(page)
        page.reload()
        page.wait_for_function("() => document.querySelectorAll('#history .answer').length")
        page.wait_for_timeout(200)
        return {
            "asked": page.locator("#history .asked").all_text_contents(),
            "answers": page.locator("#history .answer").all_text_contents(),
            "run_hidden": page.evaluate("document.getElementById('run').hidden"),
        }

    with trio.fail_after(40):
        async with serving([paced(["Hi ", "there."])]) as served:
            seen = await chromium.run(_in_browser(served.url, steps))
            runs = len(served.loopback.requests)
    assert seen["errors"] == []
    assert seen["asked"] == ["Say hi"]
    assert seen["answers"] == ["Hi there."]
    assert seen["run_hidden"] is True
    assert runs == 1


async def test_stop_ends_the_run_as_stopped_with_a_retry(chromium: Browser) -> None:
    def steps(page: Page) -> dict[str, Any]:
        page.locator("#prompt").fill("Go on and on")
        page.locator("#start").click()
        page.wait_for_function("() => document.getElementById('answer').textContent.length > 10")
        page.locator("#stop").click()
        _ended(page)
        return {
            "outcome": page.locator("#outcome").text_content(),
            "sentence": page.locator("#failure-text").text_content(),
            "retry": page.locator("#retry").is_visible(),
            "pill": page.locator("#conn").text_content(),
        }

    with trio.fail_after(40):
        async with serving([paced(LONG, chunk_delay=0.1)]) as served:
            seen = await chromium.run(_in_browser(served.url, steps))
    assert seen["errors"] == []
    assert seen["outcome"] == "Stopped"
    assert seen["sentence"] == "Stopped before the answer was complete."
    assert seen["retry"]
    assert seen["pill"] == "stopped"


async def test_copy_and_regenerate(chromium: Browser) -> None:
    def steps(page: Page) -> dict[str, Any]:
        page.context.grant_permissions(["clipboard-read", "clipboard-write"])
        page.locator("#prompt").fill("Code please")
        page.locator("#prompt").press("Enter")
        _ended(page)
        page.locator("#answer .codebar button.copy").click()
        page.wait_for_function(
            "() => document.querySelector('#answer .codebar button.copy').textContent === 'copied'"
        )
        code = page.evaluate("navigator.clipboard.readText()")
        page.locator("#copy").click()
        page.wait_for_function("() => document.getElementById('copy').textContent === 'copied'")
        whole = page.evaluate("navigator.clipboard.readText()")
        page.locator("#regenerate").click()
        page.wait_for_function(
            "() => document.getElementById('answer').textContent === 'Another take.'"
            " && document.getElementById('outcome').textContent !== ''"
        )
        return {
            "code": code,
            "whole": whole,
            "history": page.locator("#history .exchange").count(),
            "asked": page.locator("#asked").text_content(),
        }

    first = ["Here:\n\n", "```sh\nmake demo\n```\n"]
    with trio.fail_after(40):
        async with serving([paced(first), paced(["Another ", "take."])]) as served:
            seen = await chromium.run(_in_browser(served.url, steps))
            asked = [_sent(served, i)["messages"] for i in (0, 1)]
    assert seen["errors"] == []
    assert seen["code"] == "make demo\n"
    assert seen["whole"] == "".join(first)
    assert seen["history"] == 0  # regenerated in place, not added to the conversation
    assert seen["asked"] == "Code please"
    assert asked[0] == asked[1]  # the same prompt with the same history


async def test_the_page_is_self_contained_and_its_policy_allows_only_its_own_scripts() -> None:
    with trio.fail_after(20):
        async with serving() as served:
            page = await served.client.get("/")
    csp = page.headers["content-security-policy"]
    scripts = re.search(r"script-src ([^;]*)", csp)
    assert scripts is not None
    assert len(scripts.group(1).split()) == 4  # marked, DOMPurify, highlight.js, the page
    assert all(s.startswith("'sha256-") for s in scripts.group(1).split())
    assert "unsafe" not in csp
    assert "http" not in csp
    body = page.content.decode()
    assert "vendor/" not in body  # inlined, not fetched
    assert not re.search(r"<(script|link|img)[^>]+(src|href)=\"https?:", body)
    assert "marked v18.2.1" in body
    assert "DOMPurify 3.5.0" in body
    assert "Highlight.js v11.12.0" in body


@pytest.mark.parametrize(
    ("status", "sentence", "retry"),
    [
        (401, "The provider refused the server's API key.", False),
        (404, "The provider does not know this model.", False),
        (409, "The provider could not answer. Retry in a moment.", True),
    ],
)
async def test_each_failure_says_what_to_do_and_offers_retry_only_where_it_helps(
    chromium: Browser, status: int, sentence: str, retry: bool
) -> None:
    def steps(page: Page) -> dict[str, Any]:
        page.locator("#prompt").fill("Hi")
        page.locator("#start").click()
        page.wait_for_function("() => !document.getElementById('failure').hidden")
        return {
            "sentence": page.locator("#failure-text").text_content(),
            "retry": page.locator("#retry").is_visible(),
            "outcome": page.locator("#outcome").text_content(),
            "phase": page.locator("#phase").text_content(),
        }

    reply = status_reply(status, body={"error": {"message": "provider words: sk-secret"}})
    with trio.fail_after(40):
        async with serving([reply]) as served:
            seen = await chromium.run(_in_browser(served.url, steps))
    assert seen["errors"] == []
    assert seen["sentence"].startswith(sentence)
    assert "sk-secret" not in seen["sentence"]  # never the provider's words
    assert seen["retry"] is retry
    assert seen["outcome"].startswith("Failed")
    assert seen["phase"] == ""  # no stale line about what it was waiting for
