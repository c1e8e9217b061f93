"""``fairgate plan``: size a backend's slots, context and the gateway's queues from the model's
shape, the memory left for its KV cache, and how the household uses it.

Three layers: the arithmetic (``PlanInputs`` → ``Plan``, pure), reading the model's shape and
the load (small async functions over HTTP), and the report (text, YAML, JSON).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import re
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from fractions import Fraction
from typing import Any, Literal

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from gateway.durations import parse_duration

__all__ = [
    "ModelShape",
    "Plan",
    "PlanError",
    "PlanInputs",
    "RequestTotals",
    "add_plan_arguments",
    "binary_size",
    "decimal_size",
    "llamacpp_shape",
    "make_plan",
    "measure_load",
    "measured_times",
    "ollama_shape",
    "parse_size",
    "policy_yaml",
    "reasons",
    "render_json",
    "render_text",
    "request_totals",
    "run_plan",
    "scrape_totals",
    "server_settings",
    "shape_from_model_info",
]

KvType = Literal["f16", "q8_0", "q4_0"]

# ggml block sizes: q8_0 stores 32 values in 34 bytes, q4_0 in 18 (a scale plus the values).
BYTES_PER_VALUE: dict[str, Fraction] = {
    "f16": Fraction(2),
    "q8_0": Fraction(34, 32),
    "q4_0": Fraction(18, 32),
}
DEFAULT_URLS: dict[str, str] = {
    "ollama": "http://127.0.0.1:11434",
    "llamacpp": "http://127.0.0.1:8080",
}
HEADROOM = Fraction(3, 2)
"""Slots per expected request in flight: turns arrive in bursts, not evenly."""
MAX_QUEUED = 2
DEFAULT_MAX_WAIT = 30


class PlanError(Exception):
    """The plan cannot be made: a number is missing, or a server did not answer as expected."""


# ---- the arithmetic -------------------------------------------------------------------------


@dataclass(frozen=True)
class PlanInputs:
    """Everything the plan is computed from; sizes in bytes, times in seconds."""

    layers: int
    kv_heads: int
    head_dim: int
    kv_memory: int
    context: int
    users: int
    gen_seconds: float
    think_seconds: float
    kv_type: KvType = "f16"
    context_length: int | None = None
    """The model's trained context; a longer --context is cut to it."""


@dataclass(frozen=True)
class Plan:
    """The numbers `fairgate plan` recommends, and the intermediate ones it explains them by."""

    inputs: PlanInputs
    num_ctx: int
    bytes_per_token: int
    bytes_per_conversation: int
    fit: int
    in_flight: float
    wanted: int
    slots: int
    max_concurrent: int
    max_queued: int
    queue_depth: int
    max_wait: int


