"""Budgets: 429 once a user has used a limit, Retry-After until its window renews in the
admin's time zone, never a running stream cut, reloads applied at once, replicas sharing."""

from __future__ import annotations

import asyncio
from datetime import datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import aiohttp
import anthropic
import ollama
import openai
import pytest

from gateway.config.policy import parse_policy
from gateway.config.yaml_reader import PolicyError
from tests.conftest import Gateway, StartGateway, StartSim
from tests.redis_server import redis_url  # noqa: F401 (fixture)
from tests.test_admission import MODEL, held, idle, queued, until

PARIS = "Europe/Paris"


def at(*when: int) -> float:
    """Epoch seconds of a wall-clock time in Paris."""
    return datetime(*when, tzinfo=ZoneInfo(PARIS)).timestamp()  # type: ignore[misc]


class Clock:
    """Wall-clock seconds, moved by hand."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def house(sim_url: str, alice: str, defaults: str = "") -> str:
    return (
        f"defaults: {{max_concurrent: 1, max_queued: 2{defaults}}}\n"
        f"users:\n  alice: {{keys: [alice-key]{alice}}}\n  bob: {{keys: [bob-key]}}\n"
        f"backends:\n  - {{name: sim, url: {sim_url}, kind: ollama, slots: 4}}\n"
    )


async def generate(gateway: Gateway, key: str, **options: Any) -> tuple[int, dict[str, Any], str]:
    """Status, body and Retry-After of a whole generate request of ``key``'s user."""
    body = {"model": MODEL, "prompt": "hi", "stream": False, "options": options}
    headers = {"Authorization": f"Bearer {key}"}
    async with (
        aiohttp.ClientSession() as session,
        session.post(gateway.url + "/api/generate", json=body, headers=headers) as reply,
    ):
        return reply.status, await reply.json(), reply.headers.get("Retry-After", "")


class TestPolicy:
    def test_a_users_budget_fields_replace_the_defaults_one_by_one(self) -> None:
        """Counts as admins write them; unset fields inherit; unlimited lifts one."""
        policy = parse_policy(
            "defaults: {budget: {tokens_per_day: 2M, requests_per_hour: 50}}\n"
            "users:\n"
            "  kids: {keys: [k], budget: {requests_per_hour: 20, slot_seconds_per_day: 1h30m}}\n"
            "  agent: {keys: [a], budget: {tokens_per_day: unlimited, requests_per_minute: 1.5k}}\n"
            "  root:\n    keys: [b]\n"
            "    budget: {tokens_per_day: unlimited, requests_per_hour: unlimited}\n"
            "backends: [{name: b, url: 'http://127.0.0.1:1', slots: 1}]\n"
        )
        kids, agent, guest = (policy.budget_of(u) for u in ("kids", "agent", "guest"))
        assert (kids.tokens_per_day, kids.requests_per_hour) == (2_000_000, 20)
        assert kids.slot_seconds_per_day == 5400.0
        assert (agent.tokens_per_day, agent.requests_per_minute) == (None, 1500)
        assert (guest.tokens_per_day, guest.requests_per_hour) == (2_000_000, 50)
        assert not policy.budget_of("root")  # every default lifted
        assert not parse_policy("backends: [{name: b, url: 'http://x', slots: 1}]").budget_of("x")

    def test_background_work_has_its_keys_budget_unless_a_front_end_shares_it(self) -> None:
        """alice's tasks (her own key) get a budget as large as hers, so a prompt dressed as
        a task doubles at most what she may use; so do a front end's without a total's
        budget (a person's prompt dressed as a task escapes nothing); with one, its people's
        tasks are bounded by it together, not by one person's budget, which one person's
        tasks would use up for everybody; lanes.background.budget wins over all."""
        text = (
            "defaults: {budget: {requests_per_hour: 3}}\n"
            "users:\n  alice: {keys: [a]}\n"
            "  owui: {keys: [o], on_behalf: {header: X-User}}\n"
            "backends: [{name: b, url: 'http://127.0.0.1:1', slots: 1}]\n"
        )
        policy = parse_policy(text)
        assert policy.budget_of("alice/(background)").requests_per_hour == 3
        assert policy.budget_of("owui/(background)").requests_per_hour == 3
        total = "{header: X-User, total: {budget: {requests_per_hour: 600}}}"
        policy = parse_policy(text.replace("{header: X-User}", total))
        assert not policy.budget_of("owui/(background)")
        assert policy.budget_of("owui/(all)").requests_per_hour == 600
        lanes = "lanes: {background: {budget: {requests_per_hour: 100}}}\n"
        policy = parse_policy(text + lanes)
        for account in ("alice/(background)", "owui/(background)"):
            assert policy.budget_of(account).requests_per_hour == 100

    def test_a_policy_is_budgeted_when_any_user_or_the_defaults_have_a_limit(self) -> None:
        """Requests skip the budget lookup only when no budget limits anybody."""
        backends = "backends: [{name: b, url: 'http://127.0.0.1:1', slots: 1}]\n"
        users = "users:\n  kids: {keys: [k]%s}\n  root: {keys: [r]}\n"
        assert not parse_policy(backends).budgeted
        assert not parse_policy(users % "" + backends).budgeted
        assert parse_policy(users % ", budget: {requests_per_hour: 20}" + backends).budgeted
        assert parse_policy("defaults: {budget: {tokens_per_day: 1k}}\n" + backends).budgeted
        lifted = "defaults: {budget: {tokens_per_day: 1k}}\n" + users % (
            ", budget: {tokens_per_day: unlimited}"
        )
        assert parse_policy(lifted + backends).budgeted  # root still has the default's

    def test_a_budget_that_is_not_a_count_is_refused_at_its_line(self) -> None:
        """The message names the file's line and the field, as for every policy error."""
        text = (
            "users:\n  kids:\n    keys: [k]\n    budget:\n      tokens_per_day: lots\n"
            "backends: [{name: b, url: 'http://x', slots: 1}]\n"
        )
        with pytest.raises(PolicyError) as error:
            parse_policy(text, source="fairgate.yaml")
        assert "fairgate.yaml:5" in str(error.value)
        assert "a count such as 50, 500k or 2M, or unlimited" in str(error.value)


