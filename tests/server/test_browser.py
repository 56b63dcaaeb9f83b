"""The live page in a real headless browser (Debian's chromium, driven by Playwright).

The loopback provider streams an OpenAI Chat reply at a human pace; the server runs in the
test's nursery on the real clock; the browser reaches it through a small TCP proxy in the same
nursery, which sees every request and response and can cut the page's event stream mid-frame.
Playwright's sync API is asyncio underneath, so it runs in one dedicated thread (its objects
belong to the thread that made them) while trio serves.

Each test saves a screenshot under tests/artifacts/.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import attrs
import msgspec
import pytest
import trio
from rillet.transports.testing import Reply, openai_text_stream

from ..server_support import serving

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence

    from playwright.sync_api import Browser as PlaywrightBrowser
    from playwright.sync_api import Page, Playwright

pytestmark = pytest.mark.slow

ARTIFACTS = Path(__file__).parent.parent / "artifacts"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
PACE = 0.04  # seconds between the provider's frames
PROMPT = "Dis bonjour en trois langues — こんにちは? 👋"
HELLO = [
    "Hello",
    " in three languages:",
    " Bonjour ",
    "(français),",
    " こんにちは",
    " (日本語),",
    " Привет",
    " (русский) 👋",
]
LONG = [
    f"{word} "
    for word in ("один", "two", "drei", "四", "cinq", "six✓", "sept", "ocho", "九", "dix")
] * 3
VOIDED = ["Première tentative, ", "elle va ", "casser ", "ici… ", "jamais vu"]
RETRIED = ["Second attempt: ", "the stream ", "broke, ", "was retried ", "and reset ✓"]

T = TypeVar("T")


def _chromium() -> str | None:
    for candidate in (os.environ.get("RILLET_CHROMIUM"), "chromium", "chromium-browser"):
        if candidate and (path := shutil.which(candidate)):
            return path
    return None


# --- the browser ----------------------------------------------------------------------------------


class Browser:
    """Headless chromium owned by one thread: every call runs there, trio awaits it."""

    def __init__(self, executable: str) -> None:
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="chromium")
        self._playwright: Playwright | None = None
        self._browser: PlaywrightBrowser | None = None
        try:
            self._thread.submit(self._launch, executable).result()
        except BaseException:
            self.close()
            raise

    def _launch(self, executable: str) -> None:
        from playwright.sync_api import sync_playwright

        self._playwright = sync_playwright().start()
        self._browser = self._playwright.chromium.launch(
            executable_path=executable, args=CHROMIUM_ARGS, headless=True
        )

    async def run(self, drive: Callable[[PlaywrightBrowser], T]) -> T:
        """Run `drive(browser)` in the browser's thread."""
        browser = self._browser
        assert browser is not None
        future = self._thread.submit(drive, browser)
        return await trio.to_thread.run_sync(future.result, abandon_on_cancel=True)

    def close(self) -> None:
        def stop() -> None:
            if self._browser is not None:
                self._browser.close()
            if self._playwright is not None:
                self._playwright.stop()

        self._thread.submit(stop).result()
        self._thread.shutdown()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
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


# --- a proxy that sees (and can cut) the page's connections ---------------------------------------


_REQUEST_LINE = re.compile(rb"(GET|POST|DELETE|HEAD) (\S+) HTTP/1\.1\r\n")
_FRAME = re.compile(rb"id: [0-9a-f]+:(\d+)\ndata: [^\n]*\n\n")


@attrs.define(eq=False)
class Exchange:
    """One request the page sent through the proxy, and the response bytes it got back."""

    method: str
    path: str
    head: bytes
    response: bytearray = attrs.field(factory=bytearray)
    cut: bool = False

    @property
    def is_events(self) -> bool:
        return self.method == "GET" and "/events" in self.path

    def header(self, name: str) -> str | None:
        match = re.search(rb"\r\n" + name.encode() + rb": *([^\r]*)\r\n", self.head, re.IGNORECASE)
        return match.group(1).decode() if match else None

    def seqs(self) -> list[int]:
        """The seqs of the whole SSE frames the page received on this exchange."""
        return [int(m.group(1)) for m in _FRAME.finditer(self.response)]


