"""The house page, "where am I" and the /status they read, in a real browser (Debian's
chromium, driven by playwright) against a real gateway and simulator on loopback; and the
picture of the house page in the docs, taken here."""

from __future__ import annotations

import asyncio
import hashlib
import re
import struct
import time
import zlib
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.typedefs import Handler
from playwright.async_api import Browser, ConsoleMessage, Page, expect

from gateway.admission.parallelism import SERIAL_TO_CONCLUDE
from gateway.app import create_app
from gateway.config.policy import parse_policy
from gateway.config.settings import Settings
from tests.conftest import Gateway, StartGateway, StartSim, serve
from tests.test_admission import MODEL, queued, until
from tests.test_anthropic import UNKNOWN_KEY
from tests.test_parallelism import behind_slots_2
from tests.test_preemption import TASK_PROMPT, body, post

REPO = Path(__file__).resolve().parent.parent
PROMPT = "please summarise the minutes of the last meeting " * 4  # a few dozen tokens


def house(sim_url: str, slots: int = 2, scheduling: str = "fair") -> str:
    return f"""\
scheduling: {scheduling}
defaults: {{max_concurrent: 1, max_queued: 3}}
users:
  alice: {{keys: [alice-key], admin: true}}
  bob: {{keys: [bob-key], budget: {{requests_per_hour: 100}}}}
  agent: {{keys: [agent-key]}}
  carol: {{keys: [carol-key], max_queued: 5, weight: 2}}
backends:
  - {{name: gpu, url: {sim_url}, kind: ollama, slots: {slots}}}
"""


class Stream:
    """One streamed chat of ``key``'s user: opened in the background (it waits for its turn
    like any client), stalled after its first token so that it holds its slot, and ended
    on demand."""

    def __init__(self, gateway: Gateway, key: str, person: str | None = None) -> None:
        self.user = key.removesuffix("-key")
        self.started = asyncio.Event()
        self._end = asyncio.Event()
        self._task = asyncio.create_task(self._run(gateway.url, key, person))

    async def _run(self, url: str, key: str, person: str | None) -> None:
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": PROMPT}],
            "options": {"sim_stall_after": 1},
        }
        headers = {"Authorization": f"Bearer {key}"}
        if person is not None:  # a front end's user, named in its on_behalf header
            headers["X-Person"] = person
        async with (
            aiohttp.ClientSession() as session,
            session.post(url + "/api/chat", json=body, headers=headers) as reply,
        ):
            assert reply.status == 200
            await reply.content.readline()
            self.started.set()
            await self._end.wait()

    @property
    def ended(self) -> bool:
        return self._end.is_set()

    async def end(self) -> None:
        self._end.set()
        await self._task


@pytest.fixture
async def streams() -> AsyncIterator[list[Stream]]:
    """Streams a test opens; whatever is still open at the end is ended."""
    opened: list[Stream] = []
    yield opened
    for stream in opened:
        await stream.end()


async def open_stream(streams: list[Stream], gateway: Gateway, key: str) -> Stream:
    stream = Stream(gateway, key)
    streams.append(stream)
    return stream


async def get_json(url: str, key: str | None = None) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with aiohttp.ClientSession() as session, session.get(url, headers=headers) as reply:
        return reply.status, await reply.json()


def running_users(gateway: Gateway) -> list[str]:
    return [run.user for run in gateway.services.admission.snapshot().running]


