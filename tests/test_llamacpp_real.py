"""A real llama.cpp llama-server (SmolLM2-135M on the CPU) behind the gateway.

``make test`` installs both (tests/llama_server.py starts the server). The test shows that
the gateway discovers the server's slots, relays its chat completions, and keeps the third
of three concurrent requests waiting in the gateway, not in llama.cpp's own unbounded
deferred queue.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import ollama
import openai
import structlog

from tests.conftest import StartGateway, StartSim
from tests.llama_server import MODEL_ALIAS
from tests.test_admission import until


async def test_a_real_llama_server_behind_the_gateway(
    llama_server: str, start_gateway: StartGateway, start_sim: StartSim
) -> None:
    """Slots discovered, chat relayed both ways, the third request waits in the gateway;
    beside it, a simulated Ollama gets the native requests."""
    ollama_sim, ollama_url = await start_sim(models=["llama3.2:3b"])
    gateway = await start_gateway(
        f"backends:\n  - {{name: cpp, url: {llama_server}, kind: llamacpp}}\n"
        f"  - {{name: gpu, url: {ollama_url}, kind: ollama, slots: 1}}\n"
        "defaults: {max_concurrent: 3, max_queued: 3}\n"  # one user sends all three
        "timeouts: {first_byte: 300s}\n"
        # The third waits for one of two 96-token stories: on a busy 2-core machine that
        # takes longer than the default 30 s, and this test is about order, not speed.
        "queue: {max_wait: 180s}\n"
    )
    cpp = gateway.services.policy.current.pool.backends[0]
    admission = gateway.services.admission
    # Read from GET /props total_slots: at start, or at a later probe if a busy machine made
    # the first one time out (the monitor wakes admission when the slots become known).
    await until(admission, lambda _: cpp.slots == 2, within=30)
    async with ollama.AsyncClient(host=gateway.url) as native:
        reply = await native.chat(
            model="llama3.2:3b", messages=[{"role": "user", "content": "to the simulator"}]
        )
    assert reply.done and ollama_sim.stats.prompts == ["to the simulator"]

    async with openai.AsyncOpenAI(
        base_url=gateway.url + "/v1", api_key="x", max_retries=0
    ) as client:
        whole = await client.chat.completions.create(
            model=MODEL_ALIAS,
            messages=[{"role": "user", "content": "Say hello."}],
            max_tokens=8,
        )
        assert whole.choices[0].message.content
        stream = await client.chat.completions.create(
            model=MODEL_ALIAS,
            messages=[{"role": "user", "content": "Count to five."}],
            max_tokens=8,
            stream=True,
        )
        pieces = [event async for event in stream]
        assert any(e.choices and e.choices[0].delta.content for e in pieces)

        async def long_chat(n: int) -> str | None:
            reply = await client.chat.completions.create(
                model=MODEL_ALIAS,
                messages=[{"role": "user", "content": f"Tell story number {n} about a fox."}],
                max_tokens=96,
                extra_body={"ignore_eos": True},
            )
            return reply.choices[0].message.content

        running = [asyncio.create_task(long_chat(n)) for n in range(3)]
        await until(
            admission,
            lambda snap: snap.backends["cpp"] == (2, 2) and snap.queue_depth == 1,
            within=60,
        )
        async with aiohttp.ClientSession() as session:
            async with session.get(llama_server + "/slots") as reply:
                slots = await reply.json()
            async with session.get(llama_server + "/metrics") as reply:
                metrics = await reply.text()
        assert sum(slot["is_processing"] for slot in slots) <= 2
        deferred = [
            line for line in metrics.splitlines() if line.startswith("llamacpp:requests_deferred")
        ]
        assert deferred and float(deferred[0].split()[-1]) == 0
        assert all(await asyncio.gather(*running))
    await until(admission, lambda snap: snap.queue_depth == 0 and snap.backends["cpp"][0] == 0)


def open_webui_tools(count: int = 36) -> list[dict[str, Any]]:
    """Tool schemas shaped as Open WebUI sends them with every chat (name, description,
    parameters), about 25 KB for its 36 built-in tools."""
    return [
        {
            "type": "function",
            "function": {
                "name": f"builtin_tool_{n}",
                "description": "Search the knowledge base and the web for the query and return "
                "the most relevant passages, each with its title, source and a short snippet.",
                "parameters": {
                    "type": "object",
                    "properties": {
                        "query": {"type": "string", "description": "what to look for"},
                        "count": {"type": "integer", "description": "how many passages"},
                        "source": {"type": "string", "enum": ["web", "notes", "files"]},
                    },
                    "required": ["query"],
                },
            },
        }
        for n in range(count)
    ]


async def test_a_tools_laden_chat_is_estimated_near_its_rendered_size(
    llama_server: str, start_gateway: StartGateway
) -> None:
    """A one-line question with 36 tool schemas: the gateway's estimate is within 25% of
    what a real tokenizer makes of the question and the schemas a template renders."""
    tools = open_webui_tools()
    question = "What is the weather in Lisbon tomorrow?"
    rendered = question + json.dumps(tools, separators=(",", ":"))
    async with (
        aiohttp.ClientSession() as session,
        session.post(llama_server + "/tokenize", json={"content": rendered}) as reply,
    ):
        real = len((await reply.json())["tokens"])
    gateway = await start_gateway(
        f"backends:\n  - {{name: cpp, url: {llama_server}, kind: llamacpp}}\n"
    )
    body = {
        "model": MODEL_ALIAS,
        "messages": [{"role": "user", "content": question}],
        "tools": tools,
        "max_tokens": 1,
    }
    with structlog.testing.capture_logs() as logs:
        async with (
            aiohttp.ClientSession() as session,
            session.post(gateway.url + "/v1/chat/completions", json=body) as reply,
        ):
            assert reply.status == 200
    estimate = next(entry for entry in logs if entry["event"] == "request")["input_estimate"]
    assert abs(estimate - real) <= 0.25 * real, (estimate, real)
    assert real > 2048  # heavy by default: before, the estimate said ten tokens, light


async def test_a_real_llama_servers_messages_stream_is_counted_through_the_gateway(
    llama_server: str, start_gateway: StartGateway
) -> None:
    """llama-server's /v1/messages streams through to the anthropic SDK; each reply's
    tokens are counted, the prompt's from its message_start even when a long stream has
    left it far behind the tail (llama-server's message_delta says only the output's)."""
    import anthropic  # the SDK, as a Claude Code user's tools speak it

    from tests.conftest import Finished

    gateway = await start_gateway(
        f"backends:\n  - {{name: cpp, url: {llama_server}, kind: llamacpp}}\n"
        "timeouts: {first_byte: 300s}\nqueue: {max_wait: 180s}\n"
    )
    finished = Finished(gateway)
    async with anthropic.AsyncAnthropic(base_url=gateway.url, api_key="x", max_retries=0) as client:
        for count, max_tokens in enumerate((8, 200), start=1):
            deltas = 0
            async with client.messages.stream(
                model=MODEL_ALIAS,
                max_tokens=max_tokens,
                messages=[{"role": "user", "content": "Tell a story about a fox."}],
                extra_body={"ignore_eos": True},
            ) as stream:
                async for event in stream:
                    deltas += event.type == "content_block_delta"
                final = await stream.get_final_message()
            record = (await finished.at_least(count))[-1]
            assert record.path == "/v1/messages" and record.status == 200
            assert record.completion_tokens == final.usage.output_tokens == max_tokens
            # llama-server leaves what its cache read out of input_tokens: the prompt is both.
            read = final.usage.cache_read_input_tokens or 0
            assert record.prompt_tokens == final.usage.input_tokens + read > 0
            assert record.streamed_tokens == deltas
    assert record.bytes_out > 16 * 1024  # the long one: its start is out of the tail


async def test_a_real_llama_servers_responses_stream_is_counted_through_the_gateway(
    llama_server: str, start_gateway: StartGateway
) -> None:
    """llama-server serves the Responses API too: the gateway routes /v1/responses there,
    and counts a token per output_text.delta and the usage of response.completed."""
    from tests.conftest import Finished

    gateway = await start_gateway(
        f"backends:\n  - {{name: cpp, url: {llama_server}, kind: llamacpp}}\n"
        "timeouts: {first_byte: 300s}\nqueue: {max_wait: 180s}\n"
    )
    finished = Finished(gateway)
    async with openai.AsyncOpenAI(
        base_url=gateway.url + "/v1", api_key="x", max_retries=0
    ) as client:
        stream = await client.responses.create(
            model=MODEL_ALIAS, input="Tell a story about a fox.", max_output_tokens=12, stream=True
        )
        deltas, usage = 0, None
        async for event in stream:
            deltas += event.type == "response.output_text.delta"
            if event.type == "response.completed":
                usage = event.response.usage
    record = await finished.first(("/v1/responses",))
    assert usage is not None and record.status == 200
    assert (record.prompt_tokens, record.completion_tokens) == (
        usage.input_tokens,
        usage.output_tokens,
    )
    assert record.streamed_tokens == deltas > 0


async def test_a_real_llama_server_counts_a_messages_prompt_through_the_gateway(
    llama_server: str, start_gateway: StartGateway
) -> None:
    """/v1/messages/count_tokens goes, as a read, to llama-server: the SDK gets its count."""
    import anthropic

    gateway = await start_gateway(
        f"backends:\n  - {{name: cpp, url: {llama_server}, kind: llamacpp}}\n"
    )
    messages: list[Any] = [{"role": "user", "content": "Count the tokens of this."}]
    async with anthropic.AsyncAnthropic(base_url=gateway.url, api_key="x", max_retries=0) as client:
        counted = await client.messages.count_tokens(model=MODEL_ALIAS, messages=messages)
    body = {"model": MODEL_ALIAS, "messages": messages}
    async with (
        aiohttp.ClientSession() as session,
        session.post(llama_server + "/v1/messages/count_tokens", json=body) as reply,
    ):
        direct = await reply.json()
    assert counted.input_tokens == direct["input_tokens"] > 0