class TestWindows:
    async def test_a_days_tokens_used_up_get_429_until_midnight_then_pass_again(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """Mid-afternoon in Paris: 429 in each API's shape with Retry-After to midnight;
        after midnight the same user is admitted."""
        _, sim_url = await start_sim()
        clock = Clock(at(2025, 3, 14, 15, 0, 0))
        text = house(sim_url, ", budget: {tokens_per_day: 20}")
        gateway = await start_gateway(text, clock=clock, time_zone=PARIS)
        assert (await generate(gateway, "alice-key"))[0] == 200  # 13 tokens
        assert (await generate(gateway, "alice-key"))[0] == 200  # 26: past, but it started
        status, body, retry_after = await generate(gateway, "alice-key")
        assert (status, retry_after) == (429, str(9 * 3600))
        assert body["error"] == (
            "alice has used the budget of 20 tokens per day (26 so far); it renews at "
            "Sat 00:00 CET"  # the zone named: whoever reads it may live in another
        )
        client = openai.AsyncOpenAI(
            base_url=gateway.url + "/v1", api_key="alice-key", max_retries=0
        )
        with pytest.raises(openai.RateLimitError) as refused:
            await client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}]
            )
        await client.close()
        error = refused.value.response.json()["error"]
        assert (error["code"], error["type"]) == ("budget_exhausted", "rate_limit_error")
        assert (await generate(gateway, "bob-key"))[0] == 200  # only alice's budget
        clock.now = at(2025, 3, 15, 0, 0, 1)
        assert (await generate(gateway, "alice-key"))[0] == 200

    async def test_a_budget_renewing_in_hours_tells_the_sdks_not_to_wait_for_it(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """The anthropic SDK sleeps through any Retry-After before it tries again (nine
        hours here), the openai SDK retries at once: a 429 to a budget that renews in more
        than a minute says X-Should-Retry: false, and each SDK raises it at its first
        answer; a minute's budget leaves them to wait."""
        _, sim_url = await start_sim()
        clock = Clock(at(2025, 3, 14, 15, 0, 0))
        text = house(sim_url, ", budget: {tokens_per_day: 20}")
        gateway = await start_gateway(text, clock=clock, time_zone=PARIS)
        for _ in range(2):
            assert (await generate(gateway, "alice-key"))[0] == 200  # 26 tokens in all
        history = gateway.services.history
        before = sum(minute.refusals for minute in history.snapshot().minutes)
        sdk = anthropic.AsyncAnthropic(base_url=gateway.url, api_key="alice-key")  # retries: 2
        with pytest.raises(anthropic.RateLimitError) as refused:
            call = sdk.messages.create(model=MODEL, max_tokens=5, messages=[HI])
            await asyncio.wait_for(call, timeout=20)
        await sdk.close()
        assert refused.value.response.headers["X-Should-Retry"] == "false"
        assert sum(minute.refusals for minute in history.snapshot().minutes) == before + 1

        status, headers = await _refused_at_minute(start_sim, start_gateway)
        assert status == 429 and "X-Should-Retry" not in headers

    @pytest.mark.parametrize(
        ("budget", "start", "renews_in"),
        [
            ("requests_per_hour: 2", (2025, 3, 14, 15, 59, 30), 30),
            ("requests_per_minute: 2", (2025, 3, 14, 15, 59, 45), 15),
            ("slot_seconds_per_day: 1ms", (2025, 3, 14, 23, 59, 50), 10),
        ],
    )
    async def test_each_window_refuses_until_it_renews(
        self,
        start_sim: StartSim,
        start_gateway: StartGateway,
        budget: str,
        start: tuple[int, ...],
        renews_in: int,
    ) -> None:
        """The hour's, the minute's and the day's slot time: Retry-After to the window's
        end, and the first request after it is admitted."""
        _, sim_url = await start_sim()
        clock = Clock(at(*start))
        gateway = await start_gateway(
            house(sim_url, f", budget: {{{budget}}}"), clock=clock, time_zone=PARIS
        )
        statuses = [(await generate(gateway, "alice-key"))[0] for _ in range(2)]
        assert statuses[0] == 200
        status, _, retry_after = await generate(gateway, "alice-key")
        assert (status, retry_after) == (429, str(renews_in))
        clock.now += renews_in
        assert (await generate(gateway, "alice-key"))[0] == 200


class TestRequestsInFlight:
    async def test_requests_running_or_waiting_count_against_a_requests_budget(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """With one running and one waiting, a budget of two refuses the third at once."""
        _, sim_url = await start_sim()
        gateway = await start_gateway(house(sim_url, ", budget: {requests_per_hour: 2}"))
        admission = gateway.services.admission
        async with held(gateway, "alice-key", "running"):
            waiting = asyncio.create_task(generate(gateway, "alice-key"))
            await until(admission, queued("alice", 1))
            status, body, _ = await generate(gateway, "alice-key")
            assert status == 429
            assert "2 requests per hour (2 so far)" in body["error"]
        assert (await waiting)[0] == 200
        await until(admission, idle)
        assert (await generate(gateway, "alice-key"))[0] == 429

    async def test_a_burst_passes_a_tokens_budget_by_one_requests_estimate_at_most(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """300 tokens a day, 7 requests of about 90 tokens (a one-word prompt, num_predict
        90) sent at once: each running or waiting reserves its estimate (90), so that 4 are
        served (0, 90, 180 and 270 reserved before them) and 3 get 429; before, all 7 ran."""
        _, sim_url = await start_sim(decode_tokens_per_s=200.0)
        alice = ", max_concurrent: 2, max_queued: 6, budget: {tokens_per_day: 300}"
        gateway = await start_gateway(house(sim_url, alice))
        burst = await asyncio.gather(
            *(generate(gateway, "alice-key", num_predict=90) for _ in range(7))
        )
        served = [body for status, body, _ in burst if status == 200]
        assert len(served) == 4 and [s for s, _, _ in burst].count(429) == 3
        used = sum(body["prompt_eval_count"] + body["eval_count"] for body in served)
        assert used <= 300 + 91  # one request's estimate over, at most

    async def test_a_running_stream_is_never_cut_by_a_budget(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """A budget of 5 tokens: a 40-token stream runs to its end; the next request is 429."""
        _, sim_url = await start_sim()
        gateway = await start_gateway(house(sim_url, ", budget: {tokens_per_day: 5}"))
        headers = {"Authorization": "Bearer alice-key"}
        async with ollama.AsyncClient(host=gateway.url, headers=headers) as client:
            parts = [
                part
                async for part in await client.generate(
                    model=MODEL, prompt="long", stream=True, options={"num_predict": 40}
                )
            ]
        assert parts[-1].done and parts[-1].eval_count == 40
        assert len(parts) == 41
        await until(gateway.services.admission, idle)
        assert (await generate(gateway, "alice-key"))[0] == 429

    async def test_each_person_of_a_front_end_has_the_front_ends_budget_for_themself(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """One request an hour for owui: alice through it uses hers, bob still has his."""
        _, sim_url = await start_sim()
        owui = (
            "  owui:\n    keys: [owui-key]\n    budget: {requests_per_hour: 1}\n"
            "    on_behalf: {header: X-OpenWebUI-User-Email}\n"
        )
        text = house(sim_url, "").replace("users:\n", "users:\n" + owui)
        gateway = await start_gateway(text)
        header = "X-OpenWebUI-User-Email"
        assert await as_person(gateway, header, "alice@example.com") == 200
        await until(gateway.services.admission, idle)
        assert await as_person(gateway, header, "alice@example.com") == 429
        assert await as_person(gateway, header, "bob@example.com") == 200

    async def test_people_a_front_end_names_only_to_be_refused_add_no_rows(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """Fifty made-up people asking for a made-up model: fifty refusals under the front
        end, no row each; a person served has their own, refusals after it included."""
        _, sim_url = await start_sim()
        owui = "  owui:\n    keys: [owui-key]\n    on_behalf: {header: X-Person}\n"
        gateway = await start_gateway(house(sim_url, "").replace("users:\n", "users:\n" + owui))
        for n in range(50):
            assert await as_person(gateway, "X-Person", f"nobody{n}", "made-up:1b") == 404
        assert await as_person(gateway, "X-Person", "alice") == 200
        assert await as_person(gateway, "X-Person", "alice", "made-up:1b") == 404
        usage = gateway.services.snapshot().usage
        assert sorted(user for user in usage if user.startswith("owui")) == ["owui", "owui/alice"]
        assert usage["owui"].today.refused == 50
        assert usage["owui/alice"].today.refused == 1


async def as_person(gateway: Gateway, header: str, person: str, model: str = MODEL) -> int:
    """The status of a generation sent by the front end owui (key owui-key) for ``person``;
    its body never repeats the header's value (error bodies echo nothing the client sent)."""
    body = {"model": model, "prompt": "hi", "stream": False}
    headers = {"Authorization": "Bearer owui-key", header: person}
    async with (
        aiohttp.ClientSession() as session,
        session.post(gateway.url + "/api/generate", json=body, headers=headers) as reply,
    ):
        if reply.status >= 400:
            assert person not in await reply.text()
        return reply.status


class TestReloadAndViews:
    async def test_a_reload_applies_a_changed_budget_at_once_and_keeps_the_counts(
        self, start_sim: StartSim, start_gateway: StartGateway, tmp_path: Path
    ) -> None:
        """Lowered below what was used: refused; raised again: admitted."""
        _, sim_url = await start_sim()
        path = tmp_path / "fairgate.yaml"
        path.write_text(house(sim_url, ", budget: {requests_per_hour: 10}"))
        gateway = await start_gateway(path)
        for _ in range(2):
            assert (await generate(gateway, "alice-key"))[0] == 200
        path.write_text(house(sim_url, ", budget: {requests_per_hour: 2}"))
        assert gateway.services.policy.reload()
        assert (await generate(gateway, "alice-key"))[0] == 429
        path.write_text(house(sim_url, ", budget: {requests_per_hour: 3}"))
        assert gateway.services.policy.reload()
        assert (await generate(gateway, "alice-key"))[0] == 200

    async def test_status_and_where_am_i_show_the_day_and_what_is_left(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """/status (every user) and /ui/me.json (the caller) give used, remaining, renewal."""
        _, sim_url = await start_sim()
        clock = Clock(at(2025, 3, 14, 15, 0, 0))
        text = house(sim_url, "", defaults=", budget: {tokens_per_day: 1k}")
        gateway = await start_gateway(text, clock=clock, time_zone=PARIS)
        assert (await generate(gateway, "alice-key"))[0] == 200
        await until(gateway.services.admission, idle)
        headers = {"Authorization": "Bearer alice-key"}
        async with aiohttp.ClientSession() as session:
            async with session.get(gateway.url + "/status") as reply:
                users = (await reply.json())["users"]
            async with session.get(gateway.url + "/ui/me.json", headers=headers) as reply:
                me = await reply.json()
        expected = {"limit": 1000, "used": 13, "remaining": 987, "renews_at": at(2025, 3, 15)}
        assert users["alice"]["budget"] == {"tokens_per_day": expected}
        assert me["budget"] == {"tokens_per_day": expected}
        assert users["bob"]["budget"]["tokens_per_day"]["used"] == 0
        today = me["today"]
        assert (today["requests"], today["prompt_tokens"] + today["completion_tokens"]) == (1, 13)
        assert today["slot_seconds"] > 0


async def test_two_replicas_on_one_redis_share_one_budget(
    start_sim: StartSim,
    start_gateway: StartGateway,
    redis_url: str,  # noqa: F811
) -> None:
    """Alice's two requests an hour: one on A, one on B, and then neither admits a third."""
    _, sim_url = await start_sim()
    text = house(sim_url, ", budget: {requests_per_hour: 2}")
    a = await start_gateway(text, redis_url=redis_url)
    b = await start_gateway(text, redis_url=redis_url)
    for replica in (a, b):
        assert (await generate(replica, "alice-key"))[0] == 200
        await until(replica.services.admission, idle)
        await replica.services.usage.flush()  # what the loop does every interval
    await a.services.usage.flush()  # A reads B's request back
    assert (await generate(a, "alice-key"))[0] == 429
    assert (await generate(b, "alice-key"))[0] == 429
    assert (await generate(a, "bob-key"))[0] == 200


HI = {"role": "user", "content": "hi"}


async def _refused_at_minute(
    start_sim: StartSim, start_gateway: StartGateway
) -> tuple[int, aiohttp.typedefs.LooseHeaders]:
    """The 429 of a requests_per_minute budget, 15 s before it renews: status, headers."""
    _, sim_url = await start_sim()
    clock = Clock(at(2025, 3, 14, 15, 59, 45))
    text = house(sim_url, ", budget: {requests_per_minute: 1}")
    gateway = await start_gateway(text, clock=clock, time_zone=PARIS)
    assert (await generate(gateway, "alice-key"))[0] == 200
    headers = {"Authorization": "Bearer alice-key"}
    body = {"model": MODEL, "prompt": "hi", "stream": False}
    async with (
        aiohttp.ClientSession() as session,
        session.post(gateway.url + "/api/generate", json=body, headers=headers) as reply,
    ):
        return reply.status, reply.headers


async def test_two_replicas_on_one_redis_share_the_tokens_reserved(
    start_sim: StartSim,
    start_gateway: StartGateway,
    redis_url: str,  # noqa: F811
) -> None:
    """300 tokens a day, requests of about 90 tokens sent at once half to A and half to
    B: the reservations are one count in Redis, so that 4 are served between them, not 4
    on each."""
    _, sim_url = await start_sim(decode_tokens_per_s=200.0)
    text = house(sim_url, ", max_concurrent: 4, max_queued: 6, budget: {tokens_per_day: 300}")
    a = await start_gateway(text, redis_url=redis_url)
    b = await start_gateway(text, redis_url=redis_url)
    burst = await asyncio.gather(
        *(generate(replica, "alice-key", num_predict=90) for replica in (a, b) * 4)
    )
    statuses = [status for status, _, _ in burst]
    assert statuses.count(200) == 4 and statuses.count(429) == 4
    used = sum(body["prompt_eval_count"] + body["eval_count"] for s, body, _ in burst if s == 200)
    assert used <= 300 + 91