class TestWhereAmI:
    async def test_who_runs_is_told_to_the_household_and_a_persons_address_to_nobody(
        self, start_sim: StartSim, start_gateway: StartGateway, streams: list[Stream]
    ) -> None:
        """A front end's person and bob run: bob reads "owui, bob", not the person's
        address; a caller with no key (anonymous) reads how busy the house is, not who."""
        _, sim_url = await start_sim(parallel=4)
        gateway = await start_gateway(
            "users:\n"
            "  bob: {keys: [bob-key]}\n"
            "  owui: {keys: [owui-key], on_behalf: {header: X-Person}}\n"
            "  anonymous: {max_concurrent: 1}\n"
            f"backends:\n  - {{name: gpu, url: {sim_url}, kind: ollama, slots: 2}}\n"
        )
        person = Stream(gateway, "owui-key", person="alice.private@example.com")
        streams.append(person)
        await person.started.wait()
        await (await open_stream(streams, gateway, "bob-key")).started.wait()

        status, me = await get_json(gateway.url + "/ui/me.json", "bob-key")
        assert status == 200
        assert me["house"]["running_users"] == ["owui", "bob"]
        assert me["summary"] == "2 of 2 slots busy: owui, bob; yours is running"
        status, me = await get_json(gateway.url + "/ui/me.json")
        assert (status, me["user"]) == (200, "anonymous")
        assert me["house"]["running_users"] == []
        assert me["summary"] == "2 of 2 slots busy; nobody waiting"
        assert "example.com" not in str(me)

    @pytest.mark.parametrize(
        ("scheduling", "order"),
        # fair: lifted level with bob, carol (weight 2) is charged half as much for the same
        # prompt, so her request has the earlier finish.
        [("fifo", ["bob", "bob", "carol"]), ("fair", ["carol", "bob", "bob"])],
    )
    async def test_my_position_and_estimate_are_the_order_the_room_then_keeps(
        self,
        start_sim: StartSim,
        start_gateway: StartGateway,
        streams: list[Stream],
        scheduling: str,
        order: list[str],
    ) -> None:
        """Bob, bob, carol wait for alice's slot: /ui/me.json gives each their position and
        estimate, and the slot then goes to them in exactly that order."""
        _, sim_url = await start_sim(parallel=4)
        gateway = await start_gateway(house(sim_url, slots=1, scheduling=scheduling))
        admission = gateway.services.admission
        await (await open_stream(streams, gateway, "alice-key")).started.wait()
        bob_count = 0
        for user in ("bob", "bob", "carol"):
            await open_stream(streams, gateway, f"{user}-key")
            bob_count += user == "bob"
            count = bob_count if user == "bob" else 1
            await until(admission, lambda s, u=user, n=count: s.users.get(u, (0, 0))[1] == n)

        starts = {}
        for user in ("bob", "carol"):
            status, me = await get_json(gateway.url + "/ui/me.json", f"{user}-key")
            assert status == 200
            positions = [n + 1 for n, name in enumerate(order) if name == user]
            assert [w["position"] for w in me["waiting"]] == positions
            assert [w["ahead"] for w in me["waiting"]] == [p - 1 for p in positions]
            starts.update((w["position"], w["estimated_start_seconds"]) for w in me["waiting"])
            ahead = positions[0] - 1
            tail = f"{ahead} ahead of you" if ahead else "you are next"
            assert me["summary"] == f"1 of 1 slot busy: alice; {tail}"
            assert me["limits"]["max_queued"] == (5 if user == "carol" else 3)
        # One slot: the first starts when alice's likely ends (within a hold from now), each
        # next one a hold later (nothing timed yet: the default decode, and the prefill of
        # their few tokens). Carol's was read after the others': alice had run a little
        # longer (on a loaded machine, many milliseconds).
        first, hold = starts[1], starts[2] - starts[1]
        assert 5.0 < hold < 5.1
        assert 0 < first <= hold
        assert first + 2 * hold - 1.0 < starts[3] <= first + 2 * hold + 0.002

        await streams[0].end()  # alice's
        for user in order:
            await until(admission, lambda s, u=user: [r.user for r in s.running] == [u])
            turn = next(s for s in streams if s.user == user and not s.ended)  # hers in order
            await turn.started.wait()
            await turn.end()

    async def test_an_unknown_key_gets_401_from_where_am_i(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """/ui/me.json needs a key the policy knows, as any request does."""
        _, sim_url = await start_sim()
        gateway = await start_gateway(house(sim_url))
        status, body = await get_json(gateway.url + "/ui/me.json", "nobody-key")
        assert status == 401
        assert body == {"error": UNKNOWN_KEY}

    async def test_status_shows_limits_and_the_day_of_every_user(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """After one reply, /status lists every configured user with limits, and bob's day."""
        _, sim_url = await start_sim()
        gateway = await start_gateway(house(sim_url))
        body = {"model": MODEL, "prompt": "hi", "stream": False}
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                gateway.url + "/api/generate",
                json=body,
                headers={"Authorization": "Bearer bob-key"},
            ) as reply,
        ):
            assert reply.status == 200
            await reply.read()
        await until(gateway.services.admission, lambda s: not s.running)
        status, state = await get_json(gateway.url + "/status")
        assert status == 200
        assert set(state["users"]) == {"alice", "bob", "agent", "carol"}
        bob = state["users"]["bob"]
        assert (bob["max_concurrent"], bob["max_queued"], bob["weight"]) == (1, 3, 1.0)
        assert bob["today"]["requests"] == 1
        assert bob["today"]["completion_tokens"] > 0
        assert state["users"]["carol"]["weight"] == 2.0
        assert state["last_hour"][-1]["requests"] == 1
        assert state["last_hour"][-1]["ttft_p50"] is not None


