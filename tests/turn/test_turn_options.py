"""`open_turn` and `stream_turn` take `run_turn`'s keyword options by name and type
(`TurnOptions`), `open_agent` takes `run_agent`'s (`AgentOptions`), and `run_agent` names the
ones it passes on to each step (`StepOptions`): a type checker catches a misspelt option before
anything runs, and the lists cannot drift from the functions. The keywords that say how a run
reaches its providers are the fields of one `RunOptions`, which both entry points take whole."""

from __future__ import annotations

import importlib.util
import inspect
import os
import subprocess
import sys
from pathlib import Path

import attrs
import pytest
from rillet import AgentOptions, RunOptions, StepOptions, TurnOptions, run_agent, run_turn

ROOT = Path(__file__).resolve().parent.parent.parent


def _spelt(annotation: object) -> str:
    """An annotation as written (both modules defer theirs)."""
    return str(getattr(annotation, "__forward_arg__", annotation))


def _keywords(fn: object) -> dict[str, object]:
    """A function's keyword-only parameters (but `task_status`) and their annotations."""
    return {
        name: p.annotation
        for name, p in inspect.signature(fn).parameters.items()  # type: ignore[arg-type]
        if p.kind is inspect.Parameter.KEYWORD_ONLY and name != "task_status"
    }


def test_the_options_are_run_turns_keywords_with_their_types() -> None:
    keywords = _keywords(run_turn)
    options = TurnOptions.__annotations__
    assert set(options) == set(keywords)
    for name, annotation in keywords.items():
        assert _spelt(options[name]) == _spelt(annotation), name


def test_the_agent_options_are_run_agents_keywords_and_the_step_options_run_turns() -> None:
    agent = _keywords(run_agent)
    options = AgentOptions.__annotations__  # (with the `StepOptions` it extends)
    steps = StepOptions.__annotations__
    assert set(options) == set(agent) | set(steps)
    for name, annotation in agent.items():
        assert _spelt(options[name]) == _spelt(annotation), name
    turn = _keywords(run_turn)
    for name, annotation in steps.items():  # each option has one meaning
        assert _spelt(annotation) == _spelt(turn[name]) == _spelt(agent[name]), name


def test_every_run_option_is_a_keyword_of_both_entry_points_with_its_type() -> None:
    fields = {f.name: f for f in attrs.fields(RunOptions)}
    turn, agent = _keywords(run_turn), _keywords(run_agent)
    for name, field in fields.items():
        assert _spelt(turn[name]) == _spelt(field.type), name
        assert inspect.signature(run_turn).parameters[name].default == field.default, name
        if name != "history":  # an agent keeps its own run's history
            assert _spelt(agent[name]) == _spelt(field.type), name
            assert inspect.signature(run_agent).parameters[name].default == field.default, name
    assert "options" in turn
    assert "options" in agent
    assert "options" in TurnOptions.__annotations__
    assert "options" in AgentOptions.__annotations__
    assert RunOptions.__doc__ is not None
    for name in fields:  # one docstring lists each field
        assert f"        {name}: " in RunOptions.__doc__, name


@pytest.mark.slow
def test_a_misspelt_option_is_a_type_error(tmp_path: Path) -> None:
    script = tmp_path / "user.py"
    script.write_text(
        "from rillet import TurnRequest, open_agent, open_turn, run_agent, user\n"
        "from rillet.asyncio import stream_turn\n"
        "from rillet.providers import provider_from_env\n\n\n"
        "async def main() -> None:\n"
        "    request = TurnRequest(messages=[user('hi')])\n"
        "    async with open_turn(request, provider_from_env('openai'), sinkz=[]) as turn:\n"
        "        print((await turn.result()).text)\n"
        "    async with open_turn(request, provider_from_env('openai'), history='no') as turn:\n"
        "        print(turn.run_id)\n"
        "    async with open_agent(request, provider_from_env('openai'), max_stepz=2) as a:\n"
        "        print(a.run_id)\n"
        "    await run_agent(request, provider_from_env('openai'), polcy=None)\n"
        "    print(stream_turn(request, provider_from_env('openai'), reasonning=True))\n",
        encoding="utf-8",
    )
    # mypy reads the package as installed (`rillet/...`), laid out as scripts/typecheck.py does
    spec = importlib.util.spec_from_file_location("typecheck", ROOT / "scripts" / "typecheck.py")
    assert spec is not None
    assert spec.loader is not None
    view = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(view)
    for name, source in view.MAPPING.items():
        view._link_tree(source, tmp_path / "view" / name)
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", str(script)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "MYPYPATH": str(tmp_path / "view")},
        check=False,
    )
    assert done.returncode == 1, done.stdout
    assert '"sinkz"' in done.stdout
    assert '"max_stepz"' in done.stdout
    assert '"polcy"' in done.stdout
    assert '"reasonning"' in done.stdout
    assert "history" in done.stdout  # a str where a bool goes
