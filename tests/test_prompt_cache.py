"""Cost that matches the engine: what its prompt cache holds is not charged again.

A chat's later turns repeat its tools, system prompt and history; the engine evaluates only
the new end. The gateway classes and charges them by that end (``admission/prompt_caches.py``),
sends a conversation where its prefix is held, and learns from each reply what the engine
really read from its cache. The simulator's slots keep their prompts as llama-server's do
(``fairsim/slots.py``); the real llama-server checks the same on the real thing.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import openai
import pytest

from fairsim import SimConfig, Simulator
from fairsim.slots import HostCache
from gateway.admission.prompt_caches import Prefix, PromptCaches
from gateway.app import bound_url, start_server
from gateway.backends import Backend
from gateway.backends.pool import BackendState
from gateway.core import RequestClass
from gateway.intake import prefix_of
from gateway.wire import runs_own_runner, with_slot
from tests.conftest import Finished, Gateway, StartGateway, StartSim, one_backend
from tests.llama_server import MODEL_ALIAS
from tests.test_admission import idle, until
from tests.test_backends import FAST_MONITOR, wait_backend

MODEL = "llama3.2:3b"
# 3,000 characters of instructions: about 750 tokens to the gateway's estimate, heavy at 500.
SYSTEM = " ".join(f"Rule {n}: answer briefly and kindly, in plain words." for n in range(60))
TOOLS = [
    {"type": "function", "function": {"name": f"tool_{n}", "description": "d" * 300,
     "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}
    for n in range(8)
]  # fmt: skip
HEAVY_AT_500 = "classes: {heavy: {min_prompt_tokens: 500}}\n"


async def chat(gateway: Gateway, messages: list[dict[str, str]], **fields: Any) -> str:
    """One streamed chat completion; its reply's text."""
    body = {"model": fields.pop("model", MODEL), "messages": messages, "stream": True, **fields}
    text = []
    async with (
        aiohttp.ClientSession() as session,
        session.post(gateway.url + "/v1/chat/completions", json=body) as reply,
    ):
        assert reply.status == 200, await reply.text()
        async for line in reply.content:
            if line.startswith(b"data: {"):
                for choice in json.loads(line[6:])["choices"]:
                    text.append(choice.get("delta", {}).get("content") or "")
    return "".join(text)


async def conversation(
    gateway: Gateway, turns: int, first: str = "Hello there.", **fields: Any
) -> list[Any]:
    """A conversation of ``turns`` turns, each sending the whole history again, as a chat
    front end does; the gateway's record of each turn."""
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": first}]
    records = []
    for turn in range(turns):
        finished = Finished(gateway)
        answer = await chat(gateway, messages, **fields)
        records.append(await finished.first(("/v1/chat/completions",)))
        messages += [
            {"role": "assistant", "content": answer},
            {"role": "user", "content": f"And question {turn + 2}?"},
        ]
    return records


def counter(gateway: Gateway, user: str = "anonymous") -> float:
    return gateway.services.admission.room.ordering.counters().get(user, 0.0)


async def test_a_conversations_later_turns_are_light_and_charged_what_the_engine_evaluated(
    start_sim: StartSim, start_gateway: StartGateway
) -> None:
    """Tools and a long system prompt make the first turn heavy; the next four repeat them
    and are light, their fair-share charge the engine's own count of what it evaluated."""
    _, url = await start_sim(flavor="llamacpp", parallel=2)
    gateway = await start_gateway(HEAVY_AT_500 + one_backend(url, slots=2, kind="llamacpp"))
    policy = gateway.services.policy.current.policy
    records, charges = [], []
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hi."}]
    for turn in range(5):
        before, finished = counter(gateway), Finished(gateway)
        answer = await chat(gateway, messages, tools=TOOLS)
        record = await finished.first(("/v1/chat/completions",))
        records.append(record)
        charges.append(counter(gateway) - before)
        messages += [
            {"role": "assistant", "content": answer},
            {"role": "user", "content": f"And question {turn + 2}?"},
        ]
    classes = [r.request_class for r in records]
    assert classes == [RequestClass.HEAVY] + [RequestClass.LIGHT] * 4
    for record, charge in zip(records[1:], charges[1:], strict=True):
        assert record.cached_tokens and record.prompt_tokens
        evaluated = record.prompt_tokens - record.cached_tokens
        assert evaluated < record.prompt_tokens / 10  # the engine read the rest
        weight = policy.classes.light.weight
        expected = (policy.costs.input * evaluated + policy.costs.output * 12) / weight
        assert charge == pytest.approx(expected)
        # The estimate was of the uncached end too: light, and far below the whole prompt.
        assert record.input_estimate is not None and record.input_estimate > 500


