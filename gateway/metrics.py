"""Prometheus metrics: what admins need to tell a slow queue from a slow model.

Histograms and counters are observed once per request, from its record, when it ends.
Gauges (queue depth, running, slots, health, fair-share counters) are read from
snapshots when Prometheus scrapes, so the request path pays nothing for them.
Label values are bounded by the policy, whatever clients send (``metric_labels.py``): a
user is a configured name (a front end's people count under it), ``anonymous`` or
``unknown``; a model is one a backend lists or keeps warm, else ``other``.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterator
from itertools import accumulate
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.registry import Collector

from gateway.access import RequestRecord
from gateway.metric_labels import MetricLabels, add_merged
from gateway.model_metrics import model_families
from gateway.reload import LivePolicy
from gateway.snapshot import GatewaySnapshot
from gateway.vocabulary import REFUSALS, Lane, Reason, RequestClass

__all__ = ["Metrics"]

# From tens of milliseconds (a warm short prompt) to minutes (a cold load, a long prefill).
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300)
GAP_BUCKETS = (0.005, 0.01, 0.02, 0.035, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1, 2.5, 5)
_GENERATION = ("/api/chat", "/api/generate", "/api/embed", "/api/embeddings", "/v1/")


class Metrics:
    """The gateway's metrics, in a registry of its own (no process-global state)."""

    def __init__(self, policy: LivePolicy, snapshot: Callable[[], GatewaySnapshot]) -> None:
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
        self.client_stalls = Counter(
            "fairgate_client_stalls",
            "Replies ended because the client left them unread for timeouts.client_stall.",
            ["user"], registry=r,
        )  # fmt: skip
        self._labels = labels = MetricLabels(policy)
        r.register(_SnapshotCollector(snapshot, labels))
        self._children: dict[tuple[MetricWrapperBase, tuple[str, ...]], Any] = {}

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get("/metrics", self.endpoint)

    async def endpoint(self, request: web.Request) -> web.Response:
        body = generate_latest(self.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    def observe(self, record: RequestRecord) -> None:
        """Account for one finished request."""
        user = self._labels.user(record.user)
        request_class = record.request_class or RequestClass.LIGHT
        if record.reason in REFUSALS:
            self._child(self.rejections, user, record.reason).inc()
        if not record.path.startswith(_GENERATION) or record.model is None:
            return
        model = self._labels.model(record.model)
        self._child(self.requests, user, model, request_class, str(record.status)).inc()
        if record.reason is Reason.BACKEND_FAILED_MID_STREAM and record.backend is not None:
            self._child(self.stream_failures, record.backend).inc()
        if record.reason is Reason.CLIENT_STALLED:
            self._child(self.client_stalls, user).inc()
        if record.queue_wait is not None:
            self._child(self.queue_wait, request_class).observe(record.queue_wait)
        if record.first_byte_at is not None:
            self._child(self.ttft, request_class).observe(record.first_byte_at - record.arrived)
            if record.dispatched_at is not None:
                self._child(self.ttft_dispatch, request_class).observe(
                    record.first_byte_at - record.dispatched_at
                )
            self._child(self.duration, request_class).observe(record.finished - record.arrived)
        if record.gaps:
            self.gap.observe_all(request_class, record.gaps)
        if record.prompt_tokens:
            self._child(self.prompt_tokens, user, model).inc(record.prompt_tokens)
        if record.completion_tokens:
            self._child(self.completion_tokens, user, model).inc(record.completion_tokens)

    def _child(self, metric: MetricWrapperBase, *labels: str) -> Any:
        """``metric.labels(*labels)``, remembered: labels() validates and takes a lock on
        every call, and the same few label sets come back request after request."""
        key = (metric, labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child


class _GapHistogram(Collector):
    """fairgate_inter_token_seconds, filled with a whole reply's gaps at once.

    A reply has a gap per chunk; prometheus_client's Histogram takes one observation per
    call (a lock and a Python loop over the buckets), which was a tenth of the gateway's
    CPU in a profile of 100 paced streams. Here each gap is one bisect into plain counts.
    """

    def __init__(self) -> None:
        self._counts: dict[str, list[int]] = {}  # by class; one slot per bucket, then +Inf
        self._sums: dict[str, float] = {}

    def observe_all(self, request_class: str, gaps: list[float]) -> None:
        counts = self._counts.setdefault(request_class, [0] * (len(GAP_BUCKETS) + 1))
        for gap in gaps:
            counts[bisect_left(GAP_BUCKETS, gap)] += 1  # a bucket's bound is inclusive
        self._sums[request_class] = self._sums.get(request_class, 0.0) + sum(gaps)

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(
            "fairgate_inter_token_seconds",
            "Gaps between consecutive chunks of a streamed reply (inter-token latency).",
            labels=["class"],
        )
        bounds = [repr(float(bound)) for bound in GAP_BUCKETS] + ["+Inf"]  # as the client
        for request_class, counts in self._counts.items():
            buckets = list(zip(bounds, map(float, accumulate(counts)), strict=True))
            family.add_metric([request_class], buckets, self._sums[request_class])
        yield family


class _SnapshotCollector(Collector):
    """Gauges and counters rendered from the gateway's snapshot at scrape time; users and
    models by their label values, as the per-request counters have them."""

    def __init__(self, snapshot: Callable[[], GatewaySnapshot], labels: MetricLabels) -> None:
        self._snapshot = snapshot
        self._labels = labels

    def collect(self) -> Iterator[Metric]:
        snapshot, labels = self._snapshot(), self._labels
        yield from _room(snapshot, labels)
        yield from _backends(snapshot)
        yield from _holds_and_reloads(snapshot)
        yield from _warmth(snapshot, labels)
        yield from model_families(snapshot, labels)


def _room(snapshot: GatewaySnapshot, labels: MetricLabels) -> Iterator[Metric]:
    room = snapshot.room
    depth = GaugeMetricFamily(
        "fairgate_queue_depth", "Requests waiting for a turn.", labels=["user", "class"]
    )
    queued = (
        ((labels.user(user), request_class), count)
        for (user, request_class), count in room.queued_by_class.items()
    )
    add_merged(depth, queued)
    oldest = GaugeMetricFamily(
        "fairgate_queue_oldest_wait_seconds", "Age of the oldest waiting request."
    )
    oldest.add_metric([], room.oldest_wait)
    share = GaugeMetricFamily(
        "fairgate_fair_share_virtual_tokens",
        "The fair scheduler's counter per user: weighted tokens served (lower goes next); "
        "for a front end's people, the highest of theirs.",
        labels=["user"],
    )
    # The highest, not the sum: each person joins at the level of those waiting, so a sum
    # would jump with every newcomer; the highest moves as the front end's busiest person
    # is served, as a user's own counter does.
    counters = (((labels.user(user),), value) for user, value in room.fair_counters.items())
    add_merged(share, counters, max)
    lanes = GaugeMetricFamily(
        "fairgate_lane_requests",
        "Requests running and waiting in each lane (interactive, background).",
        labels=["lane", "state"],
    )
    for lane, users in ((Lane.INTERACTIVE, room.users), (Lane.BACKGROUND, room.background_users)):
        lanes.add_metric([lane, "running"], sum(running for running, _ in users.values()))
        lanes.add_metric([lane, "waiting"], sum(waiting for _, waiting in users.values()))
    yield from (depth, oldest, share, lanes)


def _backends(snapshot: GatewaySnapshot) -> Iterator[Metric]:
    running = GaugeMetricFamily(
        "fairgate_requests_running", "Requests holding a backend slot.", labels=["backend", "class"]
    )
    slots = GaugeMetricFamily("fairgate_backend_slots", "Slots of a backend.", labels=["backend"])
    busy = GaugeMetricFamily("fairgate_backend_slots_busy", "Slots in use.", labels=["backend"])
    up = GaugeMetricFamily(
        "fairgate_backend_up", "1 when the backend is in rotation.", labels=["backend"]
    )
    for backend in snapshot.backends:
        running.add_metric([backend.name, RequestClass.HEAVY], backend.heavy_running)
        running.add_metric([backend.name, RequestClass.LIGHT], backend.busy - backend.heavy_running)
        slots.add_metric([backend.name], backend.slots)
        busy.add_metric([backend.name], backend.busy)
        up.add_metric([backend.name], 1 if backend.healthy else 0)
    yield from (running, slots, busy, up)


def _holds_and_reloads(snapshot: GatewaySnapshot) -> Iterator[Metric]:
    holds, reloads = snapshot.holds, snapshot.reloads
    shared = GaugeMetricFamily(
        "fairgate_state_shared",
        "1 while limits are shared across replicas (always 1 with one replica); 0: Redis is away.",
    )
    shared.add_metric([], 1 if holds.shared else 0)
    failures = CounterMetricFamily(
        "fairgate_state_failures", "Times the shared state (Redis) could not be reached."
    )
    failures.add_metric([], holds.failures)
    counted = CounterMetricFamily(
        "fairgate_policy_reloads", "Policy file reloads, by outcome.", labels=["outcome"]
    )
    counted.add_metric(["ok"], reloads.reloads_ok)
    counted.add_metric(["failed"], reloads.reloads_failed)
    yield from (shared, failures, counted)


def _warmth(snapshot: GatewaySnapshot, labels: MetricLabels) -> Iterator[Metric]:
    pings = CounterMetricFamily(
        "fairgate_keep_warm_pings", "Keep-warm pings sent.", labels=["backend", "model", "outcome"]
    )
    pinged = (
        ((backend, labels.model(model), outcome), count)
        for (backend, model, outcome), count in snapshot.warmth.pings.items()
    )
    add_merged(pings, pinged)
    cold = CounterMetricFamily(
        "fairgate_cold_starts",
        "Replies that paid for loading the model.",
        labels=["backend", "model"],
    )
    loads = (
        ((backend, labels.model(model)), count)
        for (backend, model), count in snapshot.warmth.cold_starts.items()
    )
    add_merged(cold, loads)
    yield from (pings, cold)
