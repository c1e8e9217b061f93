"""Two gateway replicas, one Redis: one set of limits, crash-safe, and Redis going away."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
from asyncio.subprocess import Process
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any, cast

import aiohttp
import pytest
import redis.asyncio as aioredis

from gateway.admission.admission import Admission
from gateway.admission.holds.base import HoldStore
from gateway.admission.holds.redis import RedisHolds
from gateway.admission.permit import Permit
from gateway.admission.tickets import Ticket
from gateway.backends.pool import BackendStates
from gateway.config.policy import parse_policy
from gateway.core.vocabulary import Api, Reason
from gateway.reload import PolicyView
from tests.conftest import Gateway, StartGateway, StartSim
from tests.processes import until_answers
from tests.redis_server import RedisServer, redis_server, redis_url  # noqa: F401 (fixtures)
from tests.test_admission import MODEL, generate_status, held, idle, until
from tests.test_status_cli import fairgate_status, row_of


@asynccontextmanager
async def two_admissions(url: str, limits: str) -> AsyncIterator[tuple[Admission, Admission]]:
    """Two replicas' admissions on one Redis, in front of one backend of one slot."""
    backend = "{name: gpu, url: 'http://127.0.0.1:9', kind: ollama, slots: 1}"
    text = f"{limits}backends:\n  - {backend}\n"
    replicas = []
    for _ in range(2):
        policy = parse_policy(text)
        state = RedisHolds(url, lease_seconds=30)
        state.start()
        replicas.append(Admission(policy, PolicyView.of(policy, BackendStates()).pool, holds=state))
    try:
        yield replicas[0], replicas[1]
    finally:
        for replica in replicas:
            assert replica.holds is not None
            await replica.holds.close()


def policy(sim_url: str, *, slots: int = 2, cap: int = 1, extra: str = "") -> str:
    return (
        f"defaults: {{max_concurrent: {cap}, max_queued: 8}}\n"
        "queue: {max_depth: 32, max_wait: 10s}\n"
        "users:\n  alice: {keys: [alice-key]}\n  bob: {keys: [bob-key]}\n"
        + extra
        + f"backends:\n  - {{name: sim, url: {sim_url}, kind: ollama, slots: {slots}}}\n"
    )


async def test_a_users_cap_holds_across_replicas(
    start_sim: StartSim,
    start_gateway: StartGateway,
    redis_url: str,  # noqa: F811
) -> None:
    """Alice (cap 1) running on replica A cannot start a second request on replica B."""
    _, sim_url = await start_sim(parallel=8)
    short_wait = policy(sim_url).replace("max_wait: 10s", "max_wait: 700ms")
    a = await start_gateway(short_wait, redis_url=redis_url)
    b = await start_gateway(short_wait, redis_url=redis_url)
    async with held(a, "alice-key", "running on A"):
        assert await generate_status(b, "alice-key", "second on B") == 503  # wait_timeout
        assert await generate_status(b, "bob-key", "bob on B") == 200
    await until(a.services.admission, idle)
    assert await generate_status(b, "alice-key", "after A finished") == 200


