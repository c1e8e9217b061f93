"""The simulated Ollama / llama-server, driven over loopback by the real clients."""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import time
from typing import Any

import aiohttp
import ollama
import openai
import pytest

from fairsim import SimConfig, add_sim_arguments, sim_config_from_args
from tests.conftest import Start

CHAT_TEXT = "Hello there, sim!"
CHAT = {"model": "llama3.2:3b", "messages": [{"role": "user", "content": CHAT_TEXT}]}


def with_options(body: dict[str, Any], **options: Any) -> dict[str, Any]:
    return dict(body, options=options)


async def lines_of(response: aiohttp.ClientResponse) -> list[dict[str, Any]]:
    return [json.loads(line) async for line in response.content]


# -- Ollama native API through the real ollama client --------------------------------------


async def test_ollama_client_streams_a_chat_reply_one_token_per_chunk(simulated: Start) -> None:
    """A streamed /api/chat yields one chunk per token, then a final chunk with the metrics."""
    sim, url = await simulated(default_output_tokens=5)
    async with ollama.AsyncClient(host=url) as client:
        chunks = [chunk async for chunk in await client.chat(**CHAT, stream=True)]
    assert [c.done for c in chunks] == [False] * 5 + [True]
    assert "".join(c.message.content or "" for c in chunks) == " The quick brown fox jumps"
    final = chunks[-1]
    assert final.done_reason == "stop"
    assert final.eval_count == 5
    assert final.prompt_eval_count == 5  # 17 characters, about four to a token
    assert final.total_duration and final.load_duration and final.eval_duration
    assert sim.stats.completed == 1


async def test_ollama_client_gets_whole_chat_and_generate_replies_without_streaming(
    simulated: Start,
) -> None:
    """stream=false answers a single object holding the whole reply."""
    _, url = await simulated(default_output_tokens=3)
    async with ollama.AsyncClient(host=url) as client:
        chat = await client.chat(**CHAT, stream=False)
        generated = await client.generate("llama3.2:3b", "Why?", options={"num_predict": 4})
    assert chat.message.content == " The quick brown"
    assert chat.done and chat.done_reason == "stop" and chat.eval_count == 3
    assert generated.response == " The quick brown fox"
    assert generated.done_reason == "length"
    assert generated.context is not None and len(generated.context) == 1 + 4


async def test_ollama_client_streams_generate_chunks(simulated: Start) -> None:
    """A streamed /api/generate puts each token in ``response`` and ends with done=true."""
    _, url = await simulated(default_output_tokens=2)
    async with ollama.AsyncClient(host=url) as client:
        chunks = [c async for c in await client.generate("qwen2.5:7b", "Hi", stream=True)]
    assert [c.response for c in chunks] == [" The", " quick", ""]
    assert chunks[-1].done and chunks[-1].done_reason == "stop"


async def test_final_chunk_has_ollamas_bytes_fields_and_content_type(
    simulated: Start, http: aiohttp.ClientSession
) -> None:
    """NDJSON lines are compact Go-style JSON, and the final one lists Ollama's fields in order."""
    _, url = await simulated(default_output_tokens=2)
    async with http.post(f"{url}/api/chat", json=CHAT) as response:
        assert response.headers["Content-Type"] == "application/x-ndjson"
        raw = [line async for line in response.content]
    assert all(line.endswith(b"\n") and b'": ' not in line for line in raw)
    assert re.fullmatch(
        rb'\{"model":"llama3\.2:3b","created_at":"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z",'
        rb'"message":\{"role":"assistant","content":" The"\},"done":false\}\n',
        raw[0],
    )
    final = json.loads(raw[-1])
    assert list(final) == [
        "model",
        "created_at",
        "message",
        "done",
        "done_reason",
        "total_duration",
        "load_duration",
        "prompt_eval_count",
        "prompt_eval_duration",
        "eval_count",
        "eval_duration",
    ]
    assert all(isinstance(final[k], int) for k in list(final)[5:])
    async with http.post(f"{url}/api/generate", json={**CHAT, "prompt": "x"}) as response:
        generate_final = (await lines_of(response))[-1]
    assert list(generate_final)[3:6] == ["done", "done_reason", "context"]
    async with http.post(f"{url}/api/chat", json={**CHAT, "stream": False}) as response:
        assert response.headers["Content-Type"] == "application/json; charset=utf-8"
        body = await response.read()
    assert not body.endswith(b"\n") and json.loads(body)["message"]["content"] == " The quick"


