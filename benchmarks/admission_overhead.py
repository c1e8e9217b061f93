"""Admission overhead per request: one replica vs Redis, side by side in one run.

Drives Admission directly (no HTTP): acquire a permit, release it, N times one after
another, then N with 16 at a time; once with a single replica (no hold store) and once with a
throwaway redis-server on loopback (Debian's redis-server must be on PATH). The times are
of the acquire, what a request waits before it is relayed; each release (in Redis, a
background script and a published message) runs on the same loop meanwhile, as it would
in the gateway.

    .venv/bin/python -m benchmarks.admission_overhead [--requests 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from gateway.admission import Admission, Permit, Ticket
from gateway.app import new_event_loop
from gateway.backends import BackendStates
from gateway.holds import HoldStore
from gateway.holds.redis import RedisHolds
from gateway.policy import parse_policy
from gateway.reload import PolicyView
from gateway.vocabulary import Api
from tests.redis_server import RedisServer

POLICY = """\
defaults: {max_concurrent: 16, max_queued: 64}
queue: {max_depth: 64}
backends:
  - {name: gpu, url: http://127.0.0.1:9, kind: ollama, slots: 16}
"""


async def _cycle(admission: Admission, n: int) -> float:
    """The time to admit one request; the release follows, as when its reply ends."""
    started = time.perf_counter()
    permit = await admission.acquire(Ticket(f"user{n % 4}", "m", Api.OLLAMA))
    admitted = time.perf_counter() - started
    assert isinstance(permit, Permit)
    async with permit:
        pass
    return admitted


async def _measure(state: HoldStore | None, requests: int) -> tuple[list[float], float]:
    policy = parse_policy(POLICY)
    admission = Admission(policy, PolicyView.of(policy, BackendStates()).pool, holds=state)
    for n in range(100):  # warm up: Redis connections are opened on first use
        await _cycle(admission, n)
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
    server = RedisServer(binary, Path(tempfile.mkdtemp()))
    await server.start()
    if hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) > 1:
        # As in a deployment: Redis on another core than the gateway.
        assert server._process is not None
        os.sched_setaffinity(server._process.pid, {1})
        os.sched_setaffinity(0, {0})
    memory = await _measure(None, requests)
    try:
        state = RedisHolds(server.url)
        state.start()
        shared = await _measure(state, requests)
        await state.close()
    finally:
        await server.stop()
    print(
        f"admission overhead: time to acquire, {requests} acquire+release cycles "
        f"(no HTTP, loopback Redis, {type(asyncio.get_running_loop()).__module__} loop)"
    )
    print(_line("local", *memory))
    print(_line("redis", *shared))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    # The event loop `fairgate serve` uses (uvloop when installed).
    loop = new_event_loop("auto")
    loop.run_until_complete(main(parser.parse_args().requests))
    loop.close()
