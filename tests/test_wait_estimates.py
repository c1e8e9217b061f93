"""Waiting estimates from learned service times: "starts in about", Retry-After and the
503's words are played out from how long each backend, model and class holds its slots, and
how far off they were is measured and shown in /status."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from gateway.admission import Ticket
from gateway.admission.wait_estimates import WaitEstimates
from gateway.core import Api, RequestClass
from tests.conftest import Gateway, StartGateway, StartSim, one_backend
from tests.test_admission import generate_status, idle, until
from tests.test_prompt_cache import HEAVY_AT_500, SYSTEM, TOOLS, chat

MODEL = "llama3.2:3b"
USERS = """\
defaults: {max_concurrent: 1, max_queued: 2}
users:
  ann: {keys: [ann-key]}
  ben: {keys: [ben-key]}
  cat: {keys: [cat-key]}
  dan: {keys: [dan-key]}
"""


async def generate(gateway: Gateway, key: str, tokens: int, prompt: str = "hi") -> int:
    # Streamed, as people's chats are: the first byte is the first token, after the prefill.
    return await generate_status(gateway, key, prompt, stream=True, options={"num_predict": tokens})


async def status(gateway: Gateway) -> dict[str, Any]:
    async with aiohttp.ClientSession() as session, session.get(gateway.url + "/status") as reply:
        return dict(await reply.json())


async def test_service_times_are_learned_by_class_and_the_waits_played_out_from_them(
    start_sim: StartSim, start_gateway: StartGateway
) -> None:
    """A long prompt holds the slot longer than a short one: the engine's prefill rate is
    learned (tokens over the time to the first byte) beside each class's decode, and a wait
    behind three short requests is estimated from theirs, not from an average of all."""
    _, url = await start_sim(prefill_tokens_per_s=2000.0, decode_tokens_per_s=100.0)
    gateway = await start_gateway(one_backend(url, slots=1, extra=USERS))
    # Heavy: 1.5 s of prefill each; the first loads the model (no measure of a prefill).
    assert await generate(gateway, "ann-key", 20, "x" * 12_000) == 200
    assert await generate(gateway, "ann-key", 20, "y" * 12_000) == 200
    for _ in range(3):
        assert await generate(gateway, "ann-key", 20) == 200  # light: 0.2 s
    estimates = (await status(gateway))["queue"]["estimates"]
    assert estimates["prefill_tokens_per_second"]["sim"] == pytest.approx(2000, rel=0.2)
    decode = estimates["decode_seconds"]["sim"][MODEL]
    assert decode["heavy"] == pytest.approx(0.2, abs=0.1)
    assert decode["light"] == pytest.approx(0.2, abs=0.1)
    ticket = Ticket("ben", MODEL, Api.OLLAMA, input_tokens=1)
    light = gateway.services.admission.room.waits.service("sim", ticket)
    assert light == pytest.approx(0.2, abs=0.1)

    admission = gateway.services.admission
    runs = [asyncio.ensure_future(generate(gateway, f"{u}-key", 20)) for u in ("ann", "ben")]
    await until(admission, lambda room: room.queue_depth == 1)
    runs += [asyncio.ensure_future(generate(gateway, f"{u}-key", 20)) for u in ("cat", "dan")]
    await until(admission, lambda room: room.queue_depth == 3)
    waiting = (await status(gateway))["queue"]["waiting"]
    starts = [w["estimated_start_seconds"] for w in waiting]
    # Each a light request's service after the one before it; the first within one.
    assert 0 < starts[0] <= light
    assert starts[1:] == [pytest.approx(starts[0] + light * n, rel=0.05) for n in (1, 2)]
    assert await asyncio.gather(*runs) == [200] * 4
    await until(admission, idle)
    estimates = (await status(gateway))["queue"]["estimates"]
    # Three waits were estimated as they joined and measured as they started.
    assert estimates["samples"] == 3
    assert estimates["median_error"] is not None and estimates["median_error"] < 0.3


async def test_retry_after_says_when_the_learned_service_times_free_a_place(
    start_sim: StartSim, start_gateway: StartGateway
) -> None:
    """A user at their cap is told to come back when their requests would have run: after
    their running one and their two waiting ones, each the learned time of its class."""
    _, url = await start_sim(decode_tokens_per_s=50.0)
    gateway = await start_gateway(one_backend(url, slots=1, extra=USERS))
    for _ in range(2):
        assert await generate(gateway, "ann-key", 100) == 200  # 2 s each, learned
    learned = gateway.services.admission.room.waits.service
    admission = gateway.services.admission
    runs = [asyncio.ensure_future(generate(gateway, "ben-key", 100)) for _ in range(3)]
    await until(admission, lambda room: room.queue_depth == 2)
    body = {"model": MODEL, "prompt": "hi", "stream": False, "options": {"num_predict": 100}}
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            gateway.url + "/api/generate", json=body, headers={"Authorization": "Bearer ben-key"}
        ) as reply,
    ):
        assert reply.status == 429 or reply.status == 503
        said = (await reply.json())["error"]
        retry_after = int(reply.headers["Retry-After"])
    snapshot = admission.snapshot()
    ticket = next(iter(gateway.services.admission.room.slots.holders.values()))[0]
    service = learned("sim", ticket)
    assert service == pytest.approx(2.0, rel=0.25)
    # Ben's running one (under one service from now), his two waiting, then this one.
    assert 2 * service <= retry_after <= 3 * service + 1
    assert f"try again in about {retry_after} s" in said
    assert snapshot.queue_depth == 2
    for run in runs:
        run.cancel()
    await asyncio.gather(*runs, return_exceptions=True)


def test_the_first_timing_replaces_the_guess() -> None:
    """Before any request is timed a hold is guessed at 5 s; the first timed one replaces
    the guess rather than being averaged with it, so a class not yet seen is reckoned from
    what the house has really shown (a 5 s guess lingered for a dozen requests, and the
    first waits behind light turns were estimated several times too long)."""
    waits = WaitEstimates()
    light = Ticket("ann", MODEL, Api.OLLAMA, input_tokens=10)
    waits.observe("sim", light, held=0.6, evaluated=10, first=0.1)
    heavy = Ticket("ben", MODEL, Api.OLLAMA, input_tokens=0, request_class=RequestClass.HEAVY)
    assert waits.decode("sim", heavy) == pytest.approx(0.5)
    assert waits.seconds == pytest.approx(0.6)


async def test_a_wait_behind_a_prompt_that_shares_its_start_counts_only_the_rest(
    start_sim: StartSim, start_gateway: StartGateway
) -> None:
    """Three people's first turns carry the same tools: the first runs, the other two wait
    (heavy, one slot of two for heavy work). Once the first has run, its engine holds the
    tools, so the second evaluates only its own question: the third's estimated start is
    the second's plus a short turn, not another whole prefill."""
    _, url = await start_sim(
        flavor="llamacpp", parallel=2, prefill_tokens_per_s=1000, decode_tokens_per_s=20
    )
    gateway = await start_gateway(one_backend(url, 2, "llamacpp", HEAVY_AT_500))
    admission = gateway.services.admission
    pool = gateway.services.policy.current.pool
    await until(admission, lambda _: pool.backends[0].state.slots == 2)
    other = [{"role": "system", "content": "z" * 6000}, {"role": "user", "content": "hi"}]
    await chat(gateway, other, tools=TOOLS[:1])  # learns the rate: 1,500 tokens in 1.5 s

    def turn(who: str) -> Any:
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": who}]
        return asyncio.ensure_future(chat(gateway, messages, tools=TOOLS))

    runs = [turn("alice")]
    await until(admission, lambda room: len(room.running) == 1)
    runs += [turn("bob"), turn("carol")]
    await until(admission, lambda room: room.queue_depth == 2)
    waiting = (await status(gateway))["queue"]["waiting"]
    bob, carol = (w["estimated_start_seconds"] for w in waiting)
    whole = 1650 / gateway.services.admission.room.waits.prefill_rate("sim")  # the tools' prefill
    assert whole > 1.2
    assert carol - bob < whole  # a short turn, not the tools evaluated again
    await asyncio.gather(*runs)