async def test_ollama_client_embeds_lists_shows_and_lists_running_models(
    simulated: Start,
) -> None:
    """embed, embeddings, list, ps and show answer in the shapes the ollama client parses."""
    _, url = await simulated(embedding_dims=6)
    async with ollama.AsyncClient(host=url) as client:
        embedded = await client.embed("llama3.2:3b", ["one", "two"])
        legacy = await client.embeddings("llama3.2:3b", "one")
        listed = await client.list()
        running = await client.ps()
        shown = await client.show("llama3.2:3b")
    assert len(embedded.embeddings) == 2 and all(len(v) == 6 for v in embedded.embeddings)
    assert legacy.embedding == pytest.approx(embedded.embeddings[0], abs=1e-6)
    assert [m.model for m in listed.models] == ["llama3.2:3b", "qwen2.5:7b"]
    assert [m.model for m in running.models] == ["llama3.2:3b"]
    assert running.models[0].expires_at is not None
    assert shown.details is not None and shown.details.family == "llama"
    assert shown.modelinfo is not None
    assert shown.modelinfo["general.architecture"] == "llama"
    assert shown.modelinfo["llama.block_count"] == 28
    assert shown.modelinfo["llama.attention.head_count_kv"] == 8
    assert shown.modelinfo["llama.attention.head_count"] == 24
    assert shown.modelinfo["llama.embedding_length"] == 3072
    assert shown.modelinfo["llama.attention.key_length"] == 128
    assert shown.modelinfo["llama.context_length"] == 131072


async def test_ps_reports_expires_at_as_rfc3339_with_a_timezone(
    simulated: Start, http: aiohttp.ClientSession
) -> None:
    """/api/ps writes expires_at like Go's time.Time, with nanoseconds and a zone."""
    _, url = await simulated()
    async with http.post(f"{url}/api/chat", json={**CHAT, "stream": False}):
        pass
    async with http.get(f"{url}/api/ps") as response:
        model = (await response.json())["models"][0]
    assert re.fullmatch(
        r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,9})?(Z|[+-]\d\d:\d\d)", model["expires_at"]
    )
    assert list(model) == [
        "name",
        "model",
        "size",
        "digest",
        "details",
        "expires_at",
        "size_vram",
        "context_length",
    ]


async def test_unknown_models_get_ollamas_404_wording(
    simulated: Start, http: aiohttp.ClientSession
) -> None:
    """Each endpoint names a missing model the way that Ollama handler does."""
    _, url = await simulated()
    expected = {
        "/api/chat": "model 'nope' not found",
        "/api/generate": "model 'nope' not found",
        "/api/show": "model 'nope' not found",
        "/api/embed": 'model "nope" not found, try pulling it first',
    }
    body = {"model": "nope", "prompt": "x", "input": "x", "messages": CHAT["messages"]}
    for path, message in expected.items():
        async with http.post(url + path, json=body) as response:
            assert response.status == 404
            assert await response.read() == json.dumps({"error": message}).encode().replace(
                b'": "', b'":"'
            )
    async with ollama.AsyncClient(host=url) as client:
        with pytest.raises(ollama.ResponseError) as raised:
            await client.chat(model="nope", messages=CHAT["messages"])
    assert raised.value.status_code == 404


async def test_a_model_is_found_by_any_spelling_ollama_finds_it_by(
    simulated: Start, http: aiohttp.ClientSession
) -> None:
    """As Ollama (getExistingName): the default host and namespace filled in and any case
    on chat and /api/embed; the legacy /api/embeddings reads the name as written."""
    _, url = await simulated()
    spelling = "Registry.Ollama.AI/Library/LLAMA3.2:3B"
    for path, status in (("/api/chat", 200), ("/api/embed", 200), ("/api/embeddings", 404)):
        body = {**CHAT, "model": spelling, "stream": False, "input": "x", "prompt": "x"}
        async with http.post(url + path, json=body) as response:
            assert response.status == status, (path, await response.text())
    body = {"model": "registry.ollama.ai/library/llama3.2:3b", "prompt": "x"}
    async with http.post(url + "/api/embeddings", json=body) as response:
        assert response.status == 200


async def test_malformed_json_gets_a_400_with_gos_decoder_message(
    simulated: Start, http: aiohttp.ClientSession
) -> None:
    """Bad bodies get 400 and the error text Go's JSON decoder would give."""
    _, url = await simulated()
    cases = {
        b"{bad": "invalid character 'b' looking for beginning of object key string",
        b"": "missing request body",
        b"[1]": "json: cannot unmarshal array into Go value of type api.ChatRequest",
        b'{"model": 3}': "json: cannot unmarshal number into Go struct field "
        "ChatRequest.model of type string",
    }
    for raw, message in cases.items():
        async with http.post(f"{url}/api/chat", data=raw) as response:
            assert (response.status, await response.json()) == (400, {"error": message})
    async with http.post(f"{url}/v1/chat/completions", data=b"{bad") as response:
        error = (await response.json())["error"]
    assert response.status == 400 and error["type"] == "invalid_request_error"


