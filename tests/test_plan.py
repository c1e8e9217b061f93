"""fairgate plan: the KV-cache arithmetic, the model's shape read from real servers, the CLI."""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

import aiohttp
import pytest

from fairplan import (
    ModelCost,
    Plan,
    PlanInputs,
    RequestTotals,
    binary_size,
    decimal_size,
    llamacpp_shape,
    make_plan,
    measured_times,
    ollama_shape,
    parse_size,
    plan_models,
    policy_yaml,
    request_totals,
    shape_from_model_info,
)
from gateway.__main__ import main
from gateway.config.policy import parse_policy
from tests.conftest import Gateway, StartGateway, StartSim, one_backend
from tests.llama_server import LlamaServer
from tests.test_metrics import MODEL

GIB = 1024**3
WORKED = ["--layers", "36", "--kv-heads", "8", "--head-dim", "128", "--kv-memory", "6GiB"]
WORKED += ["--context", "8192", "--users", "20", "--gen-seconds", "12", "--think-seconds", "90"]


def plan_of(**overrides: Any) -> Plan:
    """The worked example (36 x 8 x 128, f16, 6 GiB, 8k, 20 users, 12 s every 90 s), changed."""
    fields: dict[str, Any] = dict(
        layers=36, kv_heads=8, head_dim=128, kv_memory=6 * GIB, context=8192,
        users=20, gen_seconds=12.0, think_seconds=90.0,
    )  # fmt: skip
    fields.update(overrides)
    return make_plan(PlanInputs(**fields))


def yaml_part(output: str) -> str:
    return output.split("Policy YAML (paste):\n\n", 1)[1]


async def chats(gateway: Gateway, count: int) -> None:
    async with aiohttp.ClientSession() as session:
        for n in range(count):
            body = {"model": MODEL, "prompt": f"question {n}", "stream": False}
            async with session.post(gateway.url + "/api/generate", json=body) as reply:
                assert reply.status == 200
                await reply.read()


async def scrape_totals(gateway: Gateway) -> RequestTotals:
    async with aiohttp.ClientSession() as session, session.get(gateway.url + "/metrics") as reply:
        return request_totals(await reply.text())


class TestArithmetic:
    def test_a_36_layer_model_needs_144_kib_per_token_and_1_2_gb_per_8k_conversation(
        self,
    ) -> None:
        """2 x 36 x 8 x 128 x 2 bytes is 147,456 bytes a token; 8,192 tokens make 1.2 GB."""
        plan = plan_of()
        assert plan.bytes_per_token == 147_456
        assert binary_size(plan.bytes_per_token) == "144 KiB"
        assert plan.bytes_per_conversation == 1_207_959_552
        assert decimal_size(plan.bytes_per_conversation) == "1.2 GB"

    def test_six_gib_hold_five_such_conversations(self) -> None:
        """6 GiB of KV cache fits five 8k conversations of that model, not six."""
        assert plan_of().fit == 5

    def test_a_32_layer_model_needs_256_mib_for_a_2k_conversation(self) -> None:
        """2 x 32 x 8 x 128 x 2 bytes is 131,072 bytes a token; 2,048 tokens make 256 MiB."""
        plan = plan_of(layers=32, context=2048)
        assert plan.bytes_per_token == 131_072
        assert binary_size(plan.bytes_per_conversation) == "256 MiB"

    def test_twenty_users_taking_twelve_seconds_every_ninety_keep_2_7_in_flight(self) -> None:
        """20 x 12 / 90 is 2.666…, shown as 2.7; x 1.5 is exactly 4 slots, not 5."""
        plan = plan_of()
        assert f"{plan.in_flight:.1f}" == "2.7"
        assert (plan.wanted, plan.slots) == (4, 4)

    def test_slots_are_capped_by_what_fits_in_memory(self) -> None:
        """With twice the load, the 5 conversations that fit bound the slots."""
        plan = plan_of(users=40)
        assert (plan.wanted, plan.fit, plan.slots) == (8, 5, 5)

    def test_one_slot_remains_when_not_even_one_conversation_fits(self) -> None:
        """1 GiB cannot hold a 1.1 GiB conversation; the plan still has one slot."""
        plan = plan_of(kv_memory=GIB)
        assert (plan.fit, plan.slots) == (0, 1)

    def test_quantized_caches_cost_their_ggml_block_sizes(self) -> None:
        """q8_0 is 34 bytes per 32 values, q4_0 18 per 32."""
        assert plan_of(kv_type="q8_0").bytes_per_token == 147_456 * 34 // 64
        assert plan_of(kv_type="q4_0").bytes_per_token == 147_456 * 18 // 64

    def test_queues_and_caps_follow_the_slots(self) -> None:
        """Queue depth is twice the slots; many users run one request each, few share slots."""
        crowded, pair = plan_of(), plan_of(users=2, gen_seconds=60.0)
        assert (crowded.queue_depth, crowded.max_concurrent, crowded.max_queued) == (8, 1, 2)
        assert (pair.slots, pair.max_concurrent) == (2, 1)
        assert plan_of(users=2, gen_seconds=200.0).max_concurrent == 2  # 5 slots // 2 users

    def test_long_replies_lengthen_the_longest_wait(self) -> None:
        """The last in a queue of twice the slots waits about two replies: 2 x 60 s."""
        assert plan_of().max_wait == 30
        assert plan_of(gen_seconds=60.0, users=5).max_wait == 120

    def test_the_context_is_cut_to_the_models_trained_context(self) -> None:
        """Asking 8k of a 4k model plans 4k conversations."""
        plan = plan_of(context_length=4096)
        assert (plan.num_ctx, plan.bytes_per_conversation) == (4096, 147_456 * 4096)

    def test_the_yaml_is_a_complete_policy(self) -> None:
        """The snippet alone parses as a policy with the planned numbers."""
        policy = parse_policy(policy_yaml(plan_of(), "gpu", "http://127.0.0.1:11434", "ollama"))
        assert policy.backends[0].slots == 4
        assert (policy.defaults.max_concurrent, policy.defaults.max_queued) == (1, 2)
        assert (policy.queue.max_depth, policy.queue.max_wait) == (8, 30.0)


