"""How many requests a backend really runs at once: ``slots: 2`` in front of an Ollama that
runs 1 (its OLLAMA_NUM_PARALLEL unset) is found from what the gateway sees, said in the
log's words on /status, the house page's data and a metric, and the backend is sent one
at a time from then on. The simulated Ollama queues a second request inside its runner,
as Ollama's slot semaphore does."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp

from fairsim import Simulator
from gateway.admission.parallelism import SERIAL_TO_CONCLUDE
from gateway.backends import Backend
from tests.conftest import Gateway, StartGateway, StartSim
from tests.test_admission import until
from tests.test_hostile_clients import status_of

MODEL = "llama3.2:3b"


def _policy(url: str) -> str:
    return (
        "defaults: {max_concurrent: 2, max_queued: 4}\n"
        f"backends:\n  - {{name: gpu, url: {url}, slots: 2}}\n"
    )


async def _chat(session: aiohttp.ClientSession, gateway: Gateway) -> int:
    body: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "options": {"num_predict": 40},
    }
    async with session.post(gateway.url + "/api/chat", json=body) as reply:
        await reply.read()
        return reply.status


async def _pairs(gateway: Gateway, count: int) -> None:
    """``count`` times, two chats sent together, the next pair once both are done."""
    async with aiohttp.ClientSession() as session:
        for _ in range(count):
            statuses = await asyncio.gather(_chat(session, gateway), _chat(session, gateway))
            assert statuses == [200, 200]


async def behind_slots_2(
    start_sim: StartSim, start_gateway: StartGateway, runs: int, pairs: int
) -> tuple[Simulator, Gateway, Backend]:
    """An Ollama that runs ``runs`` at once, ``slots: 2`` in front, ``pairs`` pairs sent."""
    sim, url = await start_sim(parallel=runs, decode_tokens_per_s=100.0, models=[MODEL])
    gateway = await start_gateway(_policy(url))
    await _pairs(gateway, pairs)
    return sim, gateway, gateway.services.policy.current.pool.backends[0]


async def test_a_backend_that_runs_fewer_than_its_slots_is_found_and_sent_fewer(
    start_sim: StartSim, start_gateway: StartGateway
) -> None:
    sim, gateway, gpu = await behind_slots_2(start_sim, start_gateway, 1, SERIAL_TO_CONCLUDE)
    assert gpu.slots == 1 and gpu.configured_slots == 2
    said = (await status_of(gateway))["backends"]["gpu"]["runs_fewer"]
    assert "runs 1 request at once, not the 2" in said
    assert "OLLAMA_NUM_PARALLEL=2" in said and "slots: 1" in said
    async with aiohttp.ClientSession() as session, session.get(gateway.url + "/metrics") as r:
        assert 'fairgate_backend_runs_fewer{backend="gpu"} 1.0' in await r.text()
    # From now on the second of a pair waits in the gateway, not inside the backend.
    admission = gateway.services.admission
    async with aiohttp.ClientSession() as session:
        pair = [asyncio.create_task(_chat(session, gateway)) for _ in range(2)]
        await until(admission, lambda s: s.queue_depth == 1)
        assert sim.stats.running + sim.stats.pending <= 1
        assert await asyncio.gather(*pair) == [200, 200]


async def test_a_backend_that_runs_its_slots_is_not_suspected(
    start_sim: StartSim, start_gateway: StartGateway
) -> None:
    _, gateway, gpu = await behind_slots_2(start_sim, start_gateway, 2, 2 * SERIAL_TO_CONCLUDE)
    assert gpu.slots == 2 and gpu.state.runs_at_most is None
    assert (await status_of(gateway))["backends"]["gpu"]["runs_fewer"] is None


async def test_a_new_slots_in_the_policy_drops_the_finding(
    start_sim: StartSim, start_gateway: StartGateway, tmp_path: Path
) -> None:
    """The finding holds for the slots it was found against: the admin's new number is
    taken as it is (and checked again)."""
    _, url = await start_sim(parallel=1, decode_tokens_per_s=100.0, models=[MODEL])
    path = tmp_path / "fairgate.yaml"
    path.write_text(_policy(url))
    gateway = await start_gateway(path, reload_interval=3600)
    await _pairs(gateway, SERIAL_TO_CONCLUDE)
    live = gateway.services.policy
    assert live.current.pool.backends[0].slots == 1
    path.write_text(_policy(url).replace("slots: 2", "slots: 3"))
    assert live.reload() is True
    assert live.current.pool.backends[0].slots == 3


async def test_a_llama_server_says_its_slots_and_the_policy_is_held_to_them(
    start_sim: StartSim, start_gateway: StartGateway
) -> None:
    """llama-server says its -np (/props): more slots in the policy are not sent, fewer
    are (the admin's choice), and either way /status says both numbers."""
    _, url = await start_sim(flavor="llamacpp", parallel=2)
    for written, sent in ((4, 2), (1, 1)):
        gateway = await start_gateway(
            f"backends:\n  - {{name: cpp, url: {url}, kind: llamacpp, slots: {written}}}\n"
        )
        cpp = gateway.services.policy.current.pool.backends[0]
        admission = gateway.services.admission
        await until(admission, lambda _, cpp=cpp: cpp.state.slots == 2, within=10)
        assert cpp.slots == sent
        said = (await status_of(gateway))["backends"]["cpp"]["runs_fewer"]
        assert f"its /props says 2 slots (-np), its slots in the policy {written}" in said
