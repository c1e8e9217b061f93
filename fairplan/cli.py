"""The ``fairgate plan`` command line: flags in, a report out.

Flags win over what the servers report, so a missing or wrong number can always be given by
hand; anything still missing is an error naming the flag. Only ``add_plan_arguments`` and
``run_plan`` are the gateway's concern: its ``__main__`` offers ``plan`` when this package is
installed, and the gateway-only image leaves it out.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

import aiohttp

from fairplan.errors import PlanError
from fairplan.report import render_json, render_text
from fairplan.sizing import BYTES_PER_VALUE, ModelCost, PlanInputs, make_plan, plan_models
from fairplan.sources import (
    ModelShape,
    RequestTotals,
    llamacpp_shape,
    measure_load,
    measured_times,
    ollama_model_cost,
    ollama_shape,
)
from gateway.core import parse_duration
from gateway.core import parse_size as parse_bytes

__all__ = ["DEFAULT_URLS", "add_plan_arguments", "parse_size", "run_plan"]

DEFAULT_URLS: dict[str, str] = {
    "ollama": "http://127.0.0.1:11434",
    "llamacpp": "http://127.0.0.1:8080",
    "llamacpp-router": "http://127.0.0.1:8080",
}


def parse_size(text: str) -> int:
    """Bytes from ``6GiB``, ``512MiB``, ``6GB`` (1000-based) or ``6G`` (1024-based, like
    llama.cpp and Docker)."""
    try:
        return parse_bytes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


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
    add("--kind", choices=list(DEFAULT_URLS), default="ollama", help="its kind (ollama)")
    add("--model", help="the model to ask about (needed for ollama and a router)")
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
    add(
        "--also",
        action="append",
        default=[],
        metavar="MODEL",
        help="ollama: another model used now and then (repeat); needs --backend and --memory",
    )
    add(
        "--memory",
        type=parse_size,
        metavar="SIZE",
        help="ollama: memory for every loaded model together (24GiB), for --also",
    )
    add("--json", action="store_true", help="print JSON instead of text")


def run_plan(args: argparse.Namespace) -> int:
    """The ``plan`` command: 0 when a plan was printed, 1 when it could not be made."""
    shape, load, models = ModelShape(), None, None
    try:
        if args.also and not (args.backend and args.kind == "ollama" and args.memory):
            raise PlanError("--also needs an ollama --backend to ask and --memory to fit in")
        if args.backend or args.from_metrics:
            shape, load = asyncio.run(_read(args))
        inputs = _inputs(args, shape, load)
        plan = make_plan(inputs)
        if args.also:
            main, others = asyncio.run(_costs(args))
            models = plan_models(main, others, plan.slots, plan.num_ctx, args.memory)
    except (PlanError, aiohttp.ClientError, json.JSONDecodeError, TimeoutError) as exc:
        print(f"fairgate plan: {exc or type(exc).__name__}", file=sys.stderr)
        return 1
    backend = (args.name or args.kind, args.backend or DEFAULT_URLS[args.kind], args.kind)
    render = render_json if args.json else render_text
    print(render(plan, shape, backend, models))
    return 0


async def _costs(args: argparse.Namespace) -> tuple[ModelCost, list[ModelCost]]:
    """What the main model and the --also ones weigh loaded, from the Ollama backend."""
    url = args.backend.rstrip("/")
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        costs = [
            await ollama_model_cost(session, url, model, args.kv_type)
            for model in (args.model, *args.also)
        ]
    return costs[0], costs[1:]


async def _read(args: argparse.Namespace) -> tuple[ModelShape, tuple[RequestTotals, float] | None]:
    timeout = aiohttp.ClientTimeout(total=30 + args.window)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        shape = ModelShape()
        if args.backend and args.kind == "ollama":
            if not args.model:
                raise PlanError("--model is needed to ask Ollama about a model")
            shape = await ollama_shape(session, args.backend.rstrip("/"), args.model)
        elif args.backend:
            url, router = args.backend.rstrip("/"), args.kind == "llamacpp-router"
            shape = await llamacpp_shape(session, url, args.model, router)
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