@pytest.mark.parametrize(
    "padding",
    [{"id": "x" * 200_000}, {"x": list(range(60_000))}],
    ids=["200 KB in its id", "60,000 numbers in a field, which no digest shortens"],
)
async def test_what_the_count_leaves_out_cannot_make_new_text_look_cached(
    start_sim: StartSim, start_gateway: StartGateway, padding: dict[str, Any]
) -> None:
    """A message carrying 200 KB that no template renders (and the count leaves out) is
    light; sent again before a long new message, its held bytes must not pass the new
    message for cached: the second turn is heavy, as its new text is."""
    _, url = await start_sim(flavor="llamacpp", parallel=2)
    gateway = await start_gateway(HEAVY_AT_500 + one_backend(url, slots=2, kind="llamacpp"))
    padded = {"role": "user", "content": "hi", **padding}
    records = []
    for messages in ([padded], [padded, {"role": "user", "content": SYSTEM}]):
        finished = Finished(gateway)
        await chat(gateway, messages)
        records.append(await finished.first(("/v1/chat/completions",)))
    assert [r.request_class for r in records] == [RequestClass.LIGHT, RequestClass.HEAVY]
    assert records[1].uncached_estimate is not None and records[1].uncached_estimate > 500


@pytest.mark.parametrize(
    "message",
    [
        {"role": "user", "content": "look", "images": ["iVBOR" + "A" * 400_000]},
        {
            "role": "user",
            "content": [
                {
                    "type": "image_url",
                    "image_url": {"url": "data:image/png;base64," + "A" * 400_000},
                }
            ],
        },
    ],
    ids=["Ollama's images", "an OpenAI image part"],
)
def test_an_image_weighs_its_tokens_in_the_blocks(message: dict[str, Any]) -> None:
    """An image of 400 KB is as many bytes of the rendered prompt as its tokens' characters
    (768 tokens, 3,072), however its data is written: a cached image then covers no more of
    the prompt than the count gives it."""
    size = prefix_of({"messages": [message]}, MODEL, 768).size
    assert 768 * 4 <= size < 768 * 4 + 200


async def test_a_backend_that_comes_back_holds_nothing(start_gateway: StartGateway) -> None:
    """A conversation held by the engine is light; its server restarts (its probes fail,
    then pass: a new process, its cache empty), and the next turn is heavy again."""
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hi."}]
    config = SimConfig(models=[MODEL], flavor="llamacpp", parallel=1, decode_tokens_per_s=500.0)
    runner = await start_server(Simulator(config).make_app(), "127.0.0.1", 0)
    url = bound_url(runner)
    gateway = await start_gateway(
        FAST_MONITOR + HEAVY_AT_500 + one_backend(url, slots=1, kind="llamacpp")
    )
    classes = []
    for _ in range(2):
        finished = Finished(gateway)
        await chat(gateway, messages)
        classes.append((await finished.first(("/v1/chat/completions",))).request_class)
    await runner.cleanup()
    await wait_backend(gateway, "sim", lambda b: not b.state.healthy)
    runner = await start_server(
        Simulator(config).make_app(), "127.0.0.1", int(url.rsplit(":", 1)[1])
    )
    try:
        await wait_backend(gateway, "sim", lambda b: b.state.healthy)
        finished = Finished(gateway)
        await chat(gateway, messages)
        classes.append((await finished.first(("/v1/chat/completions",))).request_class)
    finally:
        await runner.cleanup()
    assert classes == [RequestClass.HEAVY, RequestClass.LIGHT, RequestClass.HEAVY]


