"""`rillet demo`: everything rillet does, against an embedded provider, with no key.

An embedded provider on 127.0.0.1 streams recorded-style replies over real HTTP at a realistic
pace: an agent whose reasoning model thinks, calls a tool, gets its result and answers
(Anthropic's wire); a plain answer with multi-byte text (OpenAI Chat's wire); a reply that breaks
off mid-stream, is retried and visibly reset; and an agent whose tool needs approval (approved by
the demo itself, where `rillet run --tools demo` asks y/N). Each turn runs through the full
pipeline and prints live in the terminal; the live page is served too (its URL is printed),
answering any prompt from the same embedded provider, with the demo tools (ask it about the
weather, or to delete a file). The demo ends by itself after the scripted turns; with
`keep_serving` (what `make demo` passes) the page stays up until Ctrl-C, and the demo says so.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import trio

from .._agent._demo_tools import demo_tools
from .._agent._loop import run_agent
from .._core._dialect import Provider
from .._core._policy import Policy
from .._core._request import TurnRequest, user
from .._turn._api import run_turn
from ._agent import AgentTerminal, answer_approvals

__all__ = ["run_demo"]


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
        agent: Reply | None = _agent_reply(json.loads(body or "{}"), pace)
        if agent is not None:
            return agent
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


def _chat_call(name: str, arguments: dict[str, Any]) -> bytes:
    """An OpenAI Chat stream that calls one tool."""
    from rillet.transports.testing import sse

    head = {"id": "chatcmpl-demo", "object": "chat.completion.chunk", "created": 1}
    head["model"] = "gpt-demo"

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    call = {"index": 0, "id": f"call_demo_{name}", "type": "function"}
    call["function"] = {"name": name, "arguments": json.dumps(arguments)}
    frames = [chunk({"role": "assistant", "content": ""}), chunk({"tool_calls": [call]})]
    return sse(*frames, chunk({}, "tool_calls")) + sse("[DONE]")


def _text_of(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):
        return " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return str(content or "")


def _agent_reply(body: dict[str, Any], pace: float) -> Any:
    """What the embedded model says to an agent's request (one that offers the demo tools):
    a tool call for a question one of them answers, then an answer from the tool's result.
    None for anything else."""
    from rillet.transports.testing import Reply, openai_text_stream

    messages = body.get("messages") or []
    offered = {t.get("function", {}).get("name") for t in body.get("tools") or []}
    if not messages or "get_weather" not in offered:
        return None
    last = messages[-1]
    if last.get("role") == "tool":
        said = _text_of(last)
        words = (
            ["The tool", " says: ", said, "."]
            if not said.startswith("denied")
            else ["Understood:", " I left it", " alone."]
        )
        return Reply(chunks=_per_event(openai_text_stream(words)), chunk_delay=pace)
    prompt = _text_of(last).lower()
    words = prompt.replace("?", " ").replace(",", " ").split()
    if "delete" in words or "remove" in words:
        target = next((w for w in words if "." in w), "notes.txt")
        call = _chat_call("delete_file", {"path": target})
    elif "weather" in words:
        city = words[words.index("in") + 1].title() if "in" in words[:-1] else "Paris"
        call = _chat_call("get_weather", {"city": city})
    elif "time" in words:
        call = _chat_call("get_time", {"timezone": "Europe/Paris"})
    else:
        return None
    return Reply(chunks=_per_event(call), chunk_delay=pace)


def _approve(question: str) -> bool:
    """The demo's answer to an approval: yes, said on stderr (`rillet run` asks y/N)."""
    shown = question.removeprefix("rillet: ").split(" needs your approval")[0]
    print(
        f"  (the demo approves {shown}; rillet run --tools demo asks y/N on a terminal)",
        file=sys.stderr,
    )
    return True


def _say(text: str) -> None:
    print(f"\n\x1b[1m» {text}\x1b[0m" if sys.stderr.isatty() else f"\n» {text}", file=sys.stderr)


async def run_demo(*, keep_serving: bool = False, port: int = 0, fast: bool = False) -> int:
    """Run the scripted turns against the embedded provider; return the exit code."""
    from rillet.transports.sinks import TerminalSink
    from rillet.transports.testing import open_loopback_provider

    from ..providers import AnthropicDialect, OpenAIChatDialect

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
        # 1. an agent: a reasoning model thinks, calls a tool, and answers with its result
        _say("An agent: a reasoning model thinks, calls a tool, then answers (Anthropic wire)")
        first = await run_agent(
            TurnRequest(messages=[user("What's the weather in Paris?")], thinking_level="low"),
            claude,
            tools=demo_tools(),
            sinks=[AgentTerminal(TerminalSink(show_reasoning=True))],
            policy=policy,
            reasoning=True,
            tool_arguments=True,
        )
        ok &= first.ok
        calls = [o.call for o in first.tool_outputs if o.status == "ok"]

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

        # 4. an agent whose tool needs approval: asked, approved, run, answered
        _say("A tool that needs approval: the agent waits for a yes (OpenAI Chat wire)")
        async with trio.open_nursery() as approvals:
            agent = await approvals.start(
                lambda task_status: run_agent(
                    TurnRequest(messages=[user("Please delete notes.txt")]),
                    chat,
                    tools=demo_tools(),
                    sinks=[AgentTerminal(TerminalSink())],
                    policy=policy,
                    tool_arguments=True,
                    task_status=task_status,
                )
            )
            approvals.start_soon(answer_approvals, agent, _approve)
            approved = await agent.result()
            approvals.cancel_scope.cancel()
        ok &= approved.ok and [o.status for o in approved.tool_outputs] == ["ok"]

        print(
            f"\nrillet demo: {'all turns completed' if ok else 'a turn failed'} "
            f"(tool run {calls[0].name if calls else 'missing'}; "
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
    config = ServerConfig(
        port=port,
        provider=provider,
        models=[provider.model],
        reasoning=True,
        tool_arguments=True,
        tools="demo",
    )
    url: str = await nursery.start(lambda task_status: serve(config, task_status=task_status))
    return url
