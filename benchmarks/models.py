"""Several models on one Ollama: each scenario run straight to the simulated Ollama, then
through the gateway, side by side in one process.

1. Context thrash: one model, three people whose clients ask for num_ctx 2048, nothing (the
   default 4096) and 8192. Direct, every change reloads the model; the gateway has a
   num_ctx rule (override: 8192).
2. A resident family model: three models, room for two. The family chats with the main
   model; two others are used now and then, one after the other. Direct, Ollama unloads
   whichever model is idle first; through the gateway the main model is `resident:`.
3. Two models, memory for one, both in use: swaps are inherent. Direct, Ollama swaps when
   its queue reaches a request for the other model; through the gateway the gateway plans
   them.

The simulator behaves as Ollama's scheduler does (fairsim/ollama_sched.py): slots per
model, loads that take time by size, evictions that wait for the victim's requests, the
queue held meanwhile. Prints per scenario and run: requests, 503s, light-chat TTFT p50/p95,
tokens/s, loads, reloads and evictions (Ollama's own, and the gateway's), seconds requests
were held in Ollama's queue, and for the gateway each swap's drain.

    .venv/bin/python -m benchmarks.models [SCENARIO NUMBER...]
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import aiohttp
from aiohttp import web

from benchmarks.household import p95
from fairsim import SimConfig, Simulator
from gateway.app import SERVICES, bound_url, create_app, start_server
from gateway.config.policy import parse_policy
from gateway.config.settings import Settings
from gateway.core.logs import configure_logging
from gateway.edge.record import RequestRecord
from gateway.swaps.outcomes import DoneSwap

__all__ = ["SCENARIOS", "Scenario", "User", "main"]

LLAMA, QWEN, PHI = "llama3.2:3b", "qwen2.5:7b", "phi3:3.8b"
GB = 10**9
SIM = SimConfig(
    parallel=2,
    prefill_tokens_per_s=2000.0,
    decode_tokens_per_s=60.0,
    decode_slowdown=0.1,
    load_seconds=0.3,
    load_seconds_per_gib=0.3,  # a 3B model with 2 slots of 4096: about 1.1 s; 7B: 1.7 s
    unload_seconds=0.2,  # Ollama's wait for the GPU's memory to come back
)


@dataclass(frozen=True)
class User:
    name: str
    model: str
    chats: int
    num_ctx: int | None = None
    output: int = 12
    think: tuple[float, float] = (0.3, 1.5)  # seconds between a reply and the next question
    start: float = 0.0  # seconds after the run starts
    family: bool = True  # counted in "light chats" of the scenario's verdict
    background: bool = False  # an agent's work: sent with X-Lane: background


@dataclass(frozen=True)
class Scenario:
    name: str
    sim: SimConfig
    users: tuple[User, ...]
    policy: str  # the gateway's lines beside users and backends
    backend: str = ""  # fields added to the backend's line
    slots: int | None = None  # the backend's slots in the policy; None: the simulator's


@dataclass
class Seen:
    """What one user saw."""

    user: User
    ttft: list[float] = field(default_factory=list)
    tokens: int = 0
    refused: int = 0
    failed: int = 0


@dataclass
class Run:
    name: str
    seen: list[Seen]
    seconds: float
    sim: Simulator
    records: list[RequestRecord] = field(default_factory=list)
    swaps: tuple[DoneSwap, ...] = ()
    counts: dict[tuple[str, str, str], float] = field(default_factory=dict)
    runs_fewer_after: float | None = None  # seconds into the run the gateway found it

    def light_ttft(self) -> list[float]:
        return [t for s in self.seen if s.user.family for t in s.ttft]


SCENARIOS = (
    Scenario(
        "1. context thrash: one model, clients asking num_ctx 2048 / default / 8192",
        replace(SIM, models=[LLAMA]),
        (
            User("ctx2k", LLAMA, 10, num_ctx=2048),
            User("ctxdef", LLAMA, 10),
            User("ctx8k", LLAMA, 10, num_ctx=8192),
        ),
        "num_ctx: {override: 8192}\n",
    ),
    Scenario(
        "2. a resident family model: three models, room for two",
        replace(SIM, models=[LLAMA, QWEN, PHI], max_loaded_models=2, memory=9 * GB),
        (
            User("mum", LLAMA, 10, think=(1.0, 3.0)),
            User("dad", LLAMA, 10, think=(1.0, 3.0)),
            User("kid", LLAMA, 10, think=(1.0, 3.0)),
            User("coder", QWEN, 6, output=48, think=(1.0, 2.0), family=False),
            User("helper", PHI, 6, output=48, think=(1.0, 2.0), start=1.2, family=False),
        ),
        "",
        f", max_loaded_models: 2, memory: {9 * GB}, resident: [{LLAMA}]",
    ),
    Scenario(
        "3. two models, memory for one, both in use",
        replace(SIM, models=[LLAMA, QWEN], memory=6 * GB),
        (
            User("ann", LLAMA, 8),
            User("bea", LLAMA, 8),
            User("cal", QWEN, 8),
            User("dan", QWEN, 8),
        ),
        "",
        f", memory: {6 * GB}",
    ),
    Scenario(
        "4. two models, memory for one: two people and an agent on the large one, a child "
        "on the small one",
        replace(SIM, models=[LLAMA, QWEN], memory=6 * GB),
        (
            User("ann", QWEN, 10, think=(0.5, 2.0)),
            User("bea", QWEN, 10, think=(0.5, 2.0)),
            User("agent", QWEN, 14, output=64, think=(0.1, 0.4), family=False, background=True),
            User("kid", LLAMA, 8, think=(0.5, 2.0), family=False),
        ),
        "lanes: {header: X-Lane}\n",
        f", memory: {6 * GB}",
    ),
)


def _policy(scenario: Scenario, sim_url: str) -> str:
    users = "".join(f"  {u.name}: {{keys: [{u.name}-key]}}\n" for u in scenario.users)
    slots = scenario.slots or scenario.sim.parallel
    return (
        "monitoring: {interval: 500ms}\n"
        "defaults: {max_concurrent: 1, max_queued: 4}\n"
        "queue: {max_depth: 32, max_wait: 120s}\n"
        + scenario.policy
        + f"users:\n{users}"
        + f"backends:\n  - {{name: gpu, url: {sim_url}, slots: {slots}"
        + f"{scenario.backend}}}\n"
    )


async def _user(
    session: aiohttp.ClientSession, url: str, seen: Seen, keyed: bool, seed: int
) -> None:
    user, rng = seen.user, random.Random(seed)
    await asyncio.sleep(user.start)
    for chat in range(user.chats):
        body: dict[str, Any] = {
            "model": user.model,
            "messages": [{"role": "user", "content": f"{user.name} {chat}: " + "why " * 40}],
            "options": {"num_predict": user.output}
            | ({} if user.num_ctx is None else {"num_ctx": user.num_ctx}),
        }
        headers = {"Authorization": f"Bearer {user.name}-key"} if keyed else {}
        headers |= {"X-Lane": "background"} if user.background else {}
        sent = time.perf_counter()
        async with session.post(url + "/api/chat", json=body, headers=headers) as reply:
            if reply.status != 200:
                seen.refused += reply.status == 503
                seen.failed += reply.status != 503
                await reply.read()
            else:
                first = True
                async for line in reply.content:
                    chunk = json.loads(line)
                    if chunk.get("done") or not chunk.get("message", {}).get("content"):
                        continue
                    if first:
                        seen.ttft.append(time.perf_counter() - sent)
                        first = False
                    seen.tokens += 1
        await asyncio.sleep(rng.uniform(*user.think))


async def _warm(session: aiohttp.ClientSession, url: str, user: User, keyed: bool) -> None:
    body = {"model": user.model, "prompt": "warm up", "stream": False}
    body |= {} if user.num_ctx is None else {"options": {"num_ctx": user.num_ctx}}
    headers = {"Authorization": f"Bearer {user.name}-key"} if keyed else {}
    async with session.post(url + "/api/generate", json=body, headers=headers) as reply:
        await reply.read()


async def _serve(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = await start_server(app, "127.0.0.1", 0)
    return runner, bound_url(runner)


async def run(scenario: Scenario, through_gateway: bool) -> Run:
    """One run of ``scenario``, straight to the simulator or through a gateway."""
    simulator = Simulator(replace(scenario.sim))
    backend, url = await _serve(simulator.make_app())
    runners, gateway = [backend], None
    records: list[RequestRecord] = []
    if through_gateway:
        app = create_app(Settings(log_level="ERROR"), parse_policy(_policy(scenario, url)))
        gateway = app[SERVICES]
        gateway.on_finished.append(records.append)
        runner, url = await _serve(app)
        runners.append(runner)
    seen = [Seen(user) for user in scenario.users]
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            # The first model is loaded before the clock starts, in both runs alike: a
            # household's day does not start with every model cold.
            await _warm(session, url, scenario.users[0], through_gateway)
            started, begun = time.perf_counter(), time.monotonic()
            await asyncio.gather(
                *(_user(session, url, s, through_gateway, n) for n, s in enumerate(seen))
            )
        seconds = time.perf_counter() - started
        swaps = gateway.admission.room.swaps if gateway is not None else None
        found = None if gateway is None else gateway.policy.current.pool.backends[0].state
        fewer = None if found is None or found.runs_at_most is None else found.runs_at_most.at
        result = Run(
            "through the gateway" if through_gateway else "direct to Ollama",
            seen,
            seconds,
            simulator,
            records,
            tuple(swaps.recent) if swaps is not None else (),
            dict(swaps.counts) if swaps is not None else {},
            None if fewer is None else fewer - begun,
        )
    finally:
        for runner in reversed(runners):
            await runner.cleanup()
    return result


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:7.0f}"


def _swap_lines(run: Run) -> list[str]:
    """Each swap's drain, and the longest a request for a model other than the one swapped
    in waited while that swap was pending (requests for held models are not held back
    beyond the drain; in Ollama's queue they would wait through the load too)."""
    if not run.swaps:
        return []
    drains = [s.sent_at - s.planned_at for s in run.swaps]
    behind = 0.0
    for record in run.records:
        if record.dispatched_at is None or record.model is None:
            continue
        for swap in run.swaps:
            if record.model == swap.model:
                continue
            overlap = min(record.dispatched_at, swap.sent_at) - max(record.arrived, swap.planned_at)
            behind = max(behind, overlap)
    return [
        f"  gateway swaps: {len(drains)}, drain p50 {_ms(statistics.median(drains)).strip()} ms, "
        f"max {_ms(max(drains)).strip()} ms; longest wait of another model's request behind a "
        f"pending swap {_ms(behind).strip()} ms"
    ]


def report(scenario: Scenario, runs: list[Run], verdict: Callable[[list[Run]], str]) -> str:
    lines = [f"\n{scenario.name}"]
    for r in runs:
        stats = r.sim.stats
        tokens = sum(s.tokens for s in r.seen)
        light = r.light_ttft()
        median = statistics.median(light) if light else float("nan")
        gateway: dict[str, float] = {}
        for (_, _, counter), value in r.counts.items():
            gateway[counter] = gateway.get(counter, 0.0) + value
        lines.append(
            f"  {r.name:20} {r.seconds:6.2f} s  {tokens / r.seconds:5.0f} tokens/s  "
            f"light TTFT p50 {_ms(median)} ms p95 {_ms(p95(light))} ms  "
            f"requests {sum(len(s.ttft) for s in r.seen)} 503s {sum(s.refused for s in r.seen)}"
        )
        main_unloads = Counter(stats.unloaded)
        lines.append(
            f"  {'':20} Ollama: loads {stats.loads}, reloads {stats.reloads}, its own evictions "
            f"{stats.evictions}, unloads {dict(main_unloads)}; requests held in its queue "
            f"{stats.held_seconds:.1f} s, {stats.drain_held_seconds:.1f} s of it for drains"
            + (
                f"; gateway: loads {gateway.get('loads', 0):.0f}, reloads "
                f"{gateway.get('reloads', 0):.0f}, evictions {gateway.get('evictions', 0):.0f}"
                if r.records
                else ""
            )
        )
        lines.extend(_swap_lines(r))
    lines.append("  " + verdict(runs))
    return "\n".join(lines)


def _thrash(runs: list[Run]) -> str:
    direct, gate = runs
    loads = direct.sim.stats.loads / max(1, gate.sim.stats.loads)
    ttft = p95(direct.light_ttft()) / p95(gate.light_ttft())
    return f"=> {loads:.0f}x fewer loads, light p95 TTFT {ttft:.1f}x lower through the gateway"


def _resident(runs: list[Run]) -> str:
    direct, gate = runs
    unloaded = [Counter(r.sim.stats.unloaded)[LLAMA] for r in runs]
    ttft = p95(direct.light_ttft()) / p95(gate.light_ttft())
    return (
        f"=> {LLAMA} unloaded {unloaded[0]} times direct, {unloaded[1]} through the gateway; "
        f"the family's light p95 TTFT {ttft:.1f}x lower through the gateway"
    )


def _both(runs: list[Run]) -> str:
    direct, gate = runs
    ttft = p95(gate.light_ttft()) / p95(direct.light_ttft())
    rate = [sum(s.tokens for s in r.seen) / r.seconds for r in runs]
    return (
        f"=> through the gateway light p95 TTFT {ttft:.2f}x direct's, throughput "
        f"{rate[1] / rate[0]:.2f}x direct's"
    )


def _child(runs: list[Run]) -> str:
    direct, gate = runs
    loads = gate.sim.stats.loads / max(1, direct.sim.stats.loads)
    ttft = p95(gate.light_ttft()) / p95(direct.light_ttft())
    kid = [next(s for s in r.seen if s.user.name == "kid") for r in runs]
    return (
        f"=> through the gateway {loads:.2f}x direct's loads, the large model's people's "
        f"light p95 TTFT {ttft:.2f}x direct's; the child served {len(kid[1].ttft)} of "
        f"{kid[1].user.chats}, refused {kid[1].refused} (direct: {len(kid[0].ttft)}, "
        f"{kid[0].refused}), TTFT p95 {p95(kid[1].ttft):.2f} s (direct {p95(kid[0].ttft):.2f} s)"
    )


VERDICTS = (_thrash, _resident, _both, _child)


async def compare(only: set[int] | None = None) -> list[str]:
    """Every scenario (or those numbered in ``only``), direct then through the gateway, one
    after another."""
    reports = []
    for number, (scenario, verdict) in enumerate(zip(SCENARIOS, VERDICTS, strict=True), 1):
        if only and number not in only:
            continue
        runs = [await run(scenario, through_gateway=False), await run(scenario, True)]
        reports.append(report(scenario, runs, verdict))
    return reports


def main() -> None:
    configure_logging("json", "ERROR")  # cold starts are what these runs are about
    print(__doc__.split("\n\n")[0])
    only = {int(n) for n in sys.argv[1:]}  # scenario numbers; none: all
    for text in asyncio.run(compare(only)):
        print(text, flush=True)


if __name__ == "__main__":
    main()
