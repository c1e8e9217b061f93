"""The arithmetic of ``fairgate plan``: ``PlanInputs`` → ``Plan``.

From the model's shape, the memory left for its KV cache and how the household uses it, to the
slots, context and queue sizes to configure. Pure — no I/O, no clock — so every number can be
checked against a worked example, and the readers and the report can change without touching it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal

__all__ = [
    "BYTES_PER_VALUE",
    "DEFAULT_MAX_WAIT",
    "HEADROOM",
    "MAX_QUEUED",
    "KvType",
    "ModelCost",
    "ModelsPlan",
    "Plan",
    "PlanInputs",
    "kv_bytes_per_token",
    "make_plan",
    "plan_models",
]

KvType = Literal["f16", "q8_0", "q4_0"]

# ggml block sizes: q8_0 stores 32 values in 34 bytes, q4_0 in 18 (a scale plus the values).
BYTES_PER_VALUE: dict[str, Fraction] = {
    "f16": Fraction(2),
    "q8_0": Fraction(34, 32),
    "q4_0": Fraction(18, 32),
}
HEADROOM = Fraction(3, 2)
"""Slots per expected request in flight: turns arrive in bursts, not evenly."""
MAX_QUEUED = 2
DEFAULT_MAX_WAIT = 30


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
    per_token = kv_bytes_per_token(inputs.layers, inputs.kv_heads, inputs.head_dim, inputs.kv_type)
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


def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, kv_type: KvType) -> int:
    """A K and a V vector per layer and KV head, as llama.cpp's KV cache allocates them."""
    return math.ceil(2 * layers * kv_heads * head_dim * BYTES_PER_VALUE[kv_type])


def _exact(seconds: float) -> Fraction:
    return Fraction(repr(seconds))  # 0.1 as 1/10, not the nearest binary fraction


@dataclass(frozen=True)
class ModelCost:
    """One model as it loads: its weights, and its KV cache per token of context."""

    name: str
    weights: int
    bytes_per_token: int


@dataclass(frozen=True)
class ModelsPlan:
    """Several models on one Ollama, each loaded with the plan's slots and num_ctx."""

    memory: int
    sizes: dict[str, int]  # model -> bytes loaded (weights and slots x num_ctx of cache)
    max_loaded_models: int  # the main model and as many others as fit beside it
    main_fits: bool  # the main model alone fits
    main_stays: bool  # the main model fits beside the largest other: it can be resident


def plan_models(
    main: ModelCost, others: list[ModelCost], slots: int, num_ctx: int, memory: int
) -> ModelsPlan:
    """Which of the models fit together in ``memory`` when each runner has ``slots`` slots
    of ``num_ctx`` tokens (Ollama's OLLAMA_NUM_PARALLEL and OLLAMA_CONTEXT_LENGTH apply to
    every model). The main model stays; the others come and go, smallest first."""
    sizes = {m.name: m.weights + m.bytes_per_token * num_ctx * slots for m in (main, *others)}
    room, count = memory - sizes[main.name], 1
    for size in sorted(sizes[m.name] for m in others):
        if size > room:
            break
        room, count = room - size, count + 1
    largest = max((sizes[m.name] for m in others), default=0)
    return ModelsPlan(
        memory=memory,
        sizes=sizes,
        max_loaded_models=count,
        main_fits=sizes[main.name] <= memory,
        main_stays=sizes[main.name] + largest <= memory,
    )
