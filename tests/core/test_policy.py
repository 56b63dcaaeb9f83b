"""The policy's pure arithmetic (server-directed waits, backoff with an injected jitter source,
outcomes, defaults) and the proactive rate limiter, in virtual time."""

from __future__ import annotations

import email.utils

import attrs
import pytest
import trio
import trio.testing
from rillet._core._policy import Outcome, Policy, backoff_delay, retry_after
from rillet._turn._ratelimit import RateLimiter, shared_limiter

WALL = 1696004797.0  # Fri, 29 Sep 2023 16:26:37 GMT


def date(at: float) -> str:
    """`at` (Unix time) as an HTTP-date."""
    return email.utils.formatdate(at, usegmt=True)


# --- retry_after ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("headers", "wait"),
    [
        ({"retry-after": "2"}, 2.0),
        ({"retry-after": " 2 "}, 2.0),
        ({"retry-after": "1.5"}, 1.5),
        ({"retry-after": "3600"}, 3600.0),
        ({"retry-after": "12345678901234567890"}, 12345678901234567890.0),
        ({"retry-after-ms": "1500"}, 1.5),
        ({"retry-after-ms": "1500", "retry-after": "9"}, 1.5),
        ({"retry-after-ms": "60001"}, 60.001),
        ({"retry-after": "Fri, 29 Sep 2023 16:26:57 GMT"}, 20.0),
        ({"retry-after": date(WALL + 61)}, 61.0),
    ],
)
def test_retry_after_reads_what_the_server_asked_for(headers: dict[str, str], wait: float) -> None:
    assert retry_after(headers, WALL) == pytest.approx(wait)


@pytest.mark.parametrize(
    "value",
    [
        "soon",
        "inf",
        "-inf",
        "nan",
        "-10",
        "0",
        "0.0",
        "",
        "   ",
        "1e400",
        "Fri, 32 Sep 2023 99:99:99 GMT",
        date(WALL - 20),  # already past
        date(WALL),  # now: nothing to wait
        "1" * 65,  # absurdly long
    ],
)
def test_an_unusable_retry_after_is_absent(value: str) -> None:
    assert retry_after({"retry-after": value}, WALL) is None


@pytest.mark.parametrize("value", ["soon", "0", "-5", "nan", ""])
def test_an_unusable_retry_after_ms_falls_back_to_retry_after(value: str) -> None:
    assert retry_after({"retry-after-ms": value, "retry-after": "7"}, WALL) == 7.0
    assert retry_after({"retry-after-ms": value}, WALL) is None


def test_no_header_is_no_wait() -> None:
    assert retry_after({}, WALL) is None
    assert retry_after({"content-type": "application/json"}, WALL) is None


def test_an_http_date_is_read_against_the_injected_wall_clock() -> None:
    header = {"retry-after": date(WALL + 20)}
    assert retry_after(header, WALL) == pytest.approx(20.0)
    assert retry_after(header, WALL + 15) == pytest.approx(5.0)
    assert retry_after(header, WALL + 20) is None


# --- backoff --------------------------------------------------------------------------------------


def test_backoff_without_jitter_doubles_from_100_ms_up_to_10_s() -> None:
    policy = Policy(random=lambda: 0.0)
    delays = [backoff_delay(policy, n) for n in range(10)]
    assert delays == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 6.4, 10.0, 10.0, 10.0])


@pytest.mark.parametrize("u", [0.0, 0.25, 0.5, 0.999999])
def test_backoff_jitter_takes_at_most_10_percent_off(u: float) -> None:
    policy = Policy(random=lambda: u)
    for n, nominal in enumerate([0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 6.4, 10.0, 10.0]):
        delay = backoff_delay(policy, n)
        assert delay == pytest.approx(nominal * (1 - 0.1 * u))
        assert 0.9 * nominal < delay <= nominal


def test_backoff_follows_the_policy() -> None:
    policy = Policy(backoff_base=1.0, backoff_max=3.0, jitter=0.5, random=lambda: 1.0)
    assert [backoff_delay(policy, n) for n in range(4)] == [0.5, 1.0, 1.5, 1.5]


