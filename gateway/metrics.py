"""Prometheus metrics: what admins need to tell a slow queue from a slow model.

Histograms and counters are observed once per request, from its record, when it ends.
Gauges (queue depth, running, slots, health, fair-share counters) are read from
snapshots when Prometheus scrapes, so the request path pays nothing for them.
Label values are bounded: a user is a configured name or ``anonymous``; a model is one a
backend lists (or one kept warm), else ``other``.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator
from itertools import accumulate

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from gateway.access import RequestRecord
from gateway.backends import model_key
from gateway.keys import ADMISSION, LIVE, WARMTH
from gateway.policy import ANONYMOUS

__all__ = ["METRICS", "Metrics", "add_metrics_route"]

# From tens of milliseconds (a warm short prompt) to minutes (a cold load, a long prefill).
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300)
GAP_BUCKETS = (0.005, 0.01, 0.02, 0.035, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1, 2.5, 5)
REJECTION_REASONS = frozenset(
    {
        "user_queue_full",
        "gateway_busy",
        "wait_timeout",
        "unauthorized",
        "model_forbidden",
        "model_not_found",
        "body_too_large",
        "bad_request",
        "no_backend",
        "management_forbidden",
    }
)
_GENERATION = ("/api/chat", "/api/generate", "/api/embed", "/api/embeddings", "/v1/")


class Metrics:
    """The gateway's metrics, in a registry of its own (no process-global state)."""

    def __init__(self, app: web.Application) -> None:
        self.registry = CollectorRegistry()
        r = self.registry

        def latency(name: str, documentation: str) -> Histogram:
            return Histogram(name, documentation, ["class"], buckets=LATENCY_BUCKETS, registry=r)

        self.ttft = latency(
            "fairgate_time_to_first_token_seconds",
            "From the request's arrival to the first byte of the reply (queue wait + prefill).",
        )
        self.ttft_dispatch = latency(
            "fairgate_time_to_first_token_from_dispatch_seconds",
            "From sending the request to a backend to the first byte back (load + prefill).",
        )
        self.queue_wait = latency(
            "fairgate_queue_wait_seconds",
            "Time spent in the gateway's waiting room before a slot was given.",
        )
        self.gap = _GapHistogram()
        r.register(self.gap)
        self.duration = latency(
            "fairgate_request_duration_seconds", "From arrival to the end of the reply."
        )
        self.requests = Counter(
            "fairgate_requests",
            "Generation and embedding requests answered, by HTTP status code.",
            ["user", "model", "class", "code"], registry=r,
        )  # fmt: skip
        self.rejections = Counter(
            "fairgate_rejections",
            "Requests refused by the gateway itself, by reason.",
            ["user", "reason"], registry=r,
        )  # fmt: skip
        self.prompt_tokens = Counter(
            "fairgate_prompt_tokens", "Prompt tokens, as the backend counted them.",
            ["user", "model"], registry=r,
        )  # fmt: skip
        self.completion_tokens = Counter(
            "fairgate_completion_tokens", "Generated tokens, as the backend counted them.",
            ["user", "model"], registry=r,
        )  # fmt: skip
        self.stream_failures = Counter(
            "fairgate_stream_failures",
            "Replies cut by the backend (or its silence) after the first byte.",
            ["backend"], registry=r,
        )  # fmt: skip
        r.register(_StateCollector(app))
        self._app = app

    def observe(self, record: RequestRecord) -> None:
        """Account for one finished request."""
        user, klass = self._user(record.user), record.klass or "light"
        if record.reason in REJECTION_REASONS:
            self.rejections.labels(user, record.reason).inc()
        if not record.path.startswith(_GENERATION) or record.model is None:
            return
        model = self._model(record.model)
        self.requests.labels(user, model, klass, str(record.status)).inc()
        if record.reason == "backend_failed_mid_stream" and record.backend is not None:
            self.stream_failures.labels(record.backend).inc()
        if record.queue_wait is not None:
            self.queue_wait.labels(klass).observe(record.queue_wait)
        if record.first_byte_at is not None:
            self.ttft.labels(klass).observe(record.first_byte_at - record.arrived)
            if record.dispatched_at is not None:
                self.ttft_dispatch.labels(klass).observe(
                    record.first_byte_at - record.dispatched_at
                )
            self.duration.labels(klass).observe(record.finished - record.arrived)
        if record.gaps:
            self.gap.observe_all(klass, record.gaps)
        if record.prompt_tokens:
            self.prompt_tokens.labels(user, model).inc(record.prompt_tokens)
        if record.completion_tokens:
            self.completion_tokens.labels(user, model).inc(record.completion_tokens)

    def _user(self, user: str | None) -> str:
        users = self._app[LIVE].current.policy.users
        return user if user is not None and user in users else ANONYMOUS

    def _model(self, model: str) -> str:
        key, view = model_key(model), self._app[LIVE].current
        listed = any(key in (b.state.models or ()) for b in view.pool.backends)
        kept_warm = any(key in map(model_key, b.keep_warm) for b in view.policy.backends)
        return model if listed or kept_warm else "other"


