"""A burst of requests on kept-alive connections starts a few per turn of the event loop, so
that replies already under way go out between them; a client that hangs up before its turn
costs nothing, and nothing it leaves behind holds up the requests after it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from contextlib import AsyncExitStack, contextmanager

from aiohttp import web
from aiohttp.typedefs import Handler

from gateway.app import SERVICES, create_app, drain
from gateway.config.policy import parse_policy
from gateway.config.settings import Settings
from gateway.edge.http.connections import Listener
from tests.conftest import Finished, Gateway, StartSim, one_backend
from tests.test_hostile_clients import (
    POLICY,
    _generate,
    read_streamed,
    request_bytes,
    warm_raw,
)


class Turns:
    """The event loop's turns, counted by a callback that runs once in each."""

    def __init__(self) -> None:
        self.now = 0
        self._handle: asyncio.Handle | None = None

    @contextmanager
    def counting(self) -> Iterator[None]:
        loop = asyncio.get_running_loop()

        def tick() -> None:
            self.now += 1
            self._handle = loop.call_soon(tick)

        self._handle = loop.call_soon(tick)
        try:
            yield
        finally:
            self._handle.cancel()


async def started_gateway(
    servers: AsyncExitStack,
    sim_url: str,
    per_turn: int,
    started: list[tuple[int, str]],
    turns: Turns,
    began: dict[str, float] | None = None,
) -> Gateway:
    """A gateway whose listener starts ``per_turn`` hot requests a turn, noting in
    ``started`` the turn each request's handling began in, by its X-Request-Id (and in
    ``began``, when)."""

    @web.middleware
    async def note(request: web.Request, handler: Handler) -> web.StreamResponse:
        request_id = request.headers.get("X-Request-Id", "")
        started.append((turns.now, request_id))
        if began is not None:
            began[request_id] = time.monotonic()
        return await handler(request)

    house = "defaults: {max_concurrent: 8, max_queued: 8}\n" + POLICY  # a burst of alice's
    app = create_app(Settings(), parse_policy(house + one_backend(sim_url, slots=8)))
    app.middlewares.insert(0, note)
    services = app[SERVICES]
    listener = Listener(app, services.settings, services.connections, starts_per_turn=per_turn)
    await listener.start(port=0)
    servers.push_async_callback(listener.close)
    return Gateway(listener.url, app)


async def test_a_burst_starts_a_few_requests_a_turn(
    start_sim: StartSim, servers: AsyncExitStack
) -> None:
    """Six requests that arrive together start two a turn, over three turns or more, and
    are all answered whole."""
    _, sim_url = await start_sim()
    started: list[tuple[int, str]] = []
    turns = Turns()
    gateway = await started_gateway(servers, sim_url, 2, started, turns)
    connections = [await warm_raw(gateway) for _ in range(6)]
    started.clear()
    with turns.counting():
        for n, (_, writer) in enumerate(connections):
            writer.write(
                request_bytes("/api/generate", _generate(2), extra=f"X-Request-Id: r{n}\r\n")
            )
        replies = [await read_streamed(reader) for reader, _ in connections]
    assert all(reply.startswith(b"HTTP/1.1 200") for reply in replies)
    by_turn: dict[int, list[str]] = {}
    for turn, request_id in started:
        by_turn.setdefault(turn, []).append(request_id)
    assert sorted(request_id for _, request_id in started) == [f"r{n}" for n in range(6)]
    assert max(len(ids) for ids in by_turn.values()) <= 2 and len(by_turn) >= 3, by_turn
    for _, writer in connections:
        writer.close()


async def test_clients_that_hang_up_before_their_turn_hold_up_nobody(
    start_sim: StartSim, servers: AsyncExitStack
) -> None:
    """Requests whose clients left while they waited for their turn never start; the
    requests after them start and are answered."""
    _, sim_url = await start_sim()
    started: list[tuple[int, str]] = []
    gateway = await started_gateway(servers, sim_url, 1, started, Turns())
    connections = [await warm_raw(gateway) for _ in range(5)]
    started.clear()
    for n, (_, writer) in enumerate(connections):
        writer.write(request_bytes("/api/generate", _generate(2), extra=f"X-Request-Id: r{n}\r\n"))
        if n in (1, 2, 3):
            writer.close()  # gone before its turn can come
    for n in (0, 4):
        reader, writer = connections[n]
        assert (await read_streamed(reader)).startswith(b"HTTP/1.1 200")
    assert {"r0", "r4"} <= {request_id for _, request_id in started} < {f"r{n}" for n in range(5)}
    later = await warm_raw(gateway)  # and one more, on a new connection
    later[1].write(request_bytes("/api/generate", _generate(2)))
    assert (await read_streamed(later[0])).startswith(b"HTTP/1.1 200")
    for _, writer in [*connections, later]:
        writer.close()


async def test_requests_waiting_their_turn_when_the_gateway_stops_are_each_answered(
    start_sim: StartSim,
) -> None:
    """Requests that came whole and wait for their turn when a drain begins each get a
    reply before the listener closes their connections, none a connection closed unanswered."""
    _, sim_url = await start_sim()
    house = "defaults: {max_concurrent: 8, max_queued: 8}\n" + POLICY
    app = create_app(Settings(), parse_policy(house + one_backend(sim_url, slots=8)))
    services = app[SERVICES]
    stopping: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    armed = False

    @web.middleware
    async def stop_at_first(request: web.Request, handler: Handler) -> web.StreamResponse:
        # SIGTERM lands as the first of the burst starts: serve() drains, then closes.
        if armed and not stopping.done():
            await drain(services, 5.0)
            stopping.set_result(None)
        return await handler(request)

    app.middlewares.insert(0, stop_at_first)
    listener = Listener(app, services.settings, services.connections, starts_per_turn=1)
    await listener.start(port=0)
    try:
        gateway = Gateway(listener.url, app)
        connections = [await warm_raw(gateway) for _ in range(6)]
        armed = True
        for _, writer in connections:
            writer.write(request_bytes("/api/generate", _generate(2)))
        await stopping
    finally:
        await listener.close()
    replies = [await asyncio.wait_for(reader.read(), timeout=10) for reader, _ in connections]
    assert all(reply.startswith(b"HTTP/1.1 ") for reply in replies), replies
    for _, writer in connections:
        writer.close()


async def test_a_request_counts_its_wait_for_a_turn_from_when_it_was_read(
    start_sim: StartSim, servers: AsyncExitStack
) -> None:
    """Its record (the access log's TTFT and total, the metrics, the house page) begins when
    its bytes were read, before its handling began; not when it began."""
    _, sim_url = await start_sim()
    began: dict[str, float] = {}
    gateway = await started_gateway(servers, sim_url, 1, [], Turns(), began)
    finished = Finished(gateway)
    connections = [await warm_raw(gateway) for _ in range(3)]
    finished.records.clear()
    for n, (_, writer) in enumerate(connections):
        writer.write(request_bytes("/api/generate", _generate(2), extra=f"X-Request-Id: r{n}\r\n"))
    for reader, _ in connections:
        assert (await read_streamed(reader)).startswith(b"HTTP/1.1 200")
    arrived = {record.request_id: record.arrived for record in await finished.at_least(3)}
    assert all(arrived[n] < began[n] for n in ("r0", "r1", "r2")), (arrived, began)
    for _, writer in connections:
        writer.close()
