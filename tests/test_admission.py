"""Admission through the gateway: caps, short bounded queues, honest 503s."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import ollama
import openai
import pytest

from gateway.admission.admission import Admission
from gateway.admission.room_snapshot import RoomSnapshot
from tests.conftest import Gateway, StartGateway, StartSim

MODEL = "llama3.2:3b"
USERS = """\
defaults: {max_concurrent: 1, max_queued: 2}
queue: {max_depth: 16, max_wait: 30s}
users:
  alice: {keys: [alice-key]}
  bob: {keys: [bob-key], max_concurrent: 2}
  carol: {keys: [carol-key], max_queued: 5}
  dave: {keys: [dave-key], max_queued: 5}
"""


def policy(sim_url: str, slots: int = 4, head: str = USERS) -> str:
    return f"{head}backends:\n  - {{name: sim, url: {sim_url}, kind: ollama, slots: {slots}}}\n"


async def until(
    admission: Admission, predicate: Callable[[RoomSnapshot], bool], within: float = 5.0
) -> None:
    """Wait, on admission's change signal, until ``predicate`` holds for its snapshot."""
    async with asyncio.timeout(within):
        while not predicate(admission.snapshot()):
            await admission.changed()


def queued(user: str, count: int) -> Callable[[RoomSnapshot], bool]:
    return lambda snapshot: snapshot.users.get(user, (0, 0))[1] == count


def idle(snapshot: RoomSnapshot) -> bool:
    busy = sum(busy for busy, _ in snapshot.backends.values())
    return not snapshot.users and snapshot.queue_depth == 0 and busy == 0


@asynccontextmanager
async def held(gateway: Gateway, key: str | None, prompt: str) -> AsyncIterator[None]:
    """Keep one running request of ``key``'s user open for the duration of the block."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": prompt}],
        "options": {"sim_stall_after": 1},  # one token, then hold the slot
    }
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with (
        aiohttp.ClientSession() as session,
        session.post(gateway.url + "/api/chat", json=body, headers=headers) as response,
    ):
        assert response.status == 200
        await response.content.readline()
        yield


async def generate_status(gateway: Gateway, key: str, prompt: str = "hi", **fields: Any) -> int:
    """The HTTP status of a generate request from ``key``'s user, read whole (not streamed,
    unless ``fields`` say otherwise)."""
    body = {"model": MODEL, "prompt": prompt, "stream": False, **fields}
    headers = {"Authorization": f"Bearer {key}"}
    async with (
        aiohttp.ClientSession() as session,
        session.post(gateway.url + "/api/generate", json=body, headers=headers) as reply,
    ):
        await reply.read()
        return reply.status


def ollama_client(gateway: Gateway, key: str) -> ollama.AsyncClient:
    return ollama.AsyncClient(host=gateway.url, headers={"Authorization": f"Bearer {key}"})


async def chat(gateway: Gateway, key: str, prompt: str) -> ollama.ChatResponse:
    """A chat from ``key``'s user with the real ollama client."""
    async with ollama_client(gateway, key) as client:
        return await client.chat(model=MODEL, messages=[{"role": "user", "content": prompt}])


def waiting_chat(gateway: Gateway, key: str, prompt: str) -> asyncio.Task[ollama.ChatResponse]:
    """``chat`` started in the background."""
    return asyncio.create_task(chat(gateway, key, prompt))


