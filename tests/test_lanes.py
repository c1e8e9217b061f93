"""Lanes: a front end's background work (titles, tags, follow-ups) never costs a person their
place. Real loopback servers: the simulator behind the gateway."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gateway.config.lanes import LaneRule
from gateway.core.vocabulary import Lane
from tests.conftest import Gateway, StartGateway, StartSim, one_backend
from tests.test_admission import MODEL, idle, queued, until
from tests.test_metrics import scrape

SAMPLES = Path(__file__).parent / "samples" / "open-webui"  # captured from Open WebUI 0.12.4
TITLE_PROMPT = "### Task:\nGenerate a concise title summarizing the chat history."
PEOPLE = """\
defaults: {max_concurrent: 1, max_queued: 1}
users:
  alice: {keys: [alice-key]}
  bob: {keys: [bob-key]}
  agent: {keys: [agent-key]}
"""


def chat_body(prompt: str, hold: bool = False) -> dict[str, Any]:
    body: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": prompt}]}
    if hold:
        body["options"] = {"sim_stall_after": 1}  # one token, then hold the slot
    else:
        body["stream"] = False
    return body


@asynccontextmanager
async def running(
    gateway: Gateway, key: str, prompt: str, headers: dict[str, str] | None = None
) -> AsyncIterator[None]:
    """A request that holds its slot for the duration of the block."""
    sent = {"Authorization": f"Bearer {key}", **(headers or {})}
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            gateway.url + "/api/chat", json=chat_body(prompt, hold=True), headers=sent
        ) as reply,
    ):
        assert reply.status == 200
        await reply.content.readline()
        yield


async def ask(
    gateway: Gateway, key: str, prompt: str, headers: dict[str, str] | None = None
) -> tuple[int, str]:
    """A whole chat: its status and body."""
    sent = {"Authorization": f"Bearer {key}", **(headers or {})}
    async with (
        aiohttp.ClientSession() as session,
        session.post(gateway.url + "/api/chat", json=chat_body(prompt), headers=sent) as reply,
    ):
        return reply.status, await reply.text()


def lanes_in(gateway: Gateway) -> dict[str, tuple[int, int]]:
    return gateway.services.admission.snapshot().background_users


async def house(
    start_sim: StartSim, start_gateway: StartGateway, lanes: str, slots: int = 2
) -> Gateway:
    _, url = await start_sim(parallel=8)
    return await start_gateway(PEOPLE + lanes + one_backend(url, slots=slots))


class TestWhichLane:
    async def test_the_named_header_puts_a_task_in_the_background(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """Open WebUI's {{TASK}} in the admin's header: non-empty is background, empty is
        the person's own chat."""
        gateway = await house(start_sim, start_gateway, "lanes: {header: X-OWUI-Task}\n")
        task = {"X-OWUI-Task": "title_generation"}
        async with running(gateway, "alice-key", "title", task):
            assert lanes_in(gateway) == {"alice": (1, 0)}
            assert gateway.services.admission.snapshot().users == {}
        async with running(gateway, "alice-key", "chat", {"X-OWUI-Task": ""}):
            assert gateway.services.admission.snapshot().users == {"alice": (1, 0)}

    async def test_the_open_webui_preset_knows_a_task_by_its_prompt(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """With the preset, a prompt starting '### Task:' is background, any other chat not."""
        gateway = await house(start_sim, start_gateway, "lanes: {presets: [open-webui]}\n")
        async with running(gateway, "alice-key", TITLE_PROMPT):
            assert lanes_in(gateway) == {"alice": (1, 0)}
            lanes = (await scrape(gateway))["fairgate_lane_requests"]
            assert (
                "fairgate_lane_requests",
                {"lane": "background", "state": "running"},
                1.0,
            ) in lanes
        async with running(gateway, "alice-key", "Plan a trip to Lisbon"):
            assert lanes_in(gateway) == {}

    async def test_a_chat_with_a_document_is_the_persons_whatever_its_template(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """Open WebUI's RAG template wraps a person's question about a document (or a web
        search) in a '### Task:': interactive by the preset; by the header, empty is the
        person's own chat whatever the prompt, and a task their reply waits for (the search
        queries) is theirs too; titles stay background."""
        rag = "### Task:\nRespond to the user query using the provided context.\n<context>"
        gateway = await house(start_sim, start_gateway, "")
        async with running(gateway, "alice-key", rag):
            assert lanes_in(gateway) == {}
        # Open WebUI's own templates for the tasks a reply waits for (search queries,
        # autocomplete, the image prompt): the person's too, by their prompt alone.
        for awaited in (
            "### Task:\nAnalyze the chat history to determine the necessity of generating "
            "search queries, in the given language.",
            "### Task:\nYou are an autocompletion system. Continue the text in `<text>`",
            "### Task:\nGenerate a detailed prompt for am image generation task based on",
        ):
            async with running(gateway, "alice-key", awaited):
                assert lanes_in(gateway) == {}
        gateway = await house(start_sim, start_gateway, "lanes: {header: X-OWUI-Task}\n")
        for task, lane in (("", {}), ("query_generation", {}), ("title_generation", None)):
            async with running(gateway, "alice-key", TITLE_PROMPT, {"X-OWUI-Task": task}):
                assert lanes_in(gateway) == (lane if lane is not None else {"alice": (1, 0)})
        async with running(gateway, "alice-key", TITLE_PROMPT):  # not sent: the preset
            assert lanes_in(gateway) == {"alice": (1, 0)}

    async def test_a_refusal_names_the_wait_of_its_own_lane(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """lanes.interactive.max_wait 1s beside queue.max_wait 30s: the 503 a person reads
        (Open WebUI shows it word for word) says the 1 s they were given."""
        lanes = "queue: {max_wait: 30s}\nlanes: {interactive: {max_wait: 1s}}\n"
        gateway = await house(start_sim, start_gateway, lanes, slots=1)
        async with running(gateway, "alice-key", "a long story"):
            status, said = await ask(gateway, "bob-key", "hello")
        assert status == 503 and "no slot freed within max_wait 1s" in said, said

    async def test_rules_match_by_user_and_by_path(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """A rule for the agent's key puts all its work in the background."""
        rules = "lanes:\n  rules:\n    - {lane: background, users: [agent]}\n"
        gateway = await house(start_sim, start_gateway, rules)
        async with running(gateway, "agent-key", "summarise the logs"):
            assert lanes_in(gateway) == {"agent": (1, 0)}


class TestBackgroundNeverCostsAPlace:
    async def test_a_title_task_running_does_not_take_the_persons_place(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """max_concurrent 1: with her title task running, alice's chat still starts at once."""
        gateway = await house(start_sim, start_gateway, "lanes: {presets: [open-webui]}\n")
        async with running(gateway, "alice-key", TITLE_PROMPT):
            status, _ = await asyncio.wait_for(ask(gateway, "alice-key", "hello"), timeout=5)
            assert status == 200

    async def test_background_work_holds_at_most_its_share_of_slots(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """max_slots 1 of 2: a second task waits although a slot is free; a person's chat
        takes that slot at once."""
        lanes = "lanes: {presets: [open-webui], background: {max_slots: 1, max_concurrent: 2}}\n"
        gateway = await house(start_sim, start_gateway, lanes)
        admission = gateway.services.admission
        async with running(gateway, "alice-key", TITLE_PROMPT):
            second = asyncio.create_task(ask(gateway, "alice-key", TITLE_PROMPT + " 2"))
            await until(admission, lambda snap: snap.background_users.get("alice") == (1, 1))
            assert (await asyncio.wait_for(ask(gateway, "bob-key", "hi"), timeout=5))[0] == 200
        assert (await asyncio.wait_for(second, timeout=5))[0] == 200
        await until(admission, idle)

    async def test_a_freed_slot_goes_to_the_person_before_the_earlier_task(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """One slot: a task that has waited longer still goes after a person's chat."""
        gateway = await house(start_sim, start_gateway, "lanes: {presets: [open-webui]}\n", slots=1)
        admission = gateway.services.admission
        finished: list[str] = []

        async def noted(name: str, key: str, prompt: str) -> None:
            await ask(gateway, key, prompt)
            finished.append(name)

        async with running(gateway, "bob-key", "holding the slot"):
            task = asyncio.create_task(noted("task", "alice-key", TITLE_PROMPT))
            await until(admission, lambda snap: snap.queue_depth == 1)
            chat = asyncio.create_task(noted("chat", "alice-key", "hello"))
            await until(admission, lambda snap: snap.queue_depth == 2)
        await asyncio.wait_for(asyncio.gather(task, chat), timeout=10)
        assert finished == ["chat", "task"]

    async def test_a_task_leaves_a_slot_alone_while_a_person_waits_for_the_backend(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """Heavy lane full (1 of 2 slots): alice's heavy chat waits for it, and a task does
        not take the free slot meanwhile; once alice runs, the task gets it."""
        lanes = "classes: {heavy: {min_prompt_tokens: 100, max_slots: 1}}\n"
        lanes += "lanes: {presets: [open-webui]}\n"
        gateway = await house(start_sim, start_gateway, lanes)
        admission = gateway.services.admission
        long = "a long document " * 40  # about 170 tokens: heavy here
        async with running(gateway, "bob-key", long):
            chat = asyncio.create_task(ask(gateway, "alice-key", long))
            await until(admission, queued("alice", 1))
            task = asyncio.create_task(ask(gateway, "agent-key", TITLE_PROMPT))
            await until(admission, lambda snap: snap.background_users.get("agent") == (0, 1))
            assert admission.snapshot().backends == {"sim": (1, 2)}
        assert (await asyncio.wait_for(chat, timeout=5))[0] == 200
        assert (await asyncio.wait_for(task, timeout=5))[0] == 200

    async def test_a_person_arriving_at_a_full_room_displaces_the_newest_task(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """max_depth 1, held by a waiting task: a person's chat takes its place; the task
        gets a 503 that says why."""
        lanes = "queue: {max_depth: 1}\nlanes: {presets: [open-webui]}\n"
        gateway = await house(start_sim, start_gateway, lanes, slots=1)
        admission = gateway.services.admission
        async with running(gateway, "bob-key", "holding the slot"):
            task = asyncio.create_task(ask(gateway, "alice-key", TITLE_PROMPT))
            await until(admission, lambda snap: snap.queue_depth == 1)
            chat = asyncio.create_task(ask(gateway, "alice-key", "hello"))
            status, body = await asyncio.wait_for(task, timeout=5)
            assert status == 503
            assert json.loads(body)["error"].startswith(
                "background work gave its place to alice's request"
            )
            assert admission.snapshot().users["alice"] == (0, 1)
        assert (await asyncio.wait_for(chat, timeout=5))[0] == 200
        await until(admission, idle)

    async def test_a_person_is_never_displaced_by_a_task(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """max_depth 1 held by a person's waiting chat: a task arriving is refused itself."""
        lanes = "queue: {max_depth: 1}\nlanes: {presets: [open-webui]}\n"
        gateway = await house(start_sim, start_gateway, lanes, slots=1)
        admission = gateway.services.admission
        async with running(gateway, "bob-key", "holding the slot"):
            chat = asyncio.create_task(ask(gateway, "alice-key", "hello"))
            await until(admission, lambda snap: snap.queue_depth == 1)
            assert (await ask(gateway, "alice-key", TITLE_PROMPT))[0] == 503
        assert (await asyncio.wait_for(chat, timeout=5))[0] == 200


def test_the_lanes_vocabulary_is_the_policys() -> None:
    """The lanes the policy names are the vocabulary's."""
    assert [lane.value for lane in Lane] == ["interactive", "background"]


@pytest.mark.skipif(
    not SAMPLES.exists(), reason="the Open WebUI captures are not beside the checkout"
)
def test_the_captured_tasks_start_as_the_preset_expects() -> None:
    """Each captured Open WebUI task request's last message starts with '### Task:'."""
    for name in ("title-request.json", "tags-request.json", "follow-ups-request.json"):
        body = json.loads((SAMPLES / name).read_text())
        assert body["messages"][-1]["content"].startswith("### Task:"), name


FRONT_END = """\
defaults: {max_concurrent: 1, max_queued: 0}
users:
  owui: {keys: [owui-key], on_behalf: {header: X-OpenWebUI-User-Email}}
  bob: {keys: [bob-key]}
"""


class TestOnBehalf:
    async def test_each_person_behind_a_front_end_has_their_own_place(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """One front-end key, two people: each gets max_concurrent 1 of their own, and a
        refusal names the person, not the key."""
        _, url = await start_sim(parallel=8)
        gateway = await start_gateway(FRONT_END + one_backend(url, slots=4))
        alice = {"X-OpenWebUI-User-Email": "alice@example.com"}
        carol = {"X-OpenWebUI-User-Email": "carol@example.com"}
        async with running(gateway, "owui-key", "long answer", alice):
            assert (await ask(gateway, "owui-key", "hi", carol))[0] == 200
            status, body = await ask(gateway, "owui-key", "again", alice)
            assert status == 503
            assert json.loads(body)["error"].startswith(
                "user owui/alice@example.com already has 1 running"
            )
            users = gateway.services.admission.snapshot().users
            assert users == {"owui/alice@example.com": (1, 0)}

    async def test_only_the_front_ends_key_is_trusted_with_the_header(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """bob's key with the header is still bob: he cannot pose as another person."""
        _, url = await start_sim(parallel=8)
        gateway = await start_gateway(FRONT_END + one_backend(url, slots=4))
        posing = {"X-OpenWebUI-User-Email": "alice@example.com"}
        async with running(gateway, "bob-key", "hold", posing):
            assert gateway.services.admission.snapshot().users == {"bob": (1, 0)}

    async def test_a_lane_rule_for_the_front_end_holds_for_each_person_it_names(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """rules: [{lane: background, users: [owui]}] puts alice's request, which the front
        end names, in the background: the rule is not lost on the people behind the key."""
        _, url = await start_sim(parallel=8)
        rules = "lanes:\n  rules:\n    - {lane: background, users: [owui]}\n"
        gateway = await start_gateway(FRONT_END + rules + one_backend(url, slots=4))
        alice = {"X-OpenWebUI-User-Email": "alice@example.com"}
        async with running(gateway, "owui-key", "summarise", alice):
            assert lanes_in(gateway) == {"owui/alice@example.com": (1, 0)}
            assert gateway.services.admission.snapshot().users == {}


def test_a_rule_naming_a_model_matches_every_spelling_ollama_runs_as_it() -> None:
    """A rule for nomic-embed-text holds for NOMIC-EMBED-TEXT:latest too: Ollama runs
    the one model for both, so a client cannot step out of the lane by its spelling."""
    rule = LaneRule(lane=Lane.BACKGROUND, models=["nomic-embed-text"])
    for spelling in ("nomic-embed-text", "NOMIC-EMBED-TEXT:latest", "library/nomic-embed-text"):
        assert rule.matches("alice", spelling, "/api/embed", None)
    assert not rule.matches("alice", "nomic-embed-text:v1.5", "/api/embed", None)


def test_a_rule_naming_a_front_end_holds_for_the_people_it_names() -> None:
    """A rule for owui holds for owui/alice@example.com, whose limits and models are owui's
    too; a rule for one person holds for that person only."""
    front_end = LaneRule(lane=Lane.BACKGROUND, users=["owui"])
    assert front_end.matches("owui", MODEL, "/api/chat", None)
    assert front_end.matches("owui/alice@example.com", MODEL, "/api/chat", None)
    assert not front_end.matches("owuix", MODEL, "/api/chat", None)
    person = LaneRule(lane=Lane.BACKGROUND, users=["owui/alice@example.com"])
    assert person.matches("owui/alice@example.com", MODEL, "/api/chat", None)
    assert not person.matches("owui/carol@example.com", MODEL, "/api/chat", None)
    assert not person.matches("owui", MODEL, "/api/chat", None)