@pytest.mark.parametrize(
    ("version", "last"),
    [
        ("0.24.0", RequestClass.HEAVY),
        ("0.32.15", RequestClass.LIGHT),
        ("0.0.0", RequestClass.LIGHT),
    ],
)
async def test_an_ollama_before_0_30_holds_one_prompt_a_slot_and_a_later_one_more(
    start_sim: StartSim, start_gateway: StartGateway, version: str, last: RequestClass
) -> None:
    """Ollama's own runner (before 0.30) keeps one prompt in each of its slots: a prompt
    asked again at once is held (light), but three prompts taking turns on two slots push
    the first out, and it is heavy again, however much room its blocks would take. Since
    0.30 each model runs on a llama-server, whose host cache keeps the first (a build from
    source, 0.0.0, is taken for a current one). The gateway reads which from /api/version."""
    _, url = await start_sim(parallel=2, ollama_version=version)
    gateway = await start_gateway(HEAVY_AT_500 + one_backend(url, slots=2))
    first, second, third = ([{"role": "user", "content": f"{n} {SYSTEM}"}] for n in range(3))
    classes = []
    async with aiohttp.ClientSession() as session:
        for messages in (first, first, second, third, first):
            finished = Finished(gateway)
            body = {"model": MODEL, "messages": messages, "stream": False}
            async with session.post(gateway.url + "/api/chat", json=body) as reply:
                assert reply.status == 200
            classes.append((await finished.first(("/api/chat",))).request_class)
        async with session.get(gateway.url + "/status") as reply:
            backend = (await reply.json())["backends"]["sim"]
    heavy, light = RequestClass.HEAVY, RequestClass.LIGHT
    assert classes == [heavy, light, heavy, heavy, last]
    assert backend["version"] == version  # what the admin sees the gateway took it for


async def test_a_conversation_goes_back_to_the_backend_that_holds_it(
    start_sim: StartSim, start_gateway: StartGateway
) -> None:
    """Two backends, both free: a conversation's next turn goes where its prefix is held
    (the pool's own rule would take the first), and the engine reads it from its cache."""
    _, first_url = await start_sim(flavor="llamacpp", parallel=1)
    _, second_url = await start_sim(flavor="llamacpp", parallel=1)
    gateway = await start_gateway(
        "backends:\n"
        f"  - {{name: one, url: {first_url}, kind: llamacpp, slots: 1}}\n"
        f"  - {{name: two, url: {second_url}, kind: llamacpp, slots: 1}}\n"
        "defaults: {max_concurrent: 2}\n"
    )
    # A long request takes "one" (the pool's first choice), so the conversation starts on
    # "two"; then "one" is free again.
    admission = gateway.services.admission
    held = asyncio.ensure_future(
        chat(gateway, [{"role": "user", "content": "x"}], sim_first_byte_delay=60)
    )
    await until(admission, lambda room: room.backends["one"][0] == 1)
    [opening] = await conversation(gateway, 1, "Our conversation.")
    assert opening.backend == "two"
    held.cancel()
    await until(admission, idle)
    # Both free: its next turns go back to "two", where the engine holds it.
    later = await conversation(gateway, 3, "Our conversation.")
    assert [r.backend for r in later] == ["two", "two", "two"]
    assert all(r.cached_tokens for r in later)


