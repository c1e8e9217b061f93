"""Admission overhead per request: in-process state vs Redis, side by side in one run.

Drives Admission directly (no HTTP): acquire a permit, release it, N times one after
another, then N with 16 at a time; once with the in-memory state and once with a
throwaway redis-server on loopback (Debian's redis-server must be on PATH).

    .venv/bin/python -m benchmarks.admission_overhead [--requests 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from gateway.admission import Admission, Permit, Ticket
from gateway.errors import Api
from gateway.live import PolicyView
from gateway.policy import parse_policy
from gateway.state import MemoryState, SharedState
from gateway.state.redis import RedisState
from tests.redis_server import RedisServer

POLICY = """\
defaults: {max_concurrent: 16, max_queued: 64}
queue: {max_depth: 64}
backends:
  - {name: gpu, url: http://127.0.0.1:9, kind: ollama, slots: 16}
"""


async def _cycle(admission: Admission, n: int) -> float:
    started = time.perf_counter()
    permit = await admission.acquire(Ticket(f"user{n % 4}", "m", Api.OLLAMA))
    assert isinstance(permit, Permit)
    async with permit:
        pass
    return time.perf_counter() - started


async def _measure(state: SharedState, requests: int) -> tuple[list[float], float]:
    policy = parse_policy(POLICY)
    admission = Admission(policy, PolicyView.of(policy, {}).pool, state=state)
    sequential = [await _cycle(admission, n) for n in range(requests)]
    started = time.perf_counter()
    for batch in range(requests // 16):
        await asyncio.gather(*(_cycle(admission, batch * 16 + n) for n in range(16)))
    return sequential, (time.perf_counter() - started) / requests


def _line(name: str, sequential: list[float], concurrent: float) -> str:
    cuts = statistics.quantiles(sequential, n=100)
    return (
        f"  {name:8}  p50 {cuts[49] * 1e6:8.1f} us   p99 {cuts[98] * 1e6:8.1f} us"
        f"   16 at a time: {concurrent * 1e6:8.1f} us per request"
    )


async def main(requests: int) -> None:
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server is not on PATH (apt-get install redis-server)")
    memory = await _measure(MemoryState(), requests)
    server = RedisServer(binary, Path(tempfile.mkdtemp()))
    await server.start()
    try:
        state = RedisState(server.url)
        shared = await _measure(state, requests)
        await state.close()
    finally:
        await server.stop()
    print(f"admission overhead, {requests} acquire+release cycles (no HTTP, loopback Redis)")
    print(_line("memory", *memory))
    print(_line("redis", *shared))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    asyncio.run(main(parser.parse_args().requests))