@attrs.define(eq=False)
class Proxy:
    """A TCP proxy from the browser to the server. With `cut_after`, the first event stream is
    cut (both sockets closed) in the middle of the frame after its `cut_after`-th."""

    target: tuple[str, int]
    cut_after: int | None = None
    exchanges: list[Exchange] = attrs.field(factory=list)
    url: str = ""

    async def serve(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(
                functools.partial(trio.serve_tcp, self._handle, 0, host="127.0.0.1")
            )
            self.url = f"http://127.0.0.1:{listeners[0].socket.getsockname()[1]}"
            task_status.started()

    async def _handle(self, client: trio.SocketStream) -> None:
        upstream = await trio.open_tcp_stream(*self.target)
        current: list[Exchange] = []
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._up, client, upstream, current, nursery.cancel_scope)
                nursery.start_soon(self._down, upstream, client, current, nursery.cancel_scope)
        finally:
            with trio.CancelScope(shield=True):  # close both, even when cancelled
                await trio.aclose_forcefully(client)
                await trio.aclose_forcefully(upstream)

    async def _up(
        self,
        client: trio.SocketStream,
        upstream: trio.SocketStream,
        current: list[Exchange],
        done: trio.CancelScope,
    ) -> None:
        try:
            while data := await client.receive_some(65536):
                if match := _REQUEST_LINE.match(data):
                    head = data[: data.find(b"\r\n\r\n") + 4]
                    exchange = Exchange(match.group(1).decode(), match.group(2).decode(), head)
                    self.exchanges.append(exchange)
                    current[:] = [exchange]
                await upstream.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        done.cancel()

    async def _down(
        self,
        upstream: trio.SocketStream,
        client: trio.SocketStream,
        current: list[Exchange],
        done: trio.CancelScope,
    ) -> None:
        try:
            while data := await upstream.receive_some(65536):
                exchange = current[0] if current else None
                if exchange is not None and self._cut_here(exchange, data):
                    part = data[: len(data) // 2]
                    exchange.response += part
                    exchange.cut = True
                    await client.send_all(part)
                    break
                if exchange is not None:
                    exchange.response += data
                await client.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        done.cancel()

    def _cut_here(self, exchange: Exchange, data: bytes) -> bool:
        if self.cut_after is None or not exchange.is_events:
            return False
        if any(e.cut for e in self.exchanges):
            return False
        return len(exchange.seqs()) + data.count(b"\ndata: ") > self.cut_after

    def events_exchanges(self) -> list[Exchange]:
        return [e for e in self.exchanges if e.is_events]


# --- driving the page -----------------------------------------------------------------------------


# records every text the answer shows, as painted (a MutationObserver added before the page's
# own script runs)
_RECORDER = """
window.__shown = [];
document.addEventListener("DOMContentLoaded", () => {
  const answer = document.getElementById("answer");
  new MutationObserver(() => window.__shown.push(answer.textContent))
    .observe(answer, { childList: true, characterData: true, subtree: true });
});
"""


@attrs.frozen
class Seen:
    """What the page showed at the end of a run."""

    answer: str
    shown: list[str]
    outcome: str
    outcome_class: str
    notes: list[str]
    reset_notes: list[str]
    connection: str
    errors: list[str]


def save(page: Page, name: str) -> None:
    """Save the whole page as tests/artifacts/`name`."""
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / name), full_page=True)


def ask(
    url: str,
    prompt: str,
    screenshot: str,
    *,
    during: Callable[[Page], None] | None = None,
) -> Callable[[PlaywrightBrowser], Seen]:
    """Open the page, type `prompt`, submit, wait for the run's outcome and the digest check,
    save a screenshot, and return what the page shows."""

    def drive(browser: PlaywrightBrowser) -> Seen:
        context = browser.new_context(viewport={"width": 900, "height": 640})
        try:
            page = context.new_page()
            page.set_default_timeout(15_000)
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.on(
                "console",
                lambda msg: (
                    errors.append(msg.text) if "Content Security Policy" in msg.text else None
                ),
            )
            page.add_init_script(_RECORDER)
            page.goto(url + "/")
            page.locator("#prompt").press_sequentially(prompt)
            page.locator("#start").click()
            if during is not None:
                during(page)
            page.wait_for_function("() => document.getElementById('outcome').textContent !== ''")
            page.wait_for_function(
                "() => [...document.querySelectorAll('#events li')].some("
                "li => li.textContent.startsWith('answer '))"
            )
            page.wait_for_timeout(100)  # a painted frame after the last delta
            save(page, screenshot)
            notes = page.locator("#events li").all_text_contents()
            return Seen(
                answer=page.locator("#answer").text_content() or "",
                shown=page.evaluate("window.__shown"),
                outcome=page.locator("#outcome").text_content() or "",
                outcome_class=page.locator("#outcome").get_attribute("class") or "",
                notes=notes,
                reset_notes=page.locator("#events li.reset").all_text_contents(),
                connection=page.locator("#conn").text_content() or "",
                errors=errors,
            )
        finally:
            context.close()

    return drive


def paced(fragments: Sequence[str], **fields: Any) -> Reply:
    """An OpenAI Chat stream, one SSE frame per chunk, `PACE` seconds apart."""
    stream = openai_text_stream(list(fragments))
    frames = tuple(frame + b"\n\n" for frame in stream.split(b"\n\n") if frame)
    return Reply(chunks=frames, **{"chunk_delay": PACE, **fields})


def broken_after(fragments: Sequence[str], kept: int, pace: float) -> Reply:
    """The stream of `fragments`, `pace` seconds apart, dropped once `kept` of them were sent."""
    reply = paced(fragments, chunk_delay=pace)
    cut = sum(len(frame) for frame in reply.chunks[: 1 + kept])
    return attrs.evolve(reply, drop_after_bytes=cut)