async def test_a_prompt_the_engine_refused_is_not_taken_for_held(
    start_sim: StartSim, start_gateway: StartGateway
) -> None:
    """A client cannot make its own long prompt look cached by sending it first in a
    request the engine refuses (or with llama-server's cache turned off): the gateway holds
    a prefix only once the engine has answered it."""
    _, url = await start_sim(flavor="llamacpp", parallel=1)
    gateway = await start_gateway(HEAVY_AT_500 + one_backend(url, slots=1, kind="llamacpp"))
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hi."}]
    body = {"model": MODEL, "messages": messages, "sim_status": 400}
    async with (
        aiohttp.ClientSession() as session,
        session.post(gateway.url + "/v1/chat/completions", json=body) as reply,
    ):
        assert reply.status == 400
    finished = Finished(gateway)
    await chat(gateway, messages, cache_prompt=False)
    assert (await finished.first(("/v1/chat/completions",))).request_class is RequestClass.HEAVY
    finished = Finished(gateway)
    await chat(gateway, messages)  # the one before did not make this one look cached
    assert (await finished.first(("/v1/chat/completions",))).request_class is RequestClass.HEAVY
    finished = Finished(gateway)
    await chat(gateway, messages)  # now the engine holds it
    record = await finished.first(("/v1/chat/completions",))
    assert record.request_class is RequestClass.LIGHT and record.cached_tokens


async def test_a_turn_the_engine_no_longer_holds_is_charged_as_it_evaluated_it(
    start_sim: StartSim, start_gateway: StartGateway
) -> None:
    """One slot and a small host cache: other long prompts push a conversation out of the
    engine. Its next turn was thought cached (light); the engine's count says it was not,
    and the charge follows the engine, not the guess."""
    simulator, url = await start_sim(flavor="llamacpp", parallel=1)
    simulator.engine.host_cache = HostCache(entries=1)
    gateway = await start_gateway(HEAVY_AT_500 + one_backend(url, slots=1, kind="llamacpp"))
    policy = gateway.services.policy.current.policy
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hi."}]
    await chat(gateway, messages)
    for n in range(3):  # three other long prompts, one after another
        await chat(gateway, [{"role": "user", "content": f"{n} " + SYSTEM[::-1]}])
    before, finished = counter(gateway), Finished(gateway)
    await chat(gateway, messages)
    record = await finished.first(("/v1/chat/completions",))
    assert record.prompt_tokens is not None and record.cached_tokens == 0
    weight = (
        policy.classes.heavy.weight
        if record.request_class is RequestClass.HEAVY
        else policy.classes.light.weight
    )
    expected = (policy.costs.input * record.prompt_tokens + policy.costs.output * 12) / weight
    assert counter(gateway) - before == pytest.approx(expected)


async def test_a_real_llama_servers_cache_makes_later_turns_light(
    llama_server: str, start_gateway: StartGateway
) -> None:
    """The real llama-server: a five-turn conversation with a long system prompt, streamed
    through the OpenAI client; its first turn heavy, the next four light and charged what
    the engine says it evaluated (its timings: no include_usage asked)."""
    gateway = await start_gateway(
        HEAVY_AT_500 + f"backends:\n  - {{name: cpp, url: {llama_server}, kind: llamacpp}}\n"
        "timeouts: {first_byte: 300s}\nqueue: {max_wait: 180s}\n"
    )
    messages: list[Any] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Hi."},
    ]
    records = []
    async with openai.AsyncOpenAI(
        base_url=gateway.url + "/v1", api_key="x", max_retries=0
    ) as client:
        for turn in range(5):
            finished = Finished(gateway)
            stream = await client.chat.completions.create(
                model=MODEL_ALIAS, messages=messages, max_tokens=8, stream=True
            )
            answer = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
            records.append(await finished.first(("/v1/chat/completions",)))
            messages += [
                {"role": "assistant", "content": answer},
                {"role": "user", "content": f"And question {turn + 2}?"},
            ]
    classes = [r.request_class for r in records]
    assert classes == [RequestClass.HEAVY] + [RequestClass.LIGHT] * 4
    for record in records[1:]:
        assert record.prompt_tokens and record.cached_tokens
        assert record.prompt_tokens - record.cached_tokens < 100  # the new end alone


