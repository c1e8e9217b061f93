"""Anthropic's Messages API (/v1/messages) through the gateway, spoken by the real
``anthropic`` package: admitted, limited, counted and refused as the other APIs are, with
its own error shapes."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import aiohttp
import anthropic
import pytest
from multidict import CIMultiDict

from fairsim import Simulator
from gateway.core.vocabulary import RequestClass
from gateway.edge.record import RequestRecord
from tests.conftest import Finished, Gateway, StartGateway, StartSim
from tests.test_accounting import settled, stored
from tests.test_admission import MODEL, held, queued, until

USERS = """\
defaults: {max_concurrent: 1, max_queued: 2}
aliases: {family: llama3.2:3b}
users:
  alice: {keys: [alice-key]}
  kids: {keys: [kids-key], models: [family]}
"""

UNKNOWN_KEY = (
    "unknown API key: no user of the gateway's policy file has it (keys are "
    "under users:, as written or as its sha256: digest, which `echo KEY | fairgate keys hash` "
    "prints)"
)


def policy(sim_url: str, extra: str = "") -> str:
    backends = f"backends:\n  - {{name: sim, url: {sim_url}, kind: ollama, slots: 4}}\n"
    return USERS + extra + backends


def client(gateway: Gateway, key: str = "alice-key") -> anthropic.AsyncAnthropic:
    """The SDK as Claude Code's users set it: the gateway's URL and a key (``x-api-key``)."""
    return anthropic.AsyncAnthropic(base_url=gateway.url, api_key=key, max_retries=0)


async def post(gateway: Gateway, body: object, headers: dict[str, str]) -> tuple[int, dict]:  # type: ignore[type-arg]
    async with (
        aiohttp.ClientSession() as session,
        session.post(gateway.url + "/v1/messages", json=body, headers=headers) as reply,
    ):
        return reply.status, await reply.json(content_type=None)


HI = [{"role": "user", "content": "hi"}]


async def llama_gateway(
    start_sim: StartSim, start_gateway: StartGateway, sims: list[Simulator] | None = None
) -> Gateway:
    """A gateway in front of one simulated llama-server serving MODEL (added to ``sims``)."""
    sim, sim_url = await start_sim(flavor="llamacpp", models=[MODEL])
    if sims is not None:
        sims.append(sim)
    return await start_gateway(
        USERS + f"backends:\n  - {{name: cpp, url: {sim_url}, kind: llamacpp}}\n"
    )


class TestReplies:
    async def test_a_streamed_and_a_whole_reply_arrive_and_their_usage_is_recorded(
        self, start_sim: StartSim, start_gateway: StartGateway, usage_db: Path
    ) -> None:
        """The SDK's stream and whole reply come through; the store has the usage they say."""
        _, sim_url = await start_sim(default_output_tokens=6)
        gateway = await start_gateway(policy(sim_url))
        async with client(gateway) as sdk:
            whole = await sdk.messages.create(model=MODEL, max_tokens=5, messages=HI)
            async with sdk.messages.stream(
                model=MODEL,
                max_tokens=40,
                system="be brief",
                messages=[{"role": "user", "content": [{"type": "text", "text": "a story"}]}],
            ) as stream:
                text = await stream.get_final_text()
                streamed = await stream.get_final_message()
        assert whole.content[0].type == "text" and whole.stop_reason == "max_tokens"
        assert whole.usage.output_tokens == 5
        assert text and streamed.usage.output_tokens == 40
        await settled(gateway)
        alice = stored(usage_db, "alice")
        assert alice["requests"] == 2
        assert alice["prompt_tokens"] == whole.usage.input_tokens + streamed.usage.input_tokens
        assert alice["completion_tokens"] == 45

    async def test_a_stream_is_charged_a_token_for_each_content_block_delta(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """The meter counts the events that carry a token, not every event or line."""
        _, sim_url = await start_sim()
        gateway = await start_gateway(policy(sim_url))
        finished = Finished(gateway)
        deltas = 0
        async with client(gateway) as sdk:
            stream = await sdk.messages.create(model=MODEL, max_tokens=30, messages=HI, stream=True)
            async for event in stream:
                deltas += event.type == "content_block_delta"
        record = await finished.first(("/v1/messages",))
        assert deltas == 30
        assert record.streamed_tokens == 30
        assert (record.prompt_tokens, record.completion_tokens) == (1, 30)

    async def test_an_alias_is_resolved_and_written_back_and_models_are_enforced(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """The backend runs the alias's model; a model the user may not use is a 403."""
        simulator, sim_url = await start_sim()
        gateway = await start_gateway(policy(sim_url))
        async with client(gateway, "kids-key") as sdk:
            reply = await sdk.messages.create(model="family", max_tokens=3, messages=HI)
            with pytest.raises(anthropic.PermissionDeniedError) as refused:
                await sdk.messages.create(model="qwen2.5:7b", max_tokens=3, messages=HI)
        assert reply.model == MODEL
        assert refused.value.body == {
            "type": "error",
            "error": {
                "type": "permission_error",
                "message": "user kids may not use model 'qwen2.5:7b'",
            },
        }
        assert len(simulator.stats.prompts) == 1


class TestRefusals:
    async def test_a_wrong_x_api_key_is_a_401_in_anthropics_shape(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """An unknown key in x-api-key, as the SDK sends it, is refused before anything runs."""
        simulator, sim_url = await start_sim()
        gateway = await start_gateway(policy(sim_url))
        async with client(gateway, "not-a-key") as sdk:
            with pytest.raises(anthropic.AuthenticationError) as refused:
                await sdk.messages.create(model=MODEL, max_tokens=3, messages=HI)
        assert refused.value.body == {
            "type": "error",
            "error": {"type": "authentication_error", "message": UNKNOWN_KEY},
        }
        assert len(simulator.stats.prompts) == 0

    async def test_a_bearer_token_as_claude_code_sends_it_is_a_key_too(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """ANTHROPIC_AUTH_TOKEN: the key as Authorization: Bearer, the user found by it."""
        _, sim_url = await start_sim()
        gateway = await start_gateway(policy(sim_url))
        finished = Finished(gateway)
        async with anthropic.AsyncAnthropic(
            base_url=gateway.url, auth_token="alice-key", max_retries=0
        ) as sdk:
            await sdk.messages.create(model=MODEL, max_tokens=3, messages=HI)
        assert (await finished.first(("/v1/messages",))).user == "alice"

    async def test_two_different_keys_in_one_request_are_refused(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """A bearer key and another x-api-key: a 401, whichever of them is a user's."""
        simulator, sim_url = await start_sim()
        gateway = await start_gateway(policy(sim_url))
        body = {"model": MODEL, "max_tokens": 3, "messages": HI}
        for bearer, api_key in (("alice-key", "kids-key"), ("alice-key", "x"), ("x", "kids-key")):
            headers = {"Authorization": f"Bearer {bearer}", "x-api-key": api_key}
            status, error = await post(gateway, body, headers)
            assert status == 401
            assert "two different keys" in error["error"]["message"]
        same = {"Authorization": "Bearer alice-key", "x-api-key": "alice-key"}
        assert (await post(gateway, body, same))[0] == 200
        assert len(simulator.stats.prompts) == 1

    async def test_a_key_header_sent_twice_with_different_keys_is_refused_on_every_route(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """Two x-api-key or two Authorization values that differ are a 401; one repeated is not."""
        simulator, sim_url = await start_sim()
        gateway = await start_gateway(policy(sim_url))
        routes = {
            "/v1/messages": {"model": MODEL, "max_tokens": 3, "messages": HI},
            "/api/chat": {"model": MODEL, "messages": HI, "stream": False},
        }
        twice = (
            [("x-api-key", "kids-key"), ("x-api-key", "alice-key")],
            [("Authorization", "Bearer kids-key"), ("Authorization", "Bearer alice-key")],
            [("Authorization", "Bearer alice-key"), ("Authorization", "Bearer nobody")],
        )
        async with aiohttp.ClientSession() as session:
            for path, body in routes.items():
                for pairs in twice:
                    headers = CIMultiDict(pairs)
                    async with session.post(
                        gateway.url + path, json=body, headers=headers
                    ) as reply:
                        assert reply.status == 401, (path, pairs)
                        assert "two different" in await reply.text()
                same = CIMultiDict([("x-api-key", "alice-key"), ("x-api-key", "alice-key")])
                async with session.post(gateway.url + path, json=body, headers=same) as reply:
                    assert reply.status == 200
        assert len(simulator.stats.prompts) == 2

    async def test_a_full_queue_is_a_503_with_retry_after(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """The user's place taken and their queue full: 503 at once, overloaded, Retry-After."""
        _, sim_url = await start_sim(parallel=8)
        gateway = await start_gateway(policy(sim_url, "queue: {max_wait: 30s}\n"))
        admission = gateway.services.admission
        async with held(gateway, "alice-key", "first"), client(gateway) as sdk:
            waiting = [
                sdk.messages.create(model=MODEL, max_tokens=3, messages=HI) for _ in range(2)
            ]
            tasks = [asyncio.ensure_future(w) for w in waiting]
            await until(admission, queued("alice", 2))
            started = time.monotonic()
            with pytest.raises(anthropic.APIStatusError) as refused:
                await sdk.messages.create(model=MODEL, max_tokens=3, messages=HI)
            assert time.monotonic() - started < 10  # at once, not after the 30 s max_wait
        for task in tasks:
            task.cancel()
        assert refused.value.status_code == 503
        assert int(refused.value.response.headers["Retry-After"]) >= 1
        error = refused.value.body
        assert isinstance(error, dict) and error["type"] == "error"
        assert error["error"]["type"] == "overloaded_error"
        assert "1 running and 2 waiting" in error["error"]["message"]

    async def test_a_body_go_and_python_read_apart_is_refused(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """Two spellings of max_tokens, or of a message's role: 400 ambiguous_field."""
        simulator, sim_url = await start_sim()
        gateway = await start_gateway(policy(sim_url))
        headers = {"x-api-key": "kids-key"}
        twice = '{"model": "family", "MODEL": "qwen2.5:7b", "max_tokens": 3, "messages": []}'
        async with (
            aiohttp.ClientSession() as session,
            session.post(gateway.url + "/v1/messages", data=twice, headers=headers) as reply,
        ):
            assert reply.status == 400
            error = await reply.json()
        assert error["error"]["type"] == "invalid_request_error"
        assert "the JSON field model is given more than once" in error["error"]["message"]
        role = {"model": MODEL, "max_tokens": 3, "messages": [{"role": "user", "ROLE": "x"}]}
        status, error = await post(gateway, role, {"x-api-key": "alice-key"})
        assert (status, error["type"]) == (400, "error")
        # A tool's schema is the client's JSON, read by Ollama with exact keys.
        tool = {
            "name": "lookup",
            "input_schema": {"type": "object", "properties": {"ID": {}, "id": {}}},
        }
        schema = {"model": MODEL, "max_tokens": 3, "messages": HI, "tools": [tool]}
        assert (await post(gateway, schema, {"x-api-key": "alice-key"}))[0] == 200
        assert len(simulator.stats.prompts) == 1

    async def test_a_tool_the_server_would_run_itself_is_refused(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """Ollama runs web_search and further chats of its own past the gateway: a 400."""
        simulator, sim_url = await start_sim()
        gateway = await start_gateway(policy(sim_url))
        async with client(gateway) as sdk:
            with pytest.raises(anthropic.BadRequestError) as refused:
                await sdk.messages.create(
                    model=MODEL,
                    max_tokens=3,
                    messages=HI,
                    tools=[{"type": "web_search_20250305", "name": "web_search"}],
                )
        assert "'web_search_20250305' is run by the server itself" in str(refused.value)
        assert len(simulator.stats.prompts) == 0


class TestRouting:
    async def test_openai_compatible_backends_alone_say_they_have_no_messages_api(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """Only Ollama and llama-server serve /v1/messages: elsewhere a 503 that says so."""
        simulator, sim_url = await start_sim()
        backends = f"backends:\n  - {{name: vllm, url: {sim_url}, kind: openai}}\n"
        gateway = await start_gateway(USERS + backends)
        async with client(gateway) as sdk:
            with pytest.raises(anthropic.APIStatusError) as refused:
                await sdk.messages.create(model=MODEL, max_tokens=3, messages=HI)
        assert refused.value.status_code == 503
        assert "no backend of this gateway serves Anthropic's Messages API" in str(refused.value)
        assert "Retry-After" not in refused.value.response.headers  # no wait will change it
        assert simulator.stats.prompts == []

    async def test_ollamas_own_routes_on_llama_cpp_alone_say_to_use_v1(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """docs/errors.md's no_backend row: not 'model not found', but where to go instead."""
        gateway = await llama_gateway(start_sim, start_gateway)
        await until(
            gateway.services.admission,
            lambda _: all(
                b.state.models is not None for b in gateway.services.policy.current.pool.backends
            ),
        )
        body = {"model": MODEL, "messages": HI}
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                gateway.url + "/api/chat", json=body, headers={"x-api-key": "alice-key"}
            ) as reply,
        ):
            assert reply.status == 503
            assert "use the OpenAI-compatible routes under /v1" in (await reply.json())["error"]


class TestForwarding:
    async def test_neither_key_reaches_the_backend_and_claude_codes_beta_query_is_served(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """Claude Code posts /v1/messages?beta=true; the backend sees neither key header."""
        simulator, sim_url = await start_sim(record_replies=True)
        gateway = await start_gateway(policy(sim_url))
        finished = Finished(gateway)
        body = {"model": MODEL, "max_tokens": 3, "messages": HI}
        headers = {"x-api-key": "alice-key", "Authorization": "Bearer alice-key"}
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                gateway.url + "/v1/messages?beta=true", json=body, headers=headers
            ) as reply,
        ):
            assert reply.status == 200
            assert (await reply.json())["type"] == "message"
        assert (await finished.first(("/v1/messages",))).user == "alice"
        sent = simulator.request_headers  # this request's, and the probes'
        assert any(h.get("Content-Length") for h in sent)  # the POST is among them
        assert not any("x-api-key" in h or "authorization" in h for h in sent)


class TestStreams:
    async def test_a_backend_failing_mid_stream_ends_in_the_error_event_the_sdk_raises(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """Tokens, then Anthropic's in-band error event: the SDK raises it with its message."""
        _, sim_url = await start_sim()
        gateway = await start_gateway(policy(sim_url))
        finished = Finished(gateway)
        texts: list[str] = []
        async with client(gateway) as sdk:
            stream = await sdk.messages.create(
                model=MODEL,
                max_tokens=30,
                messages=HI,
                stream=True,
                extra_body={"sim_die_after": 4},
            )
            with pytest.raises(anthropic.APIStatusError) as failed:
                async for event in stream:
                    if event.type == "content_block_delta" and event.delta.type == "text_delta":
                        texts.append(event.delta.text)
        assert len(texts) == 4
        assert failed.value.body == {
            "type": "error",
            "error": {
                "type": "api_error",
                "message": "the backend failed mid-stream (BackendClosed)",
            },
        }
        record = await finished.first(("/v1/messages",))
        assert record.reason == "backend_failed_mid_stream"

    async def test_the_lane_rules_read_the_last_messages_text_blocks(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """A task prompt given as text blocks, as Claude Code sends every message, is seen."""
        _, sim_url = await start_sim()
        gateway = await start_gateway(policy(sim_url, "lanes: {presets: [open-webui]}\n"))
        finished = Finished(gateway)
        blocks = [{"type": "text", "text": "### Task:"}, {"type": "text", "text": " a title"}]
        async with client(gateway) as sdk:
            await sdk.messages.create(
                model=MODEL, max_tokens=3, messages=[{"role": "user", "content": blocks}]
            )
        assert (await finished.first(("/v1/messages",))).lane == "background"

    async def test_the_estimate_counts_the_system_text_blocks_and_tool_results(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """System text, message text blocks and a tool result's content make the estimate."""
        _, sim_url = await start_sim()
        gateway = await start_gateway(policy(sim_url))
        finished = Finished(gateway)
        messages = [
            {"role": "user", "content": [{"type": "text", "text": "a" * 400}]},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "t1", "name": "read", "input": {}}],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "b" * 800}],
            },
        ]
        body = {"model": MODEL, "max_tokens": 3, "system": "s" * 200, "messages": messages}
        status, _ = await post(gateway, body, {"x-api-key": "alice-key"})
        assert status == 200
        record = await finished.first(("/v1/messages",))
        assert record.input_estimate == (200 + 400 + 800) // 4


async def served(
    start_sim: StartSim, start_gateway: StartGateway, messages: list[dict[str, object]]
) -> RequestRecord:
    """The gateway's record of alice's /v1/messages with these messages, served by fairsim."""
    _, sim_url = await start_sim()
    gateway = await start_gateway(policy(sim_url))
    finished = Finished(gateway)
    body = {"model": MODEL, "max_tokens": 3, "messages": messages}
    status, _ = await post(gateway, body, {"x-api-key": "alice-key"})
    assert status == 200
    return await finished.first(("/v1/messages",))


BIG = "x" * 8400  # 2,100 tokens at four characters a token: heavy (from 2,048)
WRITE = {"file_path": "a.py", "content": BIG}  # Claude Code's Write carries the whole file


class TestEstimateAsOllamaReads:
    @pytest.mark.parametrize(
        ("blocks", "characters"),
        [
            ([{"type": "text", "Text": BIG}], len(BIG)),
            ([{"Type": "text", "TEXT": BIG}], len(BIG)),
            (
                [{"type": "tool_use", "id": "t1", "name": "Write", "input": WRITE}],
                len(json.dumps(WRITE, separators=(",", ":"))),
            ),
            ([{"type": "tool_result", "tool_use_id": "t1", "Content": BIG}], len(BIG)),
            (
                [
                    {
                        "type": "tool_result",
                        "tool_use_id": "t1",
                        "content": [{"TYPE": "text", "Text": BIG}],
                    }
                ],
                len(BIG),
            ),
            ([{"type": "thinking", "thinking": BIG, "signature": ""}], len(BIG)),
        ],
        ids=[
            "Text",
            "TEXT-and-Type",
            "tool_use-input",
            "tool_result-Content",
            "tool_result-blocks",
            "thinking",
        ],
    )
    async def test_a_long_prompt_in_any_block_ollama_decodes_is_estimated_and_heavy(
        self,
        start_sim: StartSim,
        start_gateway: StartGateway,
        blocks: list[dict[str, object]],
        characters: int,
    ) -> None:
        """Each block as Go's decoder reads it (keys in any case) counts toward the class."""
        messages = [{"role": "user", "content": "go"}, {"role": "assistant", "content": blocks}]
        record = await served(start_sim, start_gateway, messages)
        assert record.input_estimate == (len("go") + characters) // 4
        assert record.request_class is RequestClass.HEAVY

    async def test_an_image_block_is_counted_whatever_the_case_of_its_keys(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """An image block with "Type", in a message or in a tool result, costs an image each."""
        image = {
            "Type": "image",
            "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"},
        }
        result = {"type": "tool_result", "tool_use_id": "t1", "content": [image]}
        messages = [{"role": "user", "content": [image, result]}]
        record = await served(start_sim, start_gateway, messages)
        assert record.input_estimate == 2 * 768


def test_the_error_body_is_anthropics_shape_for_each_status() -> None:
    """Every status the gateway answers has Anthropic's error type for it."""
    from gateway.core.errors import error_body
    from gateway.core.vocabulary import Api, Reason

    def kind(status: int) -> str:
        body = json.loads(error_body(Api.ANTHROPIC, status, Reason.BAD_REQUEST, "m"))
        assert body["type"] == "error" and body["error"]["message"] == "m"
        return str(body["error"]["type"])

    assert [kind(s) for s in (400, 401, 403, 404, 408, 413, 429, 502, 503, 504)] == [
        "invalid_request_error",
        "authentication_error",
        "permission_error",
        "not_found_error",
        "invalid_request_error",
        "request_too_large",
        "rate_limit_error",
        "api_error",
        "overloaded_error",
        "timeout_error",
    ]


class TestCountTokens:
    async def test_a_model_only_ollama_serves_has_its_count_refused_saying_why(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """Ollama has no count_tokens route: a 404 in Anthropic's shape that says so."""
        _, sim_url = await start_sim()
        gateway = await start_gateway(policy(sim_url))
        async with client(gateway) as sdk:
            with pytest.raises(anthropic.NotFoundError) as refused:
                await sdk.messages.count_tokens(model=MODEL, messages=HI)
            with pytest.raises(anthropic.PermissionDeniedError):
                async with client(gateway, "kids-key") as kids:
                    await kids.messages.count_tokens(model="qwen2.5:7b", messages=HI)
        error = refused.value.body
        assert isinstance(error, dict) and error["error"]["type"] == "not_found_error"
        assert "answered by llama.cpp servers only" in error["error"]["message"]


class TestLlamaCpp:
    async def test_a_backend_counts_one_prompt_at_a_time_and_each_users_one_at_a_time(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """Counts from alice and the kids at once, each taking the tokenizer a moment: the
        backend is asked one after the other (it tokenizes on the cores that decode); alice
        may have one counting and one waiting, and her third is a 429."""
        sims: list[Simulator] = []
        gateway = await llama_gateway(start_sim, start_gateway, sims)
        body = {"model": MODEL, "messages": HI, "sim_first_byte_delay": 0.2}
        async with aiohttp.ClientSession() as session:

            async def count(key: str) -> tuple[int, int]:
                url = gateway.url + "/v1/messages/count_tokens"
                headers = {"Authorization": f"Bearer {key}"}
                async with session.post(url, json=body, headers=headers) as reply:
                    counted = await reply.json()
                    return reply.status, int(counted.get("input_tokens", 0))

            alice = asyncio.create_task(count("alice-key"))
            await sims[0].wait_for(lambda stats: stats.counting == 1, timeout=5)
            # Her first is counting: of two more, one waits for it and one is refused.
            more = await asyncio.gather(count("alice-key"), count("alice-key"), count("kids-key"))
            assert sorted(more) == [(200, 1), (200, 1), (429, 0)]
            assert await alice == (200, 1)
        assert sims[0].stats.max_counting == 1

    async def test_a_long_stream_from_llama_server_keeps_the_prompt_count_of_its_start(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """llama-server's message_delta has the output's count only: the prompt's, from
        message_start, is counted though the stream left it far behind the tail."""
        gateway = await llama_gateway(start_sim, start_gateway)
        finished = Finished(gateway)
        async with client(gateway) as sdk:
            async with sdk.messages.stream(
                model=MODEL, max_tokens=400, messages=[{"role": "user", "content": "x" * 80}]
            ) as stream:
                final = await stream.get_final_message()
            counted = await sdk.messages.count_tokens(model=MODEL, messages=HI)
        record = await finished.first(("/v1/messages",))
        assert record.bytes_out > 16 * 1024  # message_start is out of the tail
        assert (record.prompt_tokens, record.completion_tokens) == (20, 400)
        assert final.usage.input_tokens == 20 and record.streamed_tokens == 400
        assert counted.input_tokens == 1
