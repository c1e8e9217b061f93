"""Reading what ``fairgate plan`` computes from: the model's shape and the household's load.

Small async functions over HTTP: the shape from Ollama's ``/api/show`` or llama-server's
``/props`` and ``/v1/models``, the load from the gateway's own ``/metrics``. Kept apart from the
arithmetic so that stays pure, and from the command line so tests can call them against real
servers directly. A server that answers unexpectedly raises ``PlanError``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from fairplan.errors import PlanError
from fairplan.sizing import KvType, ModelCost, kv_bytes_per_token

__all__ = [
    "ModelShape",
    "RequestTotals",
    "llamacpp_shape",
    "measure_load",
    "measured_times",
    "ollama_model_cost",
    "ollama_shape",
    "request_totals",
    "scrape_totals",
    "shape_from_model_info",
]


@dataclass(frozen=True)
class ModelShape:
    """What a server said about a model; None where it says nothing."""

    layers: int | None = None
    kv_heads: int | None = None
    head_dim: int | None = None
    context_length: int | None = None
    source: str = "flags"
    notes: tuple[str, ...] = ()


def shape_from_model_info(info: Mapping[str, Any]) -> ModelShape:
    """The shape in Ollama's /api/show ``model_info``: GGUF keys under the architecture."""
    arch = info.get("general.architecture")
    if not isinstance(arch, str):
        raise PlanError("model_info has no general.architecture")

    def number(key: str) -> int | None:
        value = info.get(f"{arch}.{key}")
        # Some architectures give one value per layer; the largest layer bounds them all.
        if isinstance(value, list):
            value = max(value, default=None)
        return value if isinstance(value, int) else None

    heads = number("attention.head_count")
    embedding = number("embedding_length")
    head_dim = number("attention.key_length")
    if head_dim is None and heads and embedding:
        head_dim = embedding // heads
    return ModelShape(
        layers=number("block_count"),
        # GGUF leaves head_count_kv out when it equals head_count (no grouped-query attention).
        kv_heads=number("attention.head_count_kv") or heads,
        head_dim=head_dim,
        context_length=number("context_length"),
    )


async def ollama_shape(session: aiohttp.ClientSession, url: str, model: str) -> ModelShape:
    """The model's shape from Ollama's ``POST /api/show``."""
    body = await _json(session.post(f"{url}/api/show", json={"model": model}))
    shape = shape_from_model_info(body.get("model_info") or {})
    return replace(shape, source=f"{model} at {url} (/api/show)")


async def ollama_model_cost(
    session: aiohttp.ClientSession, url: str, model: str, kv_type: KvType
) -> ModelCost:
    """A model's weights (its file size in ``GET /api/tags``) and KV cache per token (its
    shape in ``POST /api/show``)."""
    shape = await ollama_shape(session, url, model)
    if not (shape.layers and shape.kv_heads and shape.head_dim):
        raise PlanError(f"{model}: /api/show does not give its layers, KV heads and head size")
    tags = await _json(session.get(f"{url}/api/tags"))
    sizes = {
        entry.get("name"): entry.get("size")
        for entry in tags.get("models", [])
        if isinstance(entry, dict)
    }
    weights = sizes.get(model, sizes.get(f"{model}:latest"))
    if not isinstance(weights, int):
        raise PlanError(f"{model} is not in {url}/api/tags")
    per_token = kv_bytes_per_token(shape.layers, shape.kv_heads, shape.head_dim, kv_type)
    return ModelCost(model, weights, per_token)