def test_the_jitter_source_is_called_once_per_delay() -> None:
    draws = iter([0.0, 1.0, 0.5])
    policy = Policy(random=lambda: next(draws))
    assert [backoff_delay(policy, n) for n in range(3)] == pytest.approx([0.1, 0.18, 0.38])


# --- outcomes and the policy ----------------------------------------------------------------------


def test_outcomes_are_ordered_by_severity() -> None:
    order = [
        Outcome.COMPLETED,
        Outcome.TOTAL_TIMEOUT,
        Outcome.EVENT_TIMEOUT,
        Outcome.RATE_LIMITED,
        Outcome.FAILED,
        Outcome.INIT_FAILED,
        Outcome.RESCUED,
        Outcome.CANCELLED,
    ]
    assert sorted(Outcome) == order
    assert max(Outcome.FAILED, Outcome.CANCELLED) is Outcome.CANCELLED


def test_only_a_reply_brought_home_succeeded() -> None:
    assert {o for o in Outcome if o.succeeded} == {
        Outcome.COMPLETED,
        Outcome.RESCUED,
    }


def test_the_default_policy_is_the_design() -> None:
    p = Policy()
    assert (p.initial_event_timeout, p.per_event_timeout, p.total_timeout) == (120, 180, 300)
    assert (p.max_consecutive_timeouts, p.max_empty_timeouts) == (10, 2)
    assert (p.transport_retries, p.backoff_base, p.backoff_max, p.jitter) == (3, 0.1, 10, 0.1)
    assert (p.rate_limit_retries, p.retry_after_default, p.retry_after_max) == (5, 5, 60)
    assert p.rescue
    assert (p.requests_per_minute, p.limiter_max_wait) == (0, 30)
    assert (p.channel_size, p.max_frame) == (64, 32 * 1024 * 1024)
    assert 0.0 <= p.random() < 1.0


@pytest.mark.parametrize("size", [0, 1025, -1])
def test_channel_size_is_bounded(size: int) -> None:
    with pytest.raises(ValueError, match="channel_size"):
        Policy(channel_size=size)


def test_injected_sources_do_not_change_equality() -> None:
    assert Policy(random=lambda: 0.0, wall_clock=lambda: WALL) == Policy()
    assert attrs.evolve(Policy(), channel_size=1).channel_size == 1


# --- the limiter ----------------------------------------------------------------------------------

KEY = "https://api.test/v1"


async def test_no_rate_means_no_limiter(autojump_clock: trio.testing.MockClock) -> None:
    limiter = RateLimiter()
    for _ in range(1000):
        assert await limiter.acquire(KEY, 0, 30.0) == 0.0
    assert limiter.statistics() == {}
    assert trio.current_time() == 0.0


async def test_a_bucket_starts_full_then_paces(autojump_clock: trio.testing.MockClock) -> None:
    limiter = RateLimiter()
    waits = [await limiter.acquire(KEY, 6, 30.0) for _ in range(6)]
    assert waits == [0.0] * 6
    assert trio.current_time() == 0.0
    assert await limiter.acquire(KEY, 6, 30.0) == pytest.approx(10.0)
    assert trio.current_time() == pytest.approx(10.0)
    assert await limiter.acquire(KEY, 6, 30.0) == pytest.approx(10.0)
    assert trio.current_time() == pytest.approx(20.0)


async def test_waiters_are_served_in_order(autojump_clock: trio.testing.MockClock) -> None:
    limiter = RateLimiter()
    for _ in range(6):
        await limiter.acquire(KEY, 6, 60.0)
    served: list[tuple[int, float]] = []

    async def take(n: int) -> None:
        await limiter.acquire(KEY, 6, 60.0)
        served.append((n, trio.current_time()))

    async with trio.open_nursery() as nursery:
        for n in range(3):
            nursery.start_soon(take, n)
            await trio.testing.wait_all_tasks_blocked()
    assert [n for n, _ in served] == [0, 1, 2]
    assert [t for _, t in served] == pytest.approx([10.0, 20.0, 30.0])