# The browser -------------------------------------------------------------------------


class Watched:
    """A page, with what its console said and each time its main frame loaded."""

    def __init__(self, page: Page) -> None:
        self.page = page
        self.errors: list[str] = []
        self.loads = 0
        self.urls: list[str] = []
        page.on("console", self._console)
        page.on("pageerror", lambda error: self.errors.append(f"uncaught: {error}"))
        page.on("request", lambda request: self.urls.append(request.url))
        page.on("load", self._loaded)

    def _console(self, message: ConsoleMessage) -> None:
        if message.type == "error":
            self.errors.append(message.text)

    def _loaded(self, page: Page) -> None:
        self.loads += 1

    def script_errors(self) -> list[str]:
        """Errors other than the browser's note of a refused fetch (401/403 are answers)."""
        refused = ("status of 401", "status of 403")
        return [e for e in self.errors if not any(words in e for words in refused)]


@asynccontextmanager
async def opened(browser: Browser, shots: Path, name: str) -> AsyncIterator[Watched]:
    """A new page; if the block fails, a screenshot of it is saved in ``shots``."""
    page = await browser.new_page(viewport={"width": 1000, "height": 900})
    try:
        yield Watched(page)
    except BaseException:
        shot = shots / f"{name}.png"
        await page.screenshot(path=shot, full_page=True)
        print(f"screenshot of the page at the failure: {shot}")  # shown with the failure
        raise
    finally:
        await page.close()


@web.middleware
async def from_another_machine(request: web.Request, handler: Handler) -> web.StreamResponse:
    """As a laptop elsewhere in the house would reach the gateway: not from loopback."""
    return await handler(request.clone(remote="192.0.2.7"))


