"""Fairness: the household mix run three ways, side by side, in one process.

1. direct: the light users and ONE well-behaved heavy user (one request at a time) straight
   to the backend, no gateway: the reference, what light users get beside heavy work that
   behaves.
2. fifo: the heavy user floods (several long prompts at once) through the gateway with
   first-come-first-served ordering and no class limit, which is what Ollama does.
3. fair: the same flood through the gateway with the weighted fair scheduler and heavy
   requests limited to one of the two slots, each waiting (2 s at most) for the light
   requests running beside it to end before its prefill stalls them.

The backend is the simulator: 2 slots, a long prompt's prefill stalls every stream (as
llama.cpp's batches do). Prints, per user and per class: requests, 503s, TTFT p50/p95,
ITL p95, tokens; Jain's fairness index over the light users' TTFT; throughput.

    .venv/bin/python -m benchmarks.fairness

With ``--engine llama-server`` the household runs against the real llama-server the tests
build instead (benchmarks/real_engine.py: four runs of a minute each and their drains, 4-9
minutes a round).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from dataclasses import dataclass, replace

from aiohttp import web

from benchmarks import real_engine
from benchmarks.chat_household import Household
from benchmarks.household import Mix, Outcome, p95, run_mix
from fairsim import SimConfig, Simulator
from gateway.app import SERVICES, bound_url, create_app, start_server
from gateway.config.policy import parse_policy
from gateway.config.settings import IN_MEMORY, Settings
from gateway.core.logs import configure_logging

__all__ = ["Run", "compare", "household_policy", "main", "report"]

SLOTS = 2
SIM = SimConfig(
    parallel=SLOTS,
    prefill_tokens_per_s=20_000.0,
    decode_tokens_per_s=100.0,
    decode_slowdown=0.1,
    prefill_blocks_decode=True,
)
FLOOD = Mix()
REFERENCE = replace(FLOOD, heavy_streams=1)


@dataclass
class Run:
    name: str
    outcomes: list[Outcome]
    seconds: float
    max_running: int
    # The gateway's waiting estimates: their median error over people's waits, and how many.
    estimates: tuple[float | None, int] | None = None

    def light_ttft(self) -> list[float]:
        return [t for o in self.outcomes if o.request_class == "light" for t in o.ttft]


def household_policy(sim_url: str, scheduling: str, heavy_slots: int, mix: Mix) -> str:
    users = [f"light{n}" for n in range(mix.light_users)] + ["heavy"]
    entries = "".join(f"  {user}: {{keys: [{user}-key]}}\n" for user in users)
    # fifo stands for the backend on its own: heavy requests start whenever a slot is free.
    wait = 0 if scheduling == "fifo" else "2s"
    return (
        f"scheduling: {scheduling}\n"
        f"classes: {{heavy: {{min_prompt_tokens: 1000, max_slots: {heavy_slots}, "
        f"wait_for_light: {wait}}}}}\n"
        f"defaults: {{max_concurrent: {mix.heavy_streams}, max_queued: 8}}\n"
        "queue: {max_depth: 32, max_wait: 60s}\n"
        f"users:\n{entries}"
        f"backends:\n  - {{name: sim, url: {sim_url}, kind: ollama, slots: {SLOTS}}}\n"
    )


async def _serve(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = await start_server(app, "127.0.0.1", 0)
    return runner, bound_url(runner)


async def _run(
    name: str, mix: Mix, sim: SimConfig, scheduling: str | None, heavy_slots: int = SLOTS
) -> Run:
    simulator = Simulator(replace(sim))
    backend, sim_url = await _serve(simulator.make_app())
    runners = [backend]
    url, keys, app = sim_url, None, None
    if scheduling is not None:
        policy = parse_policy(household_policy(sim_url, scheduling, heavy_slots, mix))
        app = create_app(Settings(log_level="WARNING", usage_db=IN_MEMORY), policy)
        gateway, url = await _serve(app)
        runners.append(gateway)
        keys = {user: f"{user}-key" for user in policy.users}
    started = time.perf_counter()
    try:
        outcomes = await run_mix(url, mix, keys)
    finally:
        estimates = None
        if app is not None:
            found = app[SERVICES].admission.snapshot().estimates
            estimates = (found.median_error, found.samples)
        for runner in reversed(runners):
            await runner.cleanup()
    seconds = time.perf_counter() - started
    return Run(name, outcomes, seconds, simulator.stats.max_running, estimates)


async def compare(
    flood: Mix = FLOOD, reference: Mix = REFERENCE, sim: SimConfig = SIM
) -> list[Run]:
    """The three runs, one after another on the same machine."""
    return [
        await _run("direct, one heavy request at a time", reference, sim, None),
        await _run("gateway fifo, heavy flood", flood, sim, "fifo"),
        await _run("gateway fair, heavy flood", flood, sim, "fair", heavy_slots=1),
    ]


def jain(values: list[float]) -> float:
    """Jain's index: 1 when every value is equal, 1/n when one takes everything."""
    if not values or not any(values):
        return float("nan")
    return sum(values) ** 2 / (len(values) * sum(v * v for v in values))


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:8.0f}"


