"""The loopback provider in a process of its own, for the load tier: the pipeline under test
then has the test process's CPU to itself.

    python -m tests.load._provider --chunks 500 [--gap 0.0] [--per-chunk 1] [--tool NAME]

Serves Chat Completions streams of `--chunks` text deltas (the n-th delta is `t<n> `), each
delta its own SSE event, `--per-chunk` events to a chunk written every `--gap` seconds; a
request without `"stream": true` gets the matching non-streaming body. With `--tool`, a
request that brings no tool result first gets a call to that tool (`{"city": "Paris"}`) and
one that brings a result the streamed reply: an agent run's two steps. Prints `PORT <n>` once
listening, serves until its standard input closes.
"""

from __future__ import annotations

import argparse
import sys

import trio
from rillet.transports.testing import (
    RecordedRequest,
    Reply,
    open_loopback_provider,
    openai_text_body,
    openai_text_stream,
)

from ..cli.test_cli_agents import calls


def fragments(count: int) -> list[str]:
    """The deltas of a reply with `count` of them."""
    return [f"t{i} " for i in range(count)]


def stream_reply(count: int, per_chunk: int = 1, gap: float = 0.0) -> Reply:
    """The streamed reply: `count` deltas, `per_chunk` SSE events to a chunk."""
    data = openai_text_stream(fragments(count))
    frames = [f + b"\n\n" for f in data.split(b"\n\n") if f]
    chunks = tuple(b"".join(frames[i : i + per_chunk]) for i in range(0, len(frames), per_chunk))
    return Reply(chunks=chunks, chunk_delay=gap)


async def main(count: int, per_chunk: int, gap: float, tool: str | None = None) -> None:
    streamed = stream_reply(count, per_chunk, gap)
    whole = Reply(
        chunks=(openai_text_body("".join(fragments(count))),), content_type="application/json"
    )

    def script(request: RecordedRequest, n: int) -> Reply:
        if tool is not None and b'"role":"tool"' not in request.body.replace(b" ", b""):
            return Reply(chunks=(calls(tool, {"city": "Paris"}),))
        return streamed if b'"stream":true' in request.body else whole

    async with open_loopback_provider(script) as provider:
        print(f"PORT {provider.url.rsplit(':', 1)[1]}", flush=True)
        stdin = trio.lowlevel.FdStream(sys.stdin.fileno())
        while await stdin.receive_some(1024):
            pass


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--chunks", type=int, default=500)
    parser.add_argument("--per-chunk", type=int, default=1)
    parser.add_argument("--gap", type=float, default=0.0)
    parser.add_argument("--tool", default=None)
    args = parser.parse_args()
    trio.run(main, args.chunks, args.per_chunk, args.gap, args.tool)
