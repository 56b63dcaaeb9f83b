"""The old names of renamed public names, kept for one release: each resolves to the new one,
warns once per process (a `DeprecationWarning` at the caller's line), and behaves the same.

The rescue was the "fallback" (`Policy.fallback`, `FallbackFailed`, `FALLBACK_TO_NON_STREAMING`,
`--no-fallback`); "fallback" now names the chain of providers alone (`--fallback`)."""

from __future__ import annotations

import inspect
import warnings
from types import SimpleNamespace
from typing import TYPE_CHECKING, cast

import attrs
import pytest
import rillet
import trio
from rillet import Outcome, Policy, RescueFailed, run_agent, run_turn
from rillet._core import _deprecated
from rillet.transports.testing import open_loopback_provider, status_reply

from .agent_support import LIMIT, QUESTION, loop_clock, provider_at, text_reply
from .handler_support import END_TIMEOUT, SILENT, check, expect, play, rescue_ok

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from rillet import TurnResult
    from rillet.providers import Provider


clock = pytest.fixture(name="loop_clock")(loop_clock)


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    """Every test sees each old name warn afresh, and leaves none marked as warned (so a later
    use elsewhere still fails the suite, whose warnings are errors)."""
    _deprecated.warned.clear()
    yield
    _deprecated.warned.clear()


