"""No needless reloads: the num_ctx policy, and models kept loaded against a client's
keep_alive."""

from __future__ import annotations

import math
from contextlib import AsyncExitStack
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.typedefs import Handler

from fairsim import SimConfig, Simulator
from gateway.config.models import NumCtxPolicy
from gateway.config.policy import parse_policy
from gateway.config.tuning import KeepAlivePolicy
from gateway.config.yaml_reader import PolicyError
from gateway.core.errors import GatewayError
from gateway.intake.load_options import apply_keep_alive_policy, apply_num_ctx_policy, num_ctx_of
from tests.conftest import Gateway, StartGateway, StartSim, serve

LLAMA, QWEN = "llama3.2:3b", "qwen2.5:7b"
FAST = (
    "monitoring: {interval: 50ms, unhealthy_after: 2, healthy_after: 1}\n"
    "defaults: {max_concurrent: 4, max_queued: 4}\n"
)


def backend(url: str, extra: str = "") -> str:
    return f"backends:\n  - {{name: gpu, url: {url}, slots: 2{extra}}}\n"


async def chat(gateway: Gateway, model: str, **body: Any) -> int:
    """A whole chat through the gateway; its HTTP status."""
    request = {"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": False}
    async with (
        aiohttp.ClientSession() as session,
        session.post(gateway.url + "/api/chat", json=request | body) as reply,
    ):
        await reply.read()
        return reply.status


class TestNumCtxRules:
    def apply(self, options: Any, **rules: Any) -> tuple[bool, Any]:
        fields = {"model": LLAMA} if options is None else {"model": LLAMA, "options": options}
        changed = apply_num_ctx_policy(fields, NumCtxPolicy(**rules))
        return changed, fields.get("options")

    def test_override_replaces_any_num_ctx_and_adds_one_where_none_was_sent(self) -> None:
        """override: the value forwarded, whatever came, in a body with or without options."""
        assert self.apply({"num_ctx": 2048, "temperature": 0}, override=8192) == (
            True,
            {"num_ctx": 8192, "temperature": 0},
        )
        assert self.apply(None, override=8192) == (True, {"num_ctx": 8192})
        assert self.apply({"num_ctx": 8192}, override=8192) == (False, {"num_ctx": 8192})

    def test_override_default_removes_num_ctx(self) -> None:
        """'default' sends no num_ctx, so every request gets the server's context."""
        assert self.apply({"num_ctx": 2048, "top_k": 5}, override="default") == (
            True,
            {"top_k": 5},
        )
        assert self.apply({"top_k": 5}, override="default") == (False, {"top_k": 5})

    def test_min_and_max_clamp_what_ollama_would_read(self) -> None:
        """The value Ollama would act on (a number truncated, at least 4) is clamped, and
        a rewritten value is a plain integer."""
        assert self.apply({"num_ctx": 32768}, max=8192) == (True, {"num_ctx": 8192})
        assert self.apply({"num_ctx": 512}, min=2048) == (True, {"num_ctx": 2048})
        assert self.apply({"num_ctx": 4096.9}, min=2048) == (True, {"num_ctx": 4096})
        # Go's int64 of 1e300 is the smallest int64 (amd64), which Ollama raises to 4.
        assert self.apply({"num_ctx": 1e300}, max=8192) == (True, {"num_ctx": 4})
        assert self.apply({"num_ctx": -7}, min=2048) == (True, {"num_ctx": 2048})
        assert self.apply({"num_ctx": 4096}, min=2048, max=8192) == (False, {"num_ctx": 4096})
        assert self.apply(None, min=2048) == (False, None)  # the server's default stays

    def test_a_num_ctx_that_is_not_a_number_is_a_400_when_a_rule_applies(self) -> None:
        """Ollama answers a string num_ctx with a 500; the gateway says what is wrong."""
        for value in ("8192", True, [8192]):
            with pytest.raises(GatewayError) as refused:
                self.apply({"num_ctx": value}, max=8192)
            assert refused.value.status == 400
        assert self.apply({"num_ctx": "8192"}) == (False, {"num_ctx": "8192"})  # no rule

    def test_options_that_are_not_an_object_are_left_to_ollama(self) -> None:
        """Ollama refuses such a body itself (400); nothing to rewrite."""
        assert self.apply([1, 2], override=8192) == (False, [1, 2])

    def test_num_ctx_of_reads_it_as_ollama_does(self) -> None:
        """Truncated toward zero, at least 4; absent, null or not a number: the default."""
        read = [
            num_ctx_of({"options": {"num_ctx": value}})
            for value in (8192, 2048.7, -1, 1e30, None, "8192", 2**63 - 1, 2**63 - 512, 10**400)
        ]
        # 2**63 - 1 and - 512 are float64 2**63 to Go, out of int64 range: the smallest
        # int64, so 4 (a min rule must not let them through as "very large").
        assert read == [8192, 2048, 4, 4, None, None, 4, 4, 4]
        assert num_ctx_of({"options": "x"}) is None

    @pytest.mark.parametrize(
        "given", ["24h", -1, "-1m", "9223372036854775807ns", "-9223372036854775808ns"]
    )
    def test_a_keep_alive_max_holds_for_gos_longest_durations(self, given: object) -> None:
        """Go's edge durations (292 years, and the negative "forever") are durations to
        Ollama: clamped to the max like any long keep_alive, not left for Ollama to keep."""
        fields: dict[str, Any] = {"keep_alive": given}
        assert apply_keep_alive_policy(fields, KeepAlivePolicy(min=600, max=3600))
        assert fields["keep_alive"] == 3600

    def test_rules_are_checked_and_a_model_may_have_its_own(self) -> None:
        """min above max is refused; a model's rules replace the top-level ones for it,
        found under its name with or without :latest."""
        policy = parse_policy(
            "num_ctx: {max: 8192}\n"
            "models:\n  llama3.2: {num_ctx: {override: 2048}}\n" + backend("http://x")
        )
        assert policy.num_ctx_for("llama3.2:latest").override == 2048
        assert policy.num_ctx_for(QWEN).max == 8192
        with pytest.raises(PolicyError, match="min \\(9000\\) is above max \\(8192\\)"):
            parse_policy("num_ctx: {min: 9000, max: 8192}\n" + backend("http://x"))


