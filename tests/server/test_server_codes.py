"""One code per cause on every wire the server speaks: a real server on loopback in front of a
provider that refuses, and the same safe code in the runs API's `run.done`, the AI SDK UI
stream's error part, the OpenAI-compatible endpoint's error object and MMSP's; the provider's
own words in none of them."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
import trio
from rillet import RUN_CODES, RunDone
from rillet.transports.testing import Reply, status_reply

from ..server_support import PROVIDER_KEY, read_sse, serving

SAID = f"Incorrect API key provided: {PROVIDER_KEY}"


def refusal(status: int, kind: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": SAID, "type": kind, "code": code}}


CASES: list[tuple[str, Reply, int, str]] = [
    ("401", status_reply(401, body=refusal(401)), 401, "authentication_failed"),
    ("403", status_reply(403, body=refusal(403)), 403, "permission_denied"),
    ("404", status_reply(404, body=refusal(404, code="model_not_found")), 404, "model_not_found"),
    (
        "429-quota",
        status_reply(429, body=refusal(429, "insufficient_quota", "insufficient_quota")),
        429,
        "quota_exceeded",
    ),
    ("503", status_reply(503, body=refusal(503), retry_after=3600), 503, "provider_unavailable"),
]
HI = [{"id": "u", "role": "user", "parts": [{"type": "text", "text": "hi"}]}]


@pytest.mark.parametrize(("name", "reply", "status", "code"), CASES, ids=[c[0] for c in CASES])
async def test_every_wire_carries_the_same_code(
    name: str, reply: Reply, status: int, code: str
) -> None:
    with trio.fail_after(10):
        async with serving([reply], provider_key=PROVIDER_KEY) as served:
            run = await served.start()
            events = await read_sse(served.client, run["events_url"])
            ui = await served.client.post("/v1/ui/chat", json={"messages": HI})
            chat = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}
            openai = await served.client.post("/v1/chat/completions", json=chat)
            streamed = await served.client.post(
                "/v1/chat/completions", json={**chat, "stream": True}
            )
            mmsp = await served.client.post(
                "/v1/stream",
                json={
                    "model": "gpt-4o-mini",
                    "messages": [
                        {"role": "user", "content_items": [{"type": "text.done", "text": "hi"}]}
                    ],
                },
            )
    done = events.run_events[-1]
    assert isinstance(done, RunDone)
    assert (done.code, done.retryable) == (code, RUN_CODES[code].retryable)
    parts = [
        msgspec.json.decode(line.removeprefix("data: "))
        for line in ui.text.split("\n\n")
        if line.startswith("data: {")
    ]
    assert parts[-1]["type"] == "error"
    assert parts[-1]["errorText"] == f"{code}: {RUN_CODES[code].sentence}"
    # the provider's refusal of the server's own key is no 401/403 of the client's on OpenAI's
    # wire, whose SDK would raise AuthenticationError: the code still says why
    wanted = 502 if status in (401, 403) else status
    assert (openai.status_code, openai.json()["error"]["code"]) == (wanted, code)
    assert (streamed.status_code, streamed.json()["error"]["code"]) == (wanted, code)
    assert (mmsp.status_code, mmsp.json()["error"]["code"]) == (status, code)
    for wire in (b"".join(e.data.encode() for e in events.events), ui.content, openai.content):
        if status != 404:  # a refused request's words (an unknown model's) go on, key masked
            assert b"Incorrect API key" not in wire
        assert PROVIDER_KEY.encode() not in wire