def _warnings(use: Callable[[], object], times: int = 2) -> list[str]:
    """The deprecation messages `use` gives, called `times` times."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(times):
            use()
    return [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)]


def test_policy_takes_fallback_as_rescue_and_warns_once() -> None:
    said = _warnings(lambda: Policy(fallback=False))  # type: ignore[call-arg]
    assert said == [
        "Policy(fallback=...) is deprecated and goes in the next release: use Policy(rescue=...)"
    ]
    _deprecated.warned.clear()
    with pytest.warns(DeprecationWarning, match="Policy.rescue=") as caught:
        old = Policy(fallback=False, transport_retries=1)  # type: ignore[call-arg]
    assert caught[0].filename == __file__  # the caller's line
    assert old == Policy(rescue=False, transport_retries=1)
    assert not old.rescue
    evolved = attrs.evolve(Policy(), fallback=False)  # type: ignore[call-arg]
    assert evolved.rescue is False  # (warned already: silent)


def test_policy_fallback_reads_rescue_and_warns_once() -> None:
    policy = Policy(rescue=False)
    assert _warnings(lambda: policy.fallback) == [
        "Policy.fallback is deprecated and goes in the next release: use Policy.rescue"
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert policy.fallback is False
        assert Policy().fallback is True


def test_policy_without_the_old_name_stays_its_fields() -> None:
    assert "fallback" not in attrs.fields_dict(Policy)
    assert "rescue=True" in repr(Policy())
    signature = inspect.signature(Policy)
    assert "fallback" not in signature.parameters
    assert signature.parameters["rescue"].default is True
    with pytest.raises(TypeError):
        Policy(no_such_field=1)  # type: ignore[call-arg]


async def test_a_policy_made_with_the_old_name_sends_no_rescue(
    autojump_clock: trio.testing.MockClock,
) -> None:
    with pytest.warns(DeprecationWarning, match="Policy.rescue="):
        old = Policy(fallback=False, random=lambda: 0.0)  # type: ignore[call-arg]
    run = await play([SILENT], rescue=rescue_ok(), pol=old)
    check(
        run,
        at=[0.0, 120.1],
        outcome=Outcome.EVENT_TIMEOUT,
        saw=expect("start", END_TIMEOUT),
        text="",
        ended=240.1,
    )


def test_fallback_failed_is_rescue_failed_and_warns_once() -> None:
    assert _warnings(lambda: rillet.FallbackFailed) == [
        "rillet.FallbackFailed is deprecated and goes in the next release: use rillet.RescueFailed"
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from rillet import FallbackFailed

        old = rillet.FallbackFailed
    assert FallbackFailed is old is RescueFailed
    with pytest.raises(FallbackFailed):  # `except FallbackFailed` still catches it
        raise RescueFailed(Outcome.INIT_FAILED, None, ValueError("no"))
    assert "FallbackFailed" not in rillet.__all__
    with pytest.raises(AttributeError, match="NoSuchName"):
        _ = rillet.NoSuchName  # type: ignore[attr-defined]  # (type checkers see no catch-all)


def test_the_old_outcome_is_the_same_member_and_keeps_its_wire_label() -> None:
    old: Outcome = Outcome.FALLBACK_TO_NON_STREAMING  # an enum alias: no warning
    assert old is Outcome.RESCUED
    assert Outcome(6) is Outcome.RESCUED
    assert Outcome["FALLBACK_TO_NON_STREAMING"] is Outcome.RESCUED
    assert Outcome.RESCUED.name == "RESCUED"
    assert list(Outcome).count(Outcome.RESCUED) == 1
    assert Outcome.RESCUED.succeeded
    # metrics, logs and MCP results carry the label it always had
    assert Outcome.RESCUED.label == "fallback_to_non_streaming"
    assert [o.label for o in Outcome if o is not Outcome.RESCUED] == [
        o.name.lower() for o in Outcome if o is not Outcome.RESCUED
    ]


def test_a_rescued_run_is_logged_and_counted_as_before(caplog: pytest.LogCaptureFixture) -> None:
    from rillet._cli._log import log_run_end
    from rillet.transports.server._metrics import outcome_label

    result = cast(
        "TurnResult",
        SimpleNamespace(
            outcome=Outcome.RESCUED, time_to_first_event=0.5, total_time=1.0, attempts=3
        ),
    )
    assert outcome_label(result) == "fallback_to_non_streaming"  # the Prometheus label
    provider = cast("Provider", SimpleNamespace(label="openai", model="m"))
    with caplog.at_level("INFO", logger="rillet"):
        log_run_end(result, provider)
    [record] = caplog.records
    assert record.fields["outcome"] == "FallbackToNonStreaming"  # type: ignore[attr-defined]
    assert "outcome FallbackToNonStreaming," in record.getMessage()
    assert str(Outcome.RESCUED) == "Rescued"  # what a person prints is the new word


@pytest.mark.parametrize("entry", ["run_turn", "run_agent"])
async def test_fallback_on_permanent_is_chain_on_permanent_and_warns_once(
    loop_clock: trio.testing.MockClock, entry: str
) -> None:
    quick = Policy(rate_limit_retries=0, transport_retries=0, rescue=False)
    said: list[str] = []
    for old in (True, True, False):
        async with (
            open_loopback_provider([status_reply(400)]) as first,
            open_loopback_provider([text_reply("Second.")]) as second,
        ):
            chain = [provider_at(first), provider_at(second)]
            with warnings.catch_warnings(record=True) as caught, trio.fail_after(LIMIT):
                warnings.simplefilter("always")
                if entry == "run_turn":
                    turn = await run_turn(QUESTION, chain, policy=quick, fallback_on_permanent=old)
                    ok = turn.ok
                else:
                    agent = await run_agent(
                        QUESTION, chain, policy=quick, fallback_on_permanent=old
                    )
                    ok = agent.status == "completed"
            said += [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)]
        assert ok is old  # a 400 goes down the chain only when asked, by either name
        assert len(second.requests) == (1 if old else 0)
    assert said == [
        f"{entry}(fallback_on_permanent=...) is deprecated and goes in the next release: use "
        f"{entry}(chain_on_permanent=...)"
    ]


def test_no_fallback_is_no_rescue_with_a_line_on_stderr(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from rillet._cli._args import build_parser, policy_from

    parser = build_parser()
    old = parser.parse_args(["run", "hi", "--no-fallback"])
    assert capsys.readouterr().err == (
        "rillet: --no-fallback is deprecated and goes in the next release: use --no-rescue\n"
    )
    new = parser.parse_args(["run", "hi", "--no-rescue"])
    assert capsys.readouterr().err == ""
    assert old.no_rescue is new.no_rescue is True
    assert policy_from(old) == policy_from(new)
    assert not policy_from(old).rescue
    assert policy_from(parser.parse_args(["run", "hi"])).rescue


def test_run_help_names_the_rescue_switch_and_the_chain_but_not_the_old_switch(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from rillet._cli._args import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--no-fallback" not in text
    assert "--no-rescue turn off the rescue: the one non-streaming request" in text
    assert "--fallback PROVIDER[:MODEL],... the chain: providers to try in order" in text
