"""S28: reading a run and acting on it are different rights, on a real server on loopback.

The read token is in the events URL (browser history, proxy logs): with it, or with nothing,
approving, denying and cancelling get the same 404 as a run that does not exist. The act token,
which only the response that started the run carries, and the server key may act.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import trio
from rillet._core._dialect import Secret
from rillet._core._runevents import ApprovalResolved, RunDone

from ..cli.test_cli_agents import tool_then_answer
from ..server_support import Served, act, read_sse, serving
from .test_server_approvals import answer_url, approval_of

if TYPE_CHECKING:
    import httpx

KEY = "server-key-0123456789abcdef"
SCRIPT = tool_then_answer("delete_file", {"path": "notes.txt"})
UNKNOWN = "ab" * 12  # a run id no run has


def bearer(credential: str) -> dict[str, str]:
    return {"authorization": f"Bearer {credential}"}


async def attempts(served: Served, run: dict[str, str], approval_id: str) -> list[httpx.Response]:
    """Every way to act on `run` with its read token or with nothing, and the same on a run
    that does not exist; none may change anything."""
    read, run_id = run["token"], run["run_id"]
    answers: list[httpx.Response] = []
    for target in (run_id, UNKNOWN):
        url = answer_url({"run_id": target}, approval_id)
        for approve in (True, False):
            body: dict[str, Any] = {"approve": approve}
            answers.append(await served.client.post(url, json=body, headers=bearer(read)))
            answers.append(await served.client.post(f"{url}?token={read}", json=body))
            answers.append(await served.client.post(url, json=body))
        answers.append(await served.client.delete(f"/v1/runs/{target}", headers=bearer(read)))
        answers.append(await served.client.delete(f"/v1/runs/{target}?token={read}"))
        answers.append(await served.client.delete(f"/v1/runs/{target}"))
    return answers


async def test_s28_the_read_token_acts_no_more_than_an_unknown_run_and_the_act_token_does() -> None:
    with trio.fail_after(30):
        async with serving(SCRIPT, tools="demo") as served:
            run = await served.start("delete notes.txt")
            approval_id = await approval_of(served, run)
            refused = await attempts(served, run, approval_id)
            approved = await served.client.post(
                answer_url(run, approval_id), json={"approve": True}, headers=act(run)
            )
            stream = await read_sse(served.client, run["events_url"])
            other = await served.start("delete notes.txt")
            await approval_of(served, other)
            cancelled = await served.client.delete(f"/v1/runs/{other['run_id']}", headers=act(run))
            stopped = await served.client.delete(f"/v1/runs/{other['run_id']}", headers=act(other))
            other_stream = await read_sse(served.client, other["events_url"])
    assert {r.status_code for r in refused} == {404}
    assert len({r.content for r in refused}) == 1  # the read token tells nothing apart
    assert approved.status_code == 200, approved.text
    assert [e.decision for e in stream.run_events if isinstance(e, ApprovalResolved)] == [
        "approved"
    ]
    assert isinstance(end := stream.run_events[-1], RunDone)
    assert end.status == "completed"
    assert cancelled.status_code == 404  # one run's act token acts on that run only
    assert stopped.status_code == 202
    assert isinstance(done := other_stream.run_events[-1], RunDone)
    assert done.status == "cancelled"
    # the act token never travels where the read token does
    for started in (run, other):
        assert started["act_token"] != started["token"]
        assert started["act_token"] not in started["events_url"] + started["ws_url"]
    assert run["act_token"] not in b"".join(served.log(run["run_id"])).decode()


async def test_s28_on_a_keyed_server_the_server_key_acts_and_the_read_token_does_not() -> None:
    with trio.fail_after(30):
        async with serving(SCRIPT, tools="demo", api_key=Secret(KEY)) as served:
            started = await served.client.post(
                "/v1/runs", json={"prompt": "delete notes.txt"}, headers=bearer(KEY)
            )
            run = started.json()
            approval_id = await approval_of(served, run)
            refused = await attempts(served, run, approval_id)
            denied = await served.client.post(
                answer_url(run, approval_id),
                json={"approve": False, "reason": "keep it"},
                headers=bearer(KEY),
            )
            stream = await read_sse(served.client, run["events_url"])
            second = (
                await served.client.post(
                    "/v1/runs", json={"prompt": "delete notes.txt"}, headers=bearer(KEY)
                )
            ).json()
            await approval_of(served, second)
            with_act = await served.client.delete(
                f"/v1/runs/{second['run_id']}", headers=act(second)
            )
            unknown_with_key = await served.client.delete(
                f"/v1/runs/{UNKNOWN}", headers=bearer(KEY)
            )
    assert {r.status_code for r in refused} == {404}
    assert len({r.content for r in refused}) == 1
    assert denied.status_code == 200, denied.text
    resolved = [e.decision for e in stream.run_events if isinstance(e, ApprovalResolved)]
    assert resolved == ["denied"]
    assert with_act.status_code == 202  # the act token alone: no server key needed
    assert unknown_with_key.status_code == 404
    assert unknown_with_key.content == refused[0].content
