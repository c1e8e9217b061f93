"""Prometheus metrics: what admins need to tell a slow queue from a slow model.

Histograms and counters are observed once per request, from its record, when it ends, as
plain numbers rendered at scrape time (``observe/counts.py``).
Gauges (queue depth, running, slots, health, fair-share counters) are read from
snapshots when Prometheus scrapes, so the request path pays nothing for them.
Label values are bounded by the policy, whatever clients send (``observe/labels.py``): a
user is a configured name (a front end's people count under it), ``anonymous`` or
``unknown``; a model is one a backend lists or keeps warm, else ``other``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from gateway.admission import Waste
from gateway.core import REFUSALS, Lane, Reason, RequestClass
from gateway.edge import RequestRecord, names_gateway, refuse_unknown_host
from gateway.observe.counts import LabelledCounts, LabelledHistogram
from gateway.observe.labels import MetricLabels, add_merged
from gateway.observe.model_families import model_families
from gateway.observe.snapshot import GatewaySnapshot
from gateway.reload import LivePolicy

__all__ = ["Metrics"]

# From tens of milliseconds (a warm short prompt) to minutes (a cold load, a long prefill).
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300)
GAP_BUCKETS = (0.005, 0.01, 0.02, 0.035, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1, 2.5, 5)


class Metrics:
    """The gateway's metrics, in a registry of its own (no process-global state)."""

    def __init__(
        self,
        policy: LivePolicy,
        snapshot: Callable[[], GatewaySnapshot],
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``clock``: wall-clock seconds, when a label set was first counted (_created)."""

        def latency(name: str, documentation: str) -> LabelledHistogram:
            return LabelledHistogram(name, documentation, ["class"], LATENCY_BUCKETS, clock)

        def counts(name: str, documentation: str, labels: list[str]) -> LabelledCounts:
            return LabelledCounts(name, documentation, labels, clock)

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
        # Filled with a whole reply's gaps at once; no _created, as it never had one.
        self.gap = LabelledHistogram(
            "fairgate_inter_token_seconds",
            "Gaps between consecutive chunks of a streamed reply (inter-token latency).",
            ["class"], GAP_BUCKETS, clock=None,
        )  # fmt: skip
        self.duration = latency(
            "fairgate_request_duration_seconds", "From arrival to the end of the reply."
        )
        self.requests = counts(
            "fairgate_requests",
            "Generation and embedding requests answered, by HTTP status code.",
            ["user", "model", "class", "code"],
        )
        self.rejections = counts(
            "fairgate_rejections", "Requests refused by the gateway itself, by reason.",
            ["user", "reason"],
        )  # fmt: skip
        self.prompt_tokens = counts(
            "fairgate_prompt_tokens", "Prompt tokens, as the backend counted them.",
            ["user", "model"],
        )  # fmt: skip
        self.completion_tokens = counts(
            "fairgate_completion_tokens", "Generated tokens, as the backend counted them.",
            ["user", "model"],
        )  # fmt: skip
        self.stream_failures = counts(
            "fairgate_stream_failures",
            "Replies cut by the backend (or its silence) after the first byte.",
            ["backend"],
        )
        self.client_stalls = counts(
            "fairgate_client_stalls",
            "Replies ended because the client left them unread for timeouts.client_stall.",
            ["user"],
        )
        self._policy = policy
        self._labels = labels = MetricLabels(policy)
        self.registry = CollectorRegistry()
        for family in (
            self.ttft, self.ttft_dispatch, self.queue_wait, self.gap, self.duration,
            self.requests, self.rejections, self.prompt_tokens, self.completion_tokens,
            self.stream_failures, self.client_stalls, _SnapshotCollector(snapshot, labels),
        ):  # fmt: skip
            self.registry.register(family)

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get("/metrics", self.endpoint)

    async def endpoint(self, request: web.Request) -> web.Response:
        # Open to whoever reaches the port (Prometheus sends no key): not to a page on
        # a site that rebinds its name to the gateway. A key, which no page has, is
        # answered under any name, as on every route.
        view, headers = self._policy.current, request.headers
        if not names_gateway(headers, view.policy.hosts) and not view.directory.holds_key(headers):
            refuse_unknown_host(headers, view.policy.hosts)
        body = generate_latest(self.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    def observe(self, record: RequestRecord) -> None:
        """Account for one finished request."""
        user = self._labels.user(record.user)
        request_class = record.request_class or RequestClass.LIGHT
        by_class = (request_class,)
        if record.reason in REFUSALS:
            self.rejections.inc((user, record.reason))
        if record.model is None or not record.generation:
            return
        model = self._labels.model(record.model)
        self.requests.inc((user, model, request_class, str(record.status)))
        if record.reason is Reason.BACKEND_FAILED_MID_STREAM and record.backend is not None:
            self.stream_failures.inc((record.backend,))
        if record.reason is Reason.CLIENT_STALLED:
            self.client_stalls.inc((user,))
        if record.queue_wait is not None:
            self.queue_wait.observe(by_class, record.queue_wait)
        if record.first_byte_at is not None:
            self.ttft.observe(by_class, record.first_byte_at - record.arrived)
            if record.dispatched_at is not None:
                self.ttft_dispatch.observe(by_class, record.first_byte_at - record.dispatched_at)
            self.duration.observe(by_class, record.finished - record.arrived)
        if record.gaps:
            self.gap.observe_all(by_class, record.gaps)
        if record.prompt_tokens:
            self.prompt_tokens.inc((user, model), record.prompt_tokens)
        if record.completion_tokens:
            self.completion_tokens.inc((user, model), record.completion_tokens)


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
    yield from (depth, oldest, share, lanes, *_given_way(room.given_way))


def _given_way(waste: Waste) -> Iterator[Metric]:
    """What background work giving its slot to people has cost (``admission.preemption``)."""
    for name, what, value in (
        ("restarts", "Times background work gave its slot to a person.", waste.restarts),
        ("wasted_slot_seconds", "Slot time it threw away giving way.", waste.slot_seconds),
        ("wasted_prompt_tokens", "Prompt tokens read again (estimated).", waste.prompt_tokens),
    ):
        family = CounterMetricFamily(f"fairgate_background_{name}", what)
        family.add_metric([], value)
        yield family


def _backends(snapshot: GatewaySnapshot) -> Iterator[Metric]:
    running = GaugeMetricFamily(
        "fairgate_requests_running", "Requests holding a backend slot.", labels=["backend", "class"]
    )
    slots = GaugeMetricFamily("fairgate_backend_slots", "Slots of a backend.", labels=["backend"])
    busy = GaugeMetricFamily("fairgate_backend_slots_busy", "Slots in use.", labels=["backend"])
    up = GaugeMetricFamily(
        "fairgate_backend_up", "1 when the backend is in rotation.", labels=["backend"]
    )
    fewer = GaugeMetricFamily(
        "fairgate_backend_runs_fewer",
        "1 when the backend was found to run fewer requests at once than its slots.",
        labels=["backend"],
    )
    for backend in snapshot.backends:
        running.add_metric([backend.name, RequestClass.HEAVY], backend.heavy_running)
        running.add_metric([backend.name, RequestClass.LIGHT], backend.busy - backend.heavy_running)
        slots.add_metric([backend.name], backend.slots)
        busy.add_metric([backend.name], backend.busy)
        up.add_metric([backend.name], 1 if backend.healthy else 0)
        fewer.add_metric([backend.name], 1 if backend.runs_fewer else 0)
    yield from (running, slots, busy, up, fewer)


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
