"""A request's class, through the gateway: what Ollama puts into the prompt, and the context
it loads the model with, as Ollama reads them."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest

from gateway.core.vocabulary import RequestClass
from gateway.edge.record import RequestRecord
from gateway.intake.classify import output_limit
from tests.conftest import Finished, Gateway, StartGateway, StartSim, one_backend

MODEL = "llama3.2:3b"


async def classified(gateway: Gateway, body: str) -> RequestRecord:
    """The gateway's record of one /api/generate with this exact body text."""
    finished = Finished(gateway)
    headers = {"Content-Type": "application/json"}
    async with (
        aiohttp.ClientSession() as session,
        session.post(gateway.url + "/api/generate", data=body, headers=headers) as reply,
    ):
        await reply.read()
        assert reply.status == 200, await reply.text()
    return await finished.first(("/api/generate",))


def generate(**fields: object) -> str:
    return json.dumps({"model": MODEL, "prompt": "hi", "stream": False, **fields})


class TestNumCtx:
    @pytest.mark.parametrize(
        ("spelling", "request_class"),
        [
            ("16384", RequestClass.HEAVY),
            ("16384.0", RequestClass.HEAVY),
            ("16384.9", RequestClass.HEAVY),
            ("1.6384e4", RequestClass.HEAVY),
            ("16383.9", RequestClass.LIGHT),  # Ollama truncates: it loads 16383
        ],
    )
    async def test_num_ctx_is_read_as_the_integer_ollama_loads(
        self,
        start_sim: StartSim,
        start_gateway: StartGateway,
        spelling: str,
        request_class: RequestClass,
    ) -> None:
        """Ollama truncates a JSON number to its num_ctx, so 16384.9 asks for 16384: heavy."""
        _, url = await start_sim(models=[MODEL])
        policy = "classes: {heavy: {min_num_ctx: 16384}}\n" + one_backend(url, slots=2)
        gateway = await start_gateway(policy)
        body = generate(options="OPTIONS").replace('"OPTIONS"', f'{{"num_ctx": {spelling}}}')
        assert (await classified(gateway, body)).request_class is request_class