def prefixes(text: str) -> set[str]:
    return {text[:n] for n in range(len(text) + 1)}


# --- tests ----------------------------------------------------------------------------------------


async def test_the_page_streams_a_prompts_answer_exactly(browser: Browser) -> None:
    expected = "".join(HELLO)
    with trio.fail_after(30):
        async with serving([paced(HELLO)]) as served, trio.open_nursery() as nursery:
            proxy = Proxy(_address(served.url))
            await nursery.start(proxy.serve)
            seen = await browser.run(ask(proxy.url, PROMPT, "browser-answer.png"))
            sent = served.loopback.requests[0].body
            nursery.cancel_scope.cancel()
    assert seen.errors == []
    assert seen.answer == expected
    assert re.fullmatch(r"Answered in [\d.]+ m?s", seen.outcome), seen.outcome
    assert seen.outcome_class == "done-ok"
    assert "answer verified (sha256)" in seen.notes
    assert seen.reset_notes == []
    assert seen.connection == "done"
    # the text grew fragment by fragment: the page showed it while it streamed
    assert len({s for s in seen.shown if s and s != expected}) >= 3
    assert all(shown in prefixes(expected) for shown in seen.shown)
    # the prompt reached the provider as typed, multi-byte characters and all
    assert PROMPT in str(msgspec.json.decode(sent)["messages"])


async def test_a_cut_event_stream_resumes_without_loss_or_duplicate(browser: Browser) -> None:
    expected = "".join(LONG)

    def reconnecting(page: Page) -> None:  # the page says so while the browser reconnects
        page.wait_for_function(
            "() => document.getElementById('conn').textContent === 'reconnecting…'"
        )
        save(page, "browser-reconnecting.png")

    with trio.fail_after(30):
        async with serving([paced(LONG)]) as served, trio.open_nursery() as nursery:
            proxy = Proxy(_address(served.url), cut_after=8)
            await nursery.start(proxy.serve)
            seen = await browser.run(
                ask(proxy.url, "Count in ten languages", "browser-resume.png", during=reconnecting)
            )
            streams = proxy.events_exchanges()
            run_id = streams[0].path.split("/")[3]
            log = served.log(run_id)
            nursery.cancel_scope.cancel()
    assert seen.errors == []
    assert seen.answer == expected
    assert re.fullmatch(r"Answered in [\d.]+ m?s", seen.outcome), seen.outcome
    assert "answer verified (sha256)" in seen.notes
    assert all(shown in prefixes(expected) for shown in seen.shown)
    # the first stream was cut mid-frame after its 8th event, while the run was still going
    assert len(streams) == 2
    first, second = streams
    assert first.cut
    kept = len(first.seqs())
    assert kept >= 8
    assert first.seqs() == list(range(1, kept + 1))
    assert not first.response.endswith(b"\n\n")  # a partial frame, which the page discards
    assert first.header("last-event-id") is None
    # the browser resumed from the last whole frame, and the server went on right after it
    assert second.header("last-event-id") == f"{run_id}:{kept}"
    assert second.seqs() == list(range(kept + 1, len(log) + 1))
    assert b'"type":"answer.delta"' in bytes(second.response)  # resumed before the answer ended


async def test_a_retry_visibly_clears_the_voided_text(browser: Browser) -> None:
    expected = "".join(RETRIED)
    voided = "".join(VOIDED[:3])

    def shows_voided(page: Page) -> None:
        page.wait_for_function(
            "(text) => document.getElementById('answer').textContent === text", arg=voided
        )
        save(page, "browser-before-retry.png")

    # the broken attempt is slow enough for a screenshot of its text
    script = [broken_after(VOIDED, kept=3, pace=0.3), paced(RETRIED)]
    with trio.fail_after(30):
        async with serving(script) as served, trio.open_nursery() as nursery:
            proxy = Proxy(_address(served.url))
            await nursery.start(proxy.serve)
            seen = await browser.run(
                ask(proxy.url, "Break, then retry", "browser-retry.png", during=shows_voided)
            )
            attempts = len(served.loopback.requests)
            nursery.cancel_scope.cancel()
    assert attempts == 2
    assert seen.errors == []
    assert seen.answer == expected
    assert re.fullmatch(r"Answered in [\d.]+ m?s, after 1 retry", seen.outcome), seen.outcome
    assert "answer verified (sha256)" in seen.notes
    assert seen.reset_notes == ["attempt 2 starts over: the earlier text is void"]
    # the voided text was on screen, then replaced (never continued) by the retried text
    assert voided in seen.shown
    after = seen.shown[seen.shown.index(voided) + 1 :]
    assert after
    assert all(shown in prefixes(expected) for shown in after)
    assert all(shown in prefixes(voided) | prefixes(expected) for shown in seen.shown)


def _address(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    return host, int(port)
