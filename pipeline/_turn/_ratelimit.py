"""The proactive rate limiter: one token bucket per provider base URL, shared by every turn of
the process. A brake, not a gate: an attempt waits for a token (cancel-aware) at most the
policy's `limiter_max_wait`, then sends anyway; the server's 429s remain the real gate."""

from __future__ import annotations

import attrs
import trio

__all__ = ["RateLimiter", "shared_limiter"]


@attrs.define(eq=False)
class _Bucket:
    rate: float  # tokens per second
    capacity: float
    tokens: float
    updated: float

    def refill(self, now: float) -> None:
        self.tokens = min(self.capacity, self.tokens + (now - self.updated) * self.rate)
        self.updated = now


@attrs.define(eq=False)
class RateLimiter:
    """Token buckets keyed by base URL. Tokens refill continuously at `requests_per_minute`;
    a bucket starts full (a burst of one minute's worth)."""

    _buckets: dict[str, _Bucket] = attrs.field(factory=dict)

    def _bucket(self, key: str, requests_per_minute: float) -> _Bucket:
        """The bucket for `key`, created (or re-rated) for this rate. Tokens earned before a
        change of rate are counted at the old rate; the new one applies from now on."""
        rate = requests_per_minute / 60.0
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = _Bucket(rate, requests_per_minute, requests_per_minute, trio.current_time())
            self._buckets[key] = bucket
        elif bucket.rate != rate:
            bucket.refill(trio.current_time())
            bucket.rate, bucket.capacity = rate, requests_per_minute
            bucket.tokens = min(bucket.tokens, bucket.capacity)
        return bucket

    async def acquire(self, key: str, requests_per_minute: float, max_wait: float) -> float:
        """Take a token for `key`, waiting for one at most `max_wait` seconds; returns how long
        it waited. A waiter reserves its token at once, so waiters are served in order; if it
        is cancelled while waiting, the token goes back."""
        if requests_per_minute <= 0:
            return 0.0
        bucket = self._bucket(key, requests_per_minute)
        now = trio.current_time()
        bucket.refill(now)
        bucket.tokens -= 1.0
        if bucket.tokens >= 0:
            return 0.0
        wait = min(-bucket.tokens / bucket.rate, max_wait)
        try:
            await trio.sleep(wait)
        except trio.Cancelled:
            bucket.tokens += 1.0
            raise
        return wait

    def statistics(self) -> dict[str, float]:
        """Tokens left per key, as of the last use."""
        return {key: b.tokens for key, b in self._buckets.items()}


_SHARED = RateLimiter()


def shared_limiter() -> RateLimiter:
    """The process-wide limiter every turn uses unless given its own."""
    return _SHARED
