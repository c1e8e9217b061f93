"""Prometheus families for the models each Ollama backend holds, read from the snapshot at
scrape time: their requests, context, memory against the budget.

Apart from ``metrics.py`` because they belong to residency (``residency.py``); the model
label is bounded by what the backends hold.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric

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