# -- Ollama's OpenAI-compatible API through the real openai client ------------------------


async def test_openai_client_streams_a_chat_completion_with_usage(simulated: Start) -> None:
    """Chunks carry the role first, then content, a finish chunk, and usage when asked."""
    _, url = await simulated(default_output_tokens=3)
    async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x") as client:
        stream = await client.chat.completions.create(
            model="llama3.2:3b",
            messages=[{"role": "user", "content": "Hello there, sim!"}],
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [chunk async for chunk in stream]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == (
        " The quick brown"
    )
    assert chunks[-2].choices[0].finish_reason == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (5, 3)
    assert all(c.system_fingerprint == "fp_ollama" and c.id.startswith("chatcmpl-") for c in chunks)


async def test_openai_client_gets_a_whole_completion_and_the_model_list(
    simulated: Start,
) -> None:
    """Non-streamed chat completions carry usage; /v1/models lists the configured models."""
    _, url = await simulated(default_output_tokens=3)
    async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x") as client:
        completion = await client.chat.completions.create(
            model="llama3.2:3b", messages=[{"role": "user", "content": "Hi"}], max_tokens=2
        )
        models = [model.id async for model in client.models.list()]
        with pytest.raises(openai.NotFoundError):
            await client.chat.completions.create(
                model="nope", messages=[{"role": "user", "content": "Hi"}]
            )
    assert completion.object == "chat.completion"
    assert completion.choices[0].message.content == " The quick"
    assert completion.choices[0].finish_reason == "length"
    assert completion.usage is not None and completion.usage.completion_tokens == 2
    assert models == ["llama3.2:3b", "qwen2.5:7b"]


async def test_openai_sse_stream_uses_ollamas_bytes(
    simulated: Start, http: aiohttp.ClientSession
) -> None:
    """The SSE stream is text/event-stream, ``data: {...}`` blocks, ending with [DONE]."""
    _, url = await simulated(default_output_tokens=1)
    async with http.post(f"{url}/v1/chat/completions", json={**CHAT, "stream": True}) as response:
        assert response.headers["Content-Type"] == "text/event-stream"
        raw = await response.read()
    blocks = raw.split(b"\n\n")
    assert blocks[-2:] == [b"data: [DONE]", b""]
    first, finish = (json.loads(block.removeprefix(b"data: ")) for block in blocks[:2])
    assert list(first) == [
        "id",
        "object",
        "created",
        "model",
        "system_fingerprint",
        "choices",
    ]
    assert re.fullmatch(r"chatcmpl-\d+", first["id"])
    assert first["choices"] == [
        {"index": 0, "delta": {"role": "assistant", "content": " The"}, "finish_reason": None}
    ]
    assert finish["choices"] == [{"index": 0, "delta": {}, "finish_reason": "stop"}]


async def test_openai_completions_stream_carries_ollamas_zero_usage_on_every_chunk(
    simulated: Start, http: aiohttp.ClientSession
) -> None:
    """/v1/completions streams text_completion chunks, then a usage chunk and [DONE]."""
    _, url = await simulated(default_output_tokens=1)
    body = {"model": "llama3.2:3b", "prompt": "Hi", "stream": True}
    body["stream_options"] = {"include_usage": True}
    async with http.post(f"{url}/v1/completions", json=body) as response:
        blocks = (await response.read()).split(b"\n\n")
    assert blocks[-2:] == [b"data: [DONE]", b""]
    token, finish, usage = (json.loads(b.removeprefix(b"data: ")) for b in blocks[:3])
    assert list(token) == [
        "id",
        "object",
        "created",
        "choices",
        "model",
        "system_fingerprint",
        "usage",
    ]
    assert token["choices"] == [{"text": " The", "index": 0, "finish_reason": None}]
    assert token["usage"] == {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
    assert finish["choices"][0]["finish_reason"] == "stop"
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 1


# -- slots, queueing, disconnects ----------------------------------------------------------


async def test_one_slot_runs_three_concurrent_requests_one_at_a_time(
    simulated: Start, http: aiohttp.ClientSession
) -> None:
    """With parallel=1 the other requests wait in the FIFO and max_running stays 1."""
    sim, url = await simulated(parallel=1, decode_tokens_per_s=400.0, default_output_tokens=40)

    async def ask(n: int) -> str:
        body = {**CHAT, "stream": False, "messages": [{"role": "user", "content": f"q{n}"}]}
        async with http.post(f"{url}/api/chat", json=body) as response:
            return str((await response.json())["message"]["content"])

    first = asyncio.create_task(ask(0))
    await sim.wait_for(lambda s: s.running == 1, timeout=1)
    rest = [asyncio.create_task(ask(n)) for n in (1, 2)]
    await sim.wait_for(lambda s: s.queued == 2, timeout=1)
    replies = await asyncio.gather(first, *rest)
    assert len(set(replies)) == 1
    assert (sim.stats.max_running, sim.stats.completed, sim.stats.queued) == (1, 3, 0)
    assert sim.stats.prompts == ["q0", "q1", "q2"]


async def test_client_disconnect_mid_stream_frees_the_slot(
    simulated: Start, http: aiohttp.ClientSession
) -> None:
    """Closing the connection during a stream ends the request and frees its slot at once."""
    sim, url = await simulated(decode_tokens_per_s=50.0, default_output_tokens=1000)
    response = await http.post(f"{url}/api/chat", json=CHAT)
    await response.content.readline()
    assert sim.stats.running == 1
    response.close()
    await sim.wait_for(lambda s: s.running == 0, timeout=1)
    assert (sim.stats.disconnects, sim.stats.completed) == (1, 0)


async def test_client_disconnect_while_queued_leaves_the_queue(
    simulated: Start, http: aiohttp.ClientSession
) -> None:
    """A request that gives up while waiting for a slot leaves the FIFO without running."""
    sim, url = await simulated(parallel=1)
    holder = await http.post(f"{url}/api/chat", json=with_options(CHAT, sim_stall_after=1))
    await holder.content.readline()
    waiting = asyncio.create_task(http.post(f"{url}/api/chat", json=CHAT))
    await sim.wait_for(lambda s: s.queued == 1, timeout=1)
    waiting.cancel()
    await sim.wait_for(lambda s: s.queued == 0 and s.disconnects == 1, timeout=1)
    assert sim.stats.running == 1
    holder.close()
    await sim.wait_for(lambda s: s.running == 0, timeout=1)
    assert (sim.stats.max_running, sim.stats.disconnects) == (1, 2)


async def test_requests_for_a_loaded_model_beyond_its_slots_wait_without_a_bound(
    simulated: Start, http: aiohttp.ClientSession
) -> None:
    """max_queue bounds only the scheduler's queue: behind a loaded model's busy slots, any
    number wait (ollama/ollama#7758), as with Ollama's semaphore."""
    sim, url = await simulated(parallel=1, max_queue=1)
    # Stalled before its first chunk: the client is still waiting for the headers.
    holder = asyncio.create_task(
        http.post(f"{url}/api/chat", json=with_options(CHAT, sim_stall_after=0))
    )
    await sim.wait_for(lambda s: s.running == 1, timeout=1)
    waiting = [asyncio.create_task(http.post(f"{url}/api/chat", json=CHAT)) for _ in range(3)]
    await sim.wait_for(lambda s: s.queued == 3, timeout=1)
    assert (sim.stats.pending, sim.stats.max_running) == (0, 1)
    for task in (*waiting, holder):
        task.cancel()
    await sim.wait_for(lambda s: s.running == 0 and s.queued == 0, timeout=1)


async def test_requests_waiting_for_a_load_beyond_max_queue_get_ollamas_503(
    simulated: Start, http: aiohttp.ClientSession
) -> None:
    """Past max_queue requests waiting for the scheduler (here: behind a load), Ollama's
    "server busy" 503 comes back at once."""
    sim, url = await simulated(max_queue=1, load_seconds=30)
    loading = asyncio.create_task(http.post(f"{url}/api/chat", json=CHAT))
    await sim.wait_for(lambda s: s.loads == 1, timeout=1)  # taken off the queue, loading
    waiting = asyncio.create_task(http.post(f"{url}/api/chat", json=CHAT))
    await sim.wait_for(lambda s: s.pending == 2, timeout=1)
    async with http.post(f"{url}/api/chat", json=CHAT) as response:
        assert response.status == 503
        assert await response.json() == {
            "error": "server busy, please try again.  maximum pending requests exceeded"
        }
    waiting.cancel()
    loading.cancel()
    await sim.wait_for(lambda s: s.pending == 0, timeout=1)


async def test_prefill_pauses_other_streams_when_prefill_blocks_decode(
    simulated: Start, http: aiohttp.ClientSession
) -> None:
    """A long prompt's prefill stalls a running stream for about the prefill time."""
    sim, url = await simulated(parallel=2, prefill_tokens_per_s=1000.0, decode_tokens_per_s=200.0)
    body = with_options(CHAT, num_predict=60)
    gaps: list[float] = []
    async with http.post(f"{url}/api/chat", json=body) as response:
        last = time.monotonic()
        long_prompt = {
            **CHAT,
            "stream": False,
            "messages": [{"role": "user", "content": "x" * 800}],
        }
        other: asyncio.Task[Any] | None = None
        async for _ in response.content:
            now = time.monotonic()
            gaps.append(now - last)
            last = now
            if len(gaps) == 5:
                other = asyncio.create_task(http.post(f"{url}/api/chat", json=long_prompt))
    assert other is not None
    (await other).close()
    assert max(gaps[5:]) >= 0.15  # 200 prompt tokens at 1000/s
    assert sim.stats.max_running == 2


# -- models: load, keep_alive, empty requests ----------------------------------------------


async def test_keep_alive_expiry_makes_the_next_request_load_the_model(
    simulated: Start, http: aiohttp.ClientSession
) -> None:
    """A model unloads keep_alive after its last request; the next request loads it again."""
    now = [1000.0]
    sim, url = await simulated(clock=lambda: now[0])
    await (await http.post(f"{url}/api/chat", json={**CHAT, "keep_alive": "30s"})).read()
    assert sim.stats.loads == 1
    assert sim.loaded_models() == {"llama3.2:3b": 1030.0}
    now[0] += 29
    await (await http.post(f"{url}/api/chat", json=CHAT)).read()
    # Still loaded; a request without keep_alive leaves the runner's own (useLoadedRunner).
    assert sim.stats.loads == 1 and sim.loaded_models() == {"llama3.2:3b": 1059.0}
    sim.expire_all()
    await (await http.post(f"{url}/api/chat", json={**CHAT, "keep_alive": 0})).read()
    assert sim.stats.loads == 2 and sim.loaded_models() == {}
    await (await http.post(f"{url}/api/chat", json={**CHAT, "keep_alive": "1m"})).read()
    now[0] += 61
    assert sim.loaded_models() == {} and sim.stats.loads == 3


async def test_a_keep_alive_too_long_for_go_unloads_when_idle_or_is_refused(
    simulated: Start, http: aiohttp.ClientSession
) -> None:
    """As Ollama on amd64: the number 1e10 overflows time.Duration to a negative one (unload
    when idle); the string 300000000h is refused by time.ParseDuration."""
    sim, url = await simulated()
    await (await http.post(f"{url}/api/chat", json={**CHAT, "keep_alive": 1e10})).read()
    assert sim.stats.loads == 1 and sim.loaded_models() == {}
    async with http.post(f"{url}/api/chat", json={**CHAT, "keep_alive": "300000000h"}) as reply:
        assert reply.status == 400
        assert (await reply.json())["error"] == 'time: invalid duration "300000000h"'


async def test_empty_request_loads_the_model_without_taking_a_slot(
    simulated: Start, http: aiohttp.ClientSession
) -> None:
    """No prompt / no messages only loads (or with keep_alive 0 unloads) the model."""
    sim, url = await simulated(parallel=1, load_seconds=0.05)
    # Stalled before its first chunk: the client is still waiting for the headers.
    holder = asyncio.create_task(
        http.post(f"{url}/api/chat", json=with_options(CHAT, sim_stall_after=0))
    )
    await sim.wait_for(lambda s: s.running == 1, timeout=1)
    async with http.post(f"{url}/api/generate", json={"model": "qwen2.5:7b"}) as response:
        loaded = await response.json()
    assert response.headers["Content-Type"] == "application/json; charset=utf-8"
    assert list(loaded) == ["model", "created_at", "response", "done", "done_reason"]
    assert (loaded["response"], loaded["done"], loaded["done_reason"]) == ("", True, "load")
    assert "qwen2.5:7b" in sim.loaded_models()
    chat_unload = {"model": "qwen2.5:7b", "messages": [], "keep_alive": 0}
    async with http.post(f"{url}/api/chat", json=chat_unload) as response:
        unloaded = await response.json()
    assert unloaded["message"] == {"role": "assistant", "content": ""}
    assert unloaded["done_reason"] == "unload" and "qwen2.5:7b" not in sim.loaded_models()
    assert (sim.stats.loads, sim.stats.max_running, sim.stats.prompts) == (2, 1, [CHAT_TEXT])
    holder.cancel()
    await sim.wait_for(lambda s: s.running == 0, timeout=1)


# -- fault knobs ---------------------------------------------------------------------------


async def test_first_byte_delay_holds_back_the_first_chunk(
    simulated: Start, http: aiohttp.ClientSession
) -> None:
    """sim_first_byte_delay delays the first chunk (and the headers) after the slot is taken."""
    _, url = await simulated()
    started = time.monotonic()
    async with http.post(
        f"{url}/api/chat", json=with_options(CHAT, sim_first_byte_delay=0.2)
    ) as response:
        await response.content.readline()
        assert time.monotonic() - started >= 0.2


async def test_stall_after_emits_n_tokens_then_stalls_until_the_client_leaves(
    simulated: Start, http: aiohttp.ClientSession
) -> None:
    """sim_stall_after=2 sends two chunks, then nothing, holding the slot until disconnect."""
    sim, url = await simulated()
    response = await http.post(f"{url}/api/chat", json=with_options(CHAT, sim_stall_after=2))
    assert [json.loads(await response.content.readline())["done"] for _ in range(2)] == [
        False,
        False,
    ]
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(response.content.readline(), 0.1)
    assert sim.stats.running == 1
    response.close()
    await sim.wait_for(lambda s: s.running == 0 and s.disconnects == 1, timeout=1)


async def test_die_after_cuts_the_stream_without_a_final_chunk(
    simulated: Start, http: aiohttp.ClientSession
) -> None:
    """sim_die_after=N sends N chunks (after the headers) and then closes the connection."""
    sim, url = await simulated()
    received: list[dict[str, Any]] = []
    async with http.post(f"{url}/api/chat", json=with_options(CHAT, sim_die_after=2)) as response:
        with pytest.raises(aiohttp.ClientPayloadError):
            async for line in response.content:
                received.append(json.loads(line))
    assert [chunk["done"] for chunk in received] == [False, False]
    async with http.post(f"{url}/api/chat", json=with_options(CHAT, sim_die_after=0)) as response:
        assert response.status == 200  # a stream that dies at once has still started
        with pytest.raises(aiohttp.ClientPayloadError):
            await response.read()
    await sim.wait_for(lambda s: s.running == 0, timeout=1)
    assert (sim.stats.aborted, sim.stats.completed) == (2, 0)


async def test_sim_status_answers_at_once_without_a_slot(
    simulated: Start, http: aiohttp.ClientSession
) -> None:
    """sim_status returns that status with the flavour's error body, loading nothing."""
    sim, url = await simulated()
    async with http.post(f"{url}/api/chat", json=with_options(CHAT, sim_status=500)) as response:
        assert (response.status, await response.json()) == (500, {"error": "simulated failure"})
    v1 = {**CHAT, "sim_status": 503}
    async with http.post(f"{url}/v1/chat/completions", json=v1) as response:
        error = (await response.json())["error"]
    assert response.status == 503
    assert error == {
        "message": "simulated failure",
        "type": "api_error",
        "param": None,
        "code": None,
    }
    assert (sim.stats.max_running, sim.stats.loads) == (0, 0)


# -- counters ------------------------------------------------------------------------------


async def test_stats_endpoint_reports_counters_without_prompts(
    simulated: Start, http: aiohttp.ClientSession
) -> None:
    """GET /sim/stats gives the counters and a prompt count for out-of-process benchmarks."""
    _, url = await simulated()
    await (await http.post(f"{url}/api/chat", json=CHAT)).read()
    async with http.get(f"{url}/sim/stats") as response:
        stats = await response.json()
    assert stats["completed"] == 1 and stats["prompts_count"] == 1 and "prompts" not in stats


async def test_record_replies_keeps_request_headers_and_the_exact_reply_bytes(
    simulated: Start, http: aiohttp.ClientSession
) -> None:
    """record_replies keeps each request's headers and each reply's exact bytes and type."""
    sim, url = await simulated(record_replies=True, default_output_tokens=2)
    async with http.post(f"{url}/api/chat", json=CHAT, headers={"X-Trace": "t1"}) as response:
        streamed = await response.read()
    async with http.post(f"{url}/v1/chat/completions", json=CHAT) as response:
        whole = await response.read()
    assert sim.replies == [streamed, whole]
    assert sim.reply_types == ["application/x-ndjson", "application/json"]
    assert sim.request_headers[0]["x-trace"] == "t1"


async def test_wait_for_raises_timeout_error_when_the_predicate_never_holds(
    simulated: Start,
) -> None:
    """wait_for gives up with TimeoutError after its timeout."""
    sim, _ = await simulated()
    with pytest.raises(TimeoutError):
        await sim.wait_for(lambda s: s.completed == 1, timeout=0.05)


def test_cli_flags_build_a_sim_config() -> None:
    """The fairgate sim flags map onto SimConfig fields."""
    parser = argparse.ArgumentParser()
    add_sim_arguments(parser)
    args = parser.parse_args(
        [
            "--flavor",
            "llamacpp",
            "--parallel",
            "4",
            "--models",
            "a:1b, b:2b",
            "--keep-alive",
            "5m",
            "--decode-tps",
            "0",
            "--no-prefill-blocks-decode",
            "--memory",
            "12GiB",
            "--max-loaded-models",
            "2",
            "--context-length",
            "8192",
            "--load-seconds-per-gib",
            "0.5",
            "--ollama-version",
            "v0.24.0",
            "--port",
            "0",
        ]
    )
    config = sim_config_from_args(args)
    assert config.ollama_version == "v0.24.0"
    assert (config.memory, config.max_loaded_models) == (12 * 2**30, 2)
    assert (config.context_length, config.load_seconds_per_gib) == (8192, 0.5)
    assert (config.flavor, config.parallel, config.models) == ("llamacpp", 4, ["a:1b", "b:2b"])
    assert (config.default_keep_alive, config.decode_tokens_per_s) == (300.0, 0.0)
    assert config.prefill_blocks_decode is False and args.port == 0
    # Two slots on 11434 without flags: the example policy's Ollama (`make sim`).
    assert sim_config_from_args(parser.parse_args([])) == SimConfig(parallel=2)
    assert parser.parse_args([]).port == 11434
    # A release as Ollama says it, or nothing: "latest" is not one.
    assert parser.parse_args(["--ollama-version", "0.30.0-rc1"]).ollama_version == "0.30.0-rc1"
    with pytest.raises(SystemExit):
        parser.parse_args(["--ollama-version", "latest"])


# -- the llama.cpp flavour -----------------------------------------------------------------


async def test_llamacpp_health_is_503_while_loading_then_ok(
    simulated: Start, http: aiohttp.ClientSession
) -> None:
    """/health says "Loading model" (503) for load_seconds after start, then {"status":"ok"}."""
    now = [50.0]
    _, url = await simulated(clock=lambda: now[0], flavor="llamacpp", load_seconds=10)
    async with http.get(f"{url}/health") as response:
        assert response.status == 503
        assert await response.read() == (
            b'{"error":{"code":503,"message":"Loading model","type":"unavailable_error"}}'
        )
    now[0] += 10
    async with http.get(f"{url}/health") as response:
        assert (response.status, await response.read()) == (200, b'{"status":"ok"}')


async def test_llamacpp_props_slots_and_metrics_show_the_slots(
    simulated: Start, http: aiohttp.ClientSession
) -> None:
    """/props, /slots and /metrics report the slots and which one is processing."""
    sim, url = await simulated(flavor="llamacpp", parallel=2)
    async with http.get(f"{url}/props") as response:
        props = await response.json()
    assert (props["total_slots"], props["is_sleeping"]) == (2, False)
    assert props["default_generation_settings"]["n_ctx"] > 0 and props["model_path"]
    async with http.get(f"{url}/slots") as response:
        assert await response.json() == [
            {"id": i, "n_ctx": 4096, "speculative": False, "is_processing": False} for i in (0, 1)
        ]
    body = {"prompt": "Hi", "stream": True, "sim_stall_after": 1}
    holder = await http.post(f"{url}/completion", json=body)
    await holder.content.readline()
    async with http.get(f"{url}/slots") as response:
        slots = await response.json()
    assert [slot["is_processing"] for slot in slots] == [True, False]
    assert slots[0]["next_token"][0]["n_decoded"] == 1
    async with http.get(f"{url}/metrics") as response:
        metrics = await response.text()
    assert "llamacpp:requests_processing 1\n" in metrics
    assert "llamacpp:requests_deferred 0\n" in metrics
    holder.close()
    await sim.wait_for(lambda s: s.running == 0, timeout=1)


async def test_llamacpp_defers_requests_beyond_its_slots_without_a_limit(
    simulated: Start, http: aiohttp.ClientSession
) -> None:
    """llama-server queues every request past its slots (FIFO, unbounded), seen in /metrics."""
    sim, url = await simulated(flavor="llamacpp", parallel=1, max_queue=0)
    body = {"prompt": "Hi", "stream": True, "sim_stall_after": 1}
    holder = await http.post(f"{url}/completion", json=body)
    await holder.content.readline()
    waiting = [
        asyncio.create_task(http.post(f"{url}/completion", json={"prompt": f"q{n}"}))
        for n in range(2)
    ]
    await sim.wait_for(lambda s: s.queued == 2, timeout=1)
    async with http.get(f"{url}/metrics") as response:
        assert "llamacpp:requests_deferred 2\n" in await response.text()
    holder.close()
    for task in waiting:
        (await task).close()
    assert (sim.stats.max_running, sim.stats.completed) == (1, 2)


async def test_llamacpp_chat_stream_has_the_captured_sse_shape(
    simulated: Start, http: aiohttp.ClientSession
) -> None:
    """Chat chunks, the finish chunk, usage+timings and [DONE] follow llama-server's capture."""
    _, url = await simulated(flavor="llamacpp", default_output_tokens=2)
    body = {"messages": CHAT["messages"], "stream": True, "max_tokens": 2}
    async with http.post(f"{url}/v1/chat/completions", json=body) as response:
        assert response.headers["Content-Type"] == "text/event-stream"
        blocks = (await response.read()).split(b"\n\n")
    assert blocks[-2:] == [b"data: [DONE]", b""]
    chunks = [json.loads(block.removeprefix(b"data: ")) for block in blocks[:-2]]
    assert list(chunks[0]) == [
        "choices",
        "created",
        "id",
        "model",
        "system_fingerprint",
        "object",
    ]
    assert [c["choices"][0]["delta"] for c in chunks[:3]] == [
        {"role": "assistant", "content": None},
        {"content": " The"},
        {"content": " quick"},
    ]
    assert chunks[3]["choices"] == [{"finish_reason": "length", "index": 0, "delta": {}}]
    assert chunks[4]["choices"] == [] and list(chunks[4])[-2:] == ["usage", "timings"]
    assert chunks[4]["usage"]["completion_tokens"] == 2
    assert re.fullmatch(r"chatcmpl-[A-Za-z0-9]{32}", chunks[0]["id"])


async def test_openai_client_and_native_completion_work_against_llamacpp(
    simulated: Start, http: aiohttp.ClientSession
) -> None:
    """The openai client chats with the llama.cpp flavour, and /completion streams natively."""
    sim, url = await simulated(flavor="llamacpp", default_output_tokens=3)
    async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x") as client:
        completion = await client.chat.completions.create(
            model="anything", messages=[{"role": "user", "content": "Hi"}]
        )
    assert completion.choices[0].message.content == " The quick brown"
    body = {"prompt": "The capital of France is", "n_predict": 2, "stream": True}
    async with http.post(f"{url}/completion", json=body) as response:
        blocks = (await response.read()).split(b"\n\n")
    chunks = [json.loads(block.removeprefix(b"data: ")) for block in blocks if block]
    assert [c["content"] for c in chunks] == [" The", " quick", ""]
    assert chunks[-1]["stop"] is True and chunks[-1]["stop_type"] == "limit"
    assert sim.stats.prompts == ["Hi", "The capital of France is"]


@pytest.mark.parametrize(
    ("origin", "status"),
    [
        ("http://localhost:3000", 200),
        ("https://127.0.0.1", 200),
        ("app://obsidian.md", 200),
        ("https://chat.example", 403),
        ("http://localhost.evil.example", 403),
    ],
)
async def test_an_origin_ollama_does_not_list_gets_a_bare_403(
    simulated: Start, origin: str, status: int
) -> None:
    """As gin-contrib/cors with Ollama's default origins: a page elsewhere is refused before
    any handler runs, a local one is answered and told so."""
    _, url = await simulated()
    async with (
        aiohttp.ClientSession() as session,
        session.get(url + "/api/tags", headers={"Origin": origin}) as reply,
    ):
        assert reply.status == status
        allowed = reply.headers.get("Access-Control-Allow-Origin")
        assert allowed == (origin if status == 200 else None)
        if status == 403:  # gin's AbortWithStatus: no body at all
            assert await reply.read() == b""


async def test_llamacpps_stream_head_goes_out_before_its_prefill_ends(start_sim: Start) -> None:
    """As llama-server's does (cpp-httplib writes it before the stream's first event): the
    head of a stream whose prefill takes 4 s is read well before, and alone."""
    _, url = await start_sim(flavor="llamacpp", models=["smollm2"], prefill_tokens_per_s=10.0)
    host, _, port = url.removeprefix("http://").rpartition(":")
    body = json.dumps(
        {"messages": [{"role": "user", "content": "word " * 40}], "stream": True}
    ).encode()
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%b" % (len(body), body)
    )
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=2)
        assert head.startswith(b"HTTP/1.1 200") and b"text/event-stream" in head
    finally:
        writer.close()
