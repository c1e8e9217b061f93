"""``fairgate plan``: size a backend's slots, context and the gateway's queues from the model's
shape, the memory left for its KV cache, and how the household uses it; with ``--also``,
which of several models fit together on one Ollama.

One module per concern, so the arithmetic stays pure and testable apart from the network:
``sizing`` (``PlanInputs`` → ``Plan``, no I/O), ``sources`` (the model's shape and the load,
read over HTTP), ``report`` (text, YAML, JSON) and ``cli`` (the flags and the command). The
names below are re-exported so callers import from ``fairplan`` without knowing that layout.
"""

from __future__ import annotations

from fairplan.cli import add_plan_arguments, parse_size, run_plan
from fairplan.errors import PlanError
from fairplan.report import (
    binary_size,
    decimal_size,
    policy_yaml,
    reasons,
    render_json,
    render_text,
    server_settings,
)
from fairplan.sizing import ModelCost, ModelsPlan, Plan, PlanInputs, make_plan, plan_models
from fairplan.sources import (
    ModelShape,
    RequestTotals,
    llamacpp_shape,
    measure_load,
    measured_times,
    ollama_model_cost,
    ollama_shape,
    request_totals,
    scrape_totals,
    shape_from_model_info,
)

__all__ = [
    "ModelCost",
    "ModelShape",
    "ModelsPlan",
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
    "ollama_model_cost",
    "ollama_shape",
    "parse_size",
    "plan_models",
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
