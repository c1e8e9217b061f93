"""Swaps planned by the gateway: a model that needs room waits in the gateway while the
victim drains, the victim is unloaded by the gateway, and nothing reaches Ollama's hold."""

from __future__ import annotations

import asyncio
import random
from contextlib import AsyncExitStack
from dataclasses import replace
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.typedefs import Handler

from fairsim import SimConfig, Simulator
from gateway.admission.swap_waits import waits
from gateway.backends.pool import Backend, BackendState, LoadedModel
from gateway.swaps.planner import SwapPlanner
from tests.conftest import Finished, Gateway, StartGateway, StartSim, serve
from tests.test_admission import until
from tests.test_hostile_clients import status_of
from tests.test_residency import running
from tests.test_status_cli import fairgate_status

LLAMA, QWEN, PHI = "llama3.2:3b", "qwen2.5:7b", "phi3:3.8b"
CAL = frozenset({"cal"})  # a person waiting for phi
ONE_MODEL = 6 * 10**9  # llama3.2:3b (3.0 GB with 2 slots) or qwen2.5:7b (5.2 GB), not both
FAST = (
    "monitoring: {interval: 50ms, unhealthy_after: 2, healthy_after: 1}\n"
    "defaults: {max_concurrent: 4, max_queued: 4}\n"
)


def backend(url: str, extra: str = "") -> str:
    return FAST + f"backends:\n  - {{name: gpu, url: {url}, slots: 2{extra}}}\n"


async def start(
    start_sim: StartSim, start_gateway: StartGateway, placement: str, head: str = "", **sim: Any
) -> tuple[Simulator, Gateway]:
    """A simulated Ollama and a gateway that both know its memory or model count."""
    simulator, url = await start_sim(parallel=2, **sim)
    return simulator, await start_gateway(head + backend(url, placement))


async def chat(gateway: Gateway, model: str, key: str | None = None, **body: Any) -> int:
    return (await answer(gateway, model, key, **body))[0]


async def answer(
    gateway: Gateway, model: str, key: str | None = None, **body: Any
) -> tuple[int, str]:
    """A whole chat's status and body."""
    request = {"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": False}
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with (
        aiohttp.ClientSession() as session,
        session.post(gateway.url + "/api/chat", json=request | body, headers=headers) as reply,
    ):
        return reply.status, await reply.text()


def waiting(gateway: Gateway, model: str, **body: Any) -> asyncio.Task[int]:
    return asyncio.create_task(chat(gateway, model, **body))


def counts(gateway: Gateway) -> dict[tuple[str, str, str], float]:
    return dict(gateway.services.admission.room.swaps.counts)


