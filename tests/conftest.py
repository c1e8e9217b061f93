"""Real servers on loopback ports: the simulator as backend, the gateway in front of it."""

from __future__ import annotations

import asyncio
import gzip
import os
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from playwright.async_api import Browser, async_playwright

from fairsim import SimConfig, Simulator
from gateway.app import SERVICES, bound_url, create_app, start_server
from gateway.config.policy import Policy, load_policy, parse_policy
from gateway.config.settings import Settings
from gateway.edge.http.connections import Listener
from gateway.edge.record import RequestRecord
from gateway.services import Services
from tests.llama_server import LlamaServer, running_llama_router, running_llama_server, server_files
from tests.processes import required_binary, stop

StartSim = Callable[..., Awaitable[tuple[Simulator, str]]]
Start = StartSim  # the same, with instant prefill and decode by default
StartGateway = Callable[..., Awaitable["Gateway"]]


@dataclass(frozen=True)
class Gateway:
    url: str
    app: web.Application

    @property
    def services(self) -> Services:
        return self.app[SERVICES]


@pytest.fixture(autouse=True)
def usage_db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test's gateways keep usage in its own file, never in the working directory."""
    path = tmp_path / "usage.db"
    monkeypatch.setenv("FAIRGATE_USAGE_DB", str(path))
    return path


@pytest.fixture
async def servers() -> AsyncIterator[AsyncExitStack]:
    async with AsyncExitStack() as stack:
        yield stack


async def serve(stack: AsyncExitStack, app: web.Application) -> str:
    runner = await start_server(app, "127.0.0.1", 0)
    stack.push_async_callback(runner.cleanup)
    return bound_url(runner)


@pytest.fixture
async def processes() -> AsyncIterator[list[asyncio.subprocess.Process]]:
    """Child processes that the test leaves running; stopped (SIGTERM, then KILL) after it."""
    started: list[asyncio.subprocess.Process] = []
    yield started
    for process in started:
        await stop(process)


