"""What a stop tells the requests it cannot finish: each one the gateway has taken gets an
answer, a 503 when its reply has not begun, and none starts after the stop."""

from __future__ import annotations

import asyncio
import json
import signal

from yarl import URL

from gateway.app import SERVICES, create_app, drain
from gateway.config.policy import parse_policy
from gateway.config.settings import Settings
from gateway.edge.http.connections import Listener
from tests.conftest import Finished, StartGateway, StartSim, one_backend
from tests.test_admission import MODEL

ALICE = "users:\n  alice: {keys: [alice-key], max_concurrent: 1, max_queued: 4}\n"


def _generate(options: dict[str, object], stream: bool = True) -> bytes:
    return json.dumps(
        {"model": MODEL, "prompt": "x", "stream": stream, "options": options}
    ).encode()


def _head(body: bytes, extra: str = "") -> bytes:
    return (
        "POST /api/generate HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer alice-key\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n{extra}\r\n"
    ).encode()


async def _connect(url: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    address = URL(url)
    return await asyncio.open_connection(address.host, address.port)


class TestDrainAnswers:
    async def test_a_reply_not_begun_at_the_deadline_is_a_503_that_closes(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """A whole reply (stream: false) still being made when the drain's time is up gets
        503 shutting_down with Retry-After, on a connection then closed; not a bare close."""
        sim, sim_url = await start_sim(decode_tokens_per_s=20.0)
        gateway = await start_gateway(ALICE + one_backend(sim_url))
        finished = Finished(gateway)
        reader, writer = await _connect(gateway.url)
        body = _generate({"num_predict": 100_000}, stream=False)
        writer.write(_head(body) + body)
        await sim.wait_for(lambda stats: stats.running == 1, timeout=10)
        await drain(gateway.services, within=0)
        async with asyncio.timeout(10):
            reply = await reader.read(-1)  # to the connection's end
        writer.close()
        head = reply.partition(b"\r\n\r\n")[0].split(b"\r\n")
        assert head[0] == b"HTTP/1.1 503 Service Unavailable"
        assert b"Retry-After: 5" in head and b"Connection: close" in head
        record = await finished.first(("/api/generate",))
        assert (record.status, record.reason) == (503, "shutting_down")
        await sim.wait_for(lambda stats: stats.running == 0, timeout=10)

    async def test_a_request_that_would_wait_after_the_stop_is_refused_at_once(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """A request read before the stop whose body comes after it, when its user's one
        place is taken, is refused then, rather than queued for a turn the drain would give
        it (and cut) later."""
        sim, sim_url = await start_sim(decode_tokens_per_s=20.0)
        gateway = await start_gateway(ALICE + one_backend(sim_url))
        holder_reader, holder = await _connect(gateway.url)
        held = _generate({"num_predict": 100_000})
        holder.write(_head(held) + held)
        await holder_reader.readuntil(b"\r\n\r\n")  # alice's one place is taken
        reader, writer = await _connect(gateway.url)
        body = _generate({"num_predict": 5})
        writer.write(_head(body, "Expect: 100-continue\r\n"))
        assert await reader.readuntil(b"\r\n\r\n") == b"HTTP/1.1 100 Continue\r\n\r\n"
        draining = asyncio.create_task(drain(gateway.services, within=60))
        try:
            writer.write(body)  # read after the drain has begun
            async with asyncio.timeout(10):  # not at the drain's deadline
                head = await reader.readuntil(b"\r\n\r\n")
            status = head.partition(b"\r\n")[0] + b"\r\n"
            assert status == b"HTTP/1.1 503 Service Unavailable\r\n"
            assert b"Connection: close" in head  # as every answer of a drain
            assert sim.stats.completed == 0 and sim.stats.running == 1
        finally:
            draining.cancel()
            holder.close()
            writer.close()

    async def test_a_stream_cut_by_the_deadline_says_why_in_the_apis_vocabulary(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """An OpenAI stream still running when the drain's time is up ends with an error
        event whose code is shutting_down, as the 503 of a request refused then is."""
        sim, sim_url = await start_sim(decode_tokens_per_s=20.0)
        gateway = await start_gateway(ALICE + one_backend(sim_url))
        reader, writer = await _connect(gateway.url)
        body = json.dumps(
            {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "stream": True}
            | {"max_tokens": 100_000}
        ).encode()
        writer.write(_head(body).replace(b"/api/generate", b"/v1/chat/completions") + body)
        await reader.readuntil(b"\r\n\r\n")
        await sim.wait_for(lambda stats: stats.running == 1, timeout=10)
        await drain(gateway.services, within=0)
        async with asyncio.timeout(10):
            rest = await reader.readuntil(b"\r\n0\r\n\r\n")  # the stream's end
        writer.close()
        events = [line for line in rest.split(b"\n") if line.startswith(b"data: {")]
        error = json.loads(events[-1].removeprefix(b"data: "))["error"]
        assert error["code"] == "shutting_down"


async def test_a_sighup_as_the_gateway_stops_cannot_end_the_process(start_sim: StartSim) -> None:
    """Once the app's policy watch is down, SIGHUP still has a handler: its default action
    would end the process before its last usage is written."""
    _, sim_url = await start_sim()
    app = create_app(Settings(), parse_policy(one_backend(sim_url)))
    listener = Listener(app, Settings(), app[SERVICES].connections)
    await listener.start(port=0)
    await listener.close()  # the app's cleanup, as at the end of a stop
    assert signal.getsignal(signal.SIGHUP) not in (signal.SIG_DFL, None)