class TestHousePage:
    async def test_a_model_loaded_since_the_last_probe_shows_in_memory_as_the_cli_says(
        self,
        start_sim: StartSim,
        start_gateway: StartGateway,
        streams: list[Stream],
        browser: Browser,
        tmp_path: Path,
    ) -> None:
        """Bob's chat loads the model a minute before the next probe: the page says it is in
        memory at once, as `fairgate status` does (both read the gateway's own record)."""
        _, sim_url = await start_sim(parallel=4)
        gateway = await start_gateway("monitoring: {interval: 60s}\n" + house(sim_url))
        await (await open_stream(streams, gateway, "bob-key")).started.wait()

        async with opened(browser, tmp_path, "in-memory") as watched:
            page = watched.page
            await page.goto(gateway.url + "/ui")
            meta = page.locator(".backend .meta")
            await expect(meta).to_contain_text(f"in memory: {MODEL}", timeout=3000)

    async def test_a_backend_that_runs_fewer_than_its_slots_is_said_with_the_fix(
        self, start_sim: StartSim, start_gateway: StartGateway, browser: Browser, tmp_path: Path
    ) -> None:
        """slots: 2 in front of an Ollama that runs 1: once found, the backend's card says
        so in red, with what to set, as /status and `fairgate status` do."""
        _, gateway, gpu = await behind_slots_2(start_sim, start_gateway, 1, SERIAL_TO_CONCLUDE)
        assert gpu.slots == 1
        async with opened(browser, tmp_path, "runs-fewer") as watched:
            page = watched.page
            await page.goto(gateway.url + "/ui")
            said = page.locator(".backend .error")
            await expect(said).to_contain_text("runs 1 request at once, not the 2", timeout=3000)
            await expect(said).to_contain_text("OLLAMA_NUM_PARALLEL=2")

    async def test_the_page_shows_busy_slots_and_the_waiter_then_follows_a_stream_ending(
        self,
        start_sim: StartSim,
        start_gateway: StartGateway,
        streams: list[Stream],
        browser: Browser,
        tmp_path: Path,
    ) -> None:
        """Two streams run and carol waits: both slots and her position show; when agent's
        stream ends, within 2 s and without a reload the page shows carol in the slot."""
        _, sim_url = await start_sim(parallel=4)
        gateway = await start_gateway(house(sim_url, slots=2))
        admission = gateway.services.admission
        for key in ("bob-key", "agent-key"):
            await (await open_stream(streams, gateway, key)).started.wait()
        agent = streams[1]
        carol = await open_stream(streams, gateway, "carol-key")
        await until(admission, lambda s: s.queue_depth == 1)

        async with opened(browser, tmp_path, "house") as watched:
            page = watched.page
            await page.goto(gateway.url + "/ui")  # from loopback: no key needed
            who = page.locator(".slot.busy .who")
            await expect(who).to_have_text(["bob", "agent"])
            await expect(page.locator(".slot.free")).to_have_count(0)
            first = page.locator("#waiting tr").first.locator("td")
            await expect(first.nth(0)).to_have_text("1")
            await expect(first.nth(1)).to_have_text("carol")
            await expect(first.nth(2)).to_have_text(MODEL)
            await expect(page.locator("#summary")).to_contain_text("2 of 2 slots busy · 1 waiting")

            await agent.end()
            ended = time.monotonic()
            await expect(who).to_have_text(["bob", "carol"], timeout=2000)
            await expect(page.locator("#waiting")).to_have_text("nobody waiting", timeout=2000)
            assert time.monotonic() - ended < 2.0
            assert carol.started.is_set()
            assert watched.loads == 1  # followed by polling, not by reloading
            assert watched.errors == []

    async def test_a_non_admin_key_cannot_open_the_house_page_but_can_open_its_own(
        self,
        start_sim: StartSim,
        servers: AsyncExitStack,
        streams: list[Stream],
        browser: Browser,
        tmp_path: Path,
    ) -> None:
        """From another machine, bob's key is refused the house and shown his own page; an
        admin key opens the house. The key never appears in a URL."""
        _, sim_url = await start_sim(parallel=4)
        app = create_app(Settings(), parse_policy(house(sim_url, slots=2)))
        app.middlewares.insert(0, from_another_machine)
        url = await serve(servers, app)
        gateway = Gateway(url, app)
        await (await open_stream(streams, gateway, "bob-key")).started.wait()

        async with opened(browser, tmp_path, "not-admin") as watched:
            page = watched.page
            await page.goto(url + "/ui")
            form = page.locator("#key-form")
            await expect(form).to_be_visible()
            await form.locator("input").fill("bob-key")
            await form.locator("button").click()
            await expect(form.locator(".reason")).to_contain_text("not an admin key")
            await expect(form).to_be_visible()
            await expect(page.locator("#house")).to_be_hidden()
            await expect(page.locator(".slot")).to_have_count(0)

            await page.goto(url + "/ui/me")  # the key typed once is kept for the tab
            await expect(page.locator("#who")).to_have_text("bob")
            await expect(page.locator("#summary")).to_have_text(
                "1 of 2 slots busy: bob; yours is running"
            )
            await expect(page.locator("#running tr td").first).to_have_text(MODEL)
            await expect(page.locator("#house-link")).to_be_hidden()
            # The running request counts already: what is left of the hour, and when.
            budget = page.locator("#limits tr", has_text="budget: requests per hour")
            await expect(budget).to_contain_text("99 left of 100, renews")

            await page.goto(url + "/ui")
            await expect(form).to_be_visible()
            await form.locator("input").fill("alice-key")
            await form.locator("button").click()
            await expect(page.locator(".slot.busy .who")).to_have_text(["bob"])
            assert not any("-key" in seen for seen in watched.urls)
            assert watched.script_errors() == []

    async def test_the_key_form_speaks_to_people_not_programs(
        self,
        start_sim: StartSim,
        servers: AsyncExitStack,
        browser: Browser,
        tmp_path: Path,
    ) -> None:
        """Before a key is typed, "where am I" shows the form alone (no "send Authorization:
        Bearer" above it); a key the gateway does not know is said to be unknown."""
        _, sim_url = await start_sim()
        app = create_app(Settings(), parse_policy(house(sim_url, slots=2)))
        app.middlewares.insert(0, from_another_machine)
        url = await serve(servers, app)
        async with opened(browser, tmp_path, "key-form") as watched:
            page = watched.page
            await page.goto(url + "/ui/me")
            form = page.locator("#key-form")
            await expect(form).to_be_visible()
            await expect(page.locator("#summary")).to_have_text("")
            await form.locator("input").fill("nobody-key")
            await form.locator("button").click()
            await expect(page.locator("#summary")).to_contain_text("not one this gateway knows")
            await expect(form).to_be_visible()
            assert watched.script_errors() == []

    async def test_the_page_tells_how_often_background_work_gave_way_and_shows_a_persons_tasks(
        self,
        start_sim: StartSim,
        start_gateway: StartGateway,
        browser: Browser,
        tmp_path: Path,
    ) -> None:
        """After bob's title task gave its slot to alice, the summary says so; while his
        next task runs, bob's row shows it as background beside his own requests."""
        _, sim_url = await start_sim(decode_tokens_per_s=20.0)
        gateway = await start_gateway(house(sim_url, slots=1))
        admission = gateway.services.admission
        task = asyncio.create_task(post(gateway, "bob-key", body(TASK_PROMPT, 200)))
        await until(admission, lambda s: s.background_users.get("bob", (0, 0))[0] == 1)
        assert (await post(gateway, "alice-key", body("hello", 2)))[0] == 200
        await until(admission, lambda s: s.background_users.get("bob", (0, 0))[0] == 1)
        async with opened(browser, tmp_path, "gave-way") as watched:
            page = watched.page
            await page.goto(gateway.url + "/ui")
            await expect(page.locator("#summary")).to_contain_text("background work gave way once")
            bob = page.locator("#users tr", has_text="bob")
            await expect(bob).to_contain_text("0 of 1 + 1 background")
            assert watched.errors == []
        task.cancel()