class TestPromptParts:
    async def test_generates_context_counts_a_token_for_each_id(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """3,000 token ids of an earlier exchange go before a two-letter prompt: heavy."""
        _, url = await start_sim(models=[MODEL])
        gateway = await start_gateway(one_backend(url, slots=2))
        record = await classified(gateway, generate(context=list(range(1, 3001))))
        assert record.request_class is RequestClass.HEAVY
        assert record.input_estimate == 3000

    async def test_a_template_counts_like_prompt_text(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """A 12,000-character template is rendered as the prompt: about 3,000 tokens, heavy."""
        _, url = await start_sim(models=[MODEL])
        gateway = await start_gateway(one_backend(url, slots=2))
        template = "{{ .Prompt }} " + "x" * (12_000 - 14)
        record = await classified(gateway, generate(template=template))
        assert record.request_class is RequestClass.HEAVY
        assert record.input_estimate == 3000


async def test_a_message_whose_keys_are_spelt_in_capitals_is_estimated_as_ollama_reads_it(
    start_sim: StartSim, start_gateway: StartGateway
) -> None:
    """Go's decoder reads "Content" (or "CONTENT") into a message's content: a chat spelt so
    counts its prompt as one spelt "content" does, and is heavy the same."""
    _, url = await start_sim(models=[MODEL])
    gateway = await start_gateway(one_backend(url, slots=2))
    records = []
    for key in ("content", "Content", "CONTENT"):
        finished = Finished(gateway)
        chat = {"model": MODEL, "stream": False, "messages": [{"role": "user", key: "x" * 12_000}]}
        async with (
            aiohttp.ClientSession() as session,
            session.post(gateway.url + "/api/chat", json=chat) as reply,
        ):
            assert reply.status == 200, await reply.text()
        records.append(await finished.first(("/api/chat",)))
    assert {(r.request_class, r.input_estimate) for r in records} == {(RequestClass.HEAVY, 3000)}


class TestWhatAnEstimateCouldNotSee:
    """Long prompts in fields the estimate once skipped (issue 41's reproductions): a
    tool's output, a tool call's arguments, a thought. Walking every string of a message
    counts them, and any field not listed yet."""

    LONG = "hello " * 1500  # 9,000 characters: about 2,250 tokens, heavy at 2,048

    @pytest.mark.parametrize(
        ("path", "body"),
        [
            (
                "/v1/responses",
                {"input": [
                    {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
                    {"type": "function_call_output", "call_id": "c1", "output": LONG},
                    {"role": "user", "content": "ok?"},
                ]},
            ),
            (
                "/v1/chat/completions",
                {"messages": [
                    {"role": "assistant", "content": None, "tool_calls": [{
                        "id": "c1", "type": "function",
                        "function": {"name": "f", "arguments": LONG},
                    }]},
                    {"role": "tool", "tool_call_id": "c1", "content": "done"},
                ]},
            ),
            (
                "/api/chat",
                {"stream": False, "messages": [
                    {"role": "assistant", "content": "", "thinking": LONG},
                    {"role": "user", "content": "and?"},
                ]},
            ),
            (
                "/api/chat",
                {"stream": False, "messages": [
                    {"role": "assistant", "tool_calls": [
                        {"function": {"name": "f", "arguments": {"text": LONG}}}
                    ]},
                    {"role": "user", "content": "and?"},
                ]},
            ),
            (
                "/v1/responses",
                {"input": [{"type": "reasoning", "encrypted_content": LONG, "summary": []},
                           {"role": "user", "content": "ok?"}]},
            ),
        ],
        ids=["responses-function_call_output", "chat-tool_call-arguments", "ollama-thinking",
             "ollama-tool_call-arguments", "responses-reasoning"],
    )  # fmt: skip
    async def test_a_long_prompt_in_it_is_heavy(
        self, start_sim: StartSim, start_gateway: StartGateway, path: str, body: dict[str, Any]
    ) -> None:
        _, url = await start_sim(models=[MODEL])
        gateway = await start_gateway(one_backend(url, slots=2))
        finished = Finished(gateway)
        async with (
            aiohttp.ClientSession() as session,
            session.post(gateway.url + path, json={"model": MODEL, **body}) as reply,
        ):
            await reply.read()
        record = await finished.first((path,))
        assert record.input_estimate is not None and record.input_estimate >= 2048
        assert record.request_class is RequestClass.HEAVY

    async def test_a_hang_up_after_the_first_bytes_is_charged_the_hidden_prompt(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """Issue 41: a hang-up after the first bytes of a reply to a prompt hidden in a
        tool's output charged 0 tokens. The reply's counts never come; the estimate, which
        sees the hidden prompt, is what the day's usage is charged."""
        _, url = await start_sim(models=[MODEL], decode_tokens_per_s=50.0)
        gateway = await start_gateway(one_backend(url, slots=2))
        finished = Finished(gateway)
        body = {
            "model": MODEL,
            "stream": True,
            "max_output_tokens": 500,
            "input": [
                {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": self.LONG},
                {"role": "user", "content": "ok?"},
            ],
        }
        async with (
            aiohttp.ClientSession() as session,
            session.post(gateway.url + "/v1/responses", json=body) as reply,
        ):
            assert await reply.content.readline()  # the first bytes, then gone
        record = await finished.first(("/v1/responses",))
        assert record.prompt_tokens is None  # the counts never came
        used = gateway.services.usage.used(record.user or "")
        assert used.prompt_tokens >= 2048


class TestOutputLimit:
    """The most a reply may generate, as the reservation against a tokens budget reads it:
    a client cannot make a request look cheaper with a field its backend ignores."""

    @pytest.mark.parametrize(
        ("body", "limit"),
        [
            ({"options": {"num_predict": 90}}, 90),  # Ollama's
            ({"max_tokens": 64}, 64),  # OpenAI's, Anthropic's
            ({"max_output_tokens": 64}, 64),  # the Responses API's
            ({}, None),
            ({"options": {"num_predict": -1}}, None),  # until the context is full
            # llama-server reads n_predict before max_tokens: -1 there is unbounded.
            ({"max_tokens": 1, "n_predict": -1}, None),
            # /api/chat reads options.num_predict, not a top-level max_tokens.
            ({"max_tokens": 1, "options": {"num_predict": 500}}, 500),
            ({"max_tokens": True}, None),  # not a number
        ],
    )
    def test_the_largest_any_field_says_and_none_when_one_is_unbounded(
        self, body: dict[str, Any], limit: int | None
    ) -> None:
        assert output_limit(body) == limit

    @pytest.mark.parametrize(
        ("body", "limit"),
        [
            ({"max_tokens": 1}, None),  # ignored by Ollama's own API: unbounded
            ({"max_tokens": 1, "options": {"num_predict": 500}}, 500),
            ({"max_tokens": 900, "options": {"num_predict": 50}}, 50),
        ],
    )
    def test_ollamas_own_api_is_bounded_by_num_predict_alone(
        self, body: dict[str, Any], limit: int | None
    ) -> None:
        """On /api/chat a top-level max_tokens bounds nothing: read as a bound it would
        reserve one token of a tokens budget for a reply as long as the context."""
        assert output_limit(body, native=True) == limit
