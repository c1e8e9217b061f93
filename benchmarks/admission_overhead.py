"""Admission overhead per request: one replica vs Redis, side by side in one run.

Drives Admission directly (no HTTP): acquire a permit, release it, N times one after
another, then N with 16 at a time; once with a single replica (no hold store) and once with a
throwaway redis-server on loopback (Debian's redis-server must be on PATH). The times are
of the acquire, what a request waits before it is relayed; each release (in Redis, a
background script and a published message) runs on the same loop meanwhile, as it would
in the gateway. With Redis, once more for users with a requests budget, each request
counted in flight before its acquire (one more script) and uncounted after its release.

First, the CPU one replica spends on an uncontended request's admission (a free slot,
nobody waiting, one Ollama backend holding the model, no swap planned, the policy of
benchmarks/overhead.py), in process time per pair, the best of several rounds: the
acquire and the release alone, then with what the request handler adds around them (the
quick no before the body, the arrival while it is read, the permit's notes as the reply
ends). To compare two trees, copy this file into the other (``git archive``) and run both.

    .venv/bin/python -m benchmarks.admission_overhead [--requests 2000] [--cpu-only]
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

from gateway.admission.admission import Admission
from gateway.admission.holds.base import HoldStore
from gateway.admission.holds.redis import RedisHolds
from gateway.admission.permit import Permit
from gateway.admission.tickets import Ticket
from gateway.app import new_event_loop
from gateway.backends.pool import BackendStates, LoadedModel
from gateway.config.policy import parse_policy
from gateway.core.vocabulary import Api, Lane
from gateway.reload import PolicyView
from tests.redis_server import RedisServer

POLICY = """\
defaults: {max_concurrent: 16, max_queued: 64}
queue: {max_depth: 64}
backends:
  - {name: gpu, url: http://127.0.0.1:9, kind: ollama, slots: 16}
"""

# The CPU figures: as benchmarks/overhead.py configures the gateway (nothing queues: a
# request that cannot start is refused, after the quick no's full check).
UNCONTENDED = """\
defaults: {max_concurrent: 400, max_queued: 0}
backends:
  - {name: gpu, url: http://127.0.0.1:9, kind: ollama, slots: 100000}
"""
MODEL = "llama3.2:3b"
ROUNDS = 7


def _admission(holds: HoldStore | None, text: str = POLICY) -> Admission:
    """One Ollama backend that lists the model and holds it, as the monitor would see it."""
    policy, states = parse_policy(text), BackendStates()
    state = states.of("gpu")
    state.models, state.loaded = frozenset({MODEL}), {MODEL: LoadedModel(size=2_000_000_000)}
    return Admission(policy, PolicyView.of(policy, states).pool, holds=holds)


async def _pairs(admission: Admission, ticket: Ticket, n: int) -> float:
    """Process time for ``n`` acquire+release pairs, one after another."""
    started = time.process_time()
    for _ in range(n):
        permit = await admission.acquire(ticket)
        assert isinstance(permit, Permit)
        async with permit:
            pass
    return time.process_time() - started


_BODY, _MAX_BODY = 71, 32 * 1024 * 1024


async def _requests(admission: Admission, ticket: Ticket, n: int) -> float:
    """Process time for ``n`` requests' admissions, as the request handler calls it."""
    lanes = (Lane.INTERACTIVE,)
    started = time.process_time()
    for _ in range(n):
        assert admission.refuses_unseen(ticket.user, lanes) is None
        with admission.arriving(ticket.user, _BODY, _MAX_BODY):  # a chat's body, in its head
            pass
        permit = await admission.acquire(ticket)
        assert isinstance(permit, Permit)
        async with permit:
            permit.settle(12, None, 64)
            permit.loaded(None)
            permit.answered()
    return time.process_time() - started


async def _at_once(admission: Admission, ticket: Ticket, n: int) -> tuple[float, float]:
    """Process time for ``n`` acquires and for their releases, apart: 100 requests at
    once (as overhead.py's 100 streams), then their 100 releases, and again."""
    acquires = releases = 0.0
    for _ in range(n // 100):
        started = time.process_time()
        permits = [await admission.acquire(ticket) for _ in range(100)]
        admitted = time.process_time()
        for permit in permits:
            assert isinstance(permit, Permit)
            permit.release()
        releases += time.process_time() - admitted
        acquires += admitted - started
    return acquires, releases


async def cpu_per_request(requests: int) -> list[tuple[str, float]]:
    """The best of ``ROUNDS`` rounds of each, in microseconds of CPU per request."""
    admission = _admission(None, UNCONTENDED)
    ticket = Ticket("alice", MODEL, Api.OLLAMA, input_tokens=12.0)
    await _requests(admission, ticket, 200)  # warm up
    pair = min([await _pairs(admission, ticket, requests) for _ in range(ROUNDS)])
    whole = min([await _requests(admission, ticket, requests) for _ in range(ROUNDS)])
    apart = [await _at_once(admission, ticket, requests) for _ in range(ROUNDS)]
    figures = [
        ("acquire+release", pair),
        ("with the handler's other calls", whole),
        ("100 at once: acquire", min(acquire for acquire, _ in apart)),
        ("then release", min(release for _, release in apart)),
    ]
    return [(name, seconds / requests * 1e6) for name, seconds in figures]


async def _cycle(admission: Admission, n: int, budgeted: bool = False) -> float:
    """The time to admit one request; the release follows, as when its reply ends. A
    budgeted user's request is first counted in flight in the hold store
    (``usage/in_flight.py``)."""
    user, request = f"user{n % 4}", f"request{n}"
    started = time.perf_counter()
    if budgeted:
        assert admission.holds is not None
        assert await admission.holds.count_in_flight(user, request, 1_000_000)
    permit = await admission.acquire(Ticket(user, MODEL, Api.OLLAMA))
    admitted = time.perf_counter() - started
    assert isinstance(permit, Permit)
    async with permit:
        pass
    if budgeted:
        assert admission.holds is not None
        admission.holds.uncount_in_flight(user, request)
    return admitted


async def _measure(
    state: HoldStore | None, requests: int, budgeted: bool = False
) -> tuple[list[float], float]:
    admission = _admission(state)
    for n in range(100):  # warm up: Redis connections are opened on first use
        await _cycle(admission, -1 - n, budgeted)
    sequential = [await _cycle(admission, n, budgeted) for n in range(requests)]
    started = time.perf_counter()
    for batch in range(requests // 16):
        firsts = requests + batch * 16  # request names not used above
        await asyncio.gather(*(_cycle(admission, firsts + n, budgeted) for n in range(16)))
    return sequential, (time.perf_counter() - started) / requests


def _line(name: str, sequential: list[float], concurrent: float) -> str:
    cuts = statistics.quantiles(sequential, n=100)
    return (
        f"  {name:8}  p50 {cuts[49] * 1e6:8.1f} us   p99 {cuts[98] * 1e6:8.1f} us"
        f"   16 at a time: {concurrent * 1e6:8.1f} us per request"
    )


async def main(requests: int, cpu_only: bool) -> None:
    figures = await cpu_per_request(requests)
    said = ", ".join(f"{name} {micros:.2f}" for name, micros in figures)
    print(f"one replica, uncontended, us CPU a request (best of {ROUNDS}): {said}")
    if cpu_only:
        return
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
        budgeted = await _measure(state, requests, budgeted=True)
        await state.close()
    finally:
        await server.stop()
    print(
        f"admission overhead: time to acquire, {requests} acquire+release cycles "
        f"(no HTTP, loopback Redis, {type(asyncio.get_running_loop()).__module__} loop)"
    )
    print(_line("local", *memory))
    print(_line("redis", *shared))
    print(_line("budgeted", *budgeted))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--cpu-only", action="store_true", help="only the CPU per request")
    # The event loop `fairgate serve` uses (uvloop when installed).
    loop = new_event_loop("auto")
    arguments = parser.parse_args()
    loop.run_until_complete(main(arguments.requests, arguments.cpu_only))
    loop.close()
