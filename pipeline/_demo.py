"""`rillet demo`: everything rillet does, against an embedded provider, with no key.

An embedded provider on 127.0.0.1 streams recorded-style replies over real HTTP at a realistic
pace: a reasoning model that thinks, calls a tool and then answers (Anthropic's wire); a plain
answer with multi-byte text (OpenAI Chat's wire); and a reply that breaks off mid-stream, is
retried and visibly reset. Each turn runs through the full pipeline and prints live in the
terminal; the live page is served too (its URL is printed), answering any prompt from the same
embedded provider. The demo ends by itself after the scripted turns; with `keep_serving` (what
`make demo` passes) the page stays up until Ctrl-C, and the demo says so.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import trio

from ._events import ToolCallDone, ToolResultDone, UniMessage
from ._policy import Policy
from ._request import ToolSpec, TurnRequest, user
from ._turn import run_turn
from .providers._base import Provider

__all__ = ["run_demo"]

WEATHER = ToolSpec(
    name="get_weather",
    description="Current weather for a city.",
    parameters={"type": "object", "properties": {"city": {"type": "string"}}},
)


def _anthropic_events(blocks: list[tuple[str, list[str], dict[str, Any]]], stop: str) -> bytes:
    """An Anthropic Messages stream: one block per (type, fragments, start fields)."""

    def ev(name: str, body: dict[str, Any]) -> str:
        return f"event: {name}\ndata: {json.dumps(body, ensure_ascii=False)}\n\n"

    usage = {"input_tokens": 96, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
    out = [
        ev(
            "message_start",
            {
                "type": "message_start",
                "message": {
                    "id": "msg_demo",
                    "type": "message",
                    "role": "assistant",
                    "model": "claude-demo",
                    "content": [],
                    "stop_reason": None,
                    "usage": {**usage, "output_tokens": 1},
                },
            },
        )
    ]
    for index, (kind, fragments, start) in enumerate(blocks):
        out.append(
            ev(
                "content_block_start",
                {"type": "content_block_start", "index": index, "content_block": start},
            )
        )
        for fragment in fragments:
            delta = {
                "thinking": {"type": "thinking_delta", "thinking": fragment},
                "text": {"type": "text_delta", "text": fragment},
                "tool_use": {"type": "input_json_delta", "partial_json": fragment},
            }[kind]
            out.append(
                ev(
                    "content_block_delta",
                    {"type": "content_block_delta", "index": index, "delta": delta},
                )
            )
        if kind == "thinking":
            sig = {"type": "signature_delta", "signature": "ZGVtby1zaWduYXR1cmU="}
            out.append(
                ev(
                    "content_block_delta",
                    {"type": "content_block_delta", "index": index, "delta": sig},
                )
            )
        out.append(ev("content_block_stop", {"type": "content_block_stop", "index": index}))
    out.append(ev("ping", {"type": "ping"}))
    out.append(
        ev(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop, "stop_sequence": None},
                "usage": {"output_tokens": 58},
            },
        )
    )
    out.append(ev("message_stop", {"type": "message_stop"}))
    return "".join(out).encode()


def _per_event(data: bytes) -> tuple[bytes, ...]:
    """One chunk per SSE event, as a provider flushes them."""
    return tuple(part + b"\n\n" for part in data.split(b"\n\n") if part)


THINK_AND_CALL = _anthropic_events(
    [
        (
            "thinking",
            ["The user wants", " the weather in Paris.", " I should call", " get_weather."],
            {"type": "thinking", "thinking": "", "signature": ""},
        ),
        (
            "tool_use",
            ["", '{"city"', ': "Paris"}'],
            {"type": "tool_use", "id": "toolu_demo_1", "name": "get_weather", "input": {}},
        ),
    ],
    "tool_use",
)
ANSWER_AFTER_TOOL = _anthropic_events(
    [
        (
            "text",
            ["It is ", "18 °C", " in Paris", " with light rain", " — take", " an umbrella ☂️."],
            {"type": "text", "text": ""},
        )
    ],
    "end_turn",
)
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
RETRIED = [
    "Streams break.",
    " When one does,",
    " rillet retries,",
    " resets what you saw,",
    " and shows",
    " every token",
    " exactly once.",
]


def _script(pace: float) -> Any:
    from rillet.transports.testing import Reply, openai_text_stream

    state = {"chat": 0}

    def reply(request: Any, n: int) -> Reply:
        del n
        if request.path.endswith("/v1/messages"):
            has_result = b"tool_result" in request.body
            data = ANSWER_AFTER_TOOL if has_result else THINK_AND_CALL
            return Reply(chunks=_per_event(data), chunk_delay=pace)
        body = request.body.decode("utf-8", "replace")
        if "break" in body:
            state["chat"] += 1
            stream = openai_text_stream(RETRIED)
            if state["chat"] % 2 == 1:  # the first try breaks off half way
                return Reply(
                    chunks=_per_event(stream), chunk_delay=pace, drop_after_bytes=len(stream) // 2
                )
            return Reply(chunks=_per_event(stream), chunk_delay=pace)
        return Reply(chunks=_per_event(openai_text_stream(HELLO)), chunk_delay=pace)

    return reply


def _say(text: str) -> None:
    print(f"\n\x1b[1m» {text}\x1b[0m" if sys.stderr.isatty() else f"\n» {text}", file=sys.stderr)


async def run_demo(*, keep_serving: bool = False, port: int = 0, fast: bool = False) -> int:
    """Run the scripted turns against the embedded provider; return the exit code."""
    from rillet.transports.sinks import TerminalSink
    from rillet.transports.testing import open_loopback_provider

    from .providers import AnthropicDialect, OpenAIChatDialect

    pace = 0.0 if fast else 0.06
    policy = Policy(backoff_base=0.3)
    async with open_loopback_provider(_script(pace)) as embedded, trio.open_nursery() as nursery:
        claude = Provider(AnthropicDialect(), embedded.url, "claude-demo", name="embedded")
        chat = Provider(OpenAIChatDialect(), embedded.url + "/v1", "gpt-demo", name="embedded")
        page = await _start_page(nursery, chat, port)
        if page:
            until = " (it stays up until Ctrl-C)" if keep_serving else ""
            print(f"rillet demo: the live page is at {page}/{until}", file=sys.stderr, flush=True)

        ok = True
        # 1. a reasoning model thinks, calls a tool, and answers with its result
        question = user("What's the weather in Paris?")
        _say("A reasoning model thinks, calls a tool, then answers (Anthropic wire)")
        first = await run_turn(
            TurnRequest(messages=[question], tools=[WEATHER], thinking_level="low"),
            claude,
            sinks=[TerminalSink(show_reasoning=True)],
            policy=policy,
            reasoning=True,
        )
        ok &= first.ok
        calls = [i for i in first.message.content_items if isinstance(i, ToolCallDone)]
        results: list[Any] = []
        for call in calls:
            print(f"  (running {call.name}({json.dumps(call.arguments)}))", file=sys.stderr)
            results.append(ToolResultDone(text="18 °C, light rain", tool_call_id=call.tool_call_id))
        second = await run_turn(
            TurnRequest(
                messages=[question, first.message, UniMessage(role="user", content_items=results)],
                tools=[WEATHER],
            ),
            claude,
            sinks=[TerminalSink()],
            policy=policy,
        )
        ok &= second.ok

        # 2. plain text with multi-byte characters
        _say("Plain text with multi-byte characters (OpenAI Chat wire)")
        hello = await run_turn(
            TurnRequest(messages=[user("Say hello in three languages")]),
            chat,
            sinks=[TerminalSink()],
            policy=policy,
        )
        ok &= hello.ok

        # 3. a stream that breaks off and is retried, with a visible reset
        _say("A stream breaks off mid-answer; rillet retries and resets it")
        retried = await run_turn(
            TurnRequest(messages=[user("Show what happens when a stream will break")]),
            chat,
            sinks=[TerminalSink()],
            policy=policy,
        )
        ok &= retried.ok and retried.attempts == 2 and retried.text == "".join(RETRIED)

        print(
            f"\nrillet demo: {'all turns completed' if ok else 'a turn failed'} "
            f"(tool call {calls[0].name if calls else 'missing'}; "
            f"retry: {retried.attempts} attempts, text exact: {retried.text == ''.join(RETRIED)})",
            file=sys.stderr,
        )
        if keep_serving and page:
            print(
                f"rillet demo: the live page is still at {page}/ — open it, ask anything; "
                "Ctrl-C stops it",
                file=sys.stderr,
                flush=True,
            )
            await trio.sleep_forever()
        nursery.cancel_scope.cancel()
    return 0 if ok else 1


async def _start_page(nursery: trio.Nursery, provider: Provider, port: int) -> str | None:
    try:
        from rillet.transports.server import ServerConfig, serve
    except ImportError:
        return None
    config = ServerConfig(port=port, provider=provider, models=[provider.model], reasoning=True)
    url: str = await nursery.start(lambda task_status: serve(config, task_status=task_status))
    return url
