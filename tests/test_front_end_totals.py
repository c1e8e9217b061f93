"""A front end's people together (``on_behalf.total``): whatever names its header sends,
its key holds no more running, waiting or budget than the total allows."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from gateway.config.policy import parse_policy
from gateway.config.yaml_reader import PolicyError
from tests.conftest import Gateway, StartGateway, StartSim
from tests.redis_server import redis_url  # noqa: F401 (fixture)
from tests.test_admission import MODEL, until
from tests.test_budgets import PARIS, Clock, at
from tests.test_hostile_clients import head_of, invited, open_raw, request_head

HEADER = "X-OpenWebUI-User-Email"


def house(sim_url: str, total: str, slots: int = 4) -> str:
    """owui with one running and one waiting request per person, and ``total`` for all."""
    return (
        "users:\n"
        "  owui:\n"
        "    keys: [owui-key]\n"
        "    max_concurrent: 1\n"
        "    max_queued: 1\n"
        f"    on_behalf: {{header: {HEADER}, total: {total}}}\n"
        "  bob: {keys: [bob-key]}\n"
        f"backends:\n  - {{name: sim, url: {sim_url}, kind: ollama, slots: {slots}}}\n"
    )


async def as_person(
    session: aiohttp.ClientSession, gateway: Gateway, person: str, **options: Any
) -> tuple[int, str]:
    """Status and body of a chat owui sends for ``person``, read whole."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "stream": False,
        "options": options,
    }
    headers = {"Authorization": "Bearer owui-key", HEADER: person}
    async with session.post(gateway.url + "/api/chat", json=body, headers=headers) as reply:
        return reply.status, await reply.text()


class TestPolicy:
    def test_a_total_parses_and_bounds_only_its_front_ends_people(self) -> None:
        policy = parse_policy(
            house("http://127.0.0.1:1", "{max_concurrent: 2, budget: {requests_per_hour: 9}}")
        )
        found = policy.together_of("owui/alice")
        assert found is not None and found[0] == "owui/(all)"
        assert found[1].max_concurrent == 2 and found[1].max_queued is None
        assert policy.together_of("owui") == found  # the key's own requests count too
        assert policy.together_of("bob") is None
        budget = policy.budget_of("owui/(all)")
        assert budget.requests_per_hour == 9 and budget.tokens_per_day is None
        assert policy.budgeted

    def test_a_total_with_a_mistake_is_refused_at_its_line(self) -> None:
        with pytest.raises(PolicyError, match="max_queued"):
            parse_policy(house("http://127.0.0.1:1", "{max_queued: -1}"))


