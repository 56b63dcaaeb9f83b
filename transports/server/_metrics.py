"""What the server counts: the counters and recent samples `/metrics.json` answers with, and the
Prometheus metrics `/metrics` exposes (when `prometheus-client` is installed, the `metrics`
extra), each server in a registry of its own."""

from __future__ import annotations

import collections
import dataclasses
import math
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import attrs
import trio

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
    from rillet._core._dialect import Provider
    from rillet._turn._turn import TurnResult

__all__ = ["Metrics", "Prometheus", "outcome_label"]

# seconds: a first event within a few hundred ms is usual; a run may take minutes
_TTFE_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_DURATION_BUCKETS = (0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)

METRICS_EXTRA = "pip install 'rillet[metrics]'"


@dataclasses.dataclass(eq=False)  # not attrs: its fields' types are imported lazily
class Prometheus:
    """The server's Prometheus metrics, in a registry of its own (two servers in one process
    keep apart counts). Built by `Prometheus.create`, None without `prometheus-client`."""

    registry: CollectorRegistry
    runs: Counter
    provider_requests: Counter
    retries: Counter
    resets: Counter
    taken_over: Counter
    tokens: Counter
    cost: Counter
    bytes_sent: Counter
    active: Gauge
    queued: Gauge
    subscribers: Gauge
    connections: Gauge
    first_event: Histogram
    duration: Histogram

    @classmethod
    def create(cls) -> Prometheus | None:
        """The metrics in a fresh registry; None when `prometheus-client` is not installed."""
        try:
            from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
        except ImportError:
            return None
        registry = CollectorRegistry(auto_describe=True)

        def counter(name: str, doc: str, labels: tuple[str, ...] = ()) -> Counter:
            return Counter(name, doc, labels, registry=registry)

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, registry=registry)

        return cls(
            registry=registry,
            runs=counter("rillet_runs", "Runs and MMSP streams ended, by outcome.", ("outcome",)),
            provider_requests=counter(
                "rillet_provider_requests",
                "HTTP requests sent to providers, by provider and status (`error`: no answer).",
                ("provider", "status"),
            ),
            retries=counter("rillet_retries", "Attempts after a run's first one."),
            resets=counter("rillet_resets", "Attempts voided after they had streamed events."),
            taken_over=counter(
                "rillet_runs_taken_over", "Runs continued here after their server was lost."
            ),
            tokens=counter(
                "rillet_tokens",
                "Tokens the providers reported for the turns that ended here, by kind: `input` "
                "(uncached prompt), `cache_read`, `cache_write` (of the input), `output` "
                "(reasoning included), `reasoning` (of the output).",
                ("kind",),
            ),
            cost=counter(
                "rillet_cost",
                "What the turns that ended here cost at the server's prices (`--prices`), by "
                "the model asked for, in the prices' currency (US dollars from `genai`). A turn "
                "whose usage or price is unknown adds nothing.",
                ("model",),
            ),
            bytes_sent=counter("rillet_bytes_sent", "Bytes sent to clients (counted per request)."),
            active=gauge("rillet_runs_active", "Runs streaming from a provider now."),
            queued=gauge("rillet_runs_queued", "Runs waiting for a provider-stream slot now."),
            subscribers=gauge("rillet_subscribers", "Clients following runs now."),
            connections=gauge("rillet_connections", "Client connections open now."),
            first_event=Histogram(
                "rillet_time_to_first_event_seconds",
                "Seconds from a run's start to its first event, for runs that had one.",
                buckets=_TTFE_BUCKETS,
                registry=registry,
            ),
            duration=Histogram(
                "rillet_run_duration_seconds",
                "Seconds from a run's start to its end.",
                buckets=_DURATION_BUCKETS,
                registry=registry,
            ),
        )

    def exposition(self) -> bytes:
        """The registry in the Prometheus text format."""
        from prometheus_client import generate_latest

        return generate_latest(self.registry)


