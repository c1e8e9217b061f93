"""Several backends: routing by model and by what is loaded, union listings, failover,
health with hysteresis, llama.cpp slot discovery."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AsyncExitStack

import aiohttp
import ollama
import openai
from aiohttp import web
from aiohttp.typedefs import Handler

from fairsim import SimConfig, Simulator
from gateway.admission.admission import Admission
from gateway.app import bound_url, start_server
from gateway.backends.pool import Backend
from tests.conftest import Gateway, StartGateway, StartSim, serve
from tests.test_admission import until

LLAMA, QWEN = "llama3.2:3b", "qwen2.5:7b"
FAST_MONITOR = "monitoring: {interval: 50ms, timeout: 1s, unhealthy_after: 2, healthy_after: 2}\n"


def backends_yaml(*entries: str, extra: str = "") -> str:
    return extra + "backends:\n" + "".join(f"  - {entry}\n" for entry in entries)


def backend(gateway: Gateway, name: str) -> Backend:
    return next(b for b in gateway.services.policy.current.pool.backends if b.name == name)


async def wait_backend(gateway: Gateway, name: str, predicate: Callable[[Backend], bool]) -> None:
    """Wait on admission's change signal (the monitor wakes it) until the backend matches."""
    admission: Admission = gateway.services.admission
    await until(admission, lambda _: predicate(backend(gateway, name)))


async def chat(url: str, model: str, prompt: str) -> ollama.ChatResponse:
    async with ollama.AsyncClient(host=url) as client:
        return await client.chat(model=model, messages=[{"role": "user", "content": prompt}])


