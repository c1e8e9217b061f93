"""Overload: offer 10x more concurrent requests than the backend has slots, and time the 503s.

Starts a simulated Ollama (2 slots) and the gateway in this process, on loopback, then sends
waves of concurrent requests from several users. Prints p50/p99 latency of the refusals
(the time to say "no"), of the successes, and the process's memory before and after.

    .venv/bin/python benchmarks/overload.py [--waves 20] [--factor 10]
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import statistics
import time

import aiohttp

from gateway.app import bound_url, create_app, start_server
from gateway.logs import configure_logging
from gateway.policy import parse_policy
from gateway.settings import Settings
from gateway.sim import SimConfig, Simulator

SLOTS = 2
USERS = [f"user{n}" for n in range(8)]


def _policy(sim_url: str) -> str:
    users = "".join(f"  {user}: {{keys: [{user}-key]}}\n" for user in USERS)
    return (
        "defaults: {max_concurrent: 1, max_queued: 1}\n"
        "queue: {max_depth: 4, max_wait: 10s}\n"
        f"users:\n{users}"
        f"backends:\n  - {{name: sim, url: {sim_url}, kind: ollama, slots: {SLOTS}}}\n"
    )


def _rss_mib() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


async def _one(session: aiohttp.ClientSession, url: str, n: int) -> tuple[int, float]:
    headers = {"Authorization": f"Bearer {USERS[n % len(USERS)]}-key"}
    body = {"model": "llama3.2:3b", "prompt": f"overload {n}", "options": {"num_predict": 8}}
    started = time.perf_counter()
    async with session.post(url + "/api/generate", json=body, headers=headers) as reply:
        await reply.read()
        return reply.status, time.perf_counter() - started


def _percentiles(values: list[float]) -> str:
    if len(values) < 2:
        return "n/a"
    cuts = statistics.quantiles(values, n=100)
    return f"p50 {cuts[49] * 1000:7.2f} ms   p99 {cuts[98] * 1000:7.2f} ms"


async def main(waves: int, factor: int) -> None:
    configure_logging("json", "WARNING")
    sim = Simulator(SimConfig(parallel=SLOTS, prefill_tokens_per_s=0, decode_tokens_per_s=200))
    backend = await start_server(sim.make_app(), "127.0.0.1", 0)
    gateway_app = create_app(
        Settings(log_level="WARNING"), parse_policy(_policy(bound_url(backend)))
    )
    gateway = await start_server(gateway_app, "127.0.0.1", 0)
    url = bound_url(gateway)
    concurrent = SLOTS * factor
    statuses: dict[int, list[float]] = {}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        await _one(session, url, 0)  # warm up connections and the model
        rss_before = _rss_mib()
        for wave in range(waves):
            results = await asyncio.gather(
                *(_one(session, url, wave * concurrent + n) for n in range(concurrent))
            )
            for status, seconds in results:
                statuses.setdefault(status, []).append(seconds)
        rss_after = _rss_mib()
    await gateway.cleanup()
    await backend.cleanup()

    print(f"overload: {waves} waves of {concurrent} concurrent requests, {SLOTS} backend slots")
    for status in sorted(statuses):
        print(f"  {status}: {len(statuses[status]):6d} requests   {_percentiles(statuses[status])}")
    print(f"  backend max concurrent seen: {sim.stats.max_running} (slots {SLOTS})")
    print(f"  RSS before {rss_before:.1f} MiB, after {rss_after:.1f} MiB")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--waves", type=int, default=20)
    parser.add_argument("--factor", type=int, default=10, help="offered load / capacity")
    args = parser.parse_args()
    asyncio.run(main(args.waves, args.factor))