async def test_the_backend_never_sees_more_than_its_slots_from_the_pair(
    start_sim: StartSim,
    start_gateway: StartGateway,
    redis_url: str,  # noqa: F811
) -> None:
    """Eight requests split over two replicas reach a 2-slot backend two at a time."""
    sim, sim_url = await start_sim(parallel=8, decode_tokens_per_s=100.0)
    text = policy(sim_url, cap=4)
    a = await start_gateway(text, redis_url=redis_url)
    b = await start_gateway(text, redis_url=redis_url)
    statuses = await asyncio.gather(
        *(
            generate_status((a, b)[n % 2], ("alice-key", "bob-key")[n // 4], f"r{n}")
            for n in range(8)
        )
    )
    assert statuses == [200] * 8
    assert sim.stats.max_running == 2


@asynccontextmanager
async def doomed_replica(
    text: str, url: str, tmp_path: Path, port: int, lease: str | None
) -> AsyncIterator[tuple[Gateway, Process]]:
    """A replica in a process of its own (to be killed), serving ``text`` on ``port``;
    ``lease``: its FAIRGATE_REDIS_LEASE_SECONDS (None: the default)."""
    config = tmp_path / "fairgate.yaml"
    config.write_text(text)
    env = {
        **os.environ,
        "FAIRGATE_CONFIG": str(config),
        "FAIRGATE_LISTEN": f"127.0.0.1:{port}",
        "FAIRGATE_REDIS_URL": url,
        "FAIRGATE_LOG_LEVEL": "WARNING",
    }
    env.pop("FAIRGATE_REDIS_LEASE_SECONDS", None)
    if lease is not None:
        env["FAIRGATE_REDIS_LEASE_SECONDS"] = lease
    # sys.executable, not a `python` shim: the PID must be the gateway's own.
    replica = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway", "serve", env=env, stderr=subprocess.DEVNULL
    )
    doomed = Gateway(f"http://127.0.0.1:{port}", None)  # type: ignore[arg-type]
    try:
        await until_answers(doomed.url + "/", 20, replica)
        yield doomed, replica
    finally:
        if replica.returncode is None:
            replica.kill()
            await replica.wait()


# A replica in a process of its own, serving a policy text with a lease (None: the default).
Crash = Callable[[str, str | None], AbstractAsyncContextManager[tuple[Gateway, Process]]]


@pytest.fixture
def crash(redis_url: str, tmp_path: Path, unused_tcp_port: int) -> Crash:  # noqa: F811
    return lambda text, lease: doomed_replica(text, redis_url, tmp_path, unused_tcp_port, lease)


async def test_a_killed_replicas_holds_expire_and_capacity_returns(
    start_sim: StartSim,
    start_gateway: StartGateway,
    redis_url: str,  # noqa: F811
    crash: Crash,
) -> None:
    """SIGKILL a replica mid-stream: its lease expires and alice can run again elsewhere."""
    _, sim_url = await start_sim(parallel=8)
    text = policy(sim_url)
    async with crash(text, "1") as (doomed, replica):
        survivor = await start_gateway(text, redis_url=redis_url)
        async with held(doomed, "alice-key", "on the doomed replica"):
            os.kill(replica.pid, signal.SIGKILL)
            await replica.wait()
        started = time.monotonic()
        assert await generate_status(survivor, "alice-key", "after the crash") == 200
        assert time.monotonic() - started < 5  # the 1 s lease, not the 10 s max_wait


async def test_redis_going_away_is_handled_as_configured_and_sharing_resumes(
    start_sim: StartSim,
    start_gateway: StartGateway,
    redis_server: RedisServer,  # noqa: F811
) -> None:
    """on_failure local serves on per-replica limits, closed answers 503; then it resumes."""
    _, sim_url = await start_sim(parallel=8)
    local = await start_gateway(policy(sim_url), redis_url=redis_server.url)
    closed = await start_gateway(
        policy(sim_url, extra="redis: {on_failure: closed}\n"), redis_url=redis_server.url
    )
    assert await generate_status(local, "alice-key", "before") == 200
    await redis_server.stop()
    assert await generate_status(local, "alice-key", "while away, local") == 200
    assert await generate_status(closed, "alice-key", "while away, closed") == 503
    assert not local.services.admission.holds.shared
    async with aiohttp.ClientSession() as session, session.get(local.url + "/metrics") as reply:
        exposition = await reply.text()
    assert "fairgate_state_shared 0.0" in exposition
    failures = re.search(r"^fairgate_state_failures_total (\S+)$", exposition, re.MULTILINE)
    assert failures and float(failures.group(1)) >= 1
    await redis_server.start()
    state = local.services.admission.holds
    deadline = time.monotonic() + 10
    while not state.shared:
        assert time.monotonic() < deadline, "sharing did not resume"
        await state.released(within=0.1)
    assert await generate_status(local, "alice-key", "after") == 200
    for gateway in (local, closed):
        await until(gateway.services.admission, idle)
    # The hold is given back to Redis in the background, after the request has ended here.
    deadline = time.monotonic() + 10
    while await state.usage() != ({}, {}):
        assert time.monotonic() < deadline, "the hold was never given back"
        await state.released(within=0.1)


async def budgeted(
    start_sim: StartSim, start_gateway: StartGateway, url: str, count: int, cap: int = 4
) -> list[Gateway]:
    """``count`` replicas on one Redis, where each user may make two requests an hour."""
    _, sim_url = await start_sim(parallel=8)
    budget = "max_queued: 8, budget: {requests_per_hour: 2}}"
    text = policy(sim_url, slots=8, cap=cap).replace("max_queued: 8}", budget)
    return [await start_gateway(text, redis_url=url) for _ in range(count)]


async def test_a_requests_budget_holds_across_replicas(
    start_sim: StartSim,
    start_gateway: StartGateway,
    redis_url: str,  # noqa: F811
) -> None:
    """Two requests an hour: one running on A and one on B, a third on either is refused."""
    a, b = await budgeted(start_sim, start_gateway, redis_url, 2)
    async with held(a, "alice-key", "on A"), held(b, "alice-key", "on B"):
        assert await generate_status(a, "alice-key", "third on A") == 429
        assert await generate_status(b, "alice-key", "third on B") == 429
        assert await generate_status(b, "bob-key", "bob's own budget") == 200


async def test_a_request_that_ended_is_not_counted_in_flight_as_well(
    start_sim: StartSim,
    start_gateway: StartGateway,
    redis_url: str,  # noqa: F811
) -> None:
    """Two requests an hour, one after another on a replica: the second is served (the
    first counts as used, no longer in flight), the third is refused."""
    (gateway,) = await budgeted(start_sim, start_gateway, redis_url, 1)
    statuses = [await generate_status(gateway, "alice-key", f"r{n}") for n in range(3)]
    assert statuses == [200, 200, 429]


async def test_a_request_waiting_for_another_replicas_hold_counts_against_the_budget(
    start_sim: StartSim,
    start_gateway: StartGateway,
    redis_url: str,  # noqa: F811
) -> None:
    """Alice (cap 1, two requests an hour) runs on A and waits on B: a third on B is 429."""
    a, b = await budgeted(start_sim, start_gateway, redis_url, 2, cap=1)
    redis = aioredis.Redis.from_url(redis_url)
    try:
        async with held(a, "alice-key", "running on A"):
            waiting = asyncio.create_task(generate_status(b, "alice-key", "waits on B"))
            async with asyncio.timeout(5):  # counted, then in B's room (a change) to wait
                while await redis.zcard("fairgate:in_flight:alice") < 2:
                    await b.services.admission.changed()
            assert await generate_status(b, "alice-key", "third on B") == 429
        assert await waiting == 200
    finally:
        await redis.aclose()


async def test_while_redis_is_away_a_budget_counts_this_replicas_requests(
    start_sim: StartSim,
    start_gateway: StartGateway,
    redis_server: RedisServer,  # noqa: F811
) -> None:
    """No 5xx from the budget while Redis is away: its own requests count, as alone."""
    (gateway,) = await budgeted(start_sim, start_gateway, redis_server.url, 1)
    await redis_server.stop()
    async with held(gateway, "alice-key", "while away"):
        assert await generate_status(gateway, "alice-key", "second") == 200
        assert await generate_status(gateway, "alice-key", "third") == 429


async def test_fair_share_counters_and_queue_depths_travel_between_replicas(
    redis_url: str,  # noqa: F811
) -> None:
    """Service charged on replica A shows in B's counters; A's waiting room in B's estimate."""
    limits = "defaults: {max_concurrent: 1, max_queued: 4}\n"
    async with two_admissions(redis_url, limits) as (a, b):
        permit = await a.acquire(Ticket("alice", MODEL, Api.OLLAMA, input_tokens=100))
        assert isinstance(permit, Permit)
        permit.add_output(50)  # 100 in x 1 + 50 out x 2 = 200 weighted tokens
        waiting = [
            asyncio.create_task(a.acquire(Ticket(user, MODEL, Api.OLLAMA)))
            for user in ("bob", "cat")
        ]
        await until(a, lambda snap: snap.queue_depth == 2)
        await a.share()
        await b.share()
        assert b.room.ordering.counters()["alice"] == pytest.approx(200.0)
        await _in_the_house(b.holds, 2)  # A's waiting places, as B reads the house
        assert b.holds.others_waiting == 2
        refused = b._refusal(Reason.GATEWAY_BUSY, Ticket("dan", MODEL, Api.OLLAMA))
        assert refused.retry_after >= 2 * 5.0  # three ahead of one slot, 5 s each by default
        permit.release()
        for task in waiting:
            granted = await task
            assert isinstance(granted, Permit)
            granted.release()


async def _in_the_house(state: HoldStore | None, count: int) -> None:
    """Until ``state``'s reading of the house (once a second) shows ``count`` waiting."""
    assert state is not None
    async with asyncio.timeout(10):
        while len(state.house.waiting) < count:
            await state.released(within=0.1)


async def _status(gateway: Gateway, path: str = "/status", key: str = "") -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with (
        aiohttp.ClientSession() as session,
        session.get(gateway.url + path, headers=headers) as reply,
    ):
        assert reply.status == 200
        return cast(dict[str, Any], await reply.json())


async def test_a_users_max_queued_holds_across_the_house_and_each_status_shows_it(
    start_sim: StartSim,
    start_gateway: StartGateway,
    redis_url: str,  # noqa: F811
) -> None:
    """Alice (1 running, 1 waiting): running on A and waiting on B, her third request is
    refused on either replica at once; A's /status shows her request waiting on B."""
    _, sim_url = await start_sim(parallel=8)
    text = policy(sim_url).replace("max_queued: 8", "max_queued: 1")
    a = await start_gateway(text, redis_url=redis_url)
    b = await start_gateway(text, redis_url=redis_url)
    async with held(a, "alice-key", "running on A"):
        waiting = asyncio.create_task(generate_status(b, "alice-key", "waits on B"))
        await _in_the_house(a.services.admission.holds, 1)
        for replica in (a, b):
            started = time.monotonic()
            assert await generate_status(replica, "alice-key", "a third") == 503
            assert time.monotonic() - started < 2  # refused at once, not after max_wait
        status = await _status(a)
        here, there = status["state"]["replica"], status["queue"]["waiting"]
        assert [(w["user"], w["position"]) for w in there] == [("alice", 1)]
        assert there[0]["replica"] not in (None, here)
        assert status["state"]["replicas"] == 2
        assert status["users"]["alice"]["running"] == 1
        assert status["users"]["alice"]["queued"] == 1
        code, out, _ = await fairgate_status("--url", a.url)  # the admin's command too
        assert code == 0
        assert row_of(out, "RUNNING", "alice")[-1] == "here"
        assert row_of(out, "#", "1")[1] == "alice"
        assert row_of(out, "#", "1")[-1] == there[0]["replica"]
        me = await _status(a, "/ui/me.json", "alice-key")  # where am I, asked of A
        assert [(w["position"], w["ahead"]) for w in me["waiting"]] == [(1, 0)]
        assert me["summary"].endswith("you are next")
    assert await waiting == 200


async def test_each_replicas_status_counts_a_heavy_request_running_on_another(
    start_sim: StartSim,
    start_gateway: StartGateway,
    redis_url: str,  # noqa: F811
) -> None:
    """A heavy request running on A: B's /status counts it among its backend's heavy
    requests, as A's does (one house, whichever replica)."""
    _, sim_url = await start_sim(parallel=8)
    heavy = "classes: {heavy: {min_prompt_tokens: 16, wait_for_light: 0}}\n"
    a = await start_gateway(policy(sim_url, extra=heavy), redis_url=redis_url)
    b = await start_gateway(policy(sim_url, extra=heavy), redis_url=redis_url)
    async with held(a, "alice-key", "word " * 400):
        state = b.services.admission.holds
        assert state is not None
        async with asyncio.timeout(10):  # B reads the house once a second
            while not state.house.running:
                await state.released(within=0.1)
        for replica in (a, b):
            backend = (await _status(replica))["backends"]["sim"]
            assert backend["busy"] == 1 and backend["heavy_running"] == 1


async def test_idle_replicas_are_counted_in_each_status(
    start_sim: StartSim,
    start_gateway: StartGateway,
    redis_url: str,  # noqa: F811
) -> None:
    """Two replicas with nothing running nor waiting: each /status says two, not one (and
    `fairgate status` keeps its REPLICA column for the house's next requests)."""
    _, sim_url = await start_sim()
    a = await start_gateway(policy(sim_url), redis_url=redis_url)
    await start_gateway(policy(sim_url), redis_url=redis_url)
    state = a.services.admission.holds
    assert state is not None
    async with asyncio.timeout(20):  # each is there from its first renewal (4 s), read in 1
        while len(state.house.replicas) < 2:
            await state.released(within=0.1)
    assert (await _status(a))["state"]["replicas"] == 2


async def test_a_request_entering_another_replica_is_not_passed_over(
    redis_url: str,  # noqa: F811
) -> None:
    """The heavy user's long prompts wait on A, alice's question on B: when the one slot
    frees, A's room would start bob's first, but the house's order puts alice first."""
    limits = "defaults: {max_concurrent: 4, max_queued: 4}\nqueue: {max_depth: 32, max_wait: 30s}\n"
    async with two_admissions(redis_url, limits) as (a, b):
        holder = await a.acquire(Ticket("carol", MODEL, Api.OLLAMA, input_tokens=10))
        assert isinstance(holder, Permit)
        bobs = [
            asyncio.create_task(a.acquire(Ticket("bob", MODEL, Api.OLLAMA, input_tokens=4000)))
            for _ in range(3)
        ]
        await until(a, lambda snap: snap.queue_depth == 3)
        alice = asyncio.create_task(b.acquire(Ticket("alice", MODEL, Api.OLLAMA, input_tokens=40)))
        await _in_the_house(b.holds, 4)  # her place is in the house, and she asks
        holder.release()
        done, _ = await asyncio.wait([alice, *bobs], return_when=asyncio.FIRST_COMPLETED)
        assert done == {alice}
        for task in asyncio.as_completed([alice, *bobs]):  # each ends, and the next goes
            granted = await task
            assert isinstance(granted, Permit)
            granted.release()


async def test_a_replica_killed_with_requests_running_and_waiting_leaves_nothing_held(
    start_sim: StartSim,
    start_gateway: StartGateway,
    redis_url: str,  # noqa: F811
    crash: Crash,
) -> None:
    """SIGKILL a replica (the default 12 s lease) running on both slots with a request
    waiting: its clients' streams end at the backend at once, and within 15 s its slots
    serve the survivor's requests and its waiting place is gone from the house."""
    sim, sim_url = await start_sim(parallel=8)
    text = policy(sim_url, cap=2).replace("max_wait: 10s", "max_wait: 30s")
    async with crash(text, None) as (doomed, replica):
        survivor = await start_gateway(text, redis_url=redis_url)
        async with held(doomed, "alice-key", "one"), held(doomed, "bob-key", "two"):
            waiting = asyncio.create_task(generate_status(doomed, "alice-key", "waits"))
            await _in_the_house(survivor.services.admission.holds, 1)
            os.kill(replica.pid, signal.SIGKILL)
            await replica.wait()
            killed = time.monotonic()
            # The backend runs none of its requests: their connections died with it.
            await sim.wait_for(lambda stats: stats.running == 0, timeout=10)
            served = await asyncio.gather(
                generate_status(survivor, "alice-key", "after the crash"),
                generate_status(survivor, "bob-key", "after the crash"),
            )
        assert served == [200, 200]
        state, admission = survivor.services.admission.holds, survivor.services.admission
        assert state is not None
        async with asyncio.timeout(15 - (time.monotonic() - killed)):
            while admission.snapshot().queue_depth:  # the house as read once a second
                await state.released(within=0.1)
        with pytest.raises(aiohttp.ClientError):
            await waiting  # its client was cut off with its replica


async def test_a_person_is_not_refused_for_tasks_filling_the_house_on_another_replica(
    start_sim: StartSim,
    start_gateway: StartGateway,
    redis_url: str,  # noqa: F811
) -> None:
    """max_depth 1, held by a task waiting on B: a person's chat through A waits for the
    slot, rather than a 503, and both are served (one gateway turns the task away; across
    replicas it stays, one place past the bound). A second task is refused."""
    from tests.test_lanes import PEOPLE, TITLE_PROMPT, ask, running

    _, url = await start_sim(parallel=8)
    text = (
        PEOPLE
        + "queue: {max_depth: 1}\nlanes: {presets: [open-webui]}\n"
        + f"backends:\n  - {{name: sim, url: {url}, kind: ollama, slots: 1}}\n"
    )
    a = await start_gateway(text, redis_url=redis_url)
    b = await start_gateway(text, redis_url=redis_url)
    async with running(a, "bob-key", "holding the slot"):
        task = asyncio.create_task(ask(b, "alice-key", TITLE_PROMPT))
        await until(b.services.admission, lambda snap: snap.queue_depth == 1)
        chat = asyncio.create_task(ask(a, "alice-key", "hello"))
        await until(a.services.admission, lambda snap: snap.queue_depth == 2)
        assert (await ask(b, "bob-key", TITLE_PROMPT))[0] == 503
    assert (await asyncio.wait_for(chat, timeout=10))[0] == 200
    assert (await asyncio.wait_for(task, timeout=10))[0] == 200