class TestTheSlot:
    """On llama-server the gateway picks the slot (``id_slot``), written last in the body:
    the engine keeps the last of two equal keys, so the client's own cannot win."""

    @pytest.mark.parametrize(
        ("body", "written"),
        [
            (b'{"model":"m"}', b'{"model":"m","id_slot":1}'),
            (b"{}", b'{"id_slot":1}'),
            (b'{ "model": "m" }\n', b'{ "model": "m","id_slot":1}'),
            (b'{"id_slot":0,"model":"m"}', b'{"id_slot":0,"model":"m","id_slot":1}'),
        ],
    )
    def test_the_gateways_slot_is_the_last_key(self, body: bytes, written: bytes) -> None:
        assert with_slot(body, 1) == written
        assert json.loads(written)["id_slot"] == 1  # as any last-wins reader sees it
        # Where the gateway does not choose: llama-server's own choice, not the client's.
        assert json.loads(with_slot(body, None))["id_slot"] == -1

    async def test_a_conversation_keeps_its_slot_and_the_engine_reads_all_of_it(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """Two conversations on a 2-slot llama-server, started at once (one on each slot),
        then taking turns: each goes back to the slot that holds it (its whole history read
        from the cache, not the tools alone), though its client asks for slot 0."""
        simulator, url = await start_sim(flavor="llamacpp", parallel=2, decode_tokens_per_s=20)
        gateway = await start_gateway(
            one_backend(url, slots=2, kind="llamacpp", extra="defaults: {max_concurrent: 2}\n")
        )
        admission = gateway.services.admission
        await until(
            admission, lambda _: gateway.services.policy.current.pool.backends[0].state.slots == 2
        )
        names = ("one", "two")
        histories = {name: [{"role": "system", "content": SYSTEM}] for name in names}

        async def turn(name: str, number: int) -> Any:
            history = histories[name]
            history.append({"role": "user", "content": f"{name} asks {number}"})
            finished = Finished(gateway)
            answer = await chat(gateway, history, tools=TOOLS, id_slot=0)
            history.append({"role": "assistant", "content": answer})
            return await finished.first(("/v1/chat/completions",))

        # The second starts while the first runs: the slot it would wait for is taken.
        first = asyncio.ensure_future(turn("one", 0))
        await until(admission, lambda room: len(room.running) == 1)
        await asyncio.gather(first, turn("two", 0))
        slot_of = {name: self._holding(simulator, f"{name} asks 0") for name in names}
        assert sorted(slot_of.values()) == [0, 1]
        for number in (1, 2):
            for name in names:
                record = await turn(name, number)
                assert self._holding(simulator, f"{name} asks {number}") == slot_of[name]
                # The tools, the system prompt and every earlier turn: read from the cache.
                assert record.prompt_tokens and record.cached_tokens
                assert record.prompt_tokens - record.cached_tokens < 30

    async def test_a_clients_slot_is_not_the_one_the_responses_api_runs_on(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """The Responses API reads ``id_slot`` too: a client naming the slot another
        request holds would wait inside llama-server beside a free slot, where the gateway
        cannot see it. The gateway's word (here -1, a prompt too short to pin) is the one
        the server reads, and the request runs on the free slot at once."""
        simulator, url = await start_sim(flavor="llamacpp", parallel=2)
        gateway = await start_gateway(
            one_backend(url, slots=2, kind="llamacpp", extra="defaults: {max_concurrent: 2}\n")
        )
        pool = gateway.services.policy.current.pool
        await until(gateway.services.admission, lambda _: pool.backends[0].state.slots == 2)
        held = {"model": MODEL, "messages": [{"role": "user", "content": "hold"}], "stream": True}
        asked = {"model": MODEL, "input": "hello", "max_output_tokens": 2}
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                gateway.url + "/v1/chat/completions", json=held | {"sim_stall_after": 1}
            ) as holding,
        ):
            await holding.content.readline()  # it runs, and keeps its slot
            [busy] = [slot.id for slot in simulator.engine.slots if slot.busy]
            answer = session.post(gateway.url + "/v1/responses", json=asked | {"id_slot": busy})
            async with asyncio.timeout(10):  # else it waits for the held slot, forever
                async with answer as reply:
                    assert reply.status == 200, await reply.text()

    @staticmethod
    def _holding(simulator: Any, text: str) -> int:
        [slot] = [s.id for s in simulator.engine.slots if text in s.cached]
        return slot


