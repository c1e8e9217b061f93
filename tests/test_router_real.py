"""llama-server's router (``--models-dir``, ``--models-max 1``) behind the gateway, for real:
two names for the SmolLM2 file, ``family`` and ``coder``, one loaded at a time.

What the router does on its own, read in its source (tools/server/server-models.cpp) and
seen here: a request naming an unloaded model asks the least recently used child to stop
(it finishes what it runs, and is killed after 10 s) while the router keeps sending it
new requests, and ``POST /models/unload`` answers before the child has stopped. Through
the gateway, what the router holds is read from ``/models``; a swap drains the model
going out (no new requests for it), unloads it, waits until the router says so, and only
then sends the request for the model coming in.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
import yaml
from playwright.async_api import Browser, expect

from gateway.backends import Backend
from gateway.config import model_key
from tests.conftest import Gateway, StartGateway, StartSim
from tests.llama_server import LlamaServer, running_llama_preset_router, running_llama_router
from tests.test_admission import until
from tests.test_hostile_clients import status_of
from tests.test_house import opened
from tests.test_init import init
from tests.test_status_cli import fairgate_status

FAMILY, CODER = "family", "coder"


def _policy(url: str, kind: str = "llamacpp-router", second: str | None = None) -> str:
    also = f"  - {{name: second, url: {second}, kind: {kind}}}\n" if second else ""
    return (
        f"backends:\n  - {{name: router, url: {url}, kind: {kind}}}\n{also}"
        "monitoring: {interval: 300ms}\n"
        "defaults: {max_concurrent: 2, max_queued: 4}\n"
        "timeouts: {first_byte: 120s}\n"
        "queue: {max_wait: 120s}\n"
    )


async def _read(gateway: Gateway) -> Backend:
    """The gateway's router, once its probe has read what the router serves."""
    router = gateway.services.policy.current.pool.backends[0]
    await until(gateway.services.admission, lambda _: router.state.models is not None, within=30)
    return router


async def _router_models(url: str) -> dict[str, str]:
    async with aiohttp.ClientSession() as session, session.get(url + "/models") as reply:
        listed: dict[str, Any] = await reply.json()
    return {entry["id"]: entry["status"]["value"] for entry in listed["data"]}


async def test_the_router_is_read_and_its_swaps_are_planned(
    llama_router: LlamaServer, start_gateway: StartGateway
) -> None:
    """The router's models, its --models-max and its children's slots are read; a request
    for the other model waits for the running one to finish, then finds room made."""
    gateway = await start_gateway(_policy(llama_router.url))
    admission, router = gateway.services.admission, await _read(gateway)
    assert router.state.models == {model_key(FAMILY), model_key(CODER)}
    assert router.model_limit == 1

    async with openai.AsyncOpenAI(
        base_url=gateway.url + "/v1", api_key="x", max_retries=0
    ) as client:

        async def chat(model: str, tokens: int) -> openai.types.chat.ChatCompletion:
            return await client.chat.completions.create(
                model=model,
                messages=[{"role": "user", "content": "Tell a story about a fox."}],
                max_tokens=tokens,
                extra_body={"ignore_eos": True},
            )

        first = await chat(FAMILY, 4)
        assert first.choices[0].message.content
        # The child's slots come from its own /props, once the probe sees it loaded.
        await until(admission, lambda _: router.state.slots == 2, within=30)
        # Its context per slot too (-c 2048 over 2 slots), not Ollama's default num_ctx.
        assert router.state.loaded[model_key(FAMILY)].context_length == 1024

        # A family reply is running when the coder asks: it finishes, then the swap.
        story = asyncio.create_task(chat(FAMILY, 48))
        await until(admission, lambda _: admission.room.slots.busy.get(router.group(FAMILY)))
        code = await chat(CODER, 4)
        told = await story
        assert told.usage is not None and told.usage.completion_tokens == 48
        assert told.choices[0].finish_reason == "length"
        assert code.choices[0].message.content

    assert await _router_models(llama_router.url) == {FAMILY: "unloaded", CODER: "loaded"}
    counts = admission.room.swaps.counts
    assert counts[router.key, model_key(CODER), "swaps"] == 1
    assert counts[router.key, model_key(FAMILY), "evictions"] == 1
    held = (await status_of(gateway))["backends"]["router"]
    assert held["max_loaded_models"] == 1 and held["slots_per_model"] == 2
    assert list(held["models"]) == [CODER]  # as the router names it, not by its key
    code, out, _ = await fairgate_status("--url", gateway.url)
    assert code == 0 and f"{CODER} (at most 1)" in out


