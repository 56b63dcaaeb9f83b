"""Agent runs on the server (`tools="demo"`) and their approvals over HTTP on loopback: the
run's events carry the tool's run, the approval endpoint lets a waiting call run or refuses
it, and is guarded like the other per-run routes."""

from __future__ import annotations

import json
from typing import Any

import trio
import trio.testing
from rillet._core._runevents import ApprovalRequired
from rillet.transports.server import Limits

from ..cli.test_cli_agents import ANSWER, tool_messages, tool_then_answer
from ..server_support import Served, kind, read_sse, serving

WAIT = 20.0


async def approval_of(served: Served, run: dict[str, str]) -> str:
    """Wait for the run's `approval.required`; its approval id."""
    with trio.fail_after(WAIT):
        while True:
            for data in served.log(run["run_id"]):
                event = json.loads(data)
                if event["type"] == "approval.required":
                    return str(event["approval_id"])
            await trio.sleep(0.01)


def answer_url(run: dict[str, str], approval_id: str) -> str:
    return f"/v1/runs/{run['run_id']}/approvals/{approval_id}"


async def answer(
    served: Served, run: dict[str, str], approval_id: str, token: str, **body: Any
) -> Any:
    return await served.client.post(
        answer_url(run, approval_id), json=body, headers={"authorization": f"Bearer {token}"}
    )


async def test_an_agent_run_streams_the_tools_run_and_its_answer() -> None:
    async with serving(tool_then_answer("get_weather", {"city": "Paris"}), tools="demo") as s:
        run = await s.start("weather?")
        stream = await read_sse(s.client, run["events_url"])
        requests = list(s.loopback.requests)
    kinds = [kind(e) for e in stream.run_events]
    assert kinds.index("tool.started") < kinds.index("tool.completed") < kinds.index("answer.done")
    assert kinds[-1] == "run.done"
    assert stream.run_events[-1].status == "completed"  # type: ignore[union-attr]
    assert stream.seqs == list(range(1, len(kinds) + 1))
    text = "".join(e.delta for e in stream.run_events if kind(e) == "answer.delta")  # type: ignore[union-attr]
    assert text == "".join(ANSWER)
    assert tool_messages(requests[1]) == ["18 °C, light rain in Paris"]


async def test_without_a_tool_set_a_run_is_one_turn() -> None:
    async with serving(tool_then_answer("get_weather", {"city": "Paris"})) as s:
        run = await s.start("weather?")
        stream = await read_sse(s.client, run["events_url"])
        requests = list(s.loopback.requests)
    assert "tool.started" not in [kind(e) for e in stream.run_events]
    assert len(requests) == 1
    assert "tools" not in json.loads(requests[0].body)


async def test_approving_lets_the_call_run_and_a_second_answer_is_refused() -> None:
    async with serving(tool_then_answer("delete_file", {"path": "a.txt"}), tools="demo") as s:
        run = await s.start("tidy up")
        approval_id = await approval_of(s, run)
        reply = await answer(s, run, approval_id, run["act_token"], approve=True)
        assert reply.status_code == 200, reply.text
        assert reply.json() == {
            "run_id": run["run_id"],
            "approval_id": approval_id,
            "decision": "approved",
        }
        again = await answer(s, run, approval_id, run["act_token"], approve=False)
        stream = await read_sse(s.client, run["events_url"])
        requests = list(s.loopback.requests)
    assert again.status_code == 409
    assert again.json()["error"]["type"] == "approval_not_waiting"
    resolved = [e for e in stream.run_events if kind(e) == "approval.resolved"]
    assert [e.decision for e in resolved] == ["approved"]  # type: ignore[union-attr]
    assert stream.run_events[-1].status == "completed"  # type: ignore[union-attr]
    assert tool_messages(requests[1]) == ["pretended to delete a.txt (the demo deletes nothing)"]


