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
    "Plan",
    "PlanInputs",
    "make_plan",
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
