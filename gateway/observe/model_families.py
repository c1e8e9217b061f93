"""Prometheus families for the models each Ollama backend holds, read from the snapshot at
scrape time: their requests, context, memory against the budget.

Apart from ``observe/metrics.py`` because they belong to residency (``swaps/residency.py``). A
model is
named as the per-request counters name it (``observe/labels.py``): what the gateway sends
while a backend's list is not known yet is any name a client wrote, and counts as ``other``.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from gateway.observe.labels import MetricLabels, add_merged
from gateway.observe.snapshot import GatewaySnapshot

__all__ = ["model_families"]


def model_families(snapshot: GatewaySnapshot, labels: MetricLabels) -> Iterator[Metric]:
    by_model = ["backend", "model"]
    busy = GaugeMetricFamily(
        "fairgate_model_slots_busy",
        "Requests running on a model an Ollama backend holds.",
        labels=by_model,
    )
    context = GaugeMetricFamily(
        "fairgate_model_context_tokens",
        "The context per slot a held model was loaded with.",
        labels=by_model,
    )
    size = GaugeMetricFamily(
        "fairgate_model_memory_bytes",
        "What a held model takes (weights and KV cache).",
        labels=by_model,
    )
    used = GaugeMetricFamily(
        "fairgate_backend_memory_bytes",
        "What an Ollama backend's held models take together.",
        labels=["backend"],
    )
    budget = GaugeMetricFamily(
        "fairgate_backend_memory_budget_bytes",
        "The policy's memory for an Ollama backend.",
        labels=["backend"],
    )
    held = [
        ((backend.name, labels.model(model.model)), model)
        for backend in snapshot.backends
        if backend.slots_per_model is not None
        for model in backend.models
    ]
    add_merged(busy, ((named, model.busy) for named, model in held))
    # Several models under other: their largest context (a sum of contexts means nothing).
    add_merged(context, ((named, model.num_ctx) for named, model in held), max)
    add_merged(size, ((named, model.size) for named, model in held))
    for backend in snapshot.backends:
        if backend.slots_per_model is None:
            continue
        used.add_metric([backend.name], backend.memory_used)
        if backend.memory is not None:
            budget.add_metric([backend.name], backend.memory)
    yield from (busy, context, size, used, budget)
    yield from _swaps(snapshot, labels)


_COUNTERS = {
    "loads": "Models loaded because of a request (a load beside the others, a swap, a reload).",
    "evictions": "Models the gateway unloaded to make room for another.",
    "reloads": "Models reloaded for a request with another num_ctx.",
    "swaps": "Swaps done: the victims drained and unloaded, then this model sent.",
    "swap_wait_seconds": "Seconds from planning each swap to sending its model (the drain).",
}


def _swaps(snapshot: GatewaySnapshot, labels: MetricLabels) -> Iterator[Metric]:
    families = {
        name: CounterMetricFamily(f"fairgate_model_{name}", text, labels=["backend", "model"])
        for name, text in _COUNTERS.items()
    }
    pending = GaugeMetricFamily(
        "fairgate_swap_pending_seconds",
        "How long the swap under way has waited for its victims to drain.",
        labels=["backend", "model"],
    )
    for name, family in families.items():
        counted = (
            ((backend.name, labels.model(model)), value)
            for backend in snapshot.backends
            for (model, counter), value in backend.model_counts.items()
            if counter == name
        )
        add_merged(family, counted)
    for backend in snapshot.backends:
        if backend.swap is not None:  # one at a time per backend
            pending.add_metric(
                [backend.name, labels.model(backend.swap.model)], backend.swap.waited
            )
    yield from (*families.values(), pending)