@pytest.fixture
def refusing_url() -> Iterator[str]:
    """A loopback URL whose connections are refused for the whole test: its port is bound
    and never listened on, so no other server (another test's, another process's) can take
    it meanwhile, as it could a port that was merely free when looked at."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{held.getsockname()[1]}"


@pytest.fixture
def start_sim(servers: AsyncExitStack) -> StartSim:
    """Start a simulator with fast defaults; keyword arguments override SimConfig fields."""

    async def start(**overrides: Any) -> tuple[Simulator, str]:
        fields: dict[str, Any] = {"prefill_tokens_per_s": 0.0, "decode_tokens_per_s": 500.0}
        fields.update(overrides)
        simulator = Simulator(SimConfig(**fields))
        return simulator, await serve(servers, simulator.make_app())

    return start


@pytest.fixture
def start_gateway(servers: AsyncExitStack) -> StartGateway:
    """Start a gateway from policy YAML text, a Policy, or a file that it then watches;
    ``clock``, when given, is its wall clock (days, hours, budgets' windows); ``routes``
    adds a test's own routes to its app."""

    async def start(
        policy: str | Policy | Path,
        clock: Callable[[], float] = time.time,
        routes: Callable[[web.Application], None] | None = None,
        **settings: Any,
    ) -> Gateway:
        path = policy if isinstance(policy, Path) else None
        if isinstance(policy, Path):
            policy = load_policy(policy)
        elif isinstance(policy, str):
            policy = parse_policy(policy)
        app = create_app(Settings(**settings), policy, path, clock)
        if routes is not None:  # a test's own, added before the router is frozen
            routes(app)
        services = app[SERVICES]
        listener = Listener(app, services.settings, services.connections)
        await listener.start(port=0)
        servers.push_async_callback(listener.close)
        return Gateway(listener.url, app)

    return start


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    """Debian's chromium, headless; playwright downloads no browser of its own."""
    path = required_binary("chromium", "chromium")
    async with async_playwright() as playwright:
        engine = await playwright.chromium.launch(executable_path=path)
        yield engine
        await engine.close()


@pytest.fixture
async def simulated() -> AsyncIterator[Start]:
    """Start simulators on free loopback ports (instant by default); SimConfig fields override."""
    runners: list[web.AppRunner] = []

    async def start(
        clock: Callable[[], float] = time.monotonic, **overrides: Any
    ) -> tuple[Simulator, str]:
        fields: dict[str, Any] = {"prefill_tokens_per_s": 0.0, "decode_tokens_per_s": 0.0}
        simulator = Simulator(SimConfig(**(fields | overrides)), clock)
        runner = web.AppRunner(simulator.make_app(), handler_cancellation=True)
        await runner.setup()
        runners.append(runner)
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        host, port = runner.addresses[0][:2]
        return simulator, f"http://{host}:{port}"

    yield start
    for runner in reversed(runners):
        await runner.cleanup()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def post_gzipped(url: str, body: bytes, headers: dict[str, str]) -> tuple[int, str]:
    """POST ``body`` gzip-compressed (Content-Encoding: gzip, with ``headers``); the reply's
    status and text."""
    headers = {**headers, "Content-Encoding": "gzip"}
    async with (
        aiohttp.ClientSession() as session,
        session.post(url, data=gzip.compress(body), headers=headers) as reply,
    ):
        return reply.status, await reply.text()


def one_backend(url: str, slots: int = 1, kind: str = "ollama", extra: str = "") -> str:
    """Policy YAML with a single backend at ``url``."""
    return f"backends:\n  - {{name: sim, url: {url}, kind: {kind}, slots: {slots}}}\n{extra}"


class Finished:
    """The gateway's records of finished requests, awaited as they come."""

    def __init__(self, gateway: Gateway) -> None:
        self.records: list[RequestRecord] = []
        self._added = asyncio.Event()
        gateway.services.on_finished.append(self._add)

    def _add(self, record: RequestRecord) -> None:
        self.records.append(record)
        self._added.set()

    async def at_least(self, count: int) -> list[RequestRecord]:
        """The records, once ``count`` requests have finished."""
        async with asyncio.timeout(30):
            while len(self.records) < count:
                self._added.clear()
                await self._added.wait()
        return self.records

    async def first(self, paths: tuple[str, ...]) -> RequestRecord:
        """The first request to one of ``paths`` to finish (a client may ask others first)."""
        async with asyncio.timeout(30):
            while not (found := [r for r in self.records if r.path in paths]):
                self._added.clear()
                await self._added.wait()
        return found[0]


def _needs_llama_server() -> None:
    """Skip where llama-server is not installed, except on CI: `make test` installs it."""
    try:
        server_files()
    except ImportError as exc:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"llama-server is not installed ({exc}); `make test` installs it")


@pytest.fixture
async def llama_server(tmp_path: Path) -> AsyncIterator[str]:
    """The real llama-server with 2 slots on a free loopback port, stopped by its own PID."""
    _needs_llama_server()
    async with running_llama_server(tmp_path / "llama-server.log") as server:
        yield server.url


@pytest.fixture
async def llama_server_saving_slots(tmp_path: Path) -> AsyncIterator[str]:
    """The real llama-server with 2 slots that it can save and restore (``--slot-save-path``)."""
    _needs_llama_server()
    saved = tmp_path / "slots"
    saved.mkdir()
    extra = ("--slot-save-path", str(saved))
    async with running_llama_server(tmp_path / "llama-server.log", extra=extra) as server:
        yield server.url


@pytest.fixture
async def llama_router(tmp_path: Path) -> AsyncIterator[LlamaServer]:
    """The real llama-server as a router: models ``family`` and ``coder`` (both the SmolLM2
    file), one loaded at a time, 2 slots each."""
    _needs_llama_server()
    async with running_llama_router(tmp_path / "router") as server:
        yield server
