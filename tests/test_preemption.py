"""Background work gives its slot to a person at once, runs again from its saved body, and its
client sees only a delay. Real loopback servers: the simulator behind the gateway."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp

from fairsim import Simulator
from gateway.config import background_account
from tests.conftest import Gateway, StartGateway, StartSim, one_backend
from tests.test_admission import MODEL, until
from tests.test_lanes import PEOPLE
from tests.test_metrics import scrape

TASK_PROMPT = "### Task:\nGenerate a concise, 3-5 word title summarizing the chat history."
TASK_TOKENS = 40  # at 20 tokens a second: two seconds of the only slot
CHAT_TOKENS = 4


def body(prompt: str, tokens: int, stream: bool = False) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": prompt}],
        "stream": stream,
        "options": {"num_predict": tokens},
    }


async def post(gateway: Gateway, key: str, sent: dict[str, Any]) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {key}"}
    async with (
        aiohttp.ClientSession() as session,
        session.post(gateway.url + "/api/chat", json=sent, headers=headers) as reply,
    ):
        return reply.status, await reply.text()


async def post_openai(gateway: Gateway, key: str, prompt: str, tokens: int) -> tuple[int, str]:
    sent = {
        "model": MODEL,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": tokens,
    }
    headers = {"Authorization": f"Bearer {key}"}
    async with (
        aiohttp.ClientSession() as session,
        session.post(gateway.url + "/v1/chat/completions", json=sent, headers=headers) as reply,
    ):
        return reply.status, await reply.text()


async def one_slot(
    start_sim: StartSim, start_gateway: StartGateway, lanes: str = ""
) -> tuple[Simulator, Gateway]:
    simulator, url = await start_sim(decode_tokens_per_s=20.0)
    return simulator, await start_gateway(PEOPLE + lanes + one_backend(url, slots=1))


def background_running(user: str) -> Any:
    return lambda snapshot: snapshot.background_users.get(user, (0, 0))[0] == 1


class TestGivingWay:
    async def test_a_person_takes_the_slot_a_task_holds_and_the_task_finishes_after(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """With no lanes setting at all, Open WebUI's title task runs on the idle slot, gives
        it to alice's chat the moment she asks, and then completes whole: a delay, no error."""
        simulator, gateway = await one_slot(start_sim, start_gateway)
        admission = gateway.services.admission
        task = asyncio.create_task(post(gateway, "alice-key", body(TASK_PROMPT, TASK_TOKENS)))
        await until(admission, background_running("alice"))
        status, _ = await post(gateway, "alice-key", body("What is a fjord?", CHAT_TOKENS))
        assert status == 200
        assert not task.done()  # the chat did not wait for the task
        task_status, task_text = await task
        assert task_status == 200
        reply = json.loads(task_text)
        assert reply["done"] is True
        assert reply["eval_count"] == TASK_TOKENS  # run again whole, not cut
        given_way = admission.snapshot().given_way
        assert given_way.restarts == 1
        assert given_way.slot_seconds > 0
        assert simulator.stats.disconnects == 1  # the backend was told to stop the first run
        families = await scrape(gateway)
        assert ("fairgate_background_restarts_total", {}, 1.0) in families[
            "fairgate_background_restarts"
        ]

    async def test_on_llama_server_a_task_holding_the_only_slot_gives_it_up(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """llama-server's capacity is its slots: with the one slot taken the room has no free
        slot at all, and the task still gives it to the person who would wait."""
        _, url = await start_sim(decode_tokens_per_s=20.0)
        gateway = await start_gateway(PEOPLE + one_backend(url, slots=1, kind="llamacpp"))
        admission = gateway.services.admission
        task = asyncio.create_task(post_openai(gateway, "alice-key", TASK_PROMPT, TASK_TOKENS))
        await until(admission, background_running("alice"))
        assert (await post_openai(gateway, "bob-key", "hello", CHAT_TOKENS))[0] == 200
        assert not task.done()
        status, text = await task
        assert status == 200
        assert json.loads(text)["usage"]["completion_tokens"] == TASK_TOKENS
        assert admission.snapshot().given_way.restarts == 1

    async def test_a_task_gives_way_when_a_person_starts_beside_it(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """Two slots, one free: alice's chat starts at once, and the task running on the
        other slot gives way all the same, as the two would share the engine's compute."""
        _, url = await start_sim(decode_tokens_per_s=20.0)
        gateway = await start_gateway(PEOPLE + one_backend(url, slots=2))
        admission = gateway.services.admission
        task = asyncio.create_task(post(gateway, "bob-key", body(TASK_PROMPT, TASK_TOKENS)))
        await until(admission, background_running("bob"))
        assert (await post(gateway, "alice-key", body("hello", CHAT_TOKENS)))[0] == 200
        assert admission.snapshot().given_way.restarts == 1
        assert (await task)[0] == 200

    async def test_beside_people_lets_a_task_share_the_backend(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """With lanes.background.beside_people, a free slot is enough: the task goes on."""
        simulator, url = await start_sim(decode_tokens_per_s=20.0)
        lanes = "lanes: {background: {beside_people: true}}\n"
        gateway = await start_gateway(PEOPLE + lanes + one_backend(url, slots=2))
        admission = gateway.services.admission
        task = asyncio.create_task(post(gateway, "bob-key", body(TASK_PROMPT, TASK_TOKENS)))
        await until(admission, background_running("bob"))
        assert (await post(gateway, "alice-key", body("hello", CHAT_TOKENS)))[0] == 200
        assert (await task)[0] == 200
        assert admission.snapshot().given_way.restarts == 0
        assert simulator.stats.disconnects == 0

    async def test_a_task_gives_way_no_more_than_max_restarts(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """After max_restarts, the task keeps its slot to the end: bob's chat waits for it."""
        lanes = "lanes: {background: {max_restarts: 1}}\n"
        _, gateway = await one_slot(start_sim, start_gateway, lanes)
        admission = gateway.services.admission
        task = asyncio.create_task(post(gateway, "alice-key", body(TASK_PROMPT, TASK_TOKENS)))
        await until(admission, background_running("alice"))
        assert (await post(gateway, "alice-key", body("hello", CHAT_TOKENS)))[0] == 200
        await until(admission, background_running("alice"))  # its second run
        chat = asyncio.create_task(post(gateway, "bob-key", body("hello", CHAT_TOKENS)))
        await until(admission, lambda snapshot: snapshot.users.get("bob") == (0, 1))
        assert (await task)[0] == 200
        assert (await chat)[0] == 200
        assert admission.snapshot().given_way.restarts == 1

    async def test_a_streamed_task_whose_reply_has_begun_keeps_its_slot(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """Bytes that went to a client cannot be sent again: a person waits for that task."""
        _, gateway = await one_slot(start_sim, start_gateway)
        admission = gateway.services.admission
        headers = {"Authorization": "Bearer alice-key"}
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                gateway.url + "/api/chat",
                json=body(TASK_PROMPT, TASK_TOKENS, stream=True),
                headers=headers,
            ) as streamed,
        ):
            await streamed.content.readline()  # its first token is out
            chat = asyncio.create_task(post(gateway, "bob-key", body("hi", CHAT_TOKENS)))
            await until(admission, lambda snapshot: snapshot.users.get("bob") == (0, 1))
            assert admission.snapshot().given_way.restarts == 0
            rest = await streamed.read()
        assert json.loads(rest.splitlines()[-1])["done"] is True
        assert (await chat)[0] == 200

    async def test_a_person_is_not_refused_for_a_room_full_of_running_tasks(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """With the room's depth 0, the quick no would refuse anyone who waits: a person is
        let in when a task can give its slot up."""
        lanes = "queue: {max_depth: 0}\n"
        _, gateway = await one_slot(start_sim, start_gateway, lanes)
        admission = gateway.services.admission
        task = asyncio.create_task(post(gateway, "alice-key", body(TASK_PROMPT, 400)))
        await until(admission, background_running("alice"))
        assert (await post(gateway, "bob-key", body("hi", CHAT_TOKENS)))[0] == 200
        task.cancel()

    async def test_a_task_that_gave_way_waits_again_past_a_full_queue(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """A task that gave its slot to a person waits again even where its lane's queue is
        full: it was counted when it came, and its client is told only a delay, not the 503
        a newcomer would get."""
        lanes = "lanes: {background: {max_queued: 1}}\n"
        _, gateway = await one_slot(start_sim, start_gateway, lanes)
        admission = gateway.services.admission
        running = asyncio.create_task(post(gateway, "alice-key", body(TASK_PROMPT, 20)))
        await until(admission, background_running("alice"))
        waiting = asyncio.create_task(post(gateway, "alice-key", body(TASK_PROMPT, 20)))
        await until(admission, lambda snapshot: snapshot.background_users.get("alice") == (1, 1))
        assert (await post(gateway, "bob-key", body("hello", CHAT_TOKENS)))[0] == 200
        assert [(await running)[0], (await waiting)[0]] == [200, 200]
        assert admission.snapshot().given_way.restarts == 1

    async def test_a_task_giving_way_still_counts_against_its_budget(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """Between giving its slot up and waiting again (its relay being called off), a task
        is in no room; it still counts as in flight for its front end's budget, else a new
        task passes a requests budget in that moment."""
        _, gateway = await one_slot(start_sim, start_gateway)
        admission = gateway.services.admission
        account = background_account("alice")
        task = asyncio.create_task(post(gateway, "alice-key", body(TASK_PROMPT, TASK_TOKENS)))
        await until(admission, background_running("alice"))
        assert admission.in_flight(account) == 1
        [running] = admission.room.preemptions.runs.values()
        running.preempt()  # the room's own call, as a person's arrival makes it
        assert admission.in_flight(account) == 1  # out of the room, not out of flight
        assert (await task)[0] == 200
        assert admission.in_flight(account) == 0

    async def test_a_task_that_gave_way_before_its_turn_was_confirmed_is_not_left_counted(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """With replicas a turn is confirmed in Redis after it is granted; one that gave
        way meanwhile is withdrawn unused (``ReplicaHolds.confirm``) and waits again: it is
        counted in flight once, not once more for good."""
        _, gateway = await one_slot(start_sim, start_gateway)
        admission = gateway.services.admission
        task = asyncio.create_task(post(gateway, "alice-key", body(TASK_PROMPT, TASK_TOKENS)))
        await until(admission, background_running("alice"))
        [running] = admission.room.preemptions.runs.values()
        running.preempt()
        running.withdraw()  # as an unconfirmed turn is given back
        assert admission.room.preemptions.giving_way == {}
        assert (await task)[0] == 200
        assert admission.in_flight(background_account("alice")) == 0

    async def test_the_preset_can_be_turned_off(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """presets: [] makes a task a person's request again (it then takes her place)."""
        _, gateway = await one_slot(start_sim, start_gateway, "lanes: {presets: []}\n")
        admission = gateway.services.admission
        task = asyncio.create_task(post(gateway, "alice-key", body(TASK_PROMPT, TASK_TOKENS)))
        await until(admission, lambda snapshot: snapshot.users.get("alice") == (1, 0))
        assert admission.snapshot().background_users == {}
        assert (await task)[0] == 200


class TestChargedToTheFrontEnd:
    async def test_a_task_is_counted_apart_but_cannot_escape_its_users_budget(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """alice's one request an hour is not spent by her title task (it counts under
        alice/(background)); a second task is refused all the same: a prompt dressed as a
        task gets a budget of the same size, not none."""
        _, url = await start_sim()
        policy = (
            "users:\n  alice: {keys: [alice-key], budget: {requests_per_hour: 1}}\n"
            + one_backend(url, slots=2)
        )
        gateway = await start_gateway(policy)
        assert (await post(gateway, "alice-key", body(TASK_PROMPT, CHAT_TOKENS)))[0] == 200
        assert (await post(gateway, "alice-key", body("hello", CHAT_TOKENS)))[0] == 200
        status, text = await post(gateway, "alice-key", body(TASK_PROMPT, CHAT_TOKENS))
        assert status == 429
        assert json.loads(text)["error"].startswith("background work on alice")
        assert (await post(gateway, "alice-key", body("again", CHAT_TOKENS)))[0] == 429