class TestLoads:
    async def test_a_model_that_fits_beside_the_others_is_sent_at_once(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """Room for both: the second model loads beside the first, nothing is unloaded."""
        sim, gateway = await start(start_sim, start_gateway, ", memory: 12GB", memory=12 * 10**9)
        assert await chat(gateway, LLAMA) == 200
        assert await chat(gateway, QWEN) == 200
        assert set(sim.loaded_models()) == {LLAMA, QWEN}
        key = gateway.services.admission.room.pool.backends[0].key
        assert counts(gateway) == {(key, LLAMA, "loads"): 1, (key, QWEN, "loads"): 1}
        assert sim.stats.evictions == 0


class TestSwaps:
    async def test_a_swap_drains_the_victim_in_the_gateway_then_unloads_it_and_sends(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """Memory for one model: qwen's requests wait in the gateway while llama's request
        runs; llama's next request waits too (no new work for the victim); when llama is idle
        the gateway unloads it and sends qwen's. Ollama never holds a request for a drain."""
        memory = f", memory: {ONE_MODEL}, swap_after: 0s"  # planned at once
        sim, gateway = await start(start_sim, start_gateway, memory, memory=ONE_MODEL)
        admission = gateway.services.admission
        async with running(gateway, LLAMA):
            swap, beside = waiting(gateway, QWEN), waiting(gateway, QWEN)
            await until(admission, lambda s: s.queue_depth == 2)
            after = waiting(gateway, LLAMA)
            await until(admission, lambda s: s.queue_depth == 3)
            assert (sim.stats.running, sim.stats.pending, sim.stats.loads) == (1, 0, 1)
            pending = (await status_of(gateway))["backends"]["gpu"]["swap"]
            assert (pending["model"], pending["draining"]) == (QWEN, [LLAMA])
            code, out, _ = await fairgate_status("--url", gateway.url)
            assert code == 0 and f"swapping in {QWEN} (draining {LLAMA})" in out
        # Both qwen requests go once llama is idle; the second one not before the gateway
        # has unloaded llama (else Ollama, finding no room, would pick a victim itself).
        assert (await swap, await beside) == (200, 200)
        assert await after == 200  # swapped back once qwen's requests were done
        key = admission.room.pool.backends[0].key
        assert counts(gateway)[key, LLAMA, "evictions"] == 1
        assert counts(gateway)[key, QWEN, "swaps"] == 1
        # Ollama unloaded only what the gateway asked it to, and held nobody.
        assert (sim.stats.evictions, sim.stats.loads, sim.stats.unloads) == (0, 3, 2)
        assert sim.stats.drain_held_seconds == 0

    async def test_a_swap_waits_its_turn_and_takes_every_request_gathered_in_one_load(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """While llama is in use, qwen's first request waits ``swap_after`` before the swap
        is planned (a timer wakes the room: nothing else happens meanwhile); the qwen
        request that came in the meantime goes in the same load."""
        memory = f", memory: {ONE_MODEL}, swap_after: 1s"
        sim, gateway = await start(start_sim, start_gateway, memory, memory=ONE_MODEL)
        admission = gateway.services.admission
        gpu = admission.room.pool.backends[0]
        async with running(gateway, LLAMA):
            first = waiting(gateway, QWEN)
            await until(admission, lambda s: s.queue_depth == 1)
            asked = admission.clock()
            second = waiting(gateway, QWEN)
            await until(admission, lambda s: s.queue_depth == 2)
            assert admission.room.swaps.under_way(gpu) is None
            await until(admission, lambda _: admission.room.swaps.under_way(gpu) is not None)
            assert admission.clock() - asked >= 0.9  # the first joined a moment before
        assert (await first, await second) == (200, 200)
        assert counts(gateway)[gpu.key, QWEN, "loads"] == 1
        assert sim.stats.loads == 2  # llama, then qwen once for both

    async def test_requests_for_models_that_stay_keep_flowing_while_a_victim_drains(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """Two models held (room for two), the resident one and a busy victim: a third
        waits for the victim, while the resident model's requests run at once."""
        placement = f", max_loaded_models: 2, resident: [{LLAMA}], swap_after: 0s"
        sim, gateway = await start(
            start_sim, start_gateway, placement, models=[LLAMA, QWEN, PHI], max_loaded_models=2
        )
        admission = gateway.services.admission
        async with running(gateway, LLAMA), running(gateway, QWEN):
            swap = waiting(gateway, PHI)
            await until(admission, lambda s: s.queue_depth == 1)
            for _ in range(3):
                assert await chat(gateway, LLAMA) == 200
            assert admission.snapshot().queue_depth == 1 and not swap.done()
        assert await swap == 200
        assert set(sim.loaded_models()) == {LLAMA, PHI}
        assert (sim.stats.evictions, sim.stats.pending, sim.stats.drain_held_seconds) == (0, 0, 0)

    async def test_a_resident_model_is_never_the_victim_though_it_is_the_idle_one(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """Ollama would unload the idle model; the gateway waits for the busy one instead,
        because the idle one is resident."""
        placement = f", max_loaded_models: 2, resident: [{LLAMA}], swap_after: 0s"
        sim, gateway = await start(
            start_sim, start_gateway, placement, models=[LLAMA, QWEN, PHI], max_loaded_models=2
        )
        assert await chat(gateway, LLAMA) == 200
        async with running(gateway, QWEN):
            swap = waiting(gateway, PHI)
            await until(gateway.services.admission, lambda s: s.queue_depth == 1)
            assert set(sim.loaded_models()) == {LLAMA, QWEN}
        assert await swap == 200
        assert set(sim.loaded_models()) == {LLAMA, PHI}

    async def test_another_num_ctx_drains_the_model_then_reloads_it(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """A request with another num_ctx (within the rules) waits until the model's
        requests are done, then reloads it; in between the old context gets no new work."""
        sim, gateway = await start(
            start_sim, start_gateway, ", swap_after: 0s", head="num_ctx: {min: 2048, max: 8192}\n"
        )
        admission = gateway.services.admission
        async with running(gateway, LLAMA, num_ctx=2048):
            bigger = waiting(gateway, LLAMA, options={"num_ctx": 8192})
            await until(admission, lambda s: s.queue_depth == 1)
            assert sim.stats.pending == 0
        assert await bigger == 200
        assert (sim.stats.loads, sim.stats.reloads) == (2, 1)
        key = admission.room.pool.backends[0].key
        assert counts(gateway)[key, LLAMA, "reloads"] == 1

    async def test_a_reload_is_counted_when_its_client_leaves_the_reply_under_way(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """The backend reloaded the model and is streaming when the client hangs up (Stop
        in a chat app): the reload happened, and is counted."""
        sim, gateway = await start(
            start_sim, start_gateway, "", head="num_ctx: {min: 2048, max: 8192}\n",
            decode_tokens_per_s=20.0,
        )  # fmt: skip
        assert await chat(gateway, LLAMA, options={"num_ctx": 2048, "num_predict": 1}) == 200
        finished = Finished(gateway)
        request = {"model": LLAMA, "prompt": "talk", "options": {"num_ctx": 8192}}
        async with (
            aiohttp.ClientSession() as session,
            session.post(gateway.url + "/api/generate", json=request) as reply,
        ):
            assert reply.status == 200
            await reply.content.readline()  # the reply is under way; then the client goes
        assert (await finished.first(("/api/generate",))).status == 499
        assert sim.stats.reloads == 1
        key = gateway.services.admission.room.pool.backends[0].key
        assert counts(gateway).get((key, LLAMA, "reloads")) == 1

    async def test_a_request_that_cannot_get_its_model_in_time_hears_why(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """Past max_wait the 503 says a swap is pending, and Retry-After counts the drain
        and the load; the swap is called off and the victim takes work again."""
        memory = f", memory: {ONE_MODEL}"
        head = "queue: {max_depth: 16, max_wait: 300ms}\n"
        sim, gateway = await start(start_sim, start_gateway, memory, head=head, memory=ONE_MODEL)
        async with running(gateway, LLAMA), aiohttp.ClientSession() as session:
            body = {"model": QWEN, "prompt": "hi", "stream": False}
            async with session.post(gateway.url + "/api/generate", json=body) as reply:
                assert reply.status == 503
                message = (await reply.json())["error"]
                retry_after = int(reply.headers["Retry-After"])
            assert "qwen2.5:7b waits for a swap on gpu: draining llama3.2:3b (1 running)" in message
            assert retry_after >= 10  # the drain (a request's hold) and a load, 10 s untimed
            assert admission_swap(gateway) is None
            assert await chat(gateway, LLAMA) == 200  # the victim runs again
        assert sim.stats.loads == 1

    async def test_the_user_who_causes_a_load_pays_for_its_time(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """A load's seconds count as generated tokens (costs.load a second) for the user
        whose request caused it: her first request costs her that much more than the next."""
        head = "users:\n  alice: {keys: [alice-key]}\n"
        _, gateway = await start(start_sim, start_gateway, "", head=head, load_seconds=0.2)
        charged = []
        for _ in range(2):
            before = gateway.services.admission.snapshot().fair_counters.get("alice", 0.0)
            assert await chat(gateway, LLAMA, "alice-key") == 200
            charged.append(gateway.services.admission.snapshot().fair_counters["alice"] - before)
        # 0.2 s of load at 50 tokens a second, at twice the cost of a prompt token.
        assert charged[0] - charged[1] >= 0.2 * 50 * 2


class Listing:
    """A simulated Ollama whose /api/tags fails (a disk it cannot read) until told, and
    whose /api/ps, once ``held``, answers only when let through: so a test decides when the
    gateway's probe learns the models, and what it sends meanwhile."""

    def __init__(self) -> None:
        self.failing = True
        self.held = False
        self.asked = asyncio.Event()  # a probe read the list and waits for /api/ps
        self._passes = asyncio.Semaphore(0)

    def let_one_through(self) -> None:
        self._passes.release()

    def open(self) -> None:
        self.held = False
        self._passes.release()  # each one let through lets the next through

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path == "/api/tags" and self.failing:
            return web.json_response({"error": "simulated failure"}, status=500)
        if request.path == "/api/ps" and self.held:
            self.asked.set()
            await self._passes.acquire()
            if not self.held:
                self._passes.release()
        return await handler(request)


MADE_UP = [f"made-up-{n}:latest" for n in range(20)]


class TestMadeUpModels:
    """Names no backend has on disk (Ollama answers 404 at once) take no room and unload
    nothing, whether the backend's list is unknown or just came back."""

    async def start(
        self, servers: AsyncExitStack, start_gateway: StartGateway
    ) -> tuple[Simulator, Listing, Gateway]:
        """Room for two models, and a list that fails: the backend stays in rotation."""
        sim = Simulator(
            SimConfig(
                parallel=2,
                models=[LLAMA, QWEN, PHI],
                max_loaded_models=2,
                prefill_tokens_per_s=0.0,
                decode_tokens_per_s=500.0,
            )
        )
        listing = Listing()
        app = sim.make_app()
        app.middlewares.append(listing.middleware)
        url = await serve(servers, app)
        head = "monitoring: {interval: 50ms, unhealthy_after: 1000, healthy_after: 1}\n"
        gateway = await start_gateway(
            head + "defaults: {max_concurrent: 4, max_queued: 4}\n"
            f"backends:\n  - {{name: gpu, url: {url}, slots: 2, max_loaded_models: 2}}\n"
        )
        return sim, listing, gateway

    async def test_made_up_models_sent_while_the_list_is_unknown_unload_no_real_model(
        self, servers: AsyncExitStack, start_gateway: StartGateway
    ) -> None:
        """With /api/tags failing, twenty made-up names go to Ollama (which refuses them)
        between two requests for the family's model: it stays loaded, loaded once."""
        sim, _, gateway = await self.start(servers, start_gateway)
        assert await chat(gateway, LLAMA) == 200
        assert [await chat(gateway, model) for model in MADE_UP] == [404] * len(MADE_UP)
        assert (await chat(gateway, LLAMA), await chat(gateway, QWEN)) == (200, 200)
        assert (sim.stats.unloaded, sim.stats.evictions, sim.stats.loads) == ([], 0, 2)
        assert set(sim.loaded_models()) == {LLAMA, QWEN}

    async def test_made_up_models_sent_as_the_list_comes_back_take_no_room_after_it(
        self, servers: AsyncExitStack, start_gateway: StartGateway
    ) -> None:
        """A made-up name sent while the probe that reads the list is under way does not
        count as held once it has: the next real model loads beside the family's model."""
        sim, listing, gateway = await self.start(servers, start_gateway)
        backend = gateway.services.admission.room.pool.backends[0]
        assert await chat(gateway, LLAMA) == 200
        listing.held, listing.failing = True, False
        async with asyncio.timeout(5):
            await listing.asked.wait()  # this probe has the list; not yet what is loaded
        # One name only: it fits beside llama even to the old view, so that any unload is
        # caused after the list came back.
        assert await chat(gateway, MADE_UP[0]) == 404
        listing.asked.clear()
        listing.let_one_through()
        await until(gateway.services.admission, lambda _: backend.state.models is not None)
        try:
            assert await chat(gateway, QWEN) == 200
        finally:
            listing.open()
        assert (sim.stats.unloaded, sim.stats.evictions, sim.stats.loads) == ([], 0, 2)
        assert set(sim.loaded_models()) == {LLAMA, QWEN}


def admission_swap(gateway: Gateway) -> object:
    snapshot = gateway.services.admission.room.swaps.snapshot()
    return snapshot.pending.get(gateway.services.admission.room.pool.backends[0].key)


class TestPlanner:
    """The planner alone: pure, on a hand-made backend and clock."""

    def setup_method(self) -> None:
        self.now = 100.0
        self.planner = SwapPlanner(lambda: self.now)
        state = BackendState(observed_at=0.0, models=frozenset({LLAMA, QWEN, PHI}))
        state.sizes = {LLAMA: 2 * 10**9, QWEN: 4 * 10**9, PHI: 2 * 10**9}
        self.backend = Backend(
            "gpu", "http://gpu", "ollama", 2, state, max_loaded_models=2, protected=frozenset()
        )

    def hold(self, *models: str) -> None:
        """Ollama's /api/ps shows ``models`` loaded at the default context."""
        self.backend.state.loaded = {
            m: LoadedModel(size=self.planner.residency.estimate(self.backend, m, 4096))
            for m in models
        }

    def busy(self, **running: int) -> dict[str, int]:
        names = {"llama": LLAMA, "qwen": QWEN, "phi": PHI}
        return {self.backend.group(names[k]): n for k, n in running.items()}

    def test_requests_for_the_model_swapped_in_wait_until_its_room_is_made(self) -> None:
        """After the swap is sent, the next request for its model waits for the unload."""
        planner, backend = self.planner, self.backend
        self.hold(LLAMA, QWEN)
        assert planner.plan(backend, PHI, None, {}, {})
        placement = planner.placed(backend, PHI, None, {})
        assert placement.kind == "swap" and len(placement.unload) == 1
        assert not planner.admits(backend, PHI, None, self.busy(phi=1))
        assert not planner.plan(backend, QWEN, None, self.busy(phi=1), {})  # one at a time
        planner.made_room(backend)
        assert planner.admits(backend, PHI, None, self.busy(phi=1))

    def test_a_swap_is_due_after_its_cost_unless_the_models_it_unloads_are_idle(self) -> None:
        """While its victim is in use (running, waited for, or used within the cost), a
        request for another model waits what the swap keeps the victim away: the loads it
        brings (its model's and the victim's, to come back) and the request's own time
        (``away``), at most its patience; with the victim idle, not at all; ``swap_after``
        in place of the cost when given."""
        planner, backend = self.planner, self.backend

        def away(_: Backend) -> float:
            return 0.5  # phi's request holds its slot half a second

        self.hold(LLAMA, QWEN)
        plans = planner.plans_of(backend)
        plans.load_seconds.update({LLAMA: 1.5, QWEN: 3.0, PHI: 2.0})
        # llama is the victim each time: it runs or is wanted less than qwen.
        busy, wanted = self.busy(llama=1, qwen=2), {(backend.key, LLAMA): 1, (backend.key, QWEN): 2}
        for runs, demand, waited, patience, due in (
            ({}, {}, 0.0, 10.0, True),  # nobody runs or waits for either: at once
            (busy, {}, 3.9, 10.0, False),  # phi 2.0 + its 0.5 s + llama 1.5 = 4.0
            (busy, {}, 4.0, 10.0, True),
            ({}, wanted, 3.9, 10.0, False),  # waited for counts as in use
            (busy, {}, 1.0, 1.0, True),  # at most its patience
        ):
            found = planner.room_for(
                [backend], PHI, None, runs, demand, waited, patience, CAL, away
            )
            assert (found is backend) is due, (runs, demand, waited)
            assert planner.due_in == (None if due else pytest.approx(4.0 - waited))
            planner.due_in = None
        # Used a moment ago, their users are between two questions: in use still; unless
        # more people wait for phi than use llama, who are then the ones to wait.
        plans.last_used.update({LLAMA: self.now - 1.0, QWEN: self.now - 0.5})
        plans.users.update({LLAMA: {"ann": self.now - 1.0}, QWEN: {"bea": self.now - 0.5}})
        assert planner.room_for([backend], PHI, None, {}, {}, 3.9, 10.0, CAL, away) is None
        assert planner.room_for([backend], PHI, None, {}, {}, 4.0, 10.0, CAL, away) is backend
        assert (
            planner.room_for([backend], PHI, None, {}, {}, 0.0, 10.0, CAL | {"dan"}, away)
            is backend
        )
        # Background work waits its patience while they are in use.
        assert planner.room_for([backend], PHI, None, {}, {}, 9.9, 10.0, frozenset(), away) is None
        # For background work a person reading their reply is a user still: used 6 s ago,
        # past the cost but within its patience, the task waits its patience; a person
        # would not wait at all.
        plans.last_used.update({LLAMA: self.now - 6.0, QWEN: self.now - 6.0})
        plans.users.update({LLAMA: {"ann": self.now - 6.0}, QWEN: {"bea": self.now - 6.0}})
        assert planner.room_for([backend], PHI, None, {}, {}, 9.9, 10.0, frozenset(), away) is None
        assert planner.room_for([backend], PHI, None, {}, {}, 10.0, 10.0, frozenset(), away)
        assert planner.room_for([backend], PHI, None, {}, {}, 0.0, 10.0, CAL, away) is backend
        fixed = replace(backend, swap_after=0.5)
        assert planner.room_for([fixed], PHI, None, busy, {}, 0.5, 10.0, CAL, away)
        # A fixed wait whoever the switch interrupts: three of llama's, one waiting for phi;
        # one of llama's, two waiting for phi (the rule's own would swap at once).
        plans.users[LLAMA] = {u: self.now - 0.1 for u in ("ann", "cy", "eve")}
        assert planner.room_for([fixed], PHI, None, busy, {}, 0.49, 10.0, CAL, away) is None
        assert planner.room_for([fixed], PHI, None, busy, {}, 0.5, 10.0, CAL, away)
        plans.users[LLAMA] = {"ann": self.now - 0.1}
        two = CAL | {"dan"}
        assert planner.room_for([backend], PHI, None, busy, {}, 0.0, 10.0, two, away)
        assert planner.room_for([fixed], PHI, None, busy, {}, 0.49, 10.0, two, away) is None

    def test_a_model_being_loaded_stays_held_after_its_request_went(self) -> None:
        """Ollama goes on loading a model whose request was cancelled; a probe during the
        load shows nothing. Until the load has had time to end (twice its last, and 5 s),
        only a probe that shows it settles it, else room would look free beside it."""
        planner, backend = self.planner, self.backend
        planner.plans_of(backend).load_seconds[QWEN] = 2.0
        assert planner.placed(backend, QWEN, None, {}).kind == "load"
        self.now += 1.0
        planner.residency.ran(backend, QWEN)  # its request went, mid-load
        backend.state.observed_at = self.now + 0.1  # a probe since, that shows nothing
        assert planner.residency.context(backend, QWEN, {}) == 4096
        assert list(planner.residency.residents(backend, {})) == [QWEN]
        self.now += 9.0  # sent 10 s ago: past 2 x 2 s + 5 s
        backend.state.observed_at = self.now
        assert planner.residency.context(backend, QWEN, {}) is None

    def test_the_victim_is_the_least_busy_then_least_wanted_then_longest_unused(self) -> None:
        """Running requests first, then waiting ones, then when it was last used."""
        planner, backend = self.planner, self.backend
        self.hold(LLAMA, QWEN)
        planner.placed(backend, LLAMA, None, {})
        self.now += 1
        planner.placed(backend, QWEN, None, {})  # llama is the longest unused
        waiting = {(backend.key, LLAMA): 2}
        for busy, demand, victim in (
            (self.busy(llama=1), {}, QWEN),
            (self.busy(qwen=1), {}, LLAMA),
            ({}, waiting, QWEN),
            ({}, {}, LLAMA),
        ):
            assert planner.plan(backend, PHI, None, busy, demand)
            assert planner.snapshot().pending[backend.key][1] == (victim,)
            planner.keep_only(set())  # nobody waits for phi: called off

    def test_protected_models_are_never_victims(self) -> None:
        """With every held model resident or kept warm, no swap is possible; the request
        hears why."""
        self.backend = Backend(
            "gpu",
            "http://gpu",
            "ollama",
            2,
            self.backend.state,
            max_loaded_models=2,
            protected=frozenset({LLAMA, QWEN}),
        )
        self.hold(LLAMA, QWEN)
        assert not self.planner.plan(self.backend, PHI, None, {}, {})
        waited = waits(self.planner, self.backend, PHI, None, {}, hold=5.0)
        assert waited is not None
        assert waited.said == f"{PHI} does not fit on gpu beside {LLAMA}, {QWEN}"

    def test_a_model_its_list_does_not_confirm_takes_no_room_and_plans_no_swap(self) -> None:
        """While the list is unknown what was sent counts for nothing and a request goes
        without a swap; once known, a name it lacks is dropped, a listed one held."""
        planner, backend = self.planner, self.backend
        listed, backend.state.models = backend.state.models, None
        planner.placed(backend, LLAMA, None, {})
        planner.placed(backend, "made-up", None, {})
        assert planner.residency.residents(backend, {}) == {}
        assert planner.admits(backend, PHI, None, {})
        assert not planner.plan(backend, PHI, None, {}, {})
        backend.state.models = listed
        assert list(planner.residency.residents(backend, {})) == [LLAMA]
        assert planner.admits(backend, PHI, None, {})  # beside llama: room for two

    def test_asking_beyond_the_trained_context_once_seen_reloads_nothing(self) -> None:
        """Ollama cuts num_ctx to the model's trained context; once a probe showed the cut,
        asking that much again is no new context and plans no reload."""
        planner, backend = self.planner, self.backend
        planner.placed(backend, QWEN, 100_000, {})
        assert not planner.admits(backend, QWEN, 32768, {})  # what it holds is 100,000
        self.now += 1
        backend.state.observed_at = self.now  # a probe started after the request ended
        backend.state.loaded = {QWEN: LoadedModel(size=5 * 10**9, context_length=32768)}
        assert [r.num_ctx for r in planner.residency.residents(backend, {}).values()] == [32768]
        assert planner.admits(backend, QWEN, 100_000, {})
        assert not planner.plan(backend, QWEN, 100_000, {}, {})
        assert not planner.admits(backend, QWEN, 8192, {})  # a smaller one does reload

    def test_admitted_answers_and_places_as_admits_then_placed_do(self) -> None:
        """The quick yes's one question is the two it stands for: over a random walk of
        requests, probes, swaps and unloads, the same placement or refusal, the same state."""
        rng, backend, now = random.Random(7), self.backend, [100.0]
        both, alone = SwapPlanner(lambda: now[0]), SwapPlanner(lambda: now[0])
        models = (LLAMA, QWEN, PHI, "made-up")
        for _ in range(600):
            now[0] += rng.choice((0.0, 0.5, 3.0))
            model, asked = rng.choice(models), rng.choice((None, None, 8192, 100_000))
            busy = {backend.group(m): n for m in models if (n := rng.choice((0, 0, 0, 1)))}
            step = rng.random()
            if step < 0.1:  # a probe: what is loaded, with which context; the list, or none
                held = rng.sample(models[:3], rng.randint(0, 2))
                backend.state.loaded = {
                    m: LoadedModel(size=2 * 10**9, context_length=rng.choice((None, 32768)))
                    for m in held
                }
                backend.state.observed_at = now[0]
                backend.state.models = rng.choice((None, frozenset(models[:3])))
            elif step < 0.2:
                for planner in (both, alone):
                    planner.plan(backend, model, asked, busy, {(backend.key, model): 1})
            elif step < 0.25:
                for planner in (both, alone):
                    planner.made_room(backend)
            expected = (
                alone.placed(backend, model, asked, busy)
                if alone.admits(backend, model, asked, busy)
                else None
            )
            assert both.admitted(backend, model, asked, busy) == expected
            assert planner_state(both, backend) == planner_state(alone, backend)


def planner_state(planner: SwapPlanner, backend: Backend) -> tuple[object, ...]:
    """All a planner keeps of ``backend``, the residency's lazy pruning included."""
    residency = planner.residency
    return (planner.snapshot(), planner._plans, planner._swaps, residency._backends)


class TestWastedSwaps:
    """Ollama refuses a body it cannot decode, or a model without a capability asked for,
    before its scheduler evicts anything; a swap made for such a request unloads
    someone's model for nothing. (The simulator's sim_status stands for a refusal the
    gateway cannot foresee.)"""

    USERS = (
        "users:\n  alice: {keys: [alice-key]}\n  bob: {keys: [bob-key]}\nqueue: {max_wait: 1s}\n"
    )

    async def both_loaded(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> tuple[Simulator, Gateway]:
        """Room for two models, three on disk: bob's qwen and alice's llama loaded."""
        sim, gateway = await start(
            start_sim,
            start_gateway,
            ", max_loaded_models: 2",
            head=self.USERS,
            max_loaded_models=2,
            models=[LLAMA, QWEN, PHI],
        )
        assert await chat(gateway, QWEN, "bob-key") == 200
        assert await chat(gateway, LLAMA, "alice-key") == 200
        return sim, gateway

    async def test_a_user_whose_swap_loaded_nothing_plans_no_swap_for_a_while(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """alice's unreadable phi3 request unloads bob's qwen once; nothing counts phi3 as
        loaded after; her second one waits and is refused without unloading anything, while
        bob may still swap."""
        sim, gateway = await self.both_loaded(start_sim, start_gateway)
        refused = {"sim_status": 400}
        assert await chat(gateway, PHI, "alice-key", options=refused) == 400
        assert len(sim.stats.unloaded) == 1  # the first one cost a model: not foreseeable
        key = gateway.services.admission.room.pool.backends[0].key
        assert (key, PHI, "loads") not in counts(gateway)  # refused: it loaded nothing
        # phi3 never loaded: qwen comes back beside llama, which a phantom phi3 counted
        # as held would have had unloaded instead.
        assert await chat(gateway, QWEN, "bob-key") == 200
        assert set(sim.loaded_models()) == {LLAMA, QWEN}
        status, said = await answer(gateway, PHI, "alice-key", options=refused)
        assert status == 503 and "none is started for alice" in said, said
        assert len(sim.stats.unloaded) == 1 and set(sim.loaded_models()) == {LLAMA, QWEN}
        assert await chat(gateway, PHI, "bob-key") == 200  # bob's swaps go on
        assert counts(gateway)[key, PHI, "loads"] == 1

    async def test_a_body_ollama_cannot_decode_is_refused_before_any_swap(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """options as a string: Ollama's own 400, from the gateway, and nothing unloaded."""
        sim, gateway = await self.both_loaded(start_sim, start_gateway)
        for _ in range(3):
            assert await chat(gateway, PHI, "alice-key", options="x") == 400
        assert sim.stats.unloaded == [] and set(sim.loaded_models()) == {LLAMA, QWEN}
