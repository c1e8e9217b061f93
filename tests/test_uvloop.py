"""What differs on uvloop, the event loop ``fairgate serve`` runs on: its ``loop.time()`` is
in whole milliseconds, read once a turn of the loop. The test runs its own uvloop (the
suite's fixtures run on asyncio's)."""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack

import aiohttp
import uvloop

from fairsim import SimConfig, Simulator
from gateway.app import SERVICES, create_app
from gateway.config.policy import parse_policy
from gateway.config.settings import Settings
from gateway.edge.http.connections import Listener
from tests.conftest import Finished, Gateway, one_backend, serve
from tests.test_admission import MODEL


async def streamed_gaps() -> list[float]:
    """The gaps the gateway timed between the chunks of one streamed reply."""
    async with AsyncExitStack() as servers:
        simulator = Simulator(SimConfig(prefill_tokens_per_s=0.0, decode_tokens_per_s=700.0))
        app = create_app(
            Settings(), parse_policy(one_backend(await serve(servers, simulator.make_app())))
        )
        listener = Listener(app, app[SERVICES].settings, app[SERVICES].connections)
        await listener.start(port=0)
        servers.push_async_callback(listener.close)
        finished = Finished(Gateway(listener.url, app))
        body = {"model": MODEL, "prompt": "hi", "options": {"num_predict": 40}}
        async with (
            aiohttp.ClientSession() as session,
            session.post(listener.url + "/api/generate", json=body) as reply,
        ):
            assert reply.status == 200
            await reply.read()
        (record,) = await finished.at_least(1)
        assert isinstance(asyncio.get_running_loop(), uvloop.Loop)
        return record.gaps


def test_the_gaps_between_a_streams_chunks_are_timed_finer_than_the_loops_clock() -> None:
    """The inter-token gaps (the ITL histogram) are not whole milliseconds: a sub-millisecond
    gap read on the loop's clock is 0 or 1 ms."""
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        gaps = runner.run(streamed_gaps())
    assert len(gaps) > 10
    assert any(abs(gap * 1000 - round(gap * 1000)) > 1e-6 for gap in gaps), gaps