class _GapHistogram(Collector):
    """fairgate_inter_token_seconds, filled with a whole reply's gaps at once.

    A reply has a gap per chunk; prometheus_client's Histogram takes one observation per
    call (a lock and a Python loop over the buckets), which was a tenth of the gateway's
    CPU in a profile of 100 paced streams. Here each gap is one bisect into plain counts.
    """

    def __init__(self) -> None:
        self._counts: dict[str, list[int]] = {}  # by class; one slot per bucket, then +Inf
        self._sums: dict[str, float] = {}

    def observe_all(self, klass: str, gaps: list[float]) -> None:
        counts = self._counts.setdefault(klass, [0] * (len(GAP_BUCKETS) + 1))
        for gap in gaps:
            counts[bisect_left(GAP_BUCKETS, gap)] += 1  # a bucket's bound is inclusive
        self._sums[klass] = self._sums.get(klass, 0.0) + sum(gaps)

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(
            "fairgate_inter_token_seconds",
            "Gaps between consecutive chunks of a streamed reply (inter-token latency).",
            labels=["class"],
        )
        bounds = [repr(float(bound)) for bound in GAP_BUCKETS] + ["+Inf"]  # as the client
        for klass, counts in self._counts.items():
            buckets = list(zip(bounds, map(float, accumulate(counts)), strict=True))
            family.add_metric([klass], buckets, self._sums[klass])
        yield family


class _StateCollector(Collector):
    """Gauges and counters read from snapshots at scrape time."""

    def __init__(self, app: web.Application) -> None:
        self._app = app

    def collect(self) -> Iterator[Metric]:
        app = self._app
        snapshot = app[ADMISSION].snapshot()
        view, live, warmth = app[LIVE].current, app[LIVE], app[WARMTH]
        depth = GaugeMetricFamily(
            "fairgate_queue_depth", "Requests waiting for a turn.", labels=["user", "class"]
        )
        for (user, klass), count in snapshot.queued_by_class.items():
            depth.add_metric([user, klass], count)
        yield depth
        running = GaugeMetricFamily(
            "fairgate_requests_running",
            "Requests holding a backend slot.",
            labels=["backend", "class"],
        )
        slots = GaugeMetricFamily(
            "fairgate_backend_slots", "Slots of a backend.", labels=["backend"]
        )
        busy = GaugeMetricFamily("fairgate_backend_slots_busy", "Slots in use.", labels=["backend"])
        up = GaugeMetricFamily(
            "fairgate_backend_up", "1 when the backend is in rotation.", labels=["backend"]
        )
        for backend in view.pool.backends:
            used, total = snapshot.backends.get(backend.name, (0, backend.slots))
            heavy = snapshot.heavy_running.get(backend.name, 0)
            running.add_metric([backend.name, "heavy"], heavy)
            running.add_metric([backend.name, "light"], used - heavy)
            slots.add_metric([backend.name], total)
            busy.add_metric([backend.name], used)
            up.add_metric([backend.name], 1 if backend.state.healthy else 0)
        yield from (running, slots, busy, up)
        oldest = GaugeMetricFamily(
            "fairgate_queue_oldest_wait_seconds", "Age of the oldest waiting request."
        )
        oldest.add_metric([], snapshot.oldest_wait)
        yield oldest
        share = GaugeMetricFamily(
            "fairgate_fair_share_virtual_tokens",
            "The fair scheduler's counter per user: weighted tokens served (lower goes next).",
            labels=["user"],
        )
        for user, value in snapshot.fair_counters.items():
            share.add_metric([user], value)
        yield share
        shared = GaugeMetricFamily(
            "fairgate_state_shared",
            "1 while limits are shared across replicas (always 1 in memory); 0: Redis is away.",
        )
        shared.add_metric([], 1 if app[ADMISSION].state.shared else 0)
        yield shared
        failures = CounterMetricFamily(
            "fairgate_state_failures", "Times the shared state (Redis) could not be reached."
        )
        failures.add_metric([], app[ADMISSION].state.failures)
        yield failures
        reloads = CounterMetricFamily(
            "fairgate_policy_reloads", "Policy file reloads, by outcome.", labels=["outcome"]
        )
        reloads.add_metric(["ok"], live.reloads_ok)
        reloads.add_metric(["failed"], live.reloads_failed)
        yield reloads
        pings = CounterMetricFamily(
            "fairgate_keep_warm_pings",
            "Keep-warm pings sent.",
            labels=["backend", "model", "outcome"],
        )
        for (backend_name, model, outcome), count in warmth.pings.items():
            pings.add_metric([backend_name, model, outcome], count)
        yield pings
        cold = CounterMetricFamily(
            "fairgate_cold_starts",
            "Replies that paid for loading the model.",
            labels=["backend", "model"],
        )
        for (backend_name, model), count in warmth.cold_starts.items():
            cold.add_metric([backend_name, model], count)
        yield cold


METRICS = web.AppKey("metrics", Metrics)


def add_metrics_route(app: web.Application) -> None:
    app.router.add_get("/metrics", metrics_endpoint)


async def metrics_endpoint(request: web.Request) -> web.Response:
    body = generate_latest(request.app[METRICS].registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})