async def test_a_router_named_as_one_llama_server_says_which_kind_to_write(
    llama_router: LlamaServer, start_gateway: StartGateway
) -> None:
    gateway = await start_gateway(_policy(llama_router.url, kind="llamacpp"))
    router = gateway.services.policy.current.pool.backends[0]
    admission = gateway.services.admission
    await until(admission, lambda _: router.state.last_error is not None, within=30)
    assert "kind: llamacpp-router" in str(router.state.last_error)


async def test_init_writes_a_router_as_one(llama_router: LlamaServer, tmp_path: Path) -> None:
    policy = tmp_path / "fairgate.yaml"
    assert (
        await init("--backend", llama_router.url, "--person", "ann", "--output", str(policy)) == 0
    )
    backend = yaml.safe_load(policy.read_text())["backends"][0]
    assert backend["kind"] == "llamacpp-router" and "slots" not in backend


async def test_each_user_lists_and_runs_only_the_router_models_they_may_use(
    llama_router: LlamaServer, start_gateway: StartGateway
) -> None:
    """The router's models, read from its /models, listed per user: the kids (allowed
    ``family``) see it alone, are told they may not use the other, and are refused
    ``coder`` before anything loads; alice sees both. The coder model stays unloaded."""
    users = (
        "users:\n  alice: {keys: [alice-key]}\n"
        f"  kids: {{keys: [kids-key], models: [{FAMILY}]}}\n"
    )
    gateway = await start_gateway(_policy(llama_router.url) + users)
    await _read(gateway)
    for key, expected in (("alice-key", [CODER, FAMILY]), ("kids-key", [FAMILY])):
        async with openai.AsyncOpenAI(
            base_url=gateway.url + "/v1", api_key=key, max_retries=0
        ) as client:
            assert sorted([model.id async for model in client.models.list()]) == expected
    async with openai.AsyncOpenAI(
        base_url=gateway.url + "/v1", api_key="kids-key", max_retries=0
    ) as kids:
        assert (await kids.models.retrieve(FAMILY)).id == FAMILY
        with pytest.raises(openai.PermissionDeniedError):  # as for every backend's models
            await kids.models.retrieve(CODER)
        with pytest.raises(openai.PermissionDeniedError):
            await kids.chat.completions.create(
                model=CODER, messages=[{"role": "user", "content": "hi"}], max_tokens=2
            )
    assert (await _router_models(llama_router.url))[CODER] == "unloaded"