@attrs.define(eq=False)
class Metrics:
    """Counters and recent samples for `/metrics.json`, and the Prometheus metrics (`prom`,
    None without `prometheus-client`) for `/metrics`."""

    window: float = 10.0
    runs_started: int = 0
    streams_started: int = 0
    connections: int = 0
    connections_refused: int = 0
    connections_evicted: int = 0  # idle ones closed at the cap to let a new one in
    subscribers_dropped: int = 0
    runs_taken_over: int = 0
    prom: Prometheus | None = attrs.field(factory=Prometheus.create)
    _buckets: collections.deque[list[float]] = attrs.field(factory=collections.deque)
    _ttfe: collections.deque[float] = attrs.field(factory=lambda: collections.deque(maxlen=1024))
    # provider labels by origin (`http://host:port`), for the provider requests' counter
    _origins: dict[str, str] = attrs.field(factory=dict)

    def count(self, events: int) -> None:
        """`events` were produced now (one-second buckets over the window)."""
        second = math.floor(trio.current_time())
        buckets = self._buckets
        if buckets and buckets[-1][0] == second:
            buckets[-1][1] += events
        else:
            buckets.append([second, events])
            while buckets and buckets[0][0] <= second - self.window:
                buckets.popleft()

    def events_per_second(self) -> float:
        """Events produced a second, over the window."""
        now = trio.current_time()
        total = sum(n for second, n in self._buckets if second > now - self.window)
        return total / self.window

    def finished(self, result: TurnResult) -> None:
        """A turn ended: its outcome, retries, time to first event and duration."""
        if result.time_to_first_event is not None:
            self._ttfe.append(result.time_to_first_event)
        prom = self.prom
        if prom is None:
            return
        prom.runs.labels(outcome=outcome_label(result)).inc()
        usage = result.message.usage_metadata
        if usage is not None:
            for kind, count in (
                ("input", usage.prompt_tokens),
                ("cache_read", usage.cached_tokens),
                ("cache_write", result.cache_write_tokens),
                ("output", (usage.response_tokens or 0) + (usage.thoughts_tokens or 0)),
                ("reasoning", usage.thoughts_tokens),
            ):
                if count:
                    prom.tokens.labels(kind=kind).inc(count)
        if result.charge is not None and result.provider is not None:
            prom.cost.labels(model=result.provider.model).inc(float(result.charge))
        if result.attempts > 1:
            prom.retries.inc(result.attempts - 1)
        if result.time_to_first_event is not None:
            prom.first_event.observe(result.time_to_first_event)
        prom.duration.observe(result.total_time)

    def cancelled_queued(self) -> None:
        """A run was cancelled while it waited for a slot: it ended before reaching a provider."""
        if self.prom is not None:
            self.prom.runs.labels(outcome="cancelled").inc()

    def taken_over(self) -> None:
        """A run whose server was lost goes on here."""
        self.runs_taken_over += 1
        if self.prom is not None:
            self.prom.taken_over.inc()

    def reset(self) -> None:
        """An attempt that had streamed events was voided (a retry after it)."""
        if self.prom is not None:
            self.prom.resets.inc()

    def sent(self, size: int) -> None:
        """`size` bytes went to a client."""
        if self.prom is not None and size > 0:
            self.prom.bytes_sent.inc(size)

    def serving(self, provider: Provider) -> None:
        """`provider` answers runs: its requests are counted under its label."""
        self._origins.setdefault(_origin(provider.base_url), provider.label)

    def provider_request(self, url: str, status: int | None) -> None:
        """A request to a provider got `status` (None: no answer)."""
        if self.prom is None:
            return
        origin = _origin(url)
        label = self._origins.get(origin, origin)
        answer = str(status) if status is not None else "error"
        self.prom.provider_requests.labels(provider=label, status=answer).inc()

    def ttfe(self) -> dict[str, float | int | None]:
        """Time to first event of recent turns: count and percentiles, in ms."""
        ordered = sorted(self._ttfe)

        def rank(p: float) -> float | None:
            if not ordered:
                return None
            return round(ordered[max(0, math.ceil(p * len(ordered)) - 1)] * 1000, 3)

        return {"count": len(ordered), "p50": rank(0.5), "p95": rank(0.95), "p99": rank(0.99)}


def outcome_label(result: TurnResult) -> str:
    """A turn's outcome as a label and a log field: `completed`, `total_timeout`, `failed`."""
    return result.outcome.label


def _origin(url: str) -> str:
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return f"{parts.scheme}://{parts.hostname}:{port}"