def make_plan(inputs: PlanInputs) -> Plan:
    """The plan for ``inputs``; exact fractions, so 2.666… x 1.5 is 4, not 4.000001."""
    num_ctx = min(inputs.context, inputs.context_length or inputs.context)
    # A K and a V vector per layer and KV head, as llama.cpp's KV cache allocates them.
    values = 2 * inputs.layers * inputs.kv_heads * inputs.head_dim
    per_token = math.ceil(values * BYTES_PER_VALUE[inputs.kv_type])
    per_conversation = per_token * num_ctx
    fit = inputs.kv_memory // per_conversation
    # Little's law, with think_seconds measured from the start of one turn to the next.
    in_flight = inputs.users * _exact(inputs.gen_seconds) / _exact(inputs.think_seconds)
    wanted = math.ceil(in_flight * HEADROOM)
    slots = max(1, min(fit, wanted))
    depth = 2 * slots
    return Plan(
        inputs=inputs,
        num_ctx=num_ctx,
        bytes_per_token=per_token,
        bytes_per_conversation=per_conversation,
        fit=fit,
        in_flight=float(in_flight),
        wanted=wanted,
        slots=slots,
        max_concurrent=max(1, slots // inputs.users),
        max_queued=MAX_QUEUED,
        queue_depth=depth,
        # The last in the queue waits about depth / slots turns of the others.
        max_wait=max(DEFAULT_MAX_WAIT, math.ceil(_exact(inputs.gen_seconds) * depth / slots)),
    )


def _exact(seconds: float) -> Fraction:
    return Fraction(repr(seconds))  # 0.1 as 1/10, not the nearest binary fraction


# ---- reading the model's shape and the load -------------------------------------------------


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


async def llamacpp_shape(session: aiohttp.ClientSession, url: str, model: str | None) -> ModelShape:
    """What llama-server tells: its trained context in ``GET /v1/models`` meta, its slots and
    their context in ``GET /props``; layers, KV heads and head size it does not expose."""
    props = await _json(session.get(f"{url}/props"))
    listing = await _json(session.get(f"{url}/v1/models"))
    entries = [e for e in listing.get("data", []) if isinstance(e, dict)]
    chosen = [e for e in entries if model in (e.get("id"), *e.get("aliases", []))]
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


# ---- the report -----------------------------------------------------------------------------


def binary_size(n: float) -> str:
    """``147456`` → ``144 KiB``: 1024-based, one decimal at most."""
    return _size(n, 1024, ("bytes", "KiB", "MiB", "GiB", "TiB"))


def decimal_size(n: float) -> str:
    """``1207959552`` → ``1.2 GB``: 1000-based, as disks and spec sheets count."""
    return _size(n, 1000, ("bytes", "kB", "MB", "GB", "TB"))


def _size(n: float, step: int, units: tuple[str, ...]) -> str:
    power = 0
    while n >= step and power < len(units) - 1:
        n, power = n / step, power + 1
    return f"{_one_decimal(n)} {units[power]}"


def _one_decimal(value: float) -> str:
    return f"{value:.1f}".removesuffix(".0")


def reasons(plan: Plan) -> dict[str, str]:
    """One line per recommended setting, saying where its number comes from."""
    i, p = plan.inputs, plan
    slots = f"min({p.fit} that fit in memory, ceil({p.in_flight:.1f} in flight x 1.5) = {p.wanted})"
    if p.fit < 1:
        slots = f"not even one {p.num_ctx:,}-token conversation fits; 1 anyway (lower --context)"
    elif p.slots < math.ceil(p.in_flight):
        slots += ": memory-bound, fewer slots than requests in flight, expect waits"
    share = f"{i.users} users >= {p.slots} slots: one running request each keeps turns fair"
    if i.users < p.slots:
        share = f"{p.slots} slots // {i.users} users: each may use its share at once"
    ctx = f"{i.context:,} tokens per conversation"
    if p.num_ctx < i.context:
        ctx = f"the model's trained context ({p.num_ctx:,}), below the {i.context:,} asked"
    return {
        "slots": slots + ", at least 1",
        "num_ctx": ctx,
        "max_concurrent": share,
        "max_queued": "a retry or a second tab may wait; more gets a fast 503",
        "queue_depth": f"2 x {p.slots} slots: a short waiting room, so saying no is fast",
        "max_wait": f"the last of {p.queue_depth} waits ~{p.queue_depth}/{p.slots} x "
        f"{i.gen_seconds:g} s; at least {DEFAULT_MAX_WAIT} s",
    }


def server_settings(plan: Plan, kind: str) -> str:
    """The backend's own settings for the plan (each slot gets num_ctx of KV cache)."""
    i, p = plan.inputs, plan
    if kind == "llamacpp":
        # -c is the whole cache, split evenly over -np slots (the server logs n_ctx_slot).
        quant = f" -fa on -ctk {i.kv_type} -ctv {i.kv_type}" if i.kv_type != "f16" else ""
        return f"llama-server -np {p.slots} -c {p.slots * p.num_ctx}{quant}"
    # https://github.com/ollama/ollama/blob/main/docs/faq.md: memory scales with
    # NUM_PARALLEL x CONTEXT_LENGTH; a quantized cache needs flash attention.
    quant = (
        f" OLLAMA_FLASH_ATTENTION=1 OLLAMA_KV_CACHE_TYPE={i.kv_type}" if i.kv_type != "f16" else ""
    )
    return f"OLLAMA_NUM_PARALLEL={p.slots} OLLAMA_CONTEXT_LENGTH={p.num_ctx}{quant}"


def policy_yaml(plan: Plan, name: str, url: str, kind: str) -> str:
    """A complete policy: the backend with its slots, the per-user defaults, the queue."""
    knob = "-np" if kind == "llamacpp" else "OLLAMA_NUM_PARALLEL"
    return (
        "backends:\n"
        f"  - name: {name}\n    url: {url}\n    kind: {kind}\n"
        f"    slots: {plan.slots}  # = {knob}\n"
        "defaults:\n"
        f"  max_concurrent: {plan.max_concurrent}\n  max_queued: {plan.max_queued}\n"
        "queue:\n"
        f"  max_depth: {plan.queue_depth}\n  max_wait: {plan.max_wait}s\n"
    )


def render_text(plan: Plan, shape: ModelShape, backend: tuple[str, str, str]) -> str:
    """The report for people: the arithmetic, one line per setting, then the YAML."""
    i, p = plan.inputs, plan
    bpv = f"{float(BYTES_PER_VALUE[i.kv_type]):g}"
    trained = f", trained context {i.context_length:,}" if i.context_length else ""
    conv = p.bytes_per_conversation
    lines = [
        f"Model: {shape.source}: {i.layers} layers, {i.kv_heads} KV heads x {i.head_dim} dims"
        + trained,
        *(f"  ({note})" for note in shape.notes),
        f"KV cache per token: 2 x {i.layers} layers x {i.kv_heads} KV heads x {i.head_dim} dims"
        f" x {bpv} bytes ({i.kv_type}) = {p.bytes_per_token:,} bytes"
        f" ({binary_size(p.bytes_per_token)})",
        f"Per conversation: {p.num_ctx:,} tokens = {conv:,} bytes"
        f" ({binary_size(conv)}, {decimal_size(conv)})",
        f"Fit in {binary_size(i.kv_memory)}: {p.fit} conversations"
        f" ({i.kv_memory / conv:.1f}; the longest single one: {i.kv_memory // p.bytes_per_token:,}"
        " tokens)",
        f"In flight: {i.users} users x {i.gen_seconds:g} s generating / {i.think_seconds:g} s"
        f" between turns = {p.in_flight:.1f} requests",
        "",
        "Recommended:",
    ]
    why = reasons(plan)
    rows = [
        (f"slots = {p.slots}", why["slots"]),
        (f"num_ctx = {p.num_ctx}", why["num_ctx"]),
        (f"defaults.max_concurrent = {p.max_concurrent}", why["max_concurrent"]),
        (f"defaults.max_queued = {p.max_queued}", why["max_queued"]),
        (f"queue.max_depth = {p.queue_depth}", why["queue_depth"]),
        (f"queue.max_wait = {p.max_wait}s", why["max_wait"]),
    ]
    lines += [f"  {setting:<30} {reason}" for setting, reason in rows]
    lines += [f"  server: {server_settings(plan, backend[2])}", "", "Policy YAML (paste):", ""]
    return "\n".join(lines) + "\n" + policy_yaml(plan, *backend)


def render_json(plan: Plan, shape: ModelShape, backend: tuple[str, str, str]) -> str:
    """The same for scripts: inputs, every number, the reasons and the YAML."""
    document = {
        "inputs": asdict(plan.inputs),
        "source": shape.source,
        "notes": list(shape.notes),
        **{k: v for k, v in asdict(plan).items() if k != "inputs"},
        "llamacpp_ctx_size": plan.slots * plan.num_ctx,
        "server": server_settings(plan, backend[2]),
        "reasons": reasons(plan),
        "yaml": policy_yaml(plan, *backend),
    }
    return json.dumps(document, indent=2)


# ---- the command line -----------------------------------------------------------------------

_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([kmgt]?)(i?)(b?)", re.IGNORECASE)


def parse_size(text: str) -> int:
    """Bytes from ``6GiB``, ``512MiB``, ``6GB`` (1000-based) or ``6G`` (1024-based, like
    llama.cpp and Docker)."""
    match = _SIZE.fullmatch(text.strip())
    if match is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size such as 6GiB, 512MiB or 8GB")
    number, unit, binary, byte = match.groups()
    power = "kmgt".index(unit.lower()) + 1 if unit else 0
    base = 1000 if byte and not binary and unit else 1024
    return int(Fraction(number) * base**power)


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of at least 1")
    return int(text)


def _duration(text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_plan_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``fairgate plan``'s flags to ``parser``."""
    add = parser.add_argument
    add("--backend", metavar="URL", help="read the model's shape from this server")
    add("--kind", choices=["ollama", "llamacpp"], default="ollama", help="its kind (ollama)")
    add("--model", help="the model to ask about (needed for ollama)")
    add("--name", help="the backend's name in the YAML (default: its kind)")
    unreported = "(llama-server does not report it)"
    add("--layers", type=_positive, metavar="N", help=f"block_count {unreported}")
    add("--kv-heads", type=_positive, metavar="N", help=f"head_count_kv {unreported}")
    add("--head-dim", type=_positive, metavar="N", help=f"key_length {unreported}")
    add("--context-length", type=_positive, metavar="TOKENS", help="the model's trained context")
    add("--kv-memory", type=parse_size, required=True, metavar="SIZE", help="6GiB, 8GB, 512MiB")
    add("--kv-type", choices=list(BYTES_PER_VALUE), default="f16", help="KV precision (f16)")
    add("--context", type=_positive, default=8192, metavar="TOKENS", help="per request (8192)")
    add("--users", type=_positive, required=True, metavar="N", help="people and devices")
    add("--gen-seconds", type=_duration, metavar="DURATION", help="one reply, e.g. 12s")
    add("--think-seconds", type=_duration, metavar="DURATION", help="one user's turn to turn")
    add("--from-metrics", metavar="URL", help="the gateway: measure reply time (and turns)")
    add("--window", type=_duration, default=0.0, metavar="DURATION", help="measure for, e.g. 5m")
    add("--json", action="store_true", help="print JSON instead of text")


def run_plan(args: argparse.Namespace) -> int:
    """The ``plan`` command: 0 when a plan was printed, 1 when it could not be made."""
    shape, load = ModelShape(), None
    try:
        if args.backend or args.from_metrics:
            shape, load = asyncio.run(_read(args))
        inputs = _inputs(args, shape, load)
    except (PlanError, aiohttp.ClientError, json.JSONDecodeError, TimeoutError) as exc:
        print(f"fairgate plan: {exc or type(exc).__name__}", file=sys.stderr)
        return 1
    plan = make_plan(inputs)
    backend = (args.name or args.kind, args.backend or DEFAULT_URLS[args.kind], args.kind)
    render = render_json if args.json else render_text
    print(render(plan, shape, backend))
    return 0


async def _read(args: argparse.Namespace) -> tuple[ModelShape, tuple[RequestTotals, float] | None]:
    timeout = aiohttp.ClientTimeout(total=30 + args.window)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        shape = ModelShape()
        if args.backend and args.kind == "ollama":
            if not args.model:
                raise PlanError("--model is needed to ask Ollama about a model")
            shape = await ollama_shape(session, args.backend.rstrip("/"), args.model)
        elif args.backend:
            shape = await llamacpp_shape(session, args.backend.rstrip("/"), args.model)
        load = (
            await measure_load(session, args.from_metrics, args.window)
            if args.from_metrics
            else None
        )
    return shape, load


def _shape_numbers(args: argparse.Namespace, shape: ModelShape) -> tuple[int, int, int]:
    layers = args.layers or shape.layers
    kv_heads = args.kv_heads or shape.kv_heads
    head_dim = args.head_dim or shape.head_dim
    if layers and kv_heads and head_dim:
        return layers, kv_heads, head_dim
    flags = ("--layers", "--kv-heads", "--head-dim")
    missing = ", ".join(
        flag for flag, value in zip(flags, (layers, kv_heads, head_dim), strict=True) if not value
    )
    where = f"{shape.source} does not report them" if args.backend else "no --backend to ask"
    raise PlanError(f"give {missing} ({where})")


def _inputs(
    args: argparse.Namespace, shape: ModelShape, load: tuple[RequestTotals, float] | None
) -> PlanInputs:
    """Flags win over what the servers said; anything still missing is an error naming it."""
    layers, kv_heads, head_dim = _shape_numbers(args, shape)
    gen, think = args.gen_seconds, args.think_seconds
    if load is not None:
        measured_gen, measured_think = measured_times(*load, users=args.users)
        gen = gen if gen is not None else measured_gen
        think = think if think is not None else measured_think
    if gen is None or not think:
        raise PlanError("give --gen-seconds and --think-seconds (or --from-metrics with --window)")
    return PlanInputs(
        layers=layers, kv_heads=kv_heads, head_dim=head_dim, kv_memory=args.kv_memory,
        context=args.context, users=args.users, gen_seconds=gen, think_seconds=think,
        kv_type=args.kv_type, context_length=args.context_length or shape.context_length,
    )  # fmt: skip