async def test_a_model_the_router_cannot_load_unloads_no_other_again(
    tmp_path: Path, start_gateway: StartGateway, browser: Browser
) -> None:
    """A broken file among the router's models: its first request fails as the router
    says (500, its child exited), and from then on, for a while, a request for it is a 503
    that says why, at once, without unloading the family's model for a load that fails
    again. /status, `fairgate status` and the house page name it."""
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "broken.gguf").write_bytes(b"GGUF" + bytes(100))
    async with running_llama_router(tmp_path) as llama_router:
        gateway = await start_gateway(_policy(llama_router.url))
        admission, router = gateway.services.admission, await _read(gateway)
        async with aiohttp.ClientSession() as session:

            async def chat(model: str, **fields: int) -> tuple[int, str]:
                body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
                url = gateway.url + "/v1/chat/completions"
                async with session.post(url, json=body | {"max_tokens": 2} | fields) as reply:
                    return reply.status, await reply.text()

            assert (await chat("broken"))[0] == 500  # the router's own answer, the first time
            await until(admission, lambda _: bool(router.state.failed_loads), within=30)
            assert (await chat(FAMILY))[0] == 200
            status, said = await chat("broken")
            assert status == 503 and "failed to load 'broken' (its process exited with code" in said
            assert (await _router_models(llama_router.url))[FAMILY] == "loaded"
            held = (await status_of(gateway))["backends"]["router"]
            assert list(held["failed_loads"]) == ["broken"]
            said = "failed to load broken (its process exited with code"
            code, out, _ = await fairgate_status("--url", gateway.url)
            assert code == 0 and said in out
            async with opened(browser, tmp_path, "failed-load") as watched:
                await watched.page.goto(gateway.url + "/ui")
                await expect(watched.page.locator(".backend .error")).to_contain_text(said)
            # A minute on, a retry is due: a request refused on its way (n: 2) is not it,
            # the next one is (the router fails it again), and then the wait is twice as
            # long: a file broken for good unloads the others' model ever more rarely.
            failed = router.state.failed_loads[model_key("broken")]
            failed.retry_at = 0.0
            assert (await chat("broken", n=2))[0] == 400
            assert (await chat("broken"))[0] == 500
            await until(admission, lambda _: failed.failures == 2, within=30)
            status, said = await chat("broken")
            assert status == 503 and "tried again in 1" in said  # 120 s less the moments
            assert router.state.failed_loads[model_key("broken")] is failed


async def test_a_broken_model_asked_by_its_alias_is_refused_and_bars_nobody(
    tmp_path: Path, start_gateway: StartGateway
) -> None:
    """``brk``, an alias of the broken model, is refused at once as ``broken`` is, rather
    than unloading the family's model for a load that fails again; and mum, whose request
    met the broken file first, is not barred from swaps for it (the router failed, not
    her request): her next request for another model swaps at once."""
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + bytes(100))
    presets = {
        FAMILY: "parallel = 2\n",
        CODER: "parallel = 2\n",
        "broken": f"model = {broken}\nalias = brk\n",
    }
    users = "users:\n  mum: {keys: [mum-key]}\n  dev: {keys: [dev-key]}\n"
    async with running_llama_preset_router(tmp_path, presets) as llama_router:
        gateway = await start_gateway(_policy(llama_router.url) + users)
        admission, router = gateway.services.admission, await _read(gateway)
        async with aiohttp.ClientSession() as session:

            async def chat(key: str, model: str) -> tuple[int, str]:
                body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
                url, headers = gateway.url + "/v1/chat/completions", {"Authorization": key}
                body |= {"max_tokens": 2}
                async with session.post(url, json=body, headers=headers) as reply:
                    return reply.status, await reply.text()

            mum, dev = "Bearer mum-key", "Bearer dev-key"
            assert (await chat(dev, FAMILY))[0] == 200
            assert (await chat(mum, "broken"))[0] == 500  # the router's, the first time
            await until(admission, lambda _: bool(router.state.failed_loads), within=30)
            assert (await chat(dev, FAMILY))[0] == 200
            status, said = await chat(dev, "brk")
            assert status == 503 and "failed to load" in said, said
            assert (await _router_models(llama_router.url))[FAMILY] == "loaded"
            async with asyncio.timeout(60):  # not barred: no wait of max_wait (120 s), no 503
                assert (await chat(mum, CODER))[0] == 200
        assert (await _router_models(llama_router.url))[CODER] == "loaded"