def report(runs: list[Run], reference_name: str = "the direct reference") -> str:
    """Each run's table, and its light users' TTFT p95 against the first run's."""
    lines = []
    reference = p95(runs[0].light_ttft())
    for run in runs:
        tokens = sum(o.tokens for o in run.outcomes)
        lines.append(
            f"\n{run.name}: {run.seconds:.2f} s, {tokens / run.seconds:.0f} tokens/s, "
            f"backend max concurrent {run.max_running}"
        )
        lines.append("  user      class  requests  503s  TTFT p50  TTFT p95  ITL p95  tokens")
        for o in run.outcomes:
            median = statistics.median(o.ttft) if o.ttft else float("nan")
            lines.append(
                f"  {o.user:8}  {o.request_class:5}  {len(o.ttft):8d}  {o.refused:4d}"
                f"  {_ms(median)}"
                f"  {_ms(p95(o.ttft))}  {_ms(p95(o.gaps))}  {o.tokens:6d}"
            )
        light = run.light_ttft()
        per_user = [
            statistics.mean(o.ttft) for o in run.outcomes if o.request_class == "light" and o.ttft
        ]
        lines.append(
            f"  light p95 TTFT {p95(light) * 1000:.0f} ms = {p95(light) / reference:.2f}x "
            f"{reference_name}; Jain index over light users' mean TTFT {jain(per_user):.3f}"
        )
        if run.estimates is not None:
            error, waits = run.estimates
            said = "none measured" if error is None else f"median error {error:.0%}"
            lines.append(f"  waiting estimates (people's): {said} over {waits} waits")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--engine",
        choices=["simulator", "llama-server"],
        default="simulator",
        help="the simulated backend (seconds), or the real llama-server the tests build "
        "(four runs of --seconds each, plus their drains)",
    )
    parser.add_argument("--seconds", type=float, default=60.0, help="llama-server: load time")
    parser.add_argument("--seed", type=int, default=23, help="llama-server: the household's seed")
    parser.add_argument(
        "--rounds", type=int, default=1, help="llama-server: the four runs this many times, pooled"
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=2,
        help="llama-server: CPU threads (-t; 2 as in the tests; 1 holds up better on a busy "
        "machine, where a thread that waits for a descheduled one spins)",
    )
    args = parser.parse_args()
    configure_logging("json", "WARNING")
    if args.engine == "llama-server":
        real_engine.main(
            Household(load_seconds=args.seconds, seed=args.seed), args.rounds, args.threads
        )
        return
    print(__doc__.split("\n\n")[0])
    print(report(asyncio.run(compare())))


if __name__ == "__main__":
    main()