class TestCapsAndQueues:
    async def test_a_capped_users_extra_requests_wait_then_get_503_with_retry_after(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """Cap 1: the second request waits, up to max_queued wait, the next is refused at once."""
        _, sim_url = await start_sim(parallel=8)
        gateway = await start_gateway(policy(sim_url))
        admission = gateway.services.admission
        async with held(gateway, "alice-key", "first"):
            waiting = [waiting_chat(gateway, "alice-key", f"wait {n}") for n in range(2)]
            await until(admission, queued("alice", 2))
            client = openai.AsyncOpenAI(
                base_url=gateway.url + "/v1", api_key="alice-key", max_retries=0
            )
            started = time.monotonic()
            with pytest.raises(openai.APIStatusError) as refused:
                await client.chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": "one too many"}]
                )
            # At once, not after the 30 s max_wait (a margin no busy machine eats up).
            assert time.monotonic() - started < 10
            assert refused.value.status_code == 503
            error = refused.value.response.json()["error"]
            assert error["code"] == "user_queue_full"
            assert "1 running and 2 waiting (max_queued 2)" in error["message"]
            retry_after = refused.value.response.headers["Retry-After"]
            assert int(retry_after) >= 1
            # Front ends show the text and ignore the header: the text says it too.
            assert error["message"].endswith(f"; try again in about {retry_after} s")
            await client.close()
            assert (await chat(gateway, "bob-key", "hi")).done
            assert not any(task.done() for task in waiting)
        replies = await asyncio.gather(*waiting)
        assert all(reply.done for reply in replies)
        await until(admission, idle)

    async def test_every_reply_says_how_long_it_waited_and_from_where(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """A reply that started at once says position 0; one that arrived behind two of
        carol's says position 1 (lifted level with carol, dave's shorter prompt finishes
        first in the fair ordering) and how long it waited."""
        _, sim_url = await start_sim(parallel=8)
        gateway = await start_gateway(policy(sim_url, slots=1))
        admission = gateway.services.admission
        headers = {"Authorization": "Bearer dave-key"}
        body = {"model": MODEL, "prompt": "hi", "stream": False}
        async with aiohttp.ClientSession() as session:
            async with session.post(gateway.url + "/api/generate", json=body, headers=headers) as r:
                assert (r.headers["X-Fairgate-Queue-Position"], r.status) == ("0", 200)
            async with held(gateway, "alice-key", "holder"):
                ahead = [waiting_chat(gateway, "carol-key", f"ahead {n}") for n in range(2)]
                await until(admission, queued("carol", 2))
                reply = asyncio.create_task(
                    session.post(gateway.url + "/api/generate", json=body, headers=headers)
                )
                await until(admission, queued("dave", 1))
            async with await reply as r:
                assert r.status == 200
                assert r.headers["X-Fairgate-Queue-Position"] == "1"
                assert float(r.headers["X-Fairgate-Queue-Wait"]) > 0
            await asyncio.gather(*ahead)
        await until(admission, idle)

    async def test_max_depth_bounds_the_whole_waiting_room(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """With queue.max_depth 2 full, a third waiting request of anyone gets gateway_busy."""
        _, sim_url = await start_sim(parallel=8)
        head = USERS.replace("max_depth: 16", "max_depth: 2")
        gateway = await start_gateway(policy(sim_url, slots=1, head=head))
        admission = gateway.services.admission
        async with held(gateway, "alice-key", "holder"):
            waiting = [
                waiting_chat(gateway, "carol-key", "c1"),
                waiting_chat(gateway, "carol-key", "c2"),
            ]
            await until(admission, queued("carol", 2))
            with pytest.raises(ollama.ResponseError) as refused:
                await chat(gateway, "dave-key", "d")
            assert refused.value.status_code == 503
            assert "gateway is busy" in refused.value.error
        await asyncio.gather(*waiting)
        await until(admission, idle)

    async def test_a_request_waiting_past_max_wait_gets_503(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """max_wait bounds the time in the waiting room; the refusal carries Retry-After."""
        _, sim_url = await start_sim(parallel=8)
        head = USERS.replace("max_wait: 30s", "max_wait: 300ms")
        gateway = await start_gateway(policy(sim_url, slots=1, head=head))
        async with held(gateway, "alice-key", "holder"), aiohttp.ClientSession() as session:
            body = {"model": MODEL, "prompt": "late"}
            headers = {"X-API-Key": "bob-key"}
            async with session.post(
                gateway.url + "/api/generate", json=body, headers=headers
            ) as reply:
                assert reply.status == 503
                assert "max_wait" in (await reply.json())["error"]
                assert reply.headers["Retry-After"].isdigit()
        await until(gateway.services.admission, idle)

    async def test_the_backend_never_sees_more_than_its_slots(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """Twelve concurrent requests from three users reach a 2-slot backend two at a time."""
        sim, sim_url = await start_sim(parallel=8, decode_tokens_per_s=200.0)
        head = USERS.replace("max_queued: 2}", "max_queued: 6}")
        gateway = await start_gateway(policy(sim_url, slots=2, head=head))
        keys = ["alice-key", "bob-key", "carol-key"]
        replies = await asyncio.gather(
            *(waiting_chat(gateway, keys[n % 3], f"q{n}") for n in range(12))
        )
        assert len(replies) == 12
        assert sim.stats.max_running == 2
        assert sim.stats.completed == 12

    async def test_an_unknown_key_gets_401_and_no_key_too(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """Without an anonymous user, a request must bring a known key."""
        sim, sim_url = await start_sim()
        gateway = await start_gateway(policy(sim_url))
        for headers in ({"Authorization": "Bearer nope"}, {}):
            async with (
                aiohttp.ClientSession() as session,
                session.post(
                    gateway.url + "/v1/chat/completions",
                    json={"model": MODEL, "messages": []},
                    headers=headers,
                ) as reply,
            ):
                assert reply.status == 401
                assert (await reply.json())["error"]["type"] == "authentication_error"
        assert sim.stats.prompts == []

    async def test_a_forbidden_model_gets_403(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """A user limited to some models is refused the others."""
        _, sim_url = await start_sim()
        head = USERS + "  kids: {keys: [kids-key], models: [llama3.2:3b]}\n"
        gateway = await start_gateway(policy(sim_url, head=head))
        async with ollama_client(gateway, "kids-key") as client:
            with pytest.raises(ollama.ResponseError) as refused:
                await client.generate(model="qwen2.5:7b", prompt="hi")
            assert refused.value.status_code == 403
            assert (await client.generate(model=MODEL, prompt="hi")).done

    async def test_basic_auth_password_and_client_address_identify_users(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """http://name:KEY@host and a CIDR rule for a device without headers both identify."""
        _, sim_url = await start_sim(parallel=8)
        head = USERS + "  tv: {clients: [127.0.0.0/8], max_concurrent: 1, max_queued: 0}\n"
        gateway = await start_gateway(policy(sim_url, head=head))
        admission = gateway.services.admission
        basic_url = gateway.url.replace("http://", "http://anything:alice-key@")
        async with (
            aiohttp.ClientSession() as session
        ):  # aiohttp sends URL credentials as basic auth
            async with held(gateway, "alice-key", "holder"):
                body = {"model": MODEL, "prompt": "x", "stream": False}
                behind = asyncio.create_task(session.post(basic_url + "/api/generate", json=body))
                await until(admission, queued("alice", 1))
            reply = await behind
            assert reply.status == 200
            reply.release()
        async with (
            held(gateway, None, "tv holder"),
            aiohttp.ClientSession() as session,
            session.post(gateway.url + "/api/generate", json={"model": MODEL}) as reply,
        ):
            assert reply.status == 503  # the tv has max_queued 0
            assert "user tv" in json.loads(await reply.read())["error"]
        await until(admission, idle)
