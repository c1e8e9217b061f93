"""The gateway relays Ollama and OpenAI traffic faithfully, and fails clearly."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import ollama
import openai
import pytest
from aiohttp import web
from yarl import URL

from tests.conftest import Finished, StartGateway, StartSim, one_backend, post_gzipped

MODEL = "llama3.2:3b"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Why is the sky blue?"}]}


async def _post(url: str, body: object, **headers: str) -> tuple[int, dict[str, str], bytes]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(url, json=body, headers=headers) as response,
    ):
        return response.status, dict(response.headers), await response.read()


class TestRealClients:
    async def test_the_ollama_client_chats_streamed_and_whole(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """ollama.AsyncClient streams a chat through the gateway and gets the final counts."""
        _, sim_url = await start_sim()
        gateway = await start_gateway(one_backend(sim_url, slots=2))
        async with ollama.AsyncClient(host=gateway.url) as client:
            stream = await client.chat(model=MODEL, messages=CHAT["messages"], stream=True)
            chunks = [chunk async for chunk in stream]
            whole = await client.chat(model=MODEL, messages=CHAT["messages"])
        assert chunks[-1].done and chunks[-1].eval_count == len(chunks) - 1
        assert whole.done and whole.eval_count == chunks[-1].eval_count
        assert whole.message.content == "".join(chunk.message.content for chunk in chunks)

    async def test_the_ollama_client_generates_embeds_and_lists(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """generate, embed, list, ps and show all work through the gateway."""
        _, sim_url = await start_sim()
        gateway = await start_gateway(one_backend(sim_url, slots=2))
        async with ollama.AsyncClient(host=gateway.url) as client:
            stream = await client.generate(model=MODEL, prompt="Hi", stream=True)
            parts = [part async for part in stream]
            whole = await client.generate(model=MODEL, prompt="Hi")
            embedded = await client.embed(model=MODEL, input=["a", "b"])
            legacy = await client.embeddings(model=MODEL, prompt="a")
            listed = await client.list()
            running = await client.ps()
            shown = await client.show(MODEL)
        assert parts[-1].done and parts[-1].prompt_eval_count
        assert whole.response == "".join(part.response for part in parts)
        assert len(embedded.embeddings) == 2
        assert len(legacy.embedding) > 0
        assert MODEL in {model.model for model in listed.models}
        assert MODEL in {model.model for model in running.models}
        assert running.models[0].expires_at is not None
        assert shown.modelinfo and "general.architecture" in shown.modelinfo

    async def test_the_openai_client_chats_embeds_and_lists_models(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """openai.AsyncOpenAI streams and non-streams chat, embeds and lists models."""
        _, sim_url = await start_sim()
        gateway = await start_gateway(one_backend(sim_url, slots=2))
        client = openai.AsyncOpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0)
        stream = await client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
            stream_options={"include_usage": True},
        )
        events = [event async for event in stream]
        text = "".join(e.choices[0].delta.content or "" for e in events if e.choices)
        assert events[-1].usage is not None and events[-1].usage.completion_tokens > 0
        whole = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}]
        )
        assert whole.choices[0].message.content == text
        embedded = await client.embeddings.create(model=MODEL, input="hello")
        assert len(embedded.data[0].embedding) > 0
        assert MODEL in {model.id async for model in client.models.list()}
        completion = await client.completions.create(model=MODEL, prompt="Once", max_tokens=3)
        assert completion.choices[0].text
        await client.close()


class TestByteFaithfulRelay:
    @pytest.mark.parametrize(
        ("path", "body"),
        [
            ("/api/chat", CHAT),
            ("/api/generate", {"model": MODEL, "prompt": "Hi"}),
            ("/api/chat", {**CHAT, "stream": False}),
            ("/v1/chat/completions", {**CHAT, "stream": True}),
            ("/v1/chat/completions", {**CHAT, "stream": False}),
            ("/api/embed", {"model": MODEL, "input": "hello"}),
        ],
    )
    async def test_the_client_receives_exactly_the_bytes_the_backend_sent(
        self, start_sim: StartSim, start_gateway: StartGateway, path: str, body: object
    ) -> None:
        """NDJSON lines, SSE events and whole bodies arrive unchanged, with their type."""
        sim, sim_url = await start_sim(record_replies=True)
        gateway = await start_gateway(one_backend(sim_url))
        status, headers, received = await _post(gateway.url + path, body)
        assert status == 200
        assert received == sim.replies[-1]
        expected_type = sim.reply_types[-1]
        assert headers["Content-Type"] == expected_type

    async def test_the_client_credentials_never_reach_the_backend(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """Authorization and X-API-Key are stripped before the request goes upstream."""
        sim, sim_url = await start_sim(record_replies=True)
        gateway = await start_gateway(one_backend(sim_url))
        await _post(gateway.url + "/api/chat", CHAT, Authorization="Bearer s3cret", X_Trace="t")
        seen = {name.lower() for name in sim.request_headers[-1]}
        assert "authorization" not in seen and "x-api-key" not in seen
        assert "content-type" in seen

    @pytest.mark.parametrize("path", ["/api/chat", "/v1/chat/completions"])
    async def test_a_streams_head_is_the_one_aiohttp_writes(
        self, start_sim: StartSim, start_gateway: StartGateway, path: str
    ) -> None:
        """The head the relay writes for a kept-alive stream (relay/client_reply.py) has the
        lines, in the order, that aiohttp's prepare writes for one it closes after."""
        _, sim_url = await start_sim()
        gateway = await start_gateway(one_backend(sim_url))
        body = json.dumps({**CHAT, "stream": True}).encode()
        heads = []
        for connection in ("keep-alive", "close"):
            address = URL(gateway.url)
            reader, writer = await asyncio.open_connection(address.host, address.port)
            writer.write(
                f"POST {path} HTTP/1.1\r\nHost: localhost\r\nConnection: {connection}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
                + body
            )
            head = await reader.readuntil(b"\r\n\r\n")
            writer.close()
            # Each reply's own date and id: their names, in their places, are compared.
            lines = [
                line.partition(":")[0] if line.startswith(("Date:", "X-Request-Id:")) else line
                for line in head.decode().split("\r\n")
            ]
            heads.append(lines)
        kept, closed = heads
        assert kept[0] == "HTTP/1.1 200 OK" and "Transfer-Encoding: chunked" in kept
        assert [line for line in closed if line != "Connection: close"] == kept