class TestASecondSlotWarmed:
    """One slot holds the tools; a second conversation would wait for that slot or pay their
    whole prefill on the other. Where llama-server can save a slot and restore it into
    another (``--slot-save-path``), the gateway copies the warm slot's prompt to the idle
    one first, and both slots serve people at once, each reading the tools from its cache."""

    @pytest.mark.parametrize("slot_save", [True, False])
    async def test_on_the_simulator(
        self, start_sim: StartSim, start_gateway: StartGateway, slot_save: bool
    ) -> None:
        simulator, url = await start_sim(
            flavor="llamacpp",
            parallel=2,
            decode_tokens_per_s=20,
            prefill_tokens_per_s=1000,
            slot_save=slot_save,
        )
        gateway = await start_gateway(
            one_backend(url, 2, "llamacpp", HEAVY_AT_500 + "defaults: {max_concurrent: 2}\n")
        )
        pool = gateway.services.policy.current.pool
        await until(gateway.services.admission, lambda _: pool.backends[0].state.slots == 2)
        first, second = await self.two_at_once(gateway, MODEL, tools=TOOLS)
        copies = gateway.services.admission.room.prompts.copies["sim"]
        # The tools and the system prompt read from a cache, by both at once:
        both = self.overlapped(first, second) and all(
            r.prompt_tokens - r.cached_tokens < 40 for r in (first, second)
        )
        if slot_save:
            assert (copies, both) == (1, True)
            # Both slots hold the tools now: later turns copy nothing more.
            await asyncio.gather(*(conversation(gateway, 2, f"{n}", tools=TOOLS) for n in "ab"))
            assert gateway.services.admission.room.prompts.copies["sim"] == 1
        else:  # one waited for the other's slot or evaluated them all; nothing broke
            assert (copies, both) == (0, False)
            assert simulator.engine.saved_slots == {}

    async def test_one_person_alone_has_one_copy_not_one_a_turn(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """A conversation alone warms the second slot once; a slot filled by a copy that no
        request has used since is not filled again, so its later turns copy nothing."""
        simulator, url = await start_sim(
            flavor="llamacpp", parallel=2, prefill_tokens_per_s=1000, slot_save=True
        )
        gateway = await start_gateway(one_backend(url, 2, "llamacpp", HEAVY_AT_500))
        pool = gateway.services.policy.current.pool
        await until(gateway.services.admission, lambda _: pool.backends[0].state.slots == 2)
        messages = [{"role": "system", "content": SYSTEM}]
        for turn in range(4):  # each turn ~750 tokens more: 0.75 s to evaluate elsewhere
            messages.append({"role": "user", "content": f"{turn} " + "word " * 600})
            messages.append({"role": "assistant", "content": await chat(gateway, messages)})
        assert gateway.services.admission.room.prompts.copies["sim"] == 1
        assert len(simulator.engine.saved_slots) == 1

    async def test_on_the_real_llama_server(
        self, llama_server_saving_slots: str, start_gateway: StartGateway
    ) -> None:
        gateway = await start_gateway(
            HEAVY_AT_500 + "defaults: {max_concurrent: 2}\n"
            f"backends:\n  - {{name: cpp, url: {llama_server_saving_slots}, kind: llamacpp}}\n"
            "timeouts: {first_byte: 300s}\nqueue: {max_wait: 180s}\n"
        )
        pool = gateway.services.policy.current.pool
        await until(gateway.services.admission, lambda _: pool.backends[0].state.slots == 2)
        first, second = await self.two_at_once(gateway, MODEL_ALIAS, max_tokens=48)
        assert gateway.services.admission.room.prompts.copies["cpp"] == 1
        for record in (first, second):  # the engine's own counts: read from its cache
            assert record.prompt_tokens and record.cached_tokens
            assert record.prompt_tokens - record.cached_tokens < 60
        assert self.overlapped(first, second)

    @staticmethod
    async def two_at_once(gateway: Gateway, model: str, **fields: Any) -> list[Any]:
        """One conversation's first turn alone; then its second turn and another
        conversation's first, at once: their records."""
        one = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "one asks 0"}]
        answer = await chat(gateway, one, model=model, **fields)
        one += [{"role": "assistant", "content": answer}, {"role": "user", "content": "and 1?"}]
        two = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "two asks 0"}]
        finished = Finished(gateway)
        await asyncio.gather(*(chat(gateway, m, model=model, **fields) for m in (one, two)))
        return await finished.at_least(2)

    @staticmethod
    def overlapped(first: Any, second: Any) -> bool:
        """Each began streaming before the other ended."""
        return bool(first.first_byte_at < second.finished and second.first_byte_at < first.finished)


