"""Several models on one Ollama: slots per model, and what each backend holds in memory."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import pytest
from prometheus_client.utils import floatToGoString

from fairsim.catalog import runner_size
from gateway.config.policy import parse_policy
from gateway.config.yaml_reader import PolicyError
from tests.conftest import Gateway, StartGateway, StartSim
from tests.test_admission import until
from tests.test_hostile_clients import status_of

LLAMA, QWEN = "llama3.2:3b", "qwen2.5:7b"
FAST = (
    "monitoring: {interval: 50ms, unhealthy_after: 2, healthy_after: 1}\n"
    "defaults: {max_concurrent: 4, max_queued: 4}\n"
)


def ollama(url: str, slots: int = 1, extra: str = "") -> str:
    return FAST + f"backends:\n  - {{name: gpu, url: {url}, slots: {slots}{extra}}}\n"


@asynccontextmanager
async def running(gateway: Gateway, model: str, **options: Any) -> AsyncIterator[None]:
    """A request for ``model`` that holds its slot (one token, then a stall) for the block."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "hold"}],
        "options": {"sim_stall_after": 1, **options},
    }
    async with (
        aiohttp.ClientSession() as session,
        session.post(gateway.url + "/api/chat", json=body) as response,
    ):
        assert response.status == 200
        await response.content.readline()
        yield


async def generate(gateway: Gateway, model: str, **options: Any) -> int:
    """The status of a whole (not streamed) generate request for ``model``."""
    body = {"model": model, "prompt": "next", "stream": False, "options": options}
    async with (
        aiohttp.ClientSession() as session,
        session.post(gateway.url + "/api/generate", json=body) as reply,
    ):
        await reply.read()
        return reply.status


class TestSlotsPerModel:
    async def test_an_ollama_backends_slots_are_each_loaded_models(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """slots: 1 on Ollama is OLLAMA_NUM_PARALLEL=1: one request of each model runs at
        once, and a second one for a busy model waits in the gateway, not in Ollama."""
        sim, url = await start_sim(parallel=1)
        gateway = await start_gateway(ollama(url, slots=1))
        admission = gateway.services.admission
        async with running(gateway, LLAMA), running(gateway, QWEN):
            assert sim.stats.running == 2
            waiting = asyncio.create_task(generate(gateway, LLAMA))
            await until(admission, lambda s: s.queue_depth == 1)
            assert (sim.stats.queued, sim.stats.pending) == (0, 0)
            snapshot = admission.snapshot()
            assert snapshot.model_busy == {("gpu", LLAMA): 1, ("gpu", QWEN): 1}
            assert snapshot.backends["gpu"] == (2, 1)
        assert await waiting == 200

    async def test_a_llamacpp_backends_slots_stay_shared_by_every_request(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """llama-server runs one model with -np slots: a second request waits whatever it
        names."""
        sim, url = await start_sim(flavor="llamacpp", parallel=1, models=[LLAMA])
        gateway = await start_gateway(
            FAST + f"backends:\n  - {{name: cpp, url: {url}, kind: llamacpp, slots: 1}}\n"
        )
        room = gateway.services.admission.room
        backend = room.pool.backends[0]
        assert backend.group(LLAMA) == backend.group(QWEN) == backend.key
        assert backend.capacity == 1
        assert sim.stats.running == 0


class TestWhatIsHeld:
    async def test_status_shows_each_models_context_size_and_the_memory_budget(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """/status lists the models in memory with their requests, num_ctx and size as
        /api/ps gives them, and the memory they take against the policy's budget."""
        _, url = await start_sim(parallel=2)
        gateway = await start_gateway(ollama(url, slots=2, extra=", memory: 12GiB"))
        admission = gateway.services.admission
        size = runner_size(LLAMA, 8192, 2)
        async with running(gateway, LLAMA, num_ctx=8192):

            def probed(_: object) -> bool:
                held = admission.snapshot().residents["gpu"].residents
                return [(r.model, r.size) for r in held] == [(LLAMA, size)]

            await until(admission, probed)
            backend = (await status_of(gateway))["backends"]["gpu"]
        assert backend["slots_per_model"] == 2 and backend["max_loaded_models"] == 3
        assert backend["memory"] == {"used": size, "budget": 12 * 2**30}
        model = backend["models"][LLAMA]
        assert (model["busy"], model["slots"], model["num_ctx"], model["size"]) == (
            1,
            2,
            8192,
            size,
        )
        async with (
            aiohttp.ClientSession() as session,
            session.get(gateway.url + "/metrics") as reply,
        ):
            text = await reply.text()
        memory = f'fairgate_model_memory_bytes{{backend="gpu",model="{LLAMA}"}} '
        assert memory + floatToGoString(size) in text
        budget = 'fairgate_backend_memory_budget_bytes{backend="gpu"} '
        assert budget + floatToGoString(12 * 2**30) in text

    async def test_a_dispatch_counts_before_the_next_probe_sees_it(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """Between probes the gateway knows what it sent: the model is held, with the
        num_ctx of the request, as soon as the request is dispatched."""
        _, url = await start_sim(parallel=1)
        slow = (
            "monitoring: {interval: 1h}\n" + f"backends:\n  - {{name: gpu, url: {url}, slots: 1}}\n"
        )
        gateway = await start_gateway(slow)
        async with running(gateway, QWEN, num_ctx=2048):
            held = gateway.services.admission.snapshot().residents["gpu"].residents
        assert [(r.model, r.num_ctx, r.expires_at) for r in held] == [(QWEN, 2048, None)]


class TestPolicy:
    def test_memory_takes_sizes_and_model_placement_is_for_ollama_only(self) -> None:
        """memory: 24GiB is bytes; resident, memory and max_loaded_models on a llama-server
        are refused, naming them."""
        policy = parse_policy(
            "backends:\n  - {name: gpu, url: http://x, slots: 2, memory: 24GiB,"
            " max_loaded_models: 2, resident: [llama3.2:3b]}\n"
        )
        assert policy.backends[0].memory == 24 * 2**30
        both = "memory: only for an ollama backend; resident: only for an ollama or llamacpp-router"
        with pytest.raises(PolicyError, match=both):
            parse_policy(
                "backends:\n  - {name: cpp, url: http://x, kind: llamacpp, memory: 8GB,"
                " resident: [a]}\n"
            )
        # A router holds several models, each with its own slots: it counts them, not bytes.
        router = "- {name: r, url: http://x, kind: llamacpp-router, max_loaded_models: 2,"
        parse_policy(f"backends:\n  {router} resident: [a]}}\n")
        with pytest.raises(PolicyError, match=r"memory: only for an ollama backend \(the router"):
            parse_policy(f"backends:\n  {router} memory: 8GB}}\n")
