"""The simulated Ollama's scheduler behaves as server/sched.go does: slots per loaded model,
several models while they fit, evictions and num_ctx reloads that hold the queue."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import aiohttp

from fairsim import Simulator
from fairsim.catalog import model_path, runner_size
from tests.conftest import Start
from tests.test_sim import CHAT, with_options

LLAMA, QWEN, PHI = "llama3.2:3b", "qwen2.5:7b", "phi3:3.8b"
THREE = [LLAMA, QWEN, PHI]


def chat(model: str, **options: Any) -> dict[str, Any]:
    body = {**CHAT, "model": model, "stream": False}
    return with_options(body, **options) if options else body


@contextlib.asynccontextmanager
async def stalled(
    http: aiohttp.ClientSession, url: str, sim: Simulator, model: str, **options: Any
) -> AsyncIterator[None]:
    """A request for ``model`` that holds a slot (and its runner) until the block ends."""
    running = sim.stats.running
    body = with_options({**CHAT, "model": model}, sim_stall_after=1, **options)
    response = await http.post(f"{url}/api/chat", json=body)
    await response.content.readline()
    assert sim.stats.running == running + 1
    try:
        yield
    finally:
        response.close()
        await sim.wait_for(lambda s: s.running == running, timeout=2)


async def ask(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> int:
    async with http.post(f"{url}/api/chat", json=body) as response:
        await response.read()
        return response.status


async def ps(http: aiohttp.ClientSession, url: str) -> dict[str, dict[str, Any]]:
    async with http.get(f"{url}/api/ps") as response:
        return {model["name"]: model for model in (await response.json())["models"]}


def evicted_first(*models: str) -> str:
    """The busy runner Ollama unloads first: keep-alives equal, the lowest path."""
    return min(models, key=model_path)


async def test_each_loaded_model_has_its_own_parallel_slots(
    simulated: Start, http: aiohttp.ClientSession
) -> None:
    """OLLAMA_NUM_PARALLEL is per runner: with 1, one request of each model runs at once,
    and a second request for a busy model waits for that model's slot only."""
    sim, url = await simulated(parallel=1)
    async with stalled(http, url, sim, LLAMA), stalled(http, url, sim, QWEN):
        assert sim.stats.max_running == 2
        waiting = asyncio.create_task(ask(http, url, chat(LLAMA)))
        await sim.wait_for(lambda s: s.queued == 1, timeout=1)
    assert await waiting == 200
    assert (sim.stats.loads, sim.stats.evictions, sim.stats.max_running) == (2, 0, 2)


async def test_ps_reports_each_runners_size_context_and_expiry(
    simulated: Start, http: aiohttp.ClientSession
) -> None:
    """/api/ps: weights plus a KV cache of num_ctx for each slot, the runner's num_ctx, and
    the longest-lived model first."""
    _, url = await simulated(parallel=2)
    assert await ask(http, url, chat(LLAMA, num_ctx=8192) | {"keep_alive": "1h"}) == 200
    assert await ask(http, url, chat(QWEN)) == 200
    running = await ps(http, url)
    assert list(running) == [LLAMA, QWEN]
    assert running[LLAMA]["context_length"] == 8192
    assert running[LLAMA]["size"] == running[LLAMA]["size_vram"] == runner_size(LLAMA, 8192, 2)
    assert running[QWEN]["context_length"] == 4096
    assert running[QWEN]["size"] == runner_size(QWEN, 4096, 2)
    assert runner_size(LLAMA, 8192, 2) > runner_size(LLAMA, 4096, 2)


async def test_a_model_that_does_not_fit_replaces_an_idle_one_at_once(
    simulated: Start, http: aiohttp.ClientSession
) -> None:
    """Memory for one model: the next model evicts the idle one without waiting."""
    memory = runner_size(QWEN, 4096, 1)
    sim, url = await simulated(memory=memory)
    assert await ask(http, url, chat(LLAMA)) == 200
    assert await ask(http, url, chat(QWEN)) == 200
    assert list(await ps(http, url)) == [QWEN]
    assert (sim.stats.loads, sim.stats.evictions, sim.stats.unloads) == (2, 1, 1)


async def test_max_loaded_models_limits_runners_even_when_memory_is_plenty(
    simulated: Start, http: aiohttp.ClientSession
) -> None:
    """OLLAMA_MAX_LOADED_MODELS=2 with three models: the third evicts one."""
    sim, url = await simulated(models=THREE, max_loaded_models=2)
    for model in THREE:
        assert await ask(http, url, chat(model)) == 200
    assert len(await ps(http, url)) == 2 and PHI in await ps(http, url)
    assert sim.stats.evictions == 1


