"""Keeping models warm: pings after idle periods, keep_alive clamping, cold starts."""

from __future__ import annotations

import asyncio

import ollama
import pytest

from fairsim import SimConfig, Simulator
from gateway.app import bound_url, start_server
from tests.conftest import Gateway, StartGateway, serve
from tests.test_admission import held
from tests.test_backends import wait_backend

LLAMA = "llama3.2:3b"
FAST = (
    "monitoring: {interval: 50ms, unhealthy_after: 2, healthy_after: 1}\n"
    "warmth: {interval: 50ms, cold_start_after: 100ms}\n"
)


class Clock:
    """The simulator's clock, moved by hand: hours of idleness without waiting for them."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def policy(url: str, keep_warm: bool, extra: str = "") -> str:
    warm = f", keep_warm: [{LLAMA}], keep_alive: 30m" if keep_warm else ""
    return FAST + extra + f"backends:\n  - {{name: gpu, url: {url}, slots: 1{warm}}}\n"


async def generate(gateway: Gateway, **extra: object) -> ollama.GenerateResponse:
    async with ollama.AsyncClient(host=gateway.url) as client:
        return await client.generate(model=LLAMA, prompt="hello", **extra)  # type: ignore[arg-type]


class TestKeepWarm:
    async def test_with_keep_warm_a_request_after_hours_idle_pays_no_load(
        self, start_gateway: StartGateway, servers: object
    ) -> None:
        """The model expired while idle; the ping reloaded it before anyone asked."""
        clock = Clock()
        sim = Simulator(SimConfig(load_seconds=0.3, decode_tokens_per_s=500.0), clock=clock)
        gateway = await start_gateway(policy(await serve(servers, sim.make_app()), True))  # type: ignore[arg-type]
        # Warmed at start; its keep-alive runs from the end of the ping.
        await sim.wait_for(lambda _: sim.idle(LLAMA), timeout=5)
        clock.now += 2 * 3600  # two idle hours: far past any keep_alive
        await sim.wait_for(lambda stats: stats.loads == 2, timeout=5)  # the ping reloaded it
        await sim.wait_for(lambda _: sim.idle(LLAMA), timeout=5)
        reply = await generate(gateway)
        assert (reply.load_duration or 0) / 1e9 < 0.1
        assert not gateway.services.warmth.cold_starts

    async def test_without_keep_warm_the_request_after_idle_is_a_cold_start(
        self, start_gateway: StartGateway, servers: object
    ) -> None:
        """With no pings, the first request after the expiry pays the load and is counted."""
        clock = Clock()
        sim = Simulator(SimConfig(load_seconds=0.3, decode_tokens_per_s=500.0), clock=clock)
        gateway = await start_gateway(policy(await serve(servers, sim.make_app()), False))  # type: ignore[arg-type]
        await generate(gateway)
        clock.now += 2 * 3600
        reply = await generate(gateway)
        assert (reply.load_duration or 0) / 1e9 >= 0.3
        assert gateway.services.warmth.cold_starts == {("gpu", LLAMA): 2}

    async def test_a_clients_keep_alive_zero_is_clamped_by_the_policy(
        self, start_gateway: StartGateway, servers: object
    ) -> None:
        """keep_alive 0 would unload the model for everybody; keep_alive.min prevents it."""
        for rules, stays_loaded in (("", False), ("keep_alive: {min: 5m}\n", True)):
            sim = Simulator(SimConfig(decode_tokens_per_s=500.0))
            url = await serve(servers, sim.make_app())  # type: ignore[arg-type]
            gateway = await start_gateway(policy(url, False, extra=rules))
            await generate(gateway, keep_alive=0)
            assert (LLAMA in sim.loaded_models()) is stays_loaded

    @pytest.mark.parametrize(
        ("keep_warm", "rules"), [(True, ""), (False, "keep_alive: {min: 5m}\n")]
    )
    async def test_a_keep_alive_too_long_for_ollama_is_refused_and_unloads_nothing(
        self, start_gateway: StartGateway, servers: object, keep_warm: bool, rules: str
    ) -> None:
        """1e10 s overflows Ollama's Duration to "unload when idle": a 400, model kept."""
        sim = Simulator(SimConfig(decode_tokens_per_s=500.0))
        url = await serve(servers, sim.make_app())  # type: ignore[arg-type]
        gateway = await start_gateway(policy(url, keep_warm, extra=rules))
        await generate(gateway)
        with pytest.raises(ollama.ResponseError) as refused:
            await generate(gateway, keep_alive=1e10)
        assert refused.value.status_code == 400 and "use -1" in refused.value.error
        assert LLAMA in sim.loaded_models()

    async def test_pings_pause_while_the_backend_is_down_and_resume_after(
        self, start_gateway: StartGateway
    ) -> None:
        """No pings go to a backend out of rotation; they start again when it is back."""
        sim = Simulator(SimConfig(decode_tokens_per_s=500.0))
        runner = await start_server(sim.make_app(), "127.0.0.1", 0)
        url = bound_url(runner)
        gateway = await start_gateway(policy(url, True))
        await sim.wait_for(lambda stats: stats.loads == 1, timeout=5)
        await runner.cleanup()
        await wait_backend(gateway, "gpu", lambda b: not b.state.healthy)
        warmth = gateway.services.warmth
        attempts = sum(warmth.pings.values())
        # An observation window, not synchronisation: ten keep-warm intervals without a ping.
        await asyncio.sleep(0.5)
        assert sum(warmth.pings.values()) == attempts

        sim.expire_all()  # as if the server had restarted with nothing loaded
        runner = await start_server(sim.make_app(), "127.0.0.1", int(url.rsplit(":", 1)[1]))
        try:
            await sim.wait_for(lambda stats: stats.loads == 2, timeout=5)
        finally:
            await runner.cleanup()

    async def test_pings_take_no_slot(self, start_gateway: StartGateway, servers: object) -> None:
        """With the only slot held by a user, a ping still reloads the model; no slot is used."""
        sim = Simulator(SimConfig(parallel=4, decode_tokens_per_s=500.0))
        gateway = await start_gateway(policy(await serve(servers, sim.make_app()), True))  # type: ignore[arg-type]
        await sim.wait_for(lambda stats: stats.loads == 1, timeout=5)
        async with held(gateway, None, "holding the only slot"):
            sim.expire_all()
            await sim.wait_for(lambda stats: stats.loads == 2, timeout=5)
            snapshot = gateway.services.admission.snapshot()
            assert snapshot.backends["gpu"] == (1, 1) and snapshot.queue_depth == 0
        assert sim.stats.max_running == 1