async def test_names_the_router_gives_two_models_alike_are_refused_saying_so(
    tmp_path: Path, start_gateway: StartGateway
) -> None:
    """``Coder`` is an alias of zeta beside a model ``coder``: the policy, blind to case,
    would allow kid (allowed coder) a name the router runs as zeta. Refused, naming both."""
    presets = {CODER: "parallel = 2\n", "zeta": "parallel = 2\nalias = Coder\n"}
    async with running_llama_preset_router(tmp_path, presets) as llama_router:
        users = "users:\n  kid: {keys: [kid-key], models: [coder]}\n"
        gateway = await start_gateway(_policy(llama_router.url) + users)
        await _read(gateway)
        body = {"model": "Coder", "messages": [{"role": "user", "content": "hi"}]}
        headers = {"Authorization": "Bearer kid-key"}
        async with (
            aiohttp.ClientSession() as session,
            session.post(gateway.url + "/v1/chat/completions", json=body, headers=headers) as reply,
        ):
            assert reply.status == 503
            said = (await reply.json())["error"]["message"]
        assert "could mean any of coder, zeta" in said, said
        assert (await _router_models(llama_router.url))["zeta"] == "unloaded"


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (the router's children), from /proc."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


async def test_a_child_that_dies_mid_stream_is_a_failure_the_client_is_told(
    llama_router: LlamaServer, start_gateway: StartGateway
) -> None:
    """The router ends a stream whose child was killed with a line of text, cleanly, as if
    done: the client is told in the stream (an error event, no [DONE]), and it counts as a
    backend's failure mid-stream."""
    gateway = await start_gateway(_policy(llama_router.url))
    body = {
        "model": FAMILY,
        "messages": [{"role": "user", "content": "tell me a long story"}],
        "max_tokens": 4000,  # the slot's context ends it first, seconds from now
        "ignore_eos": True,
        "stream": True,
    }
    async with aiohttp.ClientSession() as session:
        url = gateway.url + "/v1/chat/completions"
        async with session.post(url, json=body) as reply:
            assert reply.status == 200
            streamed = await reply.content.readuntil(b"\n\n")  # a token: the child runs
            for child in _children(llama_router.pid):
                os.kill(child, signal.SIGKILL)
            streamed += await reply.read()
        async with session.get(gateway.url + "/metrics") as reply:
            metrics = await reply.text()
    assert b"data: [DONE]" not in streamed
    assert b"the backend failed mid-stream" in streamed.rsplit(b"data: ", 1)[-1], streamed[-300:]
    assert 'fairgate_stream_failures_total{backend="router"} 1.0' in metrics


async def test_a_chat_without_a_list_of_messages_unloads_nothing(
    llama_router: LlamaServer, start_gateway: StartGateway
) -> None:
    """The router starts the coder's process before its child reads the body: a chat body no
    server takes (no list of messages, a role or content of the wrong type, a length that is
    no number) is answered by the gateway, the family's model left loaded (sent, it would
    have been unloaded for the child's refusal)."""
    gateway = await start_gateway(_policy(llama_router.url))
    hi = [{"role": "user", "content": "hi"}]
    bodies: list[dict[str, Any]] = [
        *({"messages": messages} for messages in (None, 5, "hi", [5], ["hi"])),
        {"messages": [{"role": 5, "content": "hi"}]},
        {"messages": [{"role": "user", "content": {"a": 1}}]},
        {"messages": hi, "max_tokens": "x"},
    ]
    async with aiohttp.ClientSession() as session:
        assert await _chat_status(session, gateway.url, FAMILY) == 200
        whole = {"model": FAMILY, "messages": hi, "max_tokens": 2.0}  # llama-server reads 2
        async with session.post(gateway.url + "/v1/chat/completions", json=whole) as reply:
            assert reply.status == 200, await reply.text()
        for body in bodies:
            body = {"model": CODER} | body
            async with session.post(gateway.url + "/v1/chat/completions", json=body) as reply:
                assert reply.status == 400, body
                assert "must be" in (await reply.json())["error"]["message"] or not body.get(
                    "messages"
                )
            async with session.post(gateway.url + "/v1/messages", json=body) as reply:
                assert reply.status == 400, body
        completion = {"model": CODER, "prompt": "hi", "max_tokens": "x"}
        async with session.post(gateway.url + "/v1/completions", json=completion) as reply:
            assert reply.status == 400
    assert (await _router_models(llama_router.url))[FAMILY] == "loaded"


async def test_a_body_the_routers_child_fails_bars_its_sender_from_swaps(
    llama_router: LlamaServer, start_gateway: StartGateway
) -> None:
    """``tools: 5``, which only the child reads (its 500, after the router started it): the
    family's model was unloaded for it, so mum starts no other swap for a while; her next
    such request waits out max_wait and is refused, the family's model left loaded. (The
    bar is lifted only for a load the router itself says failed.)"""
    text = _policy(llama_router.url).replace("max_wait: 120s", "max_wait: 2s")
    users = "users:\n  mum: {keys: [mum-key]}\n  dev: {keys: [dev-key]}\n"
    gateway = await start_gateway(text + users)
    body = {"model": CODER, "messages": [{"role": "user", "content": "hi"}], "tools": 5}
    url = gateway.url + "/v1/chat/completions"
    async with aiohttp.ClientSession() as session:

        async def family() -> int:
            headers = {"Authorization": "Bearer dev-key"}
            chat = {"model": FAMILY, "messages": [{"role": "user", "content": "hi"}]}
            async with session.post(url, json=chat | {"max_tokens": 2}, headers=headers) as reply:
                return reply.status

        async def tools() -> tuple[int, str]:
            headers = {"Authorization": "Bearer mum-key"}
            async with session.post(url, json=body, headers=headers) as reply:
                return reply.status, await reply.text()

        assert await family() == 200
        assert (await tools())[0] == 500  # the child's, after the family's model went
        assert await family() == 200
        status, said = await tools()
        assert status == 503 and "none is started for mum" in said, said
    assert (await _router_models(llama_router.url))[FAMILY] == "loaded"


async def test_a_model_one_router_cannot_load_goes_to_another_that_can(
    tmp_path: Path, start_gateway: StartGateway
) -> None:
    """Two routers list ``coder``; on the first its file is broken. Once its load has
    failed there, requests for it go to the second, where they would otherwise be tried
    first on the first (the first of two alike) to fail there and over."""
    (tmp_path / "a" / "models").mkdir(parents=True)
    (tmp_path / "a" / "models" / "coder.gguf").write_bytes(b"GGUF" + bytes(100))
    async with (
        running_llama_router(tmp_path / "a", names=(FAMILY,), models_max=2) as first,
        running_llama_router(tmp_path / "b", names=(CODER,)) as second,
    ):
        gateway = await start_gateway(_policy(first.url, second=second.url))
        admission = gateway.services.admission
        broken, good = gateway.services.policy.current.pool.backends
        await until(admission, lambda _: None not in (broken.state.models, good.state.models))
        async with aiohttp.ClientSession() as session:

            async def chat(url: str, model: str) -> int:
                body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
                async with session.post(
                    url + "/v1/chat/completions", json=body | {"max_tokens": 2}
                ) as reply:
                    await reply.read()
                    return reply.status

            assert await chat(gateway.url, FAMILY) == 200
            assert await chat(first.url, CODER) == 500  # straight to it: its child exits
            await until(admission, lambda _: bool(broken.state.failed_loads), within=30)
            assert [await chat(gateway.url, CODER) for _ in range(3)] == [200] * 3
            held = await _router_models(first.url)
            assert held[FAMILY] == "loaded" and held[CODER] == "unloaded"
        # Sent to the first, each would have been tried there (and failed over): never was.
        log = (tmp_path / "a" / "router.log").read_text(errors="replace")
        assert log.count("spawning server instance with name=coder") == 1


def _spawned(log: Path, name: str) -> int:
    """How many children the router started for ``name``: its loads."""
    return log.read_text(errors="replace").count(f"spawning server instance with name={name} ")


async def _chat_status(session: aiohttp.ClientSession, url: str, model: str) -> int:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    async with session.post(url + "/v1/chat/completions", json=body) as reply:
        await reply.read()
        return reply.status


async def test_a_name_spelled_otherwise_goes_as_the_router_names_it(
    llama_router: LlamaServer, start_gateway: StartGateway, tmp_path: Path
) -> None:
    """The gateway tells ``Coder`` and ``coder:latest`` from ``coder`` as Ollama would (not
    at all); the router matches its names exactly. Sent as written, each would unload the
    family's model for the router's 400; sent as the router names the model, they are
    ``coder``: one swap for the first, none for the second."""
    gateway = await start_gateway(_policy(llama_router.url))
    await _read(gateway)
    async with aiohttp.ClientSession() as session:
        assert await _chat_status(session, gateway.url, FAMILY) == 200
        assert await _chat_status(session, gateway.url, "Coder") == 200
        assert await _chat_status(session, gateway.url, "coder:latest") == 200
    assert (await _router_models(llama_router.url))[CODER] == "loaded"


async def test_an_alias_of_the_routers_is_the_model_it_names(
    tmp_path: Path, start_gateway: StartGateway
) -> None:
    """A preset's aliases name its model: asked by name and by alias in turn, the family's
    model loads once, and /status holds one model with its slots, not one per name."""
    presets = {FAMILY: "parallel = 2\nalias = fam,household\n", CODER: "parallel = 2\n"}
    async with running_llama_preset_router(tmp_path, presets) as llama_router:
        gateway = await start_gateway(_policy(llama_router.url))
        await _read(gateway)
        async with aiohttp.ClientSession() as session:
            for name in (FAMILY, "fam", FAMILY, "household", "Fam"):
                assert await _chat_status(session, gateway.url, name) == 200, name
        held = (await status_of(gateway))["backends"]["router"]["models"]
        assert list(held) == [FAMILY]
    assert _spawned(tmp_path / "router.log", FAMILY) == 1


async def test_children_of_different_parallel_are_sent_no_more_than_the_fewest(
    tmp_path: Path, start_gateway: StartGateway
) -> None:
    """A preset giving one model 4 slots and another 1: one figure counts for every child
    of the router, the fewest (more, and requests would wait inside the 1-slot child),
    and it stays while that child is unloaded."""
    presets = {"big": "parallel = 4\n", "small": "parallel = 1\n"}  # listed in this order
    async with running_llama_preset_router(tmp_path, presets, models_max=2) as llama_router:
        gateway = await start_gateway(_policy(llama_router.url))
        admission, router = gateway.services.admission, await _read(gateway)
        async with aiohttp.ClientSession() as session:
            assert await _chat_status(session, gateway.url, "small") == 200
            assert await _chat_status(session, gateway.url, "big") == 200
            await until(admission, lambda _: len(router.state.child_slots) == 2, within=30)
            assert router.slots == 1
            async with session.post(llama_router.url + "/models/unload", json={"model": "small"}):
                pass
            await until(admission, lambda _: model_key("small") not in router.state.loaded)
            assert router.slots == 1


async def test_a_name_goes_as_asked_where_an_ollama_or_another_spelling_serves_it(
    tmp_path: Path, start_gateway: StartGateway, start_sim: StartSim
) -> None:
    """An Ollama lists ``household``, a router's preset names it as an alias of ``family``:
    Ollama's own API gets the name asked (renamed, Ollama would run its other model or
    none), and so does OpenAI's, which either may serve."""
    _, sim_url = await start_sim(parallel=2, models=["household", "family"])
    presets = {FAMILY: "parallel = 2\nalias = household\n"}
    async with running_llama_preset_router(tmp_path, presets) as llama_router:
        ollama = f"  - {{name: ollama, url: {sim_url}, kind: ollama, slots: 2}}\n"
        text = _policy(llama_router.url).replace("router}\n", "router}\n" + ollama, 1)
        gateway = await start_gateway(text)
        admission = gateway.services.admission
        pool = gateway.services.policy.current.pool
        await until(admission, lambda _: None not in [b.state.models for b in pool.backends])
        async with aiohttp.ClientSession() as session:
            body = {"model": "household", "messages": [{"role": "user", "content": "hi"}]}
            async with session.post(gateway.url + "/api/chat", json=body | {"stream": False}) as r:
                assert r.status == 200
                assert (await r.json())["model"] == "household"


async def test_a_resident_model_named_by_its_alias_stays(
    tmp_path: Path, start_gateway: StartGateway
) -> None:
    """``resident: [household]``, an alias of the router's ``family``: a request for the
    other model waits (and gets its 503) rather than unloading it."""
    presets = {FAMILY: "parallel = 2\nalias = household\n", CODER: "parallel = 2\n"}
    async with running_llama_preset_router(tmp_path, presets) as llama_router:
        text = _policy(llama_router.url).replace(
            "kind: llamacpp-router}", "kind: llamacpp-router, resident: [household]}"
        )
        gateway = await start_gateway(text.replace("max_wait: 120s", "max_wait: 2s"))
        admission, router = gateway.services.admission, await _read(gateway)
        async with aiohttp.ClientSession() as session:
            assert await _chat_status(session, gateway.url, "household") == 200
            await until(admission, lambda _: model_key(FAMILY) in router.state.loaded, within=30)
            assert await _chat_status(session, gateway.url, CODER) == 503
        assert (await _router_models(llama_router.url))[FAMILY] == "loaded"


async def test_a_lane_rule_naming_a_routers_alias_holds(
    tmp_path: Path, start_gateway: StartGateway
) -> None:
    """A rule puts ``household`` (an alias of the router's ``family``) in the background:
    a request for it runs there, the rule judged by the name asked, not the one sent."""
    presets = {FAMILY: "parallel = 2\nalias = household\n"}
    async with running_llama_preset_router(tmp_path, presets) as llama_router:
        rules = "lanes:\n  rules:\n    - {lane: background, models: [household]}\n"
        gateway = await start_gateway(_policy(llama_router.url) + rules)
        admission = gateway.services.admission
        await _read(gateway)
        body = {
            "model": "household",
            "messages": [{"role": "user", "content": "Tell a long story."}],
            "max_tokens": 400,
            "ignore_eos": True,
            "stream": True,
        }
        url = gateway.url + "/v1/chat/completions"
        async with aiohttp.ClientSession() as session, session.post(url, json=body) as reply:
            assert reply.status == 200
            await reply.content.readline()  # running
            assert admission.snapshot().background_users == {"anonymous": (1, 0)}


async def test_a_count_of_tokens_asked_of_a_router_is_refused_saying_why(
    llama_router: LlamaServer, start_gateway: StartGateway
) -> None:
    """Counting a prompt would make the router load the model, a swap nobody planned: a
    404 that names the router, not an Ollama the house does not have."""
    gateway = await start_gateway(_policy(llama_router.url))
    await _read(gateway)
    body = {"model": FAMILY, "messages": [{"role": "user", "content": "hi"}]}
    async with aiohttp.ClientSession() as session:
        url = gateway.url + "/v1/messages/count_tokens"
        async with session.post(url, json=body) as reply:
            assert reply.status == 404
            said = (await reply.json())["error"]["message"]
    assert "llama-server's router, which would load the model" in said and "Ollama" not in said


async def test_a_user_allowed_a_routers_alias_sees_the_model_under_it(
    tmp_path: Path, start_gateway: StartGateway
) -> None:
    """kids may use ``household``, an alias the router's preset gives ``family``: their
    /v1/models lists it under that name (the router lists its id alone), and the model's
    own entry by it answers; bob, allowed ``family``, sees it as the router names it, and not
    the router's command line for it."""
    presets = {FAMILY: "parallel = 2\nalias = household\n", CODER: "parallel = 2\n"}
    async with running_llama_preset_router(tmp_path, presets) as llama_router:
        users = (
            "users:\n  kids: {keys: [kids-key], models: [household]}\n"
            "  bob: {keys: [bob-key], models: [family]}\n"
        )
        gateway = await start_gateway(_policy(llama_router.url) + users)
        async with aiohttp.ClientSession() as session:

            async def listed(key: str, path: str = "/v1/models") -> tuple[int, Any]:
                headers = {"Authorization": f"Bearer {key}"}
                async with session.get(gateway.url + path, headers=headers) as reply:
                    return reply.status, await reply.json()

            status, body = await listed("kids-key")
            assert status == 200 and [m["id"] for m in body["data"]] == ["household"]
            status, body = await listed("kids-key", "/v1/models/household")
            assert status == 200 and body["id"] == "household"
            status, body = await listed("bob-key")
            assert [m["id"] for m in body["data"]] == [FAMILY]
            # The router's status holds its child's command line and preset: the model
            # file's path on the server is not a user's to read.
            assert set(body["data"][0]["status"]) == {"value"}
            assert str(tmp_path) not in json.dumps(body)
            for spelled in ("Family", "family:latest"):  # as a chat by that name reaches it
                status, body = await listed("bob-key", f"/v1/models/{spelled}")
                assert status == 200 and body["id"] == spelled, spelled