async def test_the_simulated_ollama_forks_a_shared_prefix_rather_than_overwrite_a_slot(
    start_sim: StartSim,
) -> None:
    """Ollama's runner (InputCache.findBestCacheSlot) copies the longest common prefix into
    its oldest free slot rather than overwrite another conversation's: after a second
    conversation with the same tools, the first is still held whole beside it."""
    simulator, url = await start_sim(parallel=2, ollama_version="0.24.0")
    texts = []
    async with aiohttp.ClientSession() as session:
        for who in ("first", "second"):
            message = {"role": "user", "content": f"the {who} conversation"}
            body = {"model": MODEL, "stream": False, "tools": TOOLS, "messages": [message]}
            async with session.post(url + "/api/chat", json=body) as reply:
                texts.append(await reply.json())
    runner = next(iter(simulator.engine.scheduler.loaded.values()))
    held = [slot.cached for slot in runner.slots.slots]
    assert any("the first conversation" in text for text in held)
    assert any("the second conversation" in text for text in held)
    assert texts[1]["prompt_eval_count"] > 500  # the whole prompt, cached or not


@pytest.mark.parametrize(("version", "held"), [("0.24.0", False), ("0.32.15", True)])
async def test_the_simulated_ollama_since_0_30_gets_a_prompt_back_from_host_memory(
    start_sim: StartSim, version: str, held: bool
) -> None:
    """Since 0.30 each Ollama model runs on a llama-server, whose slots save the prompt they
    let go of in host memory: of three conversations taking turns on two slots, the first
    finds its prompt again, where Ollama's own runner had lost it."""
    _, url = await start_sim(parallel=2, prefill_tokens_per_s=1000, ollama_version=version)
    durations = []
    async with aiohttp.ClientSession() as session:
        for n in (0, 1, 2, 0):
            body = {"model": MODEL, "stream": False}
            body["messages"] = [{"role": "user", "content": f"{n} {SYSTEM}"}]
            async with session.post(url + "/api/chat", json=body) as reply:
                durations.append((await reply.json())["prompt_eval_duration"])
    assert (durations[3] < durations[0] / 10) is held


@pytest.mark.parametrize(
    ("version", "own"),
    [
        ("0.24.0", True),
        ("v0.24.0", True),
        ("0.1.32", True),
        ("0.30.0-rc1", False),
        ("0.32.15", False),
        ("1.0.0", False),
        ("0.0.0", False),  # a build from source: current
        ("", False),
        ("garbage", False),
        (None, False),
        (24, False),
    ],
)
def test_which_ollama_runs_its_own_runner(version: object, own: bool) -> None:
    """What /api/version says decides the cache kept for an Ollama: releases before 0.30
    ran their own runner; a version that does not say is taken for a current one."""
    assert runs_own_runner(version) is own


def test_an_ollama_seen_to_change_engine_is_taken_to_hold_nothing() -> None:
    """An Ollama upgraded (or downgraded) between two probes restarted: what was kept of
    it is gone, though its probes never failed."""
    caches = PromptCaches()
    backend = Backend("gpu", "http://gpu", "ollama", 2, BackendState())
    prefix = Prefix(tuple(range(1, 11)), 2560, MODEL, tuple(range(256, 2561, 256)), 2560)
    for own in (False, True, False):
        backend.state.one_prompt_a_slot = own
        caches.evaluated(backend, prefix, 0, None)
        assert caches.matched(backend, prefix)[0] == 10
        backend.state.one_prompt_a_slot = not own
        assert caches.matched(backend, prefix) == (0, 0)
