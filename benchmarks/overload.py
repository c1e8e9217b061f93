"""Overload: offer 10x more concurrent requests than the backend has slots, and time the 503s.

A simulated Ollama with 2 slots (core 1), the gateway (core 0, its own process) and a fast
closed-loop client (``benchmarks.wire_client``, core 1) with 20 connections spread over 8
users, each allowed 1 running and 1 waiting request. A refused client asks again at once,
so the gateway answers a steady stream of 503s while it relays the replies that fit. Prints
the latency of the refusals (the time to say "no") and of the successes, the most requests
the backend ever saw at once, and the gateway's memory before and after each run. Two runs
are a storm (a refused client asks again at once, so the gateway is never idle); a third
has refused clients wait 50 ms first, which still offers refusals at many times the rate
the backend serves.

    .venv/bin/python -m benchmarks.overload [--factor 10] [--seconds 10]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import aiohttp

from benchmarks.overhead import client_figures, spawn_pinned
from tests.processes import free_port, stop, until_answers

SLOTS = 2
PAUSE = 0.05  # a client that waits a little before asking again
USERS = [f"user{n}" for n in range(8)]


def _policy(sim_url: str) -> str:
    users = "".join(f"  {user}: {{keys: [{user}-key]}}\n" for user in USERS)
    return (
        "defaults: {max_concurrent: 1, max_queued: 1}\n"
        "queue: {max_depth: 4, max_wait: 10s}\n"
        f"users:\n{users}"
        f"backends:\n  - {{name: sim, url: {sim_url}, kind: ollama, slots: {SLOTS}}}\n"
    )


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def _sim_stats(url: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as session, session.get(url + "/sim/stats") as reply:
        stats: dict[str, Any] = await reply.json()
        return stats


async def main(factor: int, seconds: float) -> None:
    workdir = Path(tempfile.mkdtemp(prefix="fairgate-overload-"))
    sim_port, gateway_port = free_port(), free_port()
    sim_url, url = f"http://127.0.0.1:{sim_port}", f"http://127.0.0.1:{gateway_port}"
    policy = workdir / "fairgate.yaml"
    policy.write_text(_policy(sim_url))
    env = {
        **os.environ,
        "FAIRGATE_CONFIG": str(policy),
        "FAIRGATE_LISTEN": f"127.0.0.1:{gateway_port}",
        "FAIRGATE_LOG_LEVEL": "WARNING",
        "FAIRGATE_USAGE_DB": str(workdir / "usage.db"),
    }
    sim_command = ["-m", "gateway", "sim", "--port", str(sim_port), "--parallel", str(SLOTS)]
    sim_command += ["--prefill-tps", "0", "--decode-tps", "200", "--output-tokens", "8"]
    processes = [await spawn_pinned(1, sys.executable, *sim_command)]
    try:
        processes.append(await spawn_pinned(0, sys.executable, "-m", "gateway", "serve", env=env))
        gateway = processes[-1]
        await until_answers(url + "/", 20)
        keys = [f"{user}-key" for user in USERS]
        rss = [_rss_mib(gateway.pid)]
        runs: dict[float, list[dict[str, Any]]] = {0.0: [], PAUSE: []}
        for pause in (0.0, 0.0, PAUSE):
            runs[pause].append(await client_figures(url, SLOTS * factor, seconds, keys, pause))
            rss.append(_rss_mib(gateway.pid))
        stats = await _sim_stats(sim_url)
    finally:
        for process in reversed(processes):
            await stop(process)
    print(
        f"overload: {SLOTS * factor} clients ({factor}x the backend's {SLOTS} slots), "
        f"{len(USERS)} users with 1 running + 1 waiting each, {seconds:g} s per run"
    )
    for pause, figures_of_runs in runs.items():
        print(
            f"  refused clients ask again {'at once (a storm)' if not pause else 'after '}"
            f"{f'{pause * 1e3:g} ms' if pause else ''}:"
        )
        for n, figures in enumerate(figures_of_runs, 1):
            for status, seen in figures["statuses"].items():
                print(
                    f"    run {n}  {status}: {seen['count']:6d} answers "
                    f"({seen['count'] / seconds:5.0f}/s)   "
                    f"p50 {seen['p50'] * 1e3:7.2f} ms   p99 {seen['p99'] * 1e3:7.2f} ms"
                )
    print(f"  backend max concurrent seen: {stats['max_running']} (slots {SLOTS})")
    print("  gateway RSS: " + ", then ".join(f"{mib:.1f} MiB" for mib in rss))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--factor", type=int, default=10, help="offered load / capacity")
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    asyncio.run(main(args.factor, args.seconds))