async def test_denying_tells_the_model_the_reason() -> None:
    async with serving(tool_then_answer("delete_file", {"path": "a.txt"}), tools="demo") as s:
        run = await s.start("tidy up")
        approval_id = await approval_of(s, run)
        reply = await answer(s, run, approval_id, run["act_token"], approve=False, reason="keep it")
        assert reply.status_code == 200
        stream = await read_sse(s.client, run["events_url"])
        requests = list(s.loopback.requests)
    assert "tool.started" not in [kind(e) for e in stream.run_events]
    assert tool_messages(requests[1]) == ["denied: the user did not allow this call: keep it"]


async def test_a_wrong_token_or_another_runs_token_is_404_and_changes_nothing() -> None:
    script = tool_then_answer("delete_file", {"path": "a.txt"})
    async with serving(script, tools="demo") as s:
        run = await s.start("tidy up")
        other = await s.start("tidy up too")
        approval_id = await approval_of(s, run)
        wrong = await answer(s, run, approval_id, "not-the-token", approve=True)
        foreign = await answer(s, run, approval_id, other["token"], approve=True)
        missing = await s.client.post(answer_url(run, approval_id), json={"approve": True})
        unknown = await answer(s, run, "apr_000000000000", run["act_token"], approve=True)
        still = await answer(s, run, approval_id, run["act_token"], approve=False)
        await s.client.delete(
            f"/v1/runs/{other['run_id']}", headers={"authorization": f"Bearer {other['act_token']}"}
        )
    assert wrong.status_code == foreign.status_code == missing.status_code == 404
    assert wrong.content == foreign.content == missing.content  # nothing tells them apart
    assert unknown.status_code == 409
    assert still.status_code == 200  # the refused answers left the approval waiting


async def test_a_bad_body_is_400_and_leaves_the_approval_waiting() -> None:
    async with serving(tool_then_answer("delete_file", {"path": "a.txt"}), tools="demo") as s:
        run = await s.start("tidy up")
        approval_id = await approval_of(s, run)
        headers = {"authorization": f"Bearer {run['act_token']}"}
        url = answer_url(run, approval_id)
        no_field = await s.client.post(url, json={"reason": "x"}, headers=headers)
        not_bool = await s.client.post(url, json={"approve": "yes"}, headers=headers)
        long = await answer(s, run, approval_id, run["act_token"], approve=False, reason="x" * 1001)
        wrong_method = await s.client.get(url, headers=headers)
        ok = await answer(s, run, approval_id, run["act_token"], approve=True)
    assert no_field.status_code == not_bool.status_code == long.status_code == 400
    assert wrong_method.status_code == 405
    assert ok.status_code == 200


async def test_cancelling_an_agent_run_waiting_for_approval_ends_it() -> None:
    async with serving(tool_then_answer("delete_file", {"path": "a.txt"}), tools="demo") as s:
        run = await s.start("tidy up")
        await approval_of(s, run)
        headers = {"authorization": f"Bearer {run['act_token']}"}
        cancelled = await s.client.delete(f"/v1/runs/{run['run_id']}", headers=headers)
        stream = await read_sse(s.client, run["events_url"])
    assert cancelled.status_code == 202
    assert stream.run_events[-1].status == "cancelled"  # type: ignore[union-attr]


async def test_an_unanswered_approval_is_denied_after_the_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    del autojump_clock  # virtual time: the timeout passes at once once everything idles
    script = tool_then_answer("delete_file", {"path": "a.txt"})
    async with serving(script, tools="demo", limits=Limits(approval_timeout=300.0)) as s:
        run = await s.start("tidy up")
        stream = await read_sse(s.client, run["events_url"])
        requests = list(s.loopback.requests)
    asked = [e for e in stream.run_events if isinstance(e, ApprovalRequired)]
    assert len(asked) == 1
    resolved = [e for e in stream.run_events if kind(e) == "approval.resolved"]
    assert [e.decision for e in resolved] == ["denied"]  # type: ignore[union-attr]
    assert tool_messages(requests[1]) == [
        "denied: the user did not allow this call: no answer in time"
    ]