class TestRefusals:
    @pytest.mark.parametrize(
        ("path", "shape"), [("/api/chat", "ollama"), ("/v1/chat/completions", "openai")]
    )
    async def test_malformed_json_gets_400_in_the_api_shape(
        self, start_sim: StartSim, start_gateway: StartGateway, path: str, shape: str
    ) -> None:
        """A body that is not JSON is refused before it reaches the backend."""
        sim, sim_url = await start_sim()
        gateway = await start_gateway(one_backend(sim_url))
        async with (
            aiohttp.ClientSession() as session,
            session.post(gateway.url + path, data=b"{not json") as response,
        ):
            assert response.status == 400
            error = (await response.json())["error"]
        message = error if shape == "ollama" else error["message"]
        assert "not valid JSON" in message
        assert sim.stats.prompts == []

    async def test_an_oversize_body_gets_413(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """Bodies over FAIRGATE_MAX_BODY_BYTES are refused with 413 in the API's shape."""
        _, sim_url = await start_sim()
        gateway = await start_gateway(one_backend(sim_url), max_body_bytes=1024)
        big = {"model": MODEL, "prompt": "x" * 4096}
        status, _, body = await _post(gateway.url + "/v1/completions", big)
        assert status == 413
        assert json.loads(body)["error"]["code"] == "body_too_large"

    async def test_a_compressed_body_that_inflates_past_the_limit_gets_413(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """A gzip body within the limit as sent but over it decoded is refused with 413."""
        sim, sim_url = await start_sim()
        gateway = await start_gateway(one_backend(sim_url), max_body_bytes=1024)
        big = json.dumps({"model": MODEL, "prompt": "x" * 4096}).encode()
        headers = {"Content-Type": "application/json"}
        status, text = await post_gzipped(gateway.url + "/api/generate", big, headers)
        assert status == 413 and json.loads(text)["error"]
        assert sim.stats.prompts == []

    async def test_a_request_without_a_model_gets_400(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """The model is required to route and to admit."""
        _, sim_url = await start_sim()
        gateway = await start_gateway(one_backend(sim_url))
        status, _, body = await _post(gateway.url + "/api/chat", {"messages": []})
        assert (status, json.loads(body)) == (400, {"error": "model is required"})

    async def test_model_management_is_refused(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """pull, delete and friends get 403 rather than changing the shared box."""
        _, sim_url = await start_sim()
        gateway = await start_gateway(one_backend(sim_url))
        status, _, body = await _post(gateway.url + "/api/pull", {"model": MODEL})
        assert status == 403 and "disabled" in json.loads(body)["error"]

    async def test_an_unknown_path_gets_a_json_404(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """Even aiohttp's own 404 comes in the API's error shape."""
        _, sim_url = await start_sim()
        gateway = await start_gateway(one_backend(sim_url))
        status, _, body = await _post(gateway.url + "/v1/nothing", {})
        assert status == 404 and json.loads(body)["error"]["code"] == "not_found"


class TestFailures:
    async def test_a_client_disconnect_frees_the_backend_slot_at_once(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """Closing the client connection mid-stream cancels the upstream request within 100 ms."""
        sim, sim_url = await start_sim(decode_tokens_per_s=50.0)
        gateway = await start_gateway(one_backend(sim_url))
        body = {**CHAT, "options": {"num_predict": 10_000}}
        async with aiohttp.ClientSession() as session:
            response = await session.post(gateway.url + "/api/chat", json=body)
            await response.content.readline()
            assert sim.stats.running == 1
            response.close()
        await sim.wait_for(lambda stats: stats.running == 0, timeout=0.1)
        assert sim.stats.disconnects == 1

    async def test_a_failure_of_the_gateways_own_is_recorded_as_the_500_it_answers(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """An exception that escapes a handler is the client's 500 and the record's too,
        not the 499 of a client that left."""

        async def broken(request: web.Request) -> web.StreamResponse:
            raise RuntimeError("a bug")

        _, sim_url = await start_sim()
        gateway = await start_gateway(
            one_backend(sim_url), routes=lambda app: app.router.add_get("/broken", broken)
        )
        finished = Finished(gateway)
        async with (
            aiohttp.ClientSession() as session,
            session.get(gateway.url + "/broken") as reply,
        ):
            assert reply.status == 500
        assert (await finished.first(("/broken",))).status == 500

    async def test_an_unreachable_backend_gets_502(
        self, start_gateway: StartGateway, unused_tcp_port: int
    ) -> None:
        """A backend that refuses connections is named as the problem, in the API's shape."""
        gateway = await start_gateway(one_backend(f"http://127.0.0.1:{unused_tcp_port}"))
        status, _, body = await _post(gateway.url + "/api/chat", CHAT)
        assert status == 502 and "cannot reach the backend" in json.loads(body)["error"]

    async def test_a_backend_silent_past_first_byte_timeout_gets_504(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """No first byte within timeouts.first_byte: 504 before anything was sent."""
        sim, sim_url = await start_sim()
        policy = one_backend(sim_url, extra="timeouts: {first_byte: 200ms}\n")
        gateway = await start_gateway(policy)
        body = {**CHAT, "sim_first_byte_delay": 30}
        status, _, reply = await _post(gateway.url + "/v1/chat/completions", body)
        assert status == 504
        assert json.loads(reply)["error"]["code"] == "backend_timeout"
        await sim.wait_for(lambda stats: stats.running == 0, timeout=1)

    async def test_a_stream_that_stalls_ends_with_an_inband_error(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """Silence over timeouts.idle after the first byte ends the stream with an error line."""
        sim, sim_url = await start_sim()
        gateway = await start_gateway(one_backend(sim_url, extra="timeouts: {idle: 200ms}\n"))
        body = {**CHAT, "options": {"sim_stall_after": 2}}
        status, _, reply = await _post(gateway.url + "/api/chat", body)
        lines = reply.splitlines()
        assert status == 200 and len(lines) == 3
        assert "sent nothing for 0.2s" in json.loads(lines[-1])["error"]
        await sim.wait_for(lambda stats: stats.running == 0, timeout=1)

    @pytest.mark.parametrize("path", ["/api/chat", "/v1/chat/completions"])
    async def test_a_backend_dying_mid_stream_gives_an_inband_error(
        self, start_sim: StartSim, start_gateway: StartGateway, path: str
    ) -> None:
        """A cut upstream stream ends with Ollama's error line, or an SSE error event."""
        _, sim_url = await start_sim()
        gateway = await start_gateway(one_backend(sim_url))
        body: dict[str, object] = {**CHAT, "stream": True}
        if path.startswith("/v1/"):
            body["sim_die_after"] = 2
        else:
            body["options"] = {"sim_die_after": 2}
        status, _, reply = await _post(gateway.url + path, body)
        assert status == 200
        last = reply.rstrip(b"\n").splitlines()[-1]
        if path.startswith("/v1/"):
            assert last.startswith(b"data: ") and b"mid-stream" in last
        else:
            assert "failed mid-stream" in json.loads(last)["error"]

    async def test_the_openai_client_sees_the_mid_stream_failure(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """The openai client raises on the SSE error event instead of ending quietly."""
        _, sim_url = await start_sim()
        gateway = await start_gateway(one_backend(sim_url))
        client = openai.AsyncOpenAI(base_url=gateway.url + "/v1", api_key="x", max_retries=0)
        stream = await client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
            extra_body={"sim_die_after": 2},
        )
        with pytest.raises(openai.APIError, match="mid-stream"):
            async for _ in stream:
                pass
        await client.close()
