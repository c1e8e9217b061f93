"""Prometheus families for the models each Ollama backend holds, read from the snapshot at
scrape time: their requests, context, memory against the budget.

Apart from ``metrics.py`` because they belong to residency (``residency.py``); the model
label is bounded by what the backends hold.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from gateway.snapshot import GatewaySnapshot

__all__ = ["model_families"]


def model_families(snapshot: GatewaySnapshot) -> Iterator[Metric]:
    labels = ["backend", "model"]
    busy = GaugeMetricFamily(
        "fairgate_model_slots_busy",
        "Requests running on a model an Ollama backend holds.",
        labels=labels,
    )
    context = GaugeMetricFamily(
        "fairgate_model_context_tokens",
        "The context per slot a held model was loaded with.",
        labels=labels,
    )
    size = GaugeMetricFamily(
        "fairgate_model_memory_bytes",
        "What a held model takes (weights and KV cache).",
        labels=labels,
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
    for backend in snapshot.backends:
        if backend.slots_per_model is None:
            continue
        used.add_metric([backend.name], backend.memory_used)
        if backend.memory is not None:
            budget.add_metric([backend.name], backend.memory)
        for model in backend.models:
            busy.add_metric([backend.name, model.model], model.busy)
            context.add_metric([backend.name, model.model], model.num_ctx)
            size.add_metric([backend.name, model.model], model.size)
    yield from (busy, context, size, used, budget)
    yield from _swaps(snapshot)


_COUNTERS = {
    "loads": "Models loaded because of a request (a load beside the others, a swap, a reload).",
    "evictions": "Models the gateway unloaded to make room for another.",
    "reloads": "Models reloaded for a request with another num_ctx.",
    "swaps": "Swaps done: the victims drained and unloaded, then this model sent.",
    "swap_wait_seconds": "Seconds from planning each swap to sending its model (the drain).",
}


def _swaps(snapshot: GatewaySnapshot) -> Iterator[Metric]:
    families = {
        name: CounterMetricFamily(f"fairgate_model_{name}", text, labels=["backend", "model"])
        for name, text in _COUNTERS.items()
    }
    pending = GaugeMetricFamily(
        "fairgate_swap_pending_seconds",
        "How long the swap under way has waited for its victims to drain.",
        labels=["backend", "model"],
    )
    for backend in snapshot.backends:
        for (model, counter), value in backend.model_counts.items():
            families[counter].add_metric([backend.name, model], value)
        if backend.swap is not None:
            pending.add_metric([backend.name, backend.swap.model], backend.swap.waited)
    yield from (*families.values(), pending)