# The picture in docs/house-page.md ----------------------------------------------------

PICTURE = REPO / "docs" / "house.png"
PAGE_FILES = REPO / "gateway" / "routes" / "ui"
EVENING = """\
classes: {{heavy: {{min_prompt_tokens: 2000}}}}
users:
  alice: {{keys: [alice-key], admin: true}}
  bob: {{keys: [bob-key]}}
  carol: {{keys: [carol-key]}}
  agent: {{keys: [agent-key], max_queued: 0, weight: 0.5}}
backends:
  - {{name: gpu, url: {url}, kind: ollama, slots: 2}}
"""
# The PNG text chunk that says what the picture shows (see ``drawn_from``).
SCENE_KEY = b"fairgate-scene"


async def ask(url: str, key: str, prompt: str, stall: bool = False) -> int:
    """One chat of ``key``'s user, read to its end; with ``stall`` it never ends (the
    simulator stops after three tokens), so that it holds its slot until cancelled."""
    chat: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": prompt}]}
    if stall:
        chat["options"] = {"sim_stall_after": 3}
    headers = {"Authorization": f"Bearer {key}"}
    async with (
        aiohttp.ClientSession() as session,
        session.post(url + "/api/chat", json=chat, headers=headers) as reply,
    ):
        async for _ in reply.content:
            pass
        return reply.status


def drawn_from(page_text: str) -> str:
    """What a picture of the page shows, as a digest: the page's own files, and its text with
    every number (a time, a duration, a count) masked, since those differ from run to run.
    The picture is redrawn when this changes, and only then: a test run leaves the tree as
    it was unless the page looks different (to redraw it anyway, delete docs/house.png)."""
    masked = re.sub(r"\d[\d.:,]*(?:\s?(?:ms|s|m|h|k|AM|PM)\b)?", "#", page_text)
    digest = hashlib.sha256(masked.encode())
    for path in sorted(p for p in PAGE_FILES.iterdir() if p.is_file()):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def png_chunks(png: bytes) -> list[tuple[bytes, bytes]]:
    """The (type, data) chunks of a PNG file (https://www.w3.org/TR/png/#5Chunk-layout)."""
    chunks, at = [], 8  # after the signature
    while at < len(png):
        (length,) = struct.unpack(">I", png[at : at + 4])
        chunks.append((png[at + 4 : at + 8], png[at + 8 : at + 8 + length]))
        at += 12 + length
    return chunks


def chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def with_scene(png: bytes, scene: str) -> bytes:
    """``png`` with a tEXt chunk holding ``scene``, right after its header chunk (IHDR)."""
    (header_length,) = struct.unpack(">I", png[8:12])
    end_of_header = 8 + 12 + header_length
    text = chunk(b"tEXt", SCENE_KEY + b"\0" + scene.encode())
    return png[:end_of_header] + text + png[end_of_header:]


