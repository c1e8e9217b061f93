"""The report of ``fairgate plan``: text for people, JSON for scripts, YAML to paste.

Every recommended number comes with the reason for it, so the plan can be checked rather than
trusted. Only formatting lives here: the numbers come from ``fairplan.sizing``.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict

from fairplan.sizing import BYTES_PER_VALUE, DEFAULT_MAX_WAIT, ModelsPlan, Plan
from fairplan.sources import ModelShape

__all__ = [
    "binary_size",
    "decimal_size",
    "policy_yaml",
    "reasons",
    "render_json",
    "render_text",
    "server_settings",
]


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
    if kind.startswith("llamacpp"):
        # -c is the whole cache, split evenly over -np slots (the server logs n_ctx_slot);
        # a router passes both to each model's process (or its preset says parallel, ctx-size).
        quant = f" -fa on -ctk {i.kv_type} -ctv {i.kv_type}" if i.kv_type != "f16" else ""
        models = " --models-dir DIR --models-max N" if kind == "llamacpp-router" else ""
        return f"llama-server{models} -np {p.slots} -c {p.slots * p.num_ctx}{quant}"
    # https://github.com/ollama/ollama/blob/main/docs/faq.md: memory scales with
    # NUM_PARALLEL x CONTEXT_LENGTH; a quantized cache needs flash attention.
    quant = (
        f" OLLAMA_FLASH_ATTENTION=1 OLLAMA_KV_CACHE_TYPE={i.kv_type}" if i.kv_type != "f16" else ""
    )
    return f"OLLAMA_NUM_PARALLEL={p.slots} OLLAMA_CONTEXT_LENGTH={p.num_ctx}{quant}"


def policy_yaml(
    plan: Plan, name: str, url: str, kind: str, models: ModelsPlan | None = None
) -> str:
    """A complete policy: the backend with its slots (and, for several models, its memory
    and the main model kept), the per-user defaults, the queue."""
    knob = "-np" if kind.startswith("llamacpp") else "OLLAMA_NUM_PARALLEL"
    several = ""
    if models is not None:
        main = next(iter(models.sizes))
        several = (
            f"    memory: {models.memory}  # {binary_size(models.memory)}\n"
            f"    max_loaded_models: {models.max_loaded_models}\n"
            + (f"    resident: [{main}]\n" if models.main_stays else "")
        )
    ctx = "" if models is None else f"num_ctx: {{override: {plan.num_ctx}}}\n"
    return (
        "backends:\n"
        f"  - name: {name}\n    url: {url}\n    kind: {kind}\n"
        f"    slots: {plan.slots}  # = {knob}, per model\n" + several + ctx + "defaults:\n"
        f"  max_concurrent: {plan.max_concurrent}\n  max_queued: {plan.max_queued}\n"
        "queue:\n"
        f"  max_depth: {plan.queue_depth}\n  max_wait: {plan.max_wait}s\n"
    )


def models_lines(plan: Plan, models: ModelsPlan) -> list[str]:
    """Several models: each one's size loaded with the plan's slots and context, what fits
    together, and whether the main model can stay."""
    main = next(iter(models.sizes))
    lines = [
        f"Several models in {binary_size(models.memory)}, each with {plan.slots} slots of "
        f"{plan.num_ctx:,} tokens (OLLAMA_NUM_PARALLEL and OLLAMA_CONTEXT_LENGTH apply to each):",
        *(f"  {name:<24} {binary_size(size)}" for name, size in models.sizes.items()),
        f"  max_loaded_models = {models.max_loaded_models}: {main} and the smallest others "
        "that fit beside it",
    ]
    if not models.main_fits:
        lines.append(f"  {main} alone does not fit: fewer slots, a shorter context, or more memory")
    elif models.main_stays:
        lines.append(
            f"  resident: [{main}]: it fits beside the largest other, so swaps are among the "
            "others and never cost the main model"
        )
    else:
        lines.append(f"  {main} cannot stay beside the largest other: not resident")
    lines.append(
        f"  num_ctx: {{override: {plan.num_ctx}}}: a client asking another context would reload"
    )
    return lines


def render_text(
    plan: Plan,
    shape: ModelShape,
    backend: tuple[str, str, str],
    models: ModelsPlan | None = None,
) -> str:
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
    lines += [f"  server: {server_settings(plan, backend[2])}"]
    lines += ["", *models_lines(plan, models)] if models is not None else []
    lines += ["", "Policy YAML (paste):", ""]
    return "\n".join(lines) + "\n" + policy_yaml(plan, *backend, models)


def render_json(
    plan: Plan,
    shape: ModelShape,
    backend: tuple[str, str, str],
    models: ModelsPlan | None = None,
) -> str:
    """The same for scripts: inputs, every number, the reasons and the YAML."""
    document = {
        "inputs": asdict(plan.inputs),
        "source": shape.source,
        "notes": list(shape.notes),
        **{k: v for k, v in asdict(plan).items() if k != "inputs"},
        "llamacpp_ctx_size": plan.slots * plan.num_ctx,
        "server": server_settings(plan, backend[2]),
        "reasons": reasons(plan),
        "yaml": policy_yaml(plan, *backend, models),
        "models": None if models is None else asdict(models),
    }
    return json.dumps(document, indent=2)
