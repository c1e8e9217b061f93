"""OpenAI's Responses API (/v1/responses) through the gateway, spoken by the real ``openai``
package's ``client.responses``: admitted, counted and refused as the other routes are."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest

from tests.conftest import Finished, Gateway, StartGateway, StartSim
from tests.test_accounting import settled, stored
from tests.test_admission import MODEL
from tests.test_anthropic import llama_gateway

USERS = """\
defaults: {max_concurrent: 1, max_queued: 2}
users:
  alice: {keys: [alice-key]}
"""


def policy(sim_url: str, extra: str = "") -> str:
    backends = f"backends:\n  - {{name: sim, url: {sim_url}, kind: ollama, slots: 4}}\n"
    return USERS + extra + backends


def client(gateway: Gateway) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=gateway.url + "/v1", api_key="alice-key", max_retries=0)


class TestResponses:
    async def test_a_whole_and_a_streamed_response_arrive_and_their_usage_is_recorded(
        self, start_sim: StartSim, start_gateway: StartGateway, usage_db: Path
    ) -> None:
        """client.responses.create, whole and streamed: the store has the usage they say."""
        _, sim_url = await start_sim()
        gateway = await start_gateway(policy(sim_url))
        finished = Finished(gateway)
        async with client(gateway) as sdk:
            whole = await sdk.responses.create(
                model=MODEL, input="hello there", instructions="be brief", max_output_tokens=5
            )
            stream = await sdk.responses.create(
                model=MODEL,
                input=[{"role": "user", "content": [{"type": "input_text", "text": "a story"}]}],
                max_output_tokens=30,
                stream=True,
            )
            deltas, usage = 0, None
            async for event in stream:
                deltas += event.type == "response.output_text.delta"
                if event.type == "response.completed":
                    usage = event.response.usage
        assert whole.output_text and whole.usage is not None
        assert whole.usage.output_tokens == 5
        assert deltas == 30 and usage is not None and usage.output_tokens == 30
        records = await finished.at_least(2)
        assert records[-1].streamed_tokens == 30  # a token per output_text.delta
        await settled(gateway)
        alice = stored(usage_db, "alice")
        assert alice["requests"] == 2
        assert alice["prompt_tokens"] == whole.usage.input_tokens + usage.input_tokens
        assert alice["completion_tokens"] == 35

    async def test_the_web_search_tool_is_refused(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """Ollama would run the search and chats of its own past the gateway: a 400."""
        simulator, sim_url = await start_sim()
        gateway = await start_gateway(policy(sim_url))
        async with client(gateway) as sdk:
            with pytest.raises(openai.BadRequestError) as refused:
                await sdk.responses.create(
                    model=MODEL, input="news?", tools=[{"type": "web_search"}]
                )
        assert "'web_search' is run by the server itself" in str(refused.value)
        assert simulator.stats.prompts == []

    async def test_the_estimate_and_the_lanes_read_the_instructions_and_the_input(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """Instructions and input items make the estimate; a task's input is background."""
        _, sim_url = await start_sim()
        gateway = await start_gateway(policy(sim_url, "lanes: {presets: [open-webui]}\n"))
        finished = Finished(gateway)
        items = [{"role": "user", "content": [{"type": "input_text", "text": "### Task: x"}]}]
        async with client(gateway) as sdk:
            await sdk.responses.create(model=MODEL, input="q" * 400, instructions="i" * 400)
            await sdk.responses.create(model=MODEL, input=items)  # type: ignore[arg-type]
        first, second = await finished.at_least(2)
        assert first.input_estimate == 200 and first.lane == "interactive"
        assert second.lane == "background"

    async def test_a_backend_failing_mid_stream_ends_in_an_error_the_sdk_raises(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """Deltas, then the gateway's in-band error: the SDK raises it with its message."""
        _, sim_url = await start_sim()
        gateway = await start_gateway(policy(sim_url))
        deltas = 0
        async with client(gateway) as sdk:
            stream = await sdk.responses.create(
                model=MODEL, input="hi", stream=True, extra_body={"sim_die_after": 4}
            )
            with pytest.raises(openai.APIError) as failed:
                async for event in stream:
                    deltas += event.type == "response.output_text.delta"
        assert deltas == 4
        assert "the backend failed mid-stream" in failed.value.message

    async def test_llama_servers_responses_are_routed_there_and_counted(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """llama-server serves /v1/responses too: routed there, a token per delta counted."""
        gateway = await llama_gateway(start_sim, start_gateway)
        finished = Finished(gateway)
        async with client(gateway) as sdk:
            whole = await sdk.responses.create(model=MODEL, input="hi", max_output_tokens=4)
            stream = await sdk.responses.create(
                model=MODEL, input="x" * 40, max_output_tokens=20, stream=True
            )
            deltas = [e async for e in stream if e.type == "response.output_text.delta"]
        assert whole.output_text and whole.usage is not None and whole.usage.output_tokens == 4
        first, second = await finished.at_least(2)
        assert (first.prompt_tokens, first.completion_tokens) == (1, 4)
        assert (second.prompt_tokens, second.completion_tokens) == (10, 20)
        assert second.streamed_tokens == len(deltas) == 20