def scene_of(png: bytes) -> str | None:
    for kind, data in png_chunks(png):
        if kind == b"tEXt" and data.startswith(SCENE_KEY + b"\0"):
            return data.removeprefix(SCENE_KEY + b"\0").decode()
    return None


class TestThePicture:
    def test_the_scene_survives_in_the_png_and_its_numbers_do_not_count(self) -> None:
        """The digest written into a picture is read back from it; a page that differs in
        its numbers alone is the same scene, one that differs in a word is another."""
        header = struct.pack(">IIBBBBB", 1, 1, 8, 0, 0, 0, 0)  # one grey pixel
        png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IEND", b"")
        assert scene_of(png) is None
        assert scene_of(with_scene(png, "abc")) == "abc"
        assert png_chunks(with_scene(png, "abc"))[0][0] == b"IHDR"
        waited = drawn_from("carol waited 4.7 s, starts in about 850 ms, at 10:02:03 PM")
        assert drawn_from("carol waited 12 s, starts in about 1.5 s, at 9:59:59 AM") == waited
        assert drawn_from("alice waited 4.7 s, starts in about 850 ms, at 10:02:03 PM") != waited

    async def test_a_busy_evening_is_what_the_page_shows_and_the_docs_picture(
        self, start_sim: StartSim, start_gateway: StartGateway, browser: Browser, tmp_path: Path
    ) -> None:
        """Bob and the agent hold both slots, carol and alice wait in the scheduler's order,
        the agent's second request was refused: the page shows exactly that, and
        docs/house.png is a picture of it (redrawn when the page has changed)."""
        _, sim_url = await start_sim(parallel=2, decode_tokens_per_s=40.0, default_output_tokens=8)
        gateway = await start_gateway(EVENING.format(url=sim_url))
        admission, url = gateway.services.admission, gateway.url
        for n in range(6):  # the last hour: a few quick replies
            await ask(url, ("bob-key", "carol-key", "alice-key")[n % 3], "what time is it?")
        held: list[asyncio.Task[int]] = []
        try:
            # The agent's long summary first: a heavy request arriving beside a light one
            # would wait for it (classes.heavy.wait_for_light), and the agent may not wait.
            for user, prompt in (("agent", "summarise: " + "minutes " * 3000), ("bob", "help")):
                held.append(asyncio.create_task(ask(url, f"{user}-key", prompt, stall=True)))
                await until(admission, lambda s, u=user: u in running_users(gateway))
            for user, prompt in (("carol", "a recipe for tonight"), ("alice", "translate this")):
                held.append(asyncio.create_task(ask(url, f"{user}-key", prompt, stall=True)))
                await until(admission, queued(user, 1))
            # Its one running request is all the agent may have: max_queued 0.
            assert await ask(url, "agent-key", "summarise the next file") == 503
            await asyncio.sleep(3.0)  # waits of a few seconds, as on a real evening
            await self.photograph(browser, tmp_path, gateway)
        finally:
            for task in held:
                task.cancel()
            await asyncio.gather(*held, return_exceptions=True)

    async def photograph(self, browser: Browser, tmp_path: Path, gateway: Gateway) -> None:
        """Check the page shows the evening, and keep docs/house.png a picture of it."""
        waiting = [w.user for w in gateway.services.admission.snapshot().waiting]
        assert sorted(waiting) == ["alice", "carol"]
        async with opened(browser, tmp_path, "picture") as watched:
            page = watched.page
            await page.set_viewport_size({"width": 1000, "height": 800})
            await page.goto(gateway.url + "/ui")
            await expect(page.locator(".slot.busy .who")).to_have_text(["agent", "bob"])
            rows = page.locator("#waiting tr")
            await expect(rows).to_have_count(2)
            for n, user in enumerate(waiting):  # in the scheduler's order
                await expect(rows.nth(n).locator("td").nth(1)).to_have_text(user)
            refused = page.locator("#refusals tr").first
            await expect(refused).to_contain_text("agent")
            await expect(refused).to_contain_text("user_queue_full")
            await expect(page.locator("#summary")).to_contain_text("2 of 2 slots busy · 2 waiting")
            scene = drawn_from(await page.locator("body").inner_text())
            if not PICTURE.exists() or scene_of(PICTURE.read_bytes()) != scene:
                PICTURE.write_bytes(with_scene(await page.screenshot(full_page=True), scene))
            assert watched.errors == []
