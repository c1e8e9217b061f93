"""One house across replicas: the household split over two replicas sharing one Redis,
against one replica, side by side in one process.

The flood of benchmarks/fairness.py (three light users chatting, a heavy user keeping six
long prompts in flight) through the fair scheduler, four ways, each on a fresh simulator
(2 slots, a long prefill stalls every stream) and a fresh Redis:

1. one replica, no Redis: the reference;
2. one replica on Redis: what sharing costs by itself;
3. two replicas, split adversarially: the heavy user through A, the family through B;
4. two replicas behind a round-robin load balancer: each user's requests alternate.

Prints, per run, each user's TTFT p50/p95 and the light users' p95 against run 1 (the
acceptance of the one waiting room: within 1.25x for runs 3 and 4), 503s, and the most
requests the backend ever ran at once (never above its 2 slots).

    .venv/bin/python -m benchmarks.replicas [--rounds N]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import shutil
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from aiohttp import web

from benchmarks.fairness import FLOOD, SIM, Run, household_policy, report
from benchmarks.household import Mix, Outcome, Route, p95, run_mix
from fairsim import SimConfig, Simulator
from gateway.app import bound_url, create_app, start_server
from gateway.config.policy import parse_policy
from gateway.config.settings import IN_MEMORY, Settings
from gateway.core.logs import configure_logging
from tests.redis_server import RedisServer

__all__ = ["Layout", "compare", "main"]


@dataclass(frozen=True)
class Layout:
    """How the household reaches the gateway: ``replicas`` of them, on Redis or not, and
    how users are sent to them (``split``: heavy to the first, the rest to the second;
    else round-robin, request by request)."""

    name: str
    replicas: int
    redis: bool
    split: bool = False


LAYOUTS = (
    Layout("one replica, no Redis (the reference)", 1, redis=False),
    Layout("one replica on Redis", 1, redis=True),
    Layout("two replicas, heavy through A, the family through B", 2, redis=True, split=True),
    Layout("two replicas, round-robin", 2, redis=True),
)


async def _serve(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = await start_server(app, "127.0.0.1", 0)
    return runner, bound_url(runner)


@asynccontextmanager
async def _redis() -> AsyncIterator[str]:
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server is not on PATH (apt-get install redis-server)")
    server = RedisServer(binary, Path(tempfile.mkdtemp()))
    await server.start()
    try:
        yield server.url
    finally:
        await server.stop()


def _route(layout: Layout, urls: list[str]) -> Route:
    if len(urls) == 1:
        return urls[0]
    if layout.split:
        return lambda user: urls[0] if user == "heavy" else urls[1]
    turns = itertools.cycle(urls)
    return lambda user: next(turns)


async def _run(layout: Layout, mix: Mix, sim: SimConfig) -> Run:
    simulator = Simulator(replace(sim))
    async with AsyncExitStack() as stack:
        backend, sim_url = await _serve(simulator.make_app())
        stack.push_async_callback(backend.cleanup)
        redis_url = await stack.enter_async_context(_redis()) if layout.redis else None
        text = household_policy(sim_url, "fair", 1, mix)
        urls = []
        for _ in range(layout.replicas):
            settings = Settings(log_level="WARNING", usage_db=IN_MEMORY, redis_url=redis_url)
            runner, url = await _serve(create_app(settings, parse_policy(text)))
            stack.push_async_callback(runner.cleanup)
            urls.append(url)
        keys = {user: f"{user}-key" for user in parse_policy(text).users}
        started = time.perf_counter()
        outcomes = await run_mix(_route(layout, urls), mix, keys)
        seconds = time.perf_counter() - started
    return Run(layout.name, outcomes, seconds, simulator.stats.max_running)


async def compare(rounds: int = 1, mix: Mix = FLOOD, sim: SimConfig = SIM) -> list[Run]:
    """Each layout ``rounds`` times, interleaved; each layout's rounds pooled."""
    pooled: dict[str, Run] = {}
    for _ in range(rounds):
        for layout in LAYOUTS:
            run = await _run(layout, mix, sim)
            before = pooled.get(layout.name)
            pooled[layout.name] = run if before is None else _pool(before, run)
    return list(pooled.values())


def _pool(first: Run, second: Run) -> Run:
    outcomes = [
        Outcome(
            a.user,
            a.request_class,
            a.ttft + b.ttft,
            a.gaps + b.gaps,
            a.tokens + b.tokens,
            a.refused + b.refused,
            a.failed + b.failed,
        )
        for a, b in zip(first.outcomes, second.outcomes, strict=True)
    ]
    seconds, most = first.seconds + second.seconds, max(first.max_running, second.max_running)
    return Run(first.name, outcomes, seconds, most)


def ratios(runs: list[Run]) -> str:
    reference = p95(runs[0].light_ttft())
    return "\n".join(
        f"  {run.name}: light p95 {p95(run.light_ttft()) * 1000:.0f} ms = "
        f"{p95(run.light_ttft()) / reference:.2f}x the single replica"
        for run in runs
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1, help="each layout this many times")
    args = parser.parse_args()
    configure_logging("json", "WARNING")
    print(__doc__.split("\n\n")[0])
    runs = asyncio.run(compare(args.rounds))
    print(report(runs, "the single replica without Redis"))
    print("\nLight users' TTFT p95 against the single replica:")
    print(ratios(runs))


if __name__ == "__main__":
    main()