class TestRouting:
    async def test_a_request_goes_to_a_backend_that_serves_its_model(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """Each model's requests reach only the backend whose tags list it."""
        llama_sim, llama_url = await start_sim(models=[LLAMA])
        qwen_sim, qwen_url = await start_sim(models=[QWEN])
        gateway = await start_gateway(
            backends_yaml(
                f"{{name: a, url: {llama_url}, slots: 1}}",
                f"{{name: b, url: {qwen_url}, slots: 1}}",
            )
        )
        await chat(gateway.url, QWEN, "to qwen")
        await chat(gateway.url, LLAMA, "to llama")
        assert qwen_sim.stats.prompts == ["to qwen"]
        assert llama_sim.stats.prompts == ["to llama"]

    async def test_a_backend_with_the_model_loaded_is_preferred(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """Of two backends serving a model, the one that has it loaded gets the request."""
        cold_sim, cold_url = await start_sim(models=[LLAMA])
        warm_sim, warm_url = await start_sim(models=[LLAMA])
        await chat(warm_url, LLAMA, "load it")  # straight to the backend, before the gateway
        gateway = await start_gateway(
            backends_yaml(
                f"{{name: cold, url: {cold_url}, slots: 2}}",
                f"{{name: warm, url: {warm_url}, slots: 1}}",
            )
        )
        await chat(gateway.url, LLAMA, "where does this go")
        assert warm_sim.stats.prompts[-1] == "where does this go"
        assert cold_sim.stats.prompts == []

    async def test_a_model_no_backend_serves_gets_ollamas_404(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """An unknown model is refused with Ollama's wording, before any queue."""
        _, sim_url = await start_sim(models=[LLAMA])
        gateway = await start_gateway(backends_yaml(f"{{name: a, url: {sim_url}, slots: 1}}"))
        async with ollama.AsyncClient(host=gateway.url) as client:
            try:
                await client.chat(model="nope:1b", messages=[{"role": "user", "content": "x"}])
            except ollama.ResponseError as refused:
                assert (refused.status_code, refused.error) == (404, "model 'nope:1b' not found")
            else:
                raise AssertionError("an unknown model was accepted")

    async def test_listings_are_the_union_over_backends(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """/api/tags and /v1/models list every backend's models once; /api/ps what is loaded."""
        _, a_url = await start_sim(models=[LLAMA, QWEN])
        _, b_url = await start_sim(models=[QWEN])
        gateway = await start_gateway(
            backends_yaml(
                f"{{name: a, url: {a_url}, slots: 1}}", f"{{name: b, url: {b_url}, slots: 1}}"
            )
        )
        await chat(gateway.url, QWEN, "load qwen somewhere")
        async with ollama.AsyncClient(host=gateway.url) as client:
            tags = [model.model for model in (await client.list()).models]
            loaded = [model.model for model in (await client.ps()).models]
        assert sorted(tags) == sorted([LLAMA, QWEN])
        assert loaded == [QWEN]
        async with openai.AsyncOpenAI(base_url=gateway.url + "/v1", api_key="x") as client:
            ids = [model.id async for model in client.models.list()]
        assert sorted(ids) == sorted([LLAMA, QWEN])


class TestFailover:
    async def test_a_refused_connection_is_retried_once_on_another_backend(
        self, start_sim: StartSim, start_gateway: StartGateway, unused_tcp_port: int
    ) -> None:
        """A backend that refuses the connection: the request runs on the next one instead."""
        sim, sim_url = await start_sim()
        gateway = await start_gateway(
            backends_yaml(
                f"{{name: dead, url: 'http://127.0.0.1:{unused_tcp_port}', slots: 4}}",
                f"{{name: live, url: {sim_url}, slots: 1}}",
            )
        )
        reply = await chat(gateway.url, LLAMA, "survives")
        assert reply.done and sim.stats.prompts == ["survives"]

    async def test_a_5xx_before_any_byte_is_retried_once_on_another_backend(
        self, start_sim: StartSim, start_gateway: StartGateway, servers: AsyncExitStack
    ) -> None:
        """An Ollama that answers 500 to every chat (out of memory, say) is passed over."""
        fine, fine_url = await start_sim()
        broken = Simulator(SimConfig(decode_tokens_per_s=500.0))
        app = broken.make_app()
        app.middlewares.append(_fail_generation)
        broken_url = await serve(servers, app)
        gateway = await start_gateway(
            backends_yaml(
                f"{{name: broken, url: {broken_url}, slots: 4}}",
                f"{{name: fine, url: {fine_url}, slots: 1}}",
            )
        )
        reply = await chat(gateway.url, LLAMA, "p")
        assert reply.done
        assert broken.stats.prompts == [] and fine.stats.prompts == ["p"]


@web.middleware
async def _fail_generation(request: web.Request, handler: Handler) -> web.StreamResponse:
    if request.path in ("/api/chat", "/api/generate"):
        return web.json_response({"error": "CUDA error: out of memory"}, status=500)
    return await handler(request)


class TestHealth:
    async def test_a_backend_that_goes_down_leaves_rotation_and_comes_back(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """After failed probes the backend is skipped; after good ones it is used again."""
        flaky = Simulator(SimConfig(models=[LLAMA, QWEN], decode_tokens_per_s=500.0))
        runner = await start_server(flaky.make_app(), "127.0.0.1", 0)
        flaky_url = bound_url(runner)
        port = int(flaky_url.rsplit(":", 1)[1])
        steady, steady_url = await start_sim(models=[LLAMA])
        gateway = await start_gateway(
            backends_yaml(
                f"{{name: flaky, url: {flaky_url}, slots: 4}}",
                f"{{name: steady, url: {steady_url}, slots: 1}}",
                extra=FAST_MONITOR,
            )
        )
        await runner.cleanup()
        await wait_backend(gateway, "flaky", lambda b: not b.state.healthy)
        await chat(gateway.url, LLAMA, "while it is down")
        assert steady.stats.prompts == ["while it is down"]
        async with ollama.AsyncClient(host=gateway.url) as client:
            try:
                await client.generate(model=QWEN, prompt="only flaky has it")
            except ollama.ResponseError as refused:
                assert refused.status_code == 503
            else:
                raise AssertionError("a model served only by a down backend was accepted")

        runner = await start_server(flaky.make_app(), "127.0.0.1", port)
        try:
            await wait_backend(gateway, "flaky", lambda b: b.state.healthy)
            await chat(gateway.url, QWEN, "after it is back")
            assert flaky.stats.prompts == ["after it is back"]
        finally:
            await runner.cleanup()

    async def test_llamacpp_slots_are_discovered_from_props(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """A llama.cpp backend without configured slots uses /props total_slots."""
        _, sim_url = await start_sim(flavor="llamacpp", parallel=3, models=["smollm2"])
        gateway = await start_gateway(
            backends_yaml(f"{{name: cpp, url: {sim_url}, kind: llamacpp}}")
        )
        assert backend(gateway, "cpp").slots == 3
        async with (
            aiohttp.ClientSession() as session,
            session.get(gateway.url + "/status") as reply,
        ):
            cpp = (await reply.json())["backends"]["cpp"]
        assert (cpp["busy"], cpp["slots"], cpp["healthy"]) == (0, 3, True)

    async def test_with_llamacpp_alone_ollamas_listing_points_to_v1(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """No backend speaks Ollama's API: its listing says to use /v1, with no retry hint
        (waiting will not change it), while /v1/models lists the model."""
        _, sim_url = await start_sim(flavor="llamacpp", parallel=1, models=["smollm2"])
        gateway = await start_gateway(
            backends_yaml(f"{{name: cpp, url: {sim_url}, kind: llamacpp}}")
        )
        async with aiohttp.ClientSession() as session:
            async with session.get(gateway.url + "/api/tags") as reply:
                status, retry = reply.status, reply.headers.get("Retry-After")
                error = (await reply.json())["error"]
            async with session.get(gateway.url + "/v1/models") as reply:
                listed = [entry["id"] for entry in (await reply.json())["data"]]
        assert (status, retry) == (503, None)
        assert error.endswith("use the OpenAI-compatible routes under /v1")
        assert listed == ["smollm2"]

    async def test_ollama_and_llamacpp_serve_side_by_side(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """Native Ollama requests go to Ollama; /v1 requests for the llama.cpp model go there."""
        ollama_sim, ollama_url = await start_sim(models=[LLAMA])
        cpp_sim, cpp_url = await start_sim(flavor="llamacpp", parallel=2, models=["smollm2"])
        gateway = await start_gateway(
            backends_yaml(
                f"{{name: gpu, url: {ollama_url}, kind: ollama, slots: 1}}",
                f"{{name: cpp, url: {cpp_url}, kind: llamacpp}}",
            )
        )
        await chat(gateway.url, LLAMA, "native")
        async with openai.AsyncOpenAI(base_url=gateway.url + "/v1", api_key="x") as client:
            reply = await client.chat.completions.create(
                model="smollm2", messages=[{"role": "user", "content": "compat"}]
            )
        assert reply.choices[0].message.content
        assert ollama_sim.stats.prompts == ["native"]
        assert cpp_sim.stats.prompts == ["compat"]