class TestNoReloads:
    async def test_clients_asking_for_different_contexts_reload_the_model_without_a_rule(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """Three clients (2048, the default, 8192) taking turns: a reload on every turn
        that changes num_ctx; with override one load serves them all, at the value sent."""
        turns = [{"num_ctx": 2048}, {}, {"num_ctx": 8192}] * 2
        for rules, loads in (("", 6), ("num_ctx: {override: 8192}\n", 1)):
            sim, url = await start_sim()
            gateway = await start_gateway(FAST + rules + backend(url))
            for options in turns:
                assert await chat(gateway, LLAMA, options=options) == 200
            assert sim.stats.loads == loads
        assert sim.stats.reloads == 0
        async with aiohttp.ClientSession() as session, session.get(url + "/api/ps") as reply:
            assert (await reply.json())["models"][0]["context_length"] == 8192

    async def test_a_num_ctx_that_is_not_a_number_gets_a_400_and_loads_nothing(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """With a rule in force, a string num_ctx is refused by the gateway."""
        sim, url = await start_sim()
        gateway = await start_gateway(FAST + "num_ctx: {max: 8192}\n" + backend(url))
        assert await chat(gateway, LLAMA, options={"num_ctx": "8192"}) == 400
        assert sim.stats.loads == 0


class TestKeptLoaded:
    async def test_a_keep_warm_model_survives_a_clients_keep_alive_zero(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """keep_alive 0 would unload a keep_warm model for everybody; it is raised to the
        keep-warm keep_alive, while another model still obeys the client."""
        sim, url = await start_sim()
        warm = f", keep_warm: [{LLAMA}], keep_alive: 30m"
        gateway = await start_gateway(FAST + backend(url, warm))
        assert await chat(gateway, LLAMA, keep_alive=0) == 200
        assert await chat(gateway, QWEN, keep_alive=0) == 200
        assert list(sim.loaded_models()) == [LLAMA]
        assert sim.loaded_models()[LLAMA] >= sim.engine.clock() + 1799

    @pytest.mark.parametrize("listed", [True, False])
    @pytest.mark.parametrize("spelling", ["LLAMA3.2:3B", "registry.ollama.ai/library/llama3.2:3b"])
    async def test_a_keep_warm_model_survives_keep_alive_zero_under_another_spelling(
        self,
        listed: bool,
        spelling: str,
        start_sim: StartSim,
        start_gateway: StartGateway,
        servers: AsyncExitStack,
    ) -> None:
        """Ollama runs llama3.2:3b for LLAMA3.2:3B and for its full name (it fills in the
        default host and namespace and finds a model case-insensitively): the keep-warm
        rule holds for those spellings too, whether the backend's list is known (the
        request is served, not a 404) or not (every name is sent on)."""
        sim = Simulator(SimConfig(prefill_tokens_per_s=0.0, decode_tokens_per_s=500.0))
        app = sim.make_app()
        if not listed:
            app.middlewares.append(_no_listing)
        url = await serve(servers, app)
        gateway = await start_gateway(
            FAST + backend(url, f", keep_warm: [{LLAMA}], keep_alive: 30m")
        )
        assert await chat(gateway, spelling, keep_alive=0) == 200
        assert list(sim.loaded_models()) == [LLAMA]

    async def test_a_resident_model_is_pinned_whatever_the_client_asks(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """A resident model's requests carry keep_alive -1: it never expires in Ollama,
        and Ollama's own choice of a model to unload takes it last."""
        sim, url = await start_sim()
        gateway = await start_gateway(FAST + backend(url, f", resident: [{LLAMA}]"))
        for keep_alive in (0, "5m", None):
            body = {} if keep_alive is None else {"keep_alive": keep_alive}
            assert await chat(gateway, LLAMA, **body) == 200
            assert sim.loaded_models() == {LLAMA: math.inf}


@web.middleware
async def _no_listing(request: web.Request, handler: Handler) -> web.StreamResponse:
    """An Ollama whose model list fails (a disk it cannot read, say): it still generates."""
    if request.path == "/api/tags":
        return web.json_response({"error": "simulated failure"}, status=500)
    return await handler(request)


class TestNobodyReloadsAnothersModel:
    """Ollama reloads a model when a request's num_ctx, num_batch, num_gpu, main_gpu,
    use_mmap or num_thread differs from the loaded runner's (server/sched.go needsReload),
    for everybody. Issue 41: bob alternating them reloaded alice's model all day."""

    async def alternate(self, gateway: Gateway, **options: tuple[Any, Any]) -> None:
        for turn in range(6):
            chosen = {name: values[turn % 2] for name, values in options.items()}
            assert await chat(gateway, LLAMA, options=chosen) == 200

    @pytest.mark.parametrize(
        "options",
        [
            {"num_batch": (256, 1024)},
            {"num_gpu": (0, 99)},
            {"main_gpu": (0, 1)},
            {"use_mmap": (True, False)},
            {"num_thread": (2, 4)},
        ],
        ids=["num_batch", "num_gpu", "main_gpu", "use_mmap", "num_thread"],
    )
    async def test_the_runner_options_are_dropped_unless_the_admin_forwards_them(
        self, start_sim: StartSim, start_gateway: StartGateway, options: dict[str, Any]
    ) -> None:
        sim, url = await start_sim()
        gateway = await start_gateway(FAST + backend(url))
        await self.alternate(gateway, **options)
        assert sim.stats.reloads == 0
        forwarded, forwarded_url = await start_sim()
        open_gateway = await start_gateway(
            FAST + "runner_options: forward\n" + backend(forwarded_url)
        )
        await self.alternate(open_gateway, **options)
        assert forwarded.stats.reloads == 5  # the control: each change reloads

    async def test_a_resident_model_is_never_reloaded_by_a_clients_num_ctx(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        sim, url = await start_sim()
        gateway = await start_gateway(FAST + backend(url, f", resident: [{LLAMA}]"))
        await self.alternate(gateway, num_ctx=(2048, 8192))
        assert sim.stats.reloads == 0
        kept, kept_url = await start_sim()
        control = await start_gateway(FAST + backend(kept_url, f", keep_warm: [{LLAMA}]"))
        await self.alternate(control, num_ctx=(2048, 8192))
        assert kept.stats.reloads >= 5  # kept warm, not resident: the client's num_ctx goes
