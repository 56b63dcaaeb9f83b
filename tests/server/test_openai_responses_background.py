"""Background responses on `rillet serve`'s `/v1/responses`, with the `openai` SDK as the
client: a streamed one read in part, left, and resumed with `retrieve(stream=True,
starting_after=N)` gives every event once and the answer whole, for one provider request; a
whole one is answered `queued` at once and retrieved when done; a cancelled one stops its
provider request; an id the server does not keep is the SDK's `NotFoundError`."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest
import trio

from .test_openai_interop import sdk_python
from .test_openai_responses_sdk import run_sdk

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.slow

CLIENT = r"""
import json, sys, time
import openai
from openai import OpenAI

spec = json.load(sys.stdin)
client = OpenAI(base_url=spec["base_url"], api_key=spec["key"], max_retries=0, timeout=30)
model = spec["model"]
out = {}

seen = []
stream = client.responses.create(model=model, input="Say hello, in the background",
                                 stream=True, background=True)
for event in stream:
    seen.append(event)
    if event.type == "response.output_text.delta":
        break  # the reader leaves (a dropped network)
stream.close()
response_id = seen[0].response.id
last = seen[-1].sequence_number
rest = list(client.responses.retrieve(response_id, stream=True, starting_after=last))
events = seen + rest
out["resumed"] = {
    "seq": [e.sequence_number for e in events],
    "text": "".join(e.delta for e in events if e.type == "response.output_text.delta"),
    "last": events[-1].type, "first_of_rest": rest[0].sequence_number,
    "background": seen[0].response.background,
}
whole = client.responses.retrieve(response_id)
out["retrieved"] = {"status": whole.status, "text": whole.output_text}

queued = client.responses.create(model=model, input="Say hello, whole in the background",
                                 background=True)
status = [queued.status]
for _ in range(200):
    polled = client.responses.retrieve(queued.id)
    status.append(polled.status)
    if polled.status in ("completed", "failed", "incomplete", "cancelled"):
        break
    time.sleep(0.02)
out["polled"] = {"first": status[0], "last": status[-1], "text": polled.output_text}

slow = client.responses.create(model=model, input="SLOW story, in the background",
                               background=True)
out["cancelled"] = client.responses.cancel(slow.id).status

try:
    client.responses.retrieve("resp_never_made")
    out["unknown"] = None
except openai.APIError as exc:
    out["unknown"] = {"class": type(exc).__name__, "status": exc.status_code}
json.dump(out, sys.stdout)
"""


async def _collect(python: Path) -> dict[str, Any]:
    out, loopback = await run_sdk(python, CLIENT)
    # the cancelled one may be stopped before its request went out: the others are counted
    said = [json.loads(r.body)["messages"][-1]["content"] for r in loopback.requests]
    out["_requests"] = len([s for s in said if "SLOW" not in s])
    return out


@pytest.fixture(scope="module")
def sdk() -> dict[str, Any]:
    return trio.run(_collect, sdk_python())


def test_a_left_stream_resumes_after_its_last_event_with_every_event_once(
    sdk: dict[str, Any],
) -> None:
    resumed = sdk["resumed"]
    assert resumed["seq"] == list(range(len(resumed["seq"])))  # no gap, no repeat
    assert resumed["text"] == "Hello, world!"
    assert resumed["last"] == "response.completed"
    assert resumed["background"] is True
    assert sdk["retrieved"] == {"status": "completed", "text": "Hello, world!"}


def test_a_whole_background_response_is_queued_then_retrieved(sdk: dict[str, Any]) -> None:
    polled = sdk["polled"]
    assert polled["first"] == "queued"
    assert (polled["last"], polled["text"]) == ("completed", "Hello, world!")


def test_cancel_and_an_unknown_id(sdk: dict[str, Any]) -> None:
    assert sdk["cancelled"] == "cancelled"
    assert sdk["unknown"] == {"class": "NotFoundError", "status": 404}
    assert sdk["_requests"] == 2  # one provider request per response, resumed or not