class TestWhateverNamesItSends:
    async def test_ten_people_at_once_get_the_totals_places_and_no_more(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """total 1 running, 1 waiting: ten people at once give 1 running, 1 waiting and 8
        refused (without the total: 4 running and 6 waiting), and bob is not held back."""
        _, sim_url = await start_sim(parallel=4)
        gateway = await start_gateway(house(sim_url, "{max_concurrent: 1, max_queued: 1}"))
        admission = gateway.services.admission
        async with aiohttp.ClientSession() as session:
            tasks = [
                asyncio.create_task(as_person(session, gateway, f"p{n}", sim_stall_after=1))
                for n in range(10)
            ]
            refused = []
            async with asyncio.timeout(10):  # the queue's max_wait is 30 s
                for task in asyncio.as_completed(tasks):
                    status, text = await task
                    refused.append(status)
                    if len(refused) == 8:
                        break
            assert refused == [503] * 8
            assert "the people of owui already have 1 running, 1 waiting and 0 on" in text
            snapshot = admission.snapshot()
            running = sum(busy for busy, _ in snapshot.backends.values())
            assert (running, snapshot.queue_depth) == (1, 1)
            body = {"model": MODEL, "prompt": "hi", "stream": False}
            bob = {"Authorization": "Bearer bob-key"}
            async with session.post(gateway.url + "/api/generate", json=body, headers=bob) as r:
                assert r.status == 200  # the total bounds owui's people, not the house
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def test_a_new_name_each_time_does_not_renew_the_budget(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """3 requests a minute for owui's people together: twelve requests, each from a
        person never seen before, give 3 served and 9 refused with 429."""
        _, sim_url = await start_sim()
        clock = Clock(at(2025, 3, 14, 15, 0, 0))  # one minute throughout
        text = house(sim_url, "{budget: {requests_per_minute: 3}}")
        gateway = await start_gateway(text, clock=clock, time_zone=PARIS)
        statuses, said = [], ""
        async with aiohttp.ClientSession() as session:
            for n in range(12):
                status, body = await as_person(session, gateway, f"new{n}@example.com")
                statuses.append(status)
                said = body if status == 429 else said
        assert statuses == [200] * 3 + [429] * 9
        assert "the people of owui together (on_behalf.total) has used the budget" in said

    async def test_a_429_from_the_total_gives_back_what_the_person_reserved(
        self,
        start_sim: StartSim,
        start_gateway: StartGateway,
        redis_url: str,  # noqa: F811
    ) -> None:
        """Each person has a tokens budget of their own, and the people 2 requests an hour
        together, counted across two replicas. With two running on A, a request on B passes
        B's own count, reserves its person's tokens, and is refused by the total's count in
        Redis: a 429, and the person's reservation given back, not left to count."""
        _, sim_url = await start_sim(parallel=4)
        text = house(sim_url, "{budget: {requests_per_hour: 2}}").replace(
            "    max_queued: 1\n", "    max_queued: 1\n    budget: {tokens_per_day: 100k}\n"
        )
        a = await start_gateway(text, redis_url=redis_url)
        b = await start_gateway(text, redis_url=redis_url)
        async with aiohttp.ClientSession() as session:
            held = [
                asyncio.create_task(as_person(session, a, f"a{n}", sim_stall_after=1))
                for n in range(2)
            ]
            await until(a.services.admission, lambda s: len(s.users) == 2)
            status, said = await as_person(session, b, "on-b")
            assert status == 429 and "the people of owui together" in said
            assert not b.services.usage.reserved
            for task in held:
                task.cancel()
            await asyncio.gather(*held, return_exceptions=True)

    async def test_the_total_bounds_the_people_across_replicas(
        self,
        start_sim: StartSim,
        start_gateway: StartGateway,
        redis_url: str,  # noqa: F811
    ) -> None:
        """total 1 running, 1 waiting, two replicas behind one Redis: ann running on A, bea
        on B waits for her (not beside her, as B's own count would let her), cleo on
        either replica is refused at once, and bea runs once ann's ends."""
        _, sim_url = await start_sim(parallel=4)
        text = house(sim_url, "{max_concurrent: 1, max_queued: 1}")
        a = await start_gateway(text, redis_url=redis_url)
        b = await start_gateway(text, redis_url=redis_url)
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
        ann = {"Authorization": "Bearer owui-key", HEADER: "ann"}
        async with aiohttp.ClientSession() as session:
            async with session.post(
                a.url + "/api/chat", json=body | {"options": {"sim_stall_after": 1}}, headers=ann
            ) as running:
                await running.content.readline()  # running on A: its hold is in Redis
                bea = asyncio.create_task(as_person(session, b, "bea"))
                holds = a.services.admission.holds
                assert holds is not None
                async with asyncio.timeout(10):
                    while [p.user for p in holds.house.waiting] != ["owui/bea"]:
                        await holds.released(within=0.1)
                assert not bea.done()
                for replica in (a, b):
                    status, said = await as_person(session, replica, "cleo")
                    assert status == 503, said
            async with asyncio.timeout(10):
                assert (await bea)[0] == 200

    async def test_people_sent_at_once_count_together_before_any_ends(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """The same three a minute, ten new people at once: three admitted (running or
        waiting count already), seven refused."""
        _, sim_url = await start_sim()
        clock = Clock(at(2025, 3, 14, 15, 0, 0))
        text = house(sim_url, "{budget: {requests_per_minute: 3}}", slots=1)
        gateway = await start_gateway(text, clock=clock, time_zone=PARIS)
        async with aiohttp.ClientSession() as session:
            replies = await asyncio.gather(
                *(as_person(session, gateway, f"burst{n}") for n in range(10))
            )
        statuses = sorted(status for status, _ in replies)
        assert statuses == [200] * 3 + [429] * 7
        await until(gateway.services.admission, lambda s: not s.users)


class TestBodiesOnTheirWay:
    async def test_new_names_get_no_more_bodies_read_than_the_totals_places_in_count_and_bytes(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """Slow bodies from a new person each time: two are read (the total's places),
        the third is refused from its head; and of big ones, two at once for the key.
        (With lanes on, a body that may be a task is read too, within a task's size and
        the key's bytes.)"""
        _, sim_url = await start_sim(parallel=4)
        lanes_off = "lanes: {presets: []}\n"
        gateway = await start_gateway(
            lanes_off + house(sim_url, "{max_concurrent: 1, max_queued: 1}")
        )
        slow = []
        for n in range(2):
            _, writer = await invited(gateway, "owui-key", 1000, f"{HEADER}: slow{n}\r\n")
            slow.append(writer)
        reader, third = await open_raw(gateway)
        third.write(request_head("/api/generate", 1000, "owui-key", f"{HEADER}: slow2\r\n"))
        assert (await head_of(reader)).startswith(b"HTTP/1.1 503")
        for writer in (*slow, third):
            writer.close()
        # Bytes: two bodies of the largest size for the key (the total's two places), so
        # two people's 30 MiB uploads go side by side and a third is refused.
        big = [
            await invited(gateway, "owui-key", 30 << 20, f"{HEADER}: big{n}\r\n") for n in (0, 1)
        ]
        reader, writer = await open_raw(gateway)
        writer.write(request_head("/api/generate", 30 << 20, "owui-key", f"{HEADER}: big2\r\n"))
        assert (await head_of(reader)).startswith(b"HTTP/1.1 503")
        writer.close()
        for _, uploading in big:
            uploading.close()


class TestNamesAPersonCannotHave:
    def test_a_name_that_only_ends_like_an_account_is_a_person(self) -> None:
        """owui/x/(all) is a person named x/(all): the front end's budget for them, not the
        total's (which would be none for a person)."""
        policy = parse_policy(
            house("http://127.0.0.1:1", "{max_concurrent: 2}").replace(
                "    max_queued: 1\n", "    max_queued: 1\n    budget: {requests_per_minute: 1}\n"
            )
        )
        for name in ("owui/x/(all)", "owui/x/(background)"):
            assert policy.budget_of(name).requests_per_minute == 1, name

    @pytest.mark.parametrize("name", ["(all)", "(background)"])
    async def test_a_header_naming_an_account_of_the_front_ends_is_refused(
        self, start_sim: StartSim, start_gateway: StartGateway, name: str
    ) -> None:
        """owui/(all) is where its people count together, owui/(background) its tasks: a
        person so named would spend (or escape) those."""
        _, sim_url = await start_sim()
        gateway = await start_gateway(house(sim_url, "{max_concurrent: 2}"))
        async with aiohttp.ClientSession() as session:
            status, text = await as_person(session, gateway, name)
        assert status == 400 and "is not a person's name" in text