async def test_the_wait_is_capped_a_brake_not_a_gate(
    autojump_clock: trio.testing.MockClock,
) -> None:
    limiter = RateLimiter()
    await limiter.acquire(KEY, 1, 30.0)
    assert await limiter.acquire(KEY, 1, 30.0) == pytest.approx(30.0)  # 60 s owed, 30 waited
    assert trio.current_time() == pytest.approx(30.0)


async def test_a_cancelled_waiter_gives_its_token_back(
    autojump_clock: trio.testing.MockClock,
) -> None:
    limiter = RateLimiter()
    for _ in range(6):
        await limiter.acquire(KEY, 6, 30.0)
    with trio.move_on_after(5.0):
        await limiter.acquire(KEY, 6, 30.0)
    # as if it never waited: the next token is due at 10 s
    assert await limiter.acquire(KEY, 6, 30.0) == pytest.approx(5.0)
    assert trio.current_time() == pytest.approx(10.0)


async def test_buckets_are_per_key(autojump_clock: trio.testing.MockClock) -> None:
    limiter = RateLimiter()
    for _ in range(6):
        await limiter.acquire(KEY, 6, 30.0)
    assert await limiter.acquire("https://other.test/v1", 6, 30.0) == 0.0
    assert set(limiter.statistics()) == {KEY, "https://other.test/v1"}
    assert limiter.statistics()["https://other.test/v1"] == 5.0


async def test_a_bucket_refills_continuously_up_to_its_capacity(
    autojump_clock: trio.testing.MockClock,
) -> None:
    limiter = RateLimiter()
    for _ in range(6):
        await limiter.acquire(KEY, 6, 30.0)
    await trio.sleep(25.0)  # 2.5 tokens
    assert [await limiter.acquire(KEY, 6, 30.0) for _ in range(3)] == pytest.approx([0.0, 0.0, 5.0])
    await trio.sleep(3600.0)
    waits = [await limiter.acquire(KEY, 6, 30.0) for _ in range(7)]
    assert waits == pytest.approx([0.0] * 6 + [10.0])  # never more than a minute's worth


async def test_a_new_rate_applies_from_now_on(autojump_clock: trio.testing.MockClock) -> None:
    limiter = RateLimiter()
    for _ in range(60):
        await limiter.acquire(KEY, 60, 30.0)
    await trio.sleep(5.0)  # 5 tokens earned at 60 rpm
    assert await limiter.acquire(KEY, 6, 30.0) == 0.0  # at 6 rpm they would be 0.5
    assert limiter.statistics()[KEY] == pytest.approx(4.0)


def test_the_shared_limiter_is_one_object() -> None:
    assert shared_limiter() is shared_limiter()
    assert isinstance(shared_limiter(), RateLimiter)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("total_timeout", 0),
        ("total_timeout", -1.0),
        ("initial_event_timeout", float("nan")),
        ("per_event_timeout", 0.0),
        ("transport_retries", -1),
        ("rate_limit_retries", 1.5),
        ("max_empty_timeouts", True),
        ("backoff_base", -0.1),
        ("jitter", 1.5),
        ("retry_after_max", float("nan")),
        ("requests_per_minute", -1.0),
        ("requests_per_minute", float("inf")),
        ("max_frame", 0),
        ("max_body", -5),
    ],
)
def test_a_policy_value_that_cannot_mean_anything_is_refused_naming_its_field(
    field: str, value: object
) -> None:
    with pytest.raises(ValueError, match=field):
        Policy(**{field: value})  # type: ignore[arg-type]


def test_the_edges_that_mean_something_are_taken() -> None:
    policy = Policy(
        total_timeout=float("inf"),  # no total deadline
        transport_retries=0,
        rate_limit_retries=0,
        max_empty_timeouts=0,
        backoff_base=0.0,
        jitter=0.0,
        retry_after_max=0.0,
        requests_per_minute=0.0,
        limiter_max_wait=0.0,
        max_frame=1,
    )
    assert policy.transport_retries == 0