async def test_an_eviction_waits_for_the_victims_requests_and_holds_every_load_meanwhile(
    simulated: Start, http: aiohttp.ClientSession
) -> None:
    """Two busy models, memory for two: a third waits until the victim's requests are done.
    Meanwhile requests for loaded models run (the victim's too, which prolongs the wait) and
    every other request needing a load is held behind it."""
    sim, url = await simulated(models=THREE, parallel=2, max_loaded_models=2)
    victim = evicted_first(LLAMA, QWEN)
    other = QWEN if victim == LLAMA else LLAMA
    async with stalled(http, url, sim, other):
        async with stalled(http, url, sim, victim):
            swap = asyncio.create_task(ask(http, url, chat(PHI)))
            await sim.wait_for(lambda s: s.pending == 1, timeout=1)
            second = asyncio.create_task(ask(http, url, chat(PHI)))
            await sim.wait_for(lambda s: s.pending == 2, timeout=1)
            # Loaded models are served at once, the victim included.
            assert await ask(http, url, chat(other)) == 200
            assert await ask(http, url, chat(victim)) == 200
            assert (sim.stats.pending, sim.stats.loads) == (2, 2)
            assert victim in await ps(http, url)
        # The victim's last request ended: it unloads, PHI loads, both waiting requests run.
        assert (await swap, await second) == (200, 200)
        assert set(await ps(http, url)) == {other, PHI}
    assert (sim.stats.loads, sim.stats.evictions, sim.stats.pending) == (3, 1, 0)
    assert 0 < sim.stats.drain_held_seconds <= sim.stats.held_seconds


async def test_a_request_with_another_num_ctx_reloads_the_model_after_its_requests(
    simulated: Start, http: aiohttp.ClientSession
) -> None:
    """A differing num_ctx reloads the same model: held until the running requests end,
    while requests with the loaded num_ctx keep running; switching back reloads again."""
    sim, url = await simulated(parallel=2)
    async with stalled(http, url, sim, LLAMA):
        bigger = asyncio.create_task(ask(http, url, chat(LLAMA, num_ctx=8192)))
        await sim.wait_for(lambda s: s.pending == 1, timeout=1)
        assert await ask(http, url, chat(LLAMA)) == 200  # the loaded num_ctx: runs now
        assert await ask(http, url, chat(LLAMA, num_ctx=4096)) == 200  # the same, said
        assert (sim.stats.pending, sim.stats.loads) == (1, 1)
    assert await bigger == 200
    assert (await ps(http, url))[LLAMA]["context_length"] == 8192
    assert await ask(http, url, chat(LLAMA)) == 200  # the default again: another reload
    assert (sim.stats.loads, sim.stats.reloads, sim.stats.evictions) == (3, 2, 0)
    assert sim.stats.held_seconds > 0


async def test_num_ctx_is_cut_to_the_trained_context_and_to_at_least_four(
    simulated: Start, http: aiohttp.ClientSession
) -> None:
    """num_ctx beyond the model's context_length (32768 for qwen2.5:7b) or below 4 is
    clamped before comparing, so those requests reload nothing more."""
    sim, url = await simulated()
    assert await ask(http, url, chat(QWEN, num_ctx=100_000)) == 200
    assert await ask(http, url, chat(QWEN, num_ctx=32768.9)) == 200  # truncated, as Go does
    assert (await ps(http, url))[QWEN]["context_length"] == 32768
    assert await ask(http, url, chat(QWEN, num_ctx=1)) == 200
    assert await ask(http, url, chat(QWEN, num_ctx=-5)) == 200
    assert (await ps(http, url))[QWEN]["context_length"] == 4
    assert sim.stats.loads == 2


async def test_a_num_ctx_that_is_not_a_number_fails_as_ollama_fails_it(
    simulated: Start, http: aiohttp.ClientSession
) -> None:
    """Options.FromMap refuses a string num_ctx; the scheduler error is a 500."""
    sim, url = await simulated()
    async with http.post(f"{url}/api/chat", json=chat(LLAMA, num_ctx="8192")) as response:
        assert response.status == 500
        assert await response.json() == {"error": 'option "num_ctx" must be of type integer'}
    assert sim.stats.loads == 0


async def test_a_keep_alive_sent_to_the_victim_postpones_its_eviction(
    simulated: Start, http: aiohttp.ClientSession
) -> None:
    """useLoadedRunner overwrites the victim's zero keep-alive: once idle, it stays until
    that keep-alive runs out, and the waiting load waits that long too."""
    sim, url = await simulated(parallel=2, memory=runner_size(QWEN, 4096, 2))
    async with stalled(http, url, sim, LLAMA):
        swap = asyncio.create_task(ask(http, url, chat(QWEN)))
        await sim.wait_for(lambda s: s.pending == 1, timeout=1)
        assert await ask(http, url, chat(LLAMA) | {"keep_alive": "300ms"}) == 200
    assert sim.idle(LLAMA) and sim.stats.pending == 1  # idle, and still not unloaded
    assert await swap == 200  # after the 300 ms keep-alive
    assert list(await ps(http, url)) == [QWEN]
    assert sim.stats.drain_held_seconds >= 0.3


async def test_load_time_grows_with_the_runners_size(
    simulated: Start, http: aiohttp.ClientSession
) -> None:
    """load_seconds_per_gib: the 7B model (about 4.6 GiB with its cache) takes about twice
    as long to load as the 3B one (about 2.3 GiB)."""
    _, url = await simulated(load_seconds_per_gib=0.1)
    durations = {}
    for model in (LLAMA, QWEN):
        async with http.post(f"{url}/api/chat", json=chat(model)) as response:
            durations[model] = (await response.json())["load_duration"] / 1e9
    assert durations[LLAMA] >= runner_size(LLAMA, 4096, 1) / 2**30 * 0.1
    assert durations[QWEN] >= runner_size(QWEN, 4096, 1) / 2**30 * 0.1 > 0.45