class TestSizes:
    def test_sizes_parse_in_binary_and_decimal_units(self) -> None:
        """GiB and bare G count in 1024s, GB in 1000s, a plain number in bytes."""
        assert parse_size("6GiB") == parse_size("6G") == 6 * GIB
        assert parse_size("6 GB") == 6_000_000_000
        assert parse_size("1.5gib") == 3 * GIB // 2
        assert parse_size("512MiB") == 512 * 1024**2
        assert parse_size("4096") == 4096

    def test_a_size_without_a_number_is_refused(self) -> None:
        """``lots`` is not a size."""
        with pytest.raises(argparse.ArgumentTypeError):
            parse_size("lots")


class TestShapes:
    async def test_the_simulators_api_show_gives_the_full_shape(self, start_sim: StartSim) -> None:
        """llama3.2:3b: 28 layers, 8 KV heads of 128, trained on 131,072 tokens."""
        _, sim_url = await start_sim()
        async with aiohttp.ClientSession() as session:
            shape = await ollama_shape(session, sim_url, "llama3.2:3b")
        assert (shape.layers, shape.kv_heads, shape.head_dim) == (28, 8, 128)
        assert shape.context_length == 131_072

    def test_head_size_and_kv_heads_fall_back_to_what_gguf_implies(self) -> None:
        """No key_length: embedding / heads; no head_count_kv: as many as the heads."""
        shape = shape_from_model_info(
            {
                "general.architecture": "llama",
                "llama.block_count": 32,
                "llama.attention.head_count": 32,
                "llama.embedding_length": 4096,
                "llama.context_length": 4096,
            }
        )
        assert (shape.layers, shape.kv_heads, shape.head_dim) == (32, 32, 128)

    async def test_a_real_llama_server_reports_its_context_but_not_its_layers(
        self,
        llama_server: str,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        """/v1/models gives n_ctx_train and /props the slots; layers, KV heads and head size
        come from flags, and without them the plan names the missing ones."""
        async with aiohttp.ClientSession() as session:
            shape = await llamacpp_shape(session, llama_server, "smollm2")
        assert (shape.layers, shape.kv_heads, shape.head_dim) == (None, None, None)
        assert shape.context_length == 8192  # SmolLM2's trained context
        assert shape.notes == ("llama-server runs 2 slot(s) of 2,048 tokens now",)

        base = ["plan", "--backend", llama_server, "--kind", "llamacpp", "--kv-memory", "512MiB"]
        base += ["--users", "3", "--gen-seconds", "10s", "--think-seconds", "1m"]
        assert await asyncio.to_thread(main, base) == 1
        assert "give --layers, --kv-heads, --head-dim" in capsys.readouterr().err
        # SmolLM2-135M: 30 layers, 3 KV heads of 64 (its config.json).
        shaped = [*base, "--layers", "30", "--kv-heads", "3", "--head-dim", "64", "--json"]
        assert await asyncio.to_thread(main, shaped) == 0
        document = json.loads(capsys.readouterr().out)
        assert document["bytes_per_token"] == 2 * 30 * 3 * 64 * 2
        assert document["num_ctx"] == 8192
        assert document["server"] == "llama-server -np 1 -c 8192"
        assert parse_policy(document["yaml"]).backends[0].url == llama_server

    async def test_a_routers_model_is_planned_for_a_router(
        self, llama_router: LlamaServer, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """A router is not one llama-server: asked as one, the plan says which kind to
        write; a model it does not have is named with those it has; its model's own /props
        gives the slots, and the policy and server line are a router's."""
        base = ["plan", "--backend", llama_router.url, "--kv-memory", "512MiB", "--users", "3"]
        base += ["--gen-seconds", "10s", "--think-seconds", "1m", "--json"]
        base += ["--layers", "30", "--kv-heads", "3", "--head-dim", "64"]
        assert await asyncio.to_thread(main, [*base, "--kind", "llamacpp"]) == 1
        assert "is llama-server's router: --kind llamacpp-router" in capsys.readouterr().err
        router = [*base, "--kind", "llamacpp-router", "--model"]
        assert await asyncio.to_thread(main, [*router, "nosuch"]) == 1
        said = capsys.readouterr().err
        assert "has no model 'nosuch' (--model); it has coder, family" in said, said
        async with (  # loaded, its own /props answers
            aiohttp.ClientSession() as session,
            session.post(
                llama_router.url + "/v1/chat/completions",
                json={
                    "model": "family",
                    "messages": [{"role": "user", "content": "hi"}],
                    "max_tokens": 1,
                },
            ) as reply,
        ):
            assert reply.status == 200
        assert await asyncio.to_thread(main, [*router, "Family"]) == 0
        document = json.loads(capsys.readouterr().out)
        assert document["notes"] == ["llama-server runs 2 slot(s) of 1,024 tokens now"]
        assert document["server"].startswith("llama-server --models-dir DIR --models-max N -np")
        assert parse_policy(document["yaml"]).backends[0].kind == "llamacpp-router"


class TestMetrics:
    async def test_a_window_counts_only_the_requests_finished_within_it(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """Four replies between two scrapes of a 60 s window: reply time is their mean, and
        3 users sending 4 turns a minute take a turn every 45 s."""
        _, sim_url = await start_sim()
        gateway = await start_gateway(one_backend(sim_url, slots=2))
        await chats(gateway, 2)
        before = await scrape_totals(gateway)
        await chats(gateway, 4)
        window = await scrape_totals(gateway) - before
        assert window.count == 4
        gen, between = measured_times(window, 60.0, users=3)
        assert gen == pytest.approx(window.seconds / 4)
        assert between == pytest.approx(45.0)

    async def test_the_plan_reads_reply_time_from_the_gateway(
        self,
        start_sim: StartSim,
        start_gateway: StartGateway,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        """--from-metrics sets the seconds per reply to the gateway's mean request duration."""
        _, sim_url = await start_sim()
        gateway = await start_gateway(one_backend(sim_url, slots=2))
        await chats(gateway, 3)
        totals = await scrape_totals(gateway)
        argv = ["plan", "--backend", sim_url, "--model", MODEL, "--kv-memory", "2GiB"]
        argv += ["--users", "4", "--think-seconds", "60", "--from-metrics", gateway.url, "--json"]
        assert await asyncio.to_thread(main, argv) == 0
        # The gateway runs in this process and logs its requests to the same stdout.
        output = capsys.readouterr().out
        document = json.loads(output[output.index("\n{\n") :])
        assert document["inputs"]["gen_seconds"] == pytest.approx(totals.seconds / totals.count)
        assert document["bytes_per_token"] == 2 * 28 * 8 * 128 * 2


class TestCommandLine:
    def test_the_worked_example_prints_its_numbers_and_a_valid_policy(
        self, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """The flags alone print bytes per token, per conversation, slots, load and YAML."""
        assert main(["plan", *WORKED]) == 0
        output = capsys.readouterr().out
        assert "= 147,456 bytes (144 KiB)" in output
        assert "8,192 tokens = 1,207,959,552 bytes (1.1 GiB, 1.2 GB)" in output
        assert "Fit in 6 GiB: 5 conversations" in output
        assert "= 2.7 requests" in output
        assert "OLLAMA_NUM_PARALLEL=4 OLLAMA_CONTEXT_LENGTH=8192" in output
        policy = parse_policy(yaml_part(output))
        assert (policy.backends[0].kind, policy.backends[0].slots) == ("ollama", 4)
        assert policy.queue.max_depth == 8

    def test_json_is_valid_and_carries_the_plan(self, capsys: pytest.CaptureFixture[str]) -> None:
        """--json prints one JSON document with the numbers, the reasons and the YAML."""
        assert main(["plan", *WORKED, "--json"]) == 0
        document = json.loads(capsys.readouterr().out)
        assert (document["slots"], document["fit"], document["queue_depth"]) == (4, 5, 8)
        assert document["reasons"]["slots"].startswith("min(5 that fit in memory")
        assert parse_policy(document["yaml"]).backends[0].slots == 4

    def test_llamacpp_gets_the_whole_cache_in_c(self, capsys: pytest.CaptureFixture[str]) -> None:
        """llama-server splits -c over -np slots, so -c is slots x num_ctx."""
        argv = ["plan", *WORKED, "--kind", "llamacpp", "--kv-type", "q8_0", "--name", "cpp"]
        assert main(argv) == 0
        output = capsys.readouterr().out
        assert "llama-server -np 4 -c 32768 -fa on -ctk q8_0 -ctv q8_0" in output
        backend = parse_policy(yaml_part(output)).backends[0]
        assert (backend.name, backend.kind, backend.url) == (
            "cpp",
            "llamacpp",
            "http://127.0.0.1:8080",
        )

    def test_missing_numbers_are_named(self, capsys: pytest.CaptureFixture[str]) -> None:
        """Without a backend or --kv-heads, the command says which flag to give."""
        argv = ["plan", *WORKED[:2], *WORKED[4:]]
        assert main(argv) == 1
        assert "give --kv-heads (no --backend to ask)" in capsys.readouterr().err

    async def test_an_unknown_model_is_reported_not_planned(
        self, start_sim: StartSim, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """Ollama's 404 for a model it does not have ends the command with its message."""
        _, sim_url = await start_sim()
        argv = ["plan", "--backend", sim_url, "--model", "nope", *WORKED[6:]]
        assert await asyncio.to_thread(main, argv) == 1
        assert "HTTP 404" in capsys.readouterr().err


class TestSeveralModels:
    async def test_the_plan_fits_several_models_and_keeps_the_main_one(
        self, start_sim: StartSim, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """--also: each model's size at the plan's slots and context (weights from
        /api/tags, cache from /api/show), how many fit beside the main one, and a policy
        that keeps it resident and fixes num_ctx."""
        _, sim_url = await start_sim(models=["llama3.2:3b", "qwen2.5:7b", "phi3:3.8b"])
        argv = ["plan", "--backend", sim_url, "--model", "llama3.2:3b", "--kv-memory", "2GiB"]
        argv += ["--context", "4096", "--users", "4", "--gen-seconds", "10s"]
        argv += ["--think-seconds", "60s", "--also", "qwen2.5:7b", "--also", "phi3:3.8b"]
        argv += ["--memory", "9GB"]
        assert await asyncio.to_thread(main, argv) == 0
        output = capsys.readouterr().out
        # 1 slot of 4096 tokens each: the simulator's own runner sizes.
        assert "llama3.2:3b              2.3 GiB" in output
        assert "qwen2.5:7b               4.6 GiB" in output
        assert "max_loaded_models = 2" in output
        policy = parse_policy(yaml_part(output))
        backend = policy.backends[0]
        assert (backend.memory, backend.max_loaded_models) == (9 * 10**9, 2)
        assert backend.resident == ["llama3.2:3b"]
        assert policy.num_ctx.override == 4096

    def test_also_needs_a_backend_and_memory(self, capsys: pytest.CaptureFixture[str]) -> None:
        """Without an Ollama to ask and a memory to fit in, --also is refused in words."""
        assert main(["plan", *WORKED, "--also", "qwen2.5:7b"]) == 1
        assert "--also needs an ollama --backend" in capsys.readouterr().err

    def test_the_main_model_stays_only_beside_the_largest_other(self) -> None:
        """plan_models: sizes at slots x num_ctx; the main model is resident only if it fits
        beside the largest other; others are counted smallest first."""
        main_model = ModelCost("main", 2 * GIB, 100_000)
        others = [ModelCost("big", 6 * GIB, 100_000), ModelCost("small", GIB, 100_000)]
        fitted = plan_models(main_model, others, slots=2, num_ctx=4096, memory=8 * GIB)
        assert fitted.sizes["main"] == 2 * GIB + 100_000 * 4096 * 2
        assert (fitted.max_loaded_models, fitted.main_fits, fitted.main_stays) == (2, True, False)
        roomy = plan_models(main_model, others, slots=2, num_ctx=4096, memory=12 * GIB)
        assert (roomy.max_loaded_models, roomy.main_stays) == (3, True)