async def llamacpp_shape(
    session: aiohttp.ClientSession, url: str, model: str | None, router: bool = False
) -> ModelShape:
    """What llama-server tells: its trained context in ``GET /v1/models`` meta, its slots and
    their context in ``GET /props`` (a router's: the model's own, while it is loaded);
    layers, KV heads and head size it does not expose."""
    props = await _json(session.get(f"{url}/props"))
    if (props.get("role") == "router") != router:
        kind = "llamacpp-router" if props.get("role") == "router" else "llamacpp"
        raise PlanError(f"{url} is {_ROLES[kind]}: --kind {kind}")
    if router and not model:
        raise PlanError("--model is needed to ask a router about one of its models")
    listing = await _json(session.get(f"{url}/v1/models"))
    entries = [e for e in listing.get("data", []) if isinstance(e, dict)]
    asked = (model or "").casefold()  # as the gateway, blind to case
    chosen = [e for e in entries if asked in (str(n).casefold() for n in _names(e))]
    if router and not chosen:  # one llama-server serves its model whatever it is called
        names = ", ".join(str(e.get("id")) for e in entries) or "none"
        raise PlanError(f"the router at {url} has no model {model!r} (--model); it has {names}")
    if router:  # its own /props says the router's role; the model's, its slots
        props = await _model_props(session, url, str(chosen[0].get("id")))
    meta = (chosen or entries or [{}])[0].get("meta") or {}
    slots = props.get("total_slots")
    per_slot = (props.get("default_generation_settings") or {}).get("n_ctx")
    name = model or props.get("model_alias") or props.get("model_path", "the model")
    return ModelShape(
        context_length=meta.get("n_ctx_train"),
        source=f"{name} at {url} (/props, /v1/models)",
        notes=(f"llama-server runs {slots} slot(s) of {per_slot:,} tokens now",)
        if isinstance(slots, int) and isinstance(per_slot, int)
        else (),
    )


_ROLES = {"llamacpp": "one llama-server", "llamacpp-router": "llama-server's router"}


def _names(entry: dict[str, Any]) -> list[object]:
    aliases = entry.get("aliases")
    return [entry.get("id"), *(aliases if isinstance(aliases, list) else [])]


async def _model_props(session: aiohttp.ClientSession, url: str, model: str) -> dict[str, Any]:
    """A router's model's /props, without loading it ({} while it is not loaded)."""
    async with session.get(f"{url}/props", params={"model": model, "autoload": "false"}) as reply:
        body = await reply.json(content_type=None) if reply.status == 200 else {}
    return body if isinstance(body, dict) else {}


async def _json(request: Any) -> dict[str, Any]:
    async with request as reply:
        if reply.status != 200:
            raise PlanError(
                f"{reply.method} {reply.url}: HTTP {reply.status}: {await reply.text()}"
            )
        body = await reply.json(content_type=None)
    if not isinstance(body, dict):
        raise PlanError(f"{reply.url}: expected a JSON object")
    return body


@dataclass(frozen=True)
class RequestTotals:
    """The gateway's fairgate_request_duration_seconds histogram, all classes together."""

    count: float
    seconds: float

    def __sub__(self, earlier: RequestTotals) -> RequestTotals:
        return RequestTotals(self.count - earlier.count, self.seconds - earlier.seconds)


def request_totals(exposition: str) -> RequestTotals:
    """The request count and seconds in a Prometheus text exposition of the gateway."""
    count = seconds = 0.0
    for family in text_string_to_metric_families(exposition):
        if family.name == "fairgate_request_duration_seconds":
            for sample in family.samples:
                count += sample.value if sample.name.endswith("_count") else 0.0
                seconds += sample.value if sample.name.endswith("_sum") else 0.0
    return RequestTotals(count, seconds)


async def scrape_totals(session: aiohttp.ClientSession, url: str) -> RequestTotals:
    """The totals in the gateway's /metrics (``url`` may name the gateway or /metrics)."""
    metrics_url = url if url.rstrip("/").endswith("/metrics") else url.rstrip("/") + "/metrics"
    async with session.get(metrics_url) as reply:
        if reply.status != 200:
            raise PlanError(f"GET {metrics_url}: HTTP {reply.status}")
        return request_totals(await reply.text())


async def measure_load(
    session: aiohttp.ClientSession, url: str, window: float
) -> tuple[RequestTotals, float]:
    """Requests finished since the gateway started, or within ``window`` seconds from now."""
    first = await scrape_totals(session, url)
    if window <= 0:
        return first, 0.0
    await asyncio.sleep(window)  # the measurement window itself, not a wait for an event
    return await scrape_totals(session, url) - first, window


def measured_times(totals: RequestTotals, window: float, users: int) -> tuple[float, float | None]:
    """Seconds per reply (arrival to end, so queueing counts too: a cautious figure) and,
    when measured over a window, seconds between one user's turns, start to start."""
    if totals.count <= 0:
        raise PlanError("the gateway's metrics show no finished requests to measure")
    between = users * window / totals.count if window > 0 else None
    return totals.seconds / totals.count, between
