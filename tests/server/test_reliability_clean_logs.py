"""S30: a client that closes its connection as soon as it has read a complete reply is an
ordinary client: the server's log gets no ERROR and no traceback for it, while a fault of the
server's own is still logged.

The clients read each reply to its last byte (parsed with h11, as a client's HTTP library
does) and close at once, over raw sockets and over httpx, for whole replies (a
`Content-Length` body) and streamed ones (chunked event streams). Closing right after the last
byte races the server's end of the response: its check of whether the client left (an SSE
comment, a `100 Continue`) can run before the response's own last step does.
"""

from __future__ import annotations

import logging
from typing import Any

import h11
import httpx
import msgspec
import pytest
import trio
from rillet._core._encode import sse_json
from rillet.transports.server import _openai

from ..server_support import Served, serving, text_reply
from .test_server_mmsp import body as mmsp_body

ROUNDS = 10  # rounds of every kind of client, side by side; each round a new connection each
WORDS = [f"w{n} " for n in range(8)]


def chat_body(*, stream: bool) -> bytes:
    return msgspec.json.encode(
        {"model": "gpt-4o-mini", "stream": stream, "messages": [{"role": "user", "content": "Hi"}]}
    )


def post(path: str, body: bytes) -> h11.Request:
    headers = [("host", "127.0.0.1"), ("content-type", "application/json")]
    headers.append(("content-length", str(len(body))))
    return h11.Request(method="POST", target=path, headers=headers)


async def read_and_close(url: str, request: h11.Request, body: bytes = b"") -> tuple[int, bytes]:
    """Send one request on a new raw connection, read its response to the last byte, and close
    the connection that instant; the status and the body."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    client = h11.Connection(h11.CLIENT)
    stream = await trio.open_tcp_stream(host, int(port))
    status, received = 0, bytearray()
    try:
        wire = bytearray()
        for sent in (request, *([h11.Data(data=body)] if body else []), h11.EndOfMessage()):
            wire += client.send(sent) or b""
        await stream.send_all(wire)
        while True:
            event = client.next_event()
            if event is h11.NEED_DATA:
                client.receive_data(await stream.receive_some(65536))
            elif isinstance(event, h11.Response):
                status = event.status_code
            elif isinstance(event, h11.Data):
                received += event.data
            elif isinstance(event, h11.EndOfMessage):
                break
    finally:
        await trio.aclose_forcefully(stream)  # at once, with no wait for anything more
    return status, bytes(received)


async def httpx_read_and_close(url: str, path: str, body: bytes) -> tuple[int, bytes]:
    """The same with httpx: a client of its own, closed as soon as the reply is read."""
    async with httpx.AsyncClient(base_url=url, timeout=None) as client:
        answer = await client.post(path, content=body, headers={"content-type": "application/json"})
    return answer.status_code, answer.content


async def gone(served: Served) -> None:
    """Until the server has seen every client but the test's own go."""
    while (await served.client.get("/metrics.json")).json()["connections"] > 1:  # noqa: ASYNC110
        await trio.sleep(0.01)  # (no event says a connection closed)


def errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


async def test_s30_clients_that_close_after_a_complete_reply_log_no_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, "rillet")
    whole, streamed = chat_body(stream=False), chat_body(stream=True)
    mmsp = msgspec.json.encode(mmsp_body())
    kinds = [
        ("raw whole", "/v1/chat/completions", whole),
        ("raw chunks", "/v1/chat/completions", streamed),
        ("raw mmsp", "/v1/stream", mmsp),
        ("httpx whole", "/v1/chat/completions", whole),
        ("httpx chunks", "/v1/chat/completions", streamed),
        ("raw events", "", b""),  # the run's events, read after it ended
    ]
    script = [text_reply(WORDS) for _ in range(ROUNDS * len(kinds) + 1)]
    answers: list[tuple[str, int, bytes]] = []

    async def one(url: str, name: str, path: str, body: bytes) -> None:
        if name.startswith("httpx"):
            answer = await httpx_read_and_close(url, path, body)
        elif body:
            answer = await read_and_close(url, post(path, body), body)
        else:
            request = h11.Request(method="GET", target=path, headers=[("host", "127.0.0.1")])
            answer = await read_and_close(url, request)
        answers.append((name, *answer))

    with trio.fail_after(60):
        async with serving(script) as served:
            run = await served.start()
            await served.wait_for(run["run_id"])
            events = "/" + run["events_url"].split("://", 1)[1].partition("/")[2]
            for _ in range(ROUNDS):
                async with trio.open_nursery() as nursery:
                    for name, path, body in kinds:
                        nursery.start_soon(one, served.url, name, path or events, body)
            await gone(served)
    assert len(answers) == ROUNDS * len(kinds)
    for name, status, body in answers:
        assert status == 200, (name, body)
        if "whole" in name:
            assert msgspec.json.decode(body)["choices"][0]["message"]["content"] == "".join(WORDS)
        elif name == "raw events":
            assert b'"type":"run.done"' in body
        else:
            assert body.rstrip().endswith(b"data: [DONE]"), (name, body[-80:])
    assert errors(caplog) == []
    assert "Traceback" not in caplog.text


async def test_s30_a_fault_of_the_servers_own_is_still_logged(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The quiet is for clients that leave, not for bugs: a reply the server fails to build,
    before its head and after it, still logs an ERROR with its traceback."""

    def broken_whole(*_: object, **__: object) -> dict[str, Any]:
        raise RuntimeError("a bug in building the whole reply")

    def broken_stop(value: Any) -> bytes:
        if value.get("choices", [{}])[0].get("finish_reason") == "stop":
            raise RuntimeError("a bug in building the last chunk")
        return sse_json(value)

    monkeypatch.setattr(_openai, "completion", broken_whole)
    monkeypatch.setattr(_openai, "sse_json", broken_stop)
    caplog.set_level(logging.DEBUG, "rillet")
    whole, streamed = chat_body(stream=False), chat_body(stream=True)
    script = [text_reply(WORDS, chunk_delay=0.01) for _ in range(2)]
    with trio.fail_after(20):
        async with serving(script) as served:
            failed, _ = await read_and_close(served.url, post("/v1/chat/completions", whole), whole)
            with pytest.raises(h11.RemoteProtocolError):  # cut off mid-stream, as it must be
                await read_and_close(served.url, post("/v1/chat/completions", streamed), streamed)
            await gone(served)
    assert failed == 500
    logged = errors(caplog)
    assert "POST /v1/chat/completions failed" in logged
    assert "connection failed" in logged
    assert "a bug in building the whole reply" in caplog.text
    assert "a bug in building the last chunk" in caplog.text
