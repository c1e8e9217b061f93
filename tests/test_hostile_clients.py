"""Clients that misbehave on the wire cannot hold what others need: a slot, memory, or a
connection. Raw sockets play the client, as an attacker's toolkit would."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import socket
import struct
import threading
import time
from contextlib import AsyncExitStack
from typing import Any

import aiohttp
import pytest
import structlog
from aiohttp import web

from gateway.core.logs import console_rendering
from gateway.intake.bodies import ON_LOOP_BYTES
from tests.conftest import (
    Finished,
    Gateway,
    StartGateway,
    StartSim,
    one_backend,
    post_gzipped,
    serve,
)
from tests.test_admission import MODEL, generate_status, held, idle, until
from tests.test_metrics import scrape

STALL = 1.0
POLICY = f"""\
timeouts: {{client_stall: {STALL:g}s}}
users:
  alice: {{keys: [alice-key]}}
  bob: {{keys: [bob-key]}}
"""


async def open_raw(
    gateway: Gateway, receive_buffer: int | None = None
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection to the gateway; a small receive buffer makes a reader that stops
    reading felt at once by the sender."""
    host, _, port = gateway.url.removeprefix("http://").rpartition(":")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if receive_buffer is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, (host, int(port)))
    return await asyncio.open_connection(sock=sock, limit=1024)


def request_head(path: str, length: int, key: str = "alice-key", extra: str = "") -> bytes:
    """A POST's head that declares ``length`` bytes of body (sent, or not, separately)."""
    return (
        f"POST {path} HTTP/1.1\r\nHost: gateway\r\nAuthorization: Bearer {key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {length}\r\n{extra}\r\n"
    ).encode()


def request_bytes(path: str, body: bytes, key: str = "alice-key", extra: str = "") -> bytes:
    return request_head(path, len(body), key, extra) + body


def closed_with(head: bytes, status: bytes) -> None:
    """``head`` answers ``status`` and says the connection is closed after it."""
    assert head.startswith(b"HTTP/1.1 " + status) and b"Connection: close" in head


async def head_of(reader: asyncio.StreamReader) -> bytes:
    """The next response head (an interim 100 Continue is one too)."""
    return await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=5)


def stamped(logger: object, method: str, event: dict[str, Any]) -> dict[str, Any]:
    """Notes when each log line was written."""
    event["at"] = time.monotonic()
    return event


async def status_of(gateway: Gateway) -> dict[str, Any]:
    async with aiohttp.ClientSession() as session, session.get(gateway.url + "/status") as reply:
        result: dict[str, Any] = await reply.json()
        return result


class TestSlowReaders:
    async def test_a_reader_that_stops_frees_its_slot_within_client_stall(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """A client that stops reading mid-stream loses its stream after client_stall; the
        slot is free within a second more and the backend saw the request cancelled."""
        sim, url = await start_sim(decode_tokens_per_s=200000.0)
        gateway = await start_gateway(
            POLICY + f"backends:\n  - {{name: sim, url: {url}, kind: ollama, slots: 1}}\n"
        )
        body = json.dumps(
            {"model": MODEL, "prompt": "talk", "options": {"num_predict": 10_000_000}}
        ).encode()
        reader, writer = await open_raw(gateway, receive_buffer=4096)
        with structlog.testing.capture_logs(processors=[stamped]) as logs:
            writer.write(request_bytes("/api/generate", body))
            assert (await reader.readline()).startswith(b"HTTP/1.1 200")
            await until(gateway.services.admission, idle, within=30)
            freed = time.monotonic()
        stalled = [entry for entry in logs if entry["event"] == "client_stalled"]
        assert len(stalled) == 1
        # The clock runs once the socket's and the transport's buffers are full: from the
        # last byte the gateway could pass on, client_stall, then the slot within a second.
        assert stalled[0]["unread_for"] < STALL + 0.2
        assert freed - stalled[0]["at"] < 1.0
        status = await status_of(gateway)
        assert status["backends"]["sim"]["busy"] == 0
        await sim.engine.wait_for(lambda stats: stats.disconnects == 1, timeout=5)
        request = next(entry for entry in logs if entry["event"] == "request")
        assert (request["reason"], request["client_gone"]) == ("client_stalled", True)
        stalls = (await scrape(gateway))["fairgate_client_stalls"]
        assert ("fairgate_client_stalls_total", {"user": "alice"}, 1.0) in stalls
        writer.close()


HUGE = 30 * 1024 * 1024
CAPPED = "defaults: {max_concurrent: 1, max_queued: 0}\n" + POLICY
CHAT = json.dumps({"model": MODEL, "prompt": "hi", "stream": False}).encode()


async def capped_gateway(start_sim: StartSim, start_gateway: StartGateway) -> Gateway:
    _, url = await start_sim()
    return await start_gateway(
        CAPPED + f"backends:\n  - {{name: sim, url: {url}, kind: ollama, slots: 2}}\n",
        max_body_bytes=HUGE + 1024,
    )


class TestRefusedBeforeTheBody:
    async def test_a_user_at_cap_gets_503_from_the_headers_alone(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """With alice's one place taken and no room to wait, a 30 MiB request of hers gets
        its 503 before a byte of its body is sent: the body is never awaited."""
        gateway = await capped_gateway(start_sim, start_gateway)
        async with held(gateway, "alice-key", "holding"):
            reader, writer = await open_raw(gateway)
            writer.write(request_head("/api/generate", HUGE))
            assert (await head_of(reader)).startswith(b"HTTP/1.1 503")
            writer.close()

    @pytest.mark.parametrize(
        ("key", "length", "status"),
        [("wrong", len(CHAT), b"401"), ("alice-key", HUGE * 2, b"413")],
        ids=["unknown key", "declared length over the limit"],
    )
    async def test_a_refusal_from_the_headers_comes_without_100_continue(
        self, start_sim: StartSim, start_gateway: StartGateway, key: str, length: int, status: bytes
    ) -> None:
        """An unknown key or an oversize body is refused at once, and the connection closed:
        the client is never invited to send its body."""
        gateway = await capped_gateway(start_sim, start_gateway)
        reader, writer = await open_raw(gateway)
        expect = "Expect: 100-continue\r\n"
        writer.write(request_head("/api/generate", length, key=key, extra=expect))
        closed_with(await head_of(reader), status)
        writer.close()

    async def test_an_accepted_request_is_invited_and_expect_is_not_forwarded(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """A request that may run gets 100 Continue from the gateway, and the backend never
        sees the Expect header (it would answer it, or never, on its own terms)."""
        sim, url = await start_sim(record_replies=True)
        gateway = await start_gateway(
            POLICY + f"backends:\n  - {{name: sim, url: {url}, kind: ollama, slots: 2}}\n"
        )
        reader, writer = await open_raw(gateway)
        writer.write(request_head("/api/generate", len(CHAT), extra="Expect: 100-continue\r\n"))
        assert await head_of(reader) == b"HTTP/1.1 100 Continue\r\n\r\n"
        writer.write(CHAT)
        assert (await head_of(reader)).startswith(b"HTTP/1.1 200")
        assert "expect" not in {name.lower() for name in sim.request_headers[-1]}
        writer.close()

    async def test_a_body_that_never_arrives_gets_408(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """Half a body, then silence: 408 after body_timeout, and the connection is closed."""
        _, url = await start_sim()
        gateway = await start_gateway(
            POLICY + f"backends:\n  - {{name: sim, url: {url}, kind: ollama, slots: 2}}\n",
            body_timeout=0.3,
        )
        reader, writer = await open_raw(gateway)
        writer.write(request_head("/api/generate", len(CHAT)) + CHAT[:5])
        closed_with(await head_of(reader), b"408")
        # Its rest, or a next request, is not read as another request.
        writer.write(CHAT[5:] + b"GET /api/version HTTP/1.1\r\nHost: gateway\r\n\r\n")
        assert b"HTTP/1.1" not in await asyncio.wait_for(reader.read(), timeout=5)
        writer.close()

    async def test_a_body_over_the_limit_sent_anyway_gets_413_and_a_closed_connection(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """A declared length over the limit, its body already coming: 413, and the
        connection closed rather than read on to what follows."""
        gateway = await capped_gateway(start_sim, start_gateway)
        reader, writer = await open_raw(gateway)
        writer.write(request_head("/api/generate", HUGE * 2) + b"x" * 1000)
        closed_with(await head_of(reader), b"413")
        writer.close()

    async def test_a_client_gone_before_its_100_continue_is_a_hang_up(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """A client that leaves while its 100 Continue is on its way is recorded as gone
        (499), not as a failure of the gateway's own (500 and a traceback)."""
        _, url = await start_sim()
        gateway = await start_gateway(POLICY + one_backend(url, slots=2))
        finished = Finished(gateway)
        head = request_head("/api/chat", 100, extra="Expect: 100-continue\r\n")
        for _ in range(20):
            _, writer = await open_raw(gateway)
            sock = writer.get_extra_info("socket")
            # A reset, sent with the head: the gateway reads the head from a closed socket.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.write(head)
            await writer.drain()
            writer.close()
        records = await finished.at_least(20)
        assert {record.status for record in records} == {499}


class TestSlowBodies:
    async def test_a_chunked_body_is_read_no_further_than_its_limit(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """alice at her cap may still send a task, a small body: one without a length is
        refused once past a task's size (503 for her, the connection closed), not read on
        to the 32 MiB any body may be."""
        gateway = await capped_gateway(start_sim, start_gateway)
        async with held(gateway, "alice-key", "holding"):
            reader, writer = await open_raw(gateway)
            head = request_head("/api/generate", 0).replace(
                b"Content-Length: 0", b"Transfer-Encoding: chunked"
            )
            writer.write(head)
            piece = b" " * 65536
            with contextlib.suppress(ConnectionError):
                for _ in range(64):  # 4 MiB, if it were all read
                    writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                    await writer.drain()
            closed_with(await head_of(reader), b"503")
            writer.close()

    async def test_bodies_on_their_way_count_as_the_users_places(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """alice may run one and queue two: three bodies sent one byte at a time are read,
        a fourth and fifth are refused from their heads, and bob is not held back. (With
        lanes on, a body that may be a task is read too, within the background lane's
        places and its small size.)"""
        _, url = await start_sim(parallel=2)
        head = "defaults: {max_concurrent: 1, max_queued: 2}\nlanes: {presets: []}\n"
        gateway = await start_gateway(head + POLICY + one_backend(url, slots=2))
        slow = [await invited(gateway, "alice-key", len(CHAT)) for _ in range(3)]
        for _, writer in slow:
            writer.write(CHAT[:1])
        for _ in range(2):
            reader, writer = await open_raw(gateway)
            writer.write(request_head("/api/generate", len(CHAT)) + CHAT[:1])
            head = await head_of(reader)
            assert head.startswith(b"HTTP/1.1 503")
            writer.close()
        assert await generate_status(gateway, "bob-key") == 200
        for reader, writer in slow:  # the three are read to their end and served
            writer.write(CHAT[1:])
            assert (await head_of(reader)).startswith(b"HTTP/1.1 200")
            writer.close()

    async def test_a_users_big_bodies_are_read_one_at_a_time(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """Two bodies of 20 MiB from alice, each sent but for its last byte: the second is
        refused from its head (together they would pass the 32 MiB one body may be),
        before a byte of it is read; bob's own big body is read beside hers."""
        _, url = await start_sim(parallel=2)
        gateway = await start_gateway(POLICY + one_backend(url, slots=2))
        size = 20 * 1024 * 1024
        _, first = await invited(gateway, "alice-key", size)
        first.write(b" " * (size - 1))
        reader, writer = await open_raw(gateway)
        writer.write(request_head("/api/generate", size))
        head = await head_of(reader)
        assert head.startswith(b"HTTP/1.1 503")
        body = await reader.readexactly(length_of(head))
        assert b"MiB of other requests with this key (for a front end, its people's)" in body
        writer.close()
        _, bob = await invited(gateway, "bob-key", size)
        bob.close()
        first.close()


class TestEncodedBodiesOnTheirWay:
    async def test_an_encoded_body_counts_as_the_largest_a_body_may_be(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """A gzip body of 1,000 bytes may decode into 32 MiB: while one is on its way, a
        second from the same key is refused from its head, not read and decoded beside it."""
        _, url = await start_sim(parallel=2)
        gateway = await start_gateway(POLICY + one_backend(url, slots=2))
        gzip = "Content-Encoding: gzip\r\n"
        _, first = await invited(gateway, "alice-key", 1000, gzip)
        reader, writer = await open_raw(gateway)
        writer.write(request_head("/api/generate", 1000, "alice-key", gzip))
        assert (await head_of(reader)).startswith(b"HTTP/1.1 503")
        writer.close()
        first.close()


async def invited(
    gateway: Gateway, key: str, length: int, extra: str = ""
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A request head declaring ``length`` bytes (``extra``: more header lines), once the
    gateway has asked for its body (100 Continue: it counts it as on its way from then)."""
    reader, writer = await open_raw(gateway)
    expect = "Expect: 100-continue\r\n" + extra
    writer.write(request_head("/api/generate", length, key, expect))
    assert await head_of(reader) == b"HTTP/1.1 100 Continue\r\n\r\n"
    return reader, writer


class TestBigBodies:
    async def test_another_users_stream_flows_while_a_big_body_waits_for_the_parser(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """A big body is parsed beside the event loop: while it waits its turn in the parser
        (busy with another big body for as long as this test says), bob's stream keeps
        receiving chunks, and the body is answered once the parser reaches it."""
        _, url = await start_sim(decode_tokens_per_s=500.0, parallel=2)
        gateway = await start_gateway(POLICY + one_backend(url, slots=2))
        image = base64.b64encode(os.urandom(ON_LOOP_BYTES)).decode()
        big = {"model": MODEL, "prompt": "what is this?", "images": [image], "stream": False}
        long = {"model": MODEL, "prompt": "talk", "options": {"num_predict": 100_000}}
        parser_free = threading.Event()
        gateway.services.parsing.submit(parser_free.wait)
        try:
            async with (
                aiohttp.ClientSession(headers={"Authorization": "Bearer bob-key"}) as session,
                session.post(gateway.url + "/api/generate", json=long) as bob,
            ):
                assert await bob.content.readline()
                reader, writer = await open_raw(gateway)
                writer.write(request_bytes("/api/generate", json.dumps(big).encode()))
                await writer.drain()
                answer = asyncio.ensure_future(reader.readuntil(b"\r\n\r\n"))
                # bob's stream is the clock: 50 chunks, each relayed after the big body was
                # sent; the body cannot be answered before the parser has it.
                for _ in range(50):
                    assert await bob.content.readline()
                    assert not answer.done()
                parser_free.set()
                assert (await asyncio.wait_for(answer, 5)).startswith(b"HTTP/1.1 200")
                assert await bob.content.readline()
                writer.close()
        finally:
            parser_free.set()


def html_error_backend() -> web.Application:
    """An Ollama behind a web server that fails with its own HTML page."""

    async def listing(request: web.Request) -> web.Response:
        return web.json_response({"models": [{"name": MODEL, "model": MODEL}], "version": "0"})

    async def broken(request: web.Request) -> web.Response:
        page = "<html><body><h1>500 Internal Server Error</h1>nginx</body></html>"
        return web.Response(status=500, text=page, content_type="text/html")

    app = web.Application()
    for path in ("/api/version", "/api/tags", "/api/ps"):
        app.router.add_get(path, listing)
    app.router.add_post("/api/chat", broken)
    app.router.add_post("/v1/chat/completions", broken)
    return app


def target_echo_backend(seen: list[str]) -> web.Application:
    """An Ollama that answers each chat with an empty reply and notes its request target."""

    async def listing(request: web.Request) -> web.Response:
        return web.json_response({"models": [{"name": MODEL, "model": MODEL}], "version": "0"})

    async def chat(request: web.Request) -> web.Response:
        seen.append(request.raw_path)
        return web.json_response({"model": MODEL, "done": True})

    app = web.Application()
    for path in ("/api/version", "/api/tags", "/api/ps"):
        app.router.add_get(path, listing)
    app.router.add_post("/api/chat", chat)
    return app


class TestHttpHygiene:
    async def test_a_generation_path_written_with_an_escaped_slash_is_no_route(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """/api%2Fchat is not /api/chat to aiohttp's router, nor to the generation routes'
        shortcut past it (edge/http/hot_routes.py): a 404, and nothing reaches the backend."""
        sim, url = await start_sim(record_replies=True)
        gateway = await start_gateway(POLICY + one_backend(url, slots=2))
        reader, writer = await open_raw(gateway)
        try:
            writer.write(request_bytes("/api%2Fchat", CHAT, extra="X-Escaped: 1\r\n"))
            head = await head_of(reader)
        finally:
            writer.close()
        assert head.startswith(b"HTTP/1.1 404")
        assert not any("X-Escaped" in headers for headers in sim.request_headers)

    async def test_the_backend_gets_the_request_target_with_its_query_and_escapes(
        self, start_gateway: StartGateway, servers: AsyncExitStack
    ) -> None:
        """A query, or an escape in a generation path, reaches the backend as aiohttp read
        it, also after a plain request to that path."""
        seen: list[str] = []
        url = await serve(servers, target_echo_backend(seen))
        gateway = await start_gateway(POLICY + one_backend(url, slots=2))
        for path in ("/api/chat", "/api/chat?keep=1", "/api/%63hat", "/api/chat"):
            reader, writer = await open_raw(gateway)
            try:
                writer.write(request_bytes(path, CHAT))
                head = await head_of(reader)
            finally:
                writer.close()
            assert head.startswith(b"HTTP/1.1 200"), head
        assert seen == ["/api/chat", "/api/chat?keep=1", "/api/%63hat", "/api/chat"]

    async def test_headers_named_in_connection_are_not_forwarded(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """A header the client marked hop-by-hop (Connection: X-Hop) stops at the gateway."""
        sim, url = await start_sim(record_replies=True)
        gateway = await start_gateway(POLICY + one_backend(url, slots=2))
        headers = {"Authorization": "Bearer alice-key", "Connection": "keep-alive, X-Hop"}
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                gateway.url + "/api/generate", data=CHAT, headers={**headers, "X-Hop": "1"}
            ) as reply,
        ):
            assert reply.status == 200
        assert "x-hop" not in {name.lower() for name in sim.request_headers[-1]}

    async def test_a_gzip_body_is_forwarded_decoded_and_without_its_encoding(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """The gateway reads a compressed body decoded; the backend gets those bytes, and no
        Content-Encoding that would claim they are still compressed."""
        sim, url = await start_sim(record_replies=True)
        gateway = await start_gateway(POLICY + one_backend(url, slots=2))
        headers = {"Authorization": "Bearer alice-key"}
        status, text = await post_gzipped(gateway.url + "/api/generate", CHAT, headers)
        assert status == 200, text
        assert "content-encoding" not in {name.lower() for name in sim.request_headers[-1]}

    async def test_only_a_safe_client_request_id_becomes_ours(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """A plain X-Request-Id is used as the log's id; one with other characters is
        replaced by our own and logged beside it, escaped."""
        _, url = await start_sim()
        gateway = await start_gateway(POLICY + one_backend(url, slots=2))
        with structlog.testing.capture_logs() as logs:
            reader, writer = await open_raw(gateway)
            writer.write(request_bytes("/api/generate", CHAT, extra="X-Request-Id: trace-7\r\n"))
            head = await head_of(reader)
            assert b"X-Request-Id: trace-7\r\n" in head
            await reader.readexactly(length_of(head))
            forged = 'X-Request-Id: a b"\r\n'
            writer.write(request_bytes("/api/generate", CHAT, extra=forged))
            head = await head_of(reader)
            writer.close()
        assert b'a b"' not in head
        request = [entry for entry in logs if entry["event"] == "request"][-1]
        assert request["client_request_id"] == 'a b"'
        assert request["request_id"] != request["client_request_id"]

    async def test_each_request_without_an_id_of_its_own_gets_a_new_one(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """Requests that bring no X-Request-Id, one after another and at once, each get
        an id of 16 hex digits that no other request has."""
        _, url = await start_sim()
        gateway = await start_gateway(POLICY + one_backend(url, slots=2))
        headers = {"Authorization": "Bearer alice-key"}
        async with aiohttp.ClientSession() as session:

            async def request_id() -> str:
                async with session.post(
                    gateway.url + "/api/generate", data=CHAT, headers=headers
                ) as r:
                    await r.read()
                    return r.headers["X-Request-Id"]

            ids = [await request_id() for _ in range(3)]
            ids += await asyncio.gather(*(request_id() for _ in range(3)))
        assert len(set(ids)) == 6
        assert all(len(given) == 16 and int(given, 16) >= 0 for given in ids)

    async def test_a_backend_error_page_reaches_the_client_as_json_with_its_status(
        self, start_gateway: StartGateway, servers: AsyncExitStack
    ) -> None:
        """An HTML 500 from the backend becomes a JSON error in each API's shape, still 500."""
        url = await serve(servers, html_error_backend())
        gateway = await start_gateway(POLICY + one_backend(url, slots=2))
        headers = {"Authorization": "Bearer alice-key"}
        chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
        async with aiohttp.ClientSession() as session:
            async with session.post(gateway.url + "/api/chat", json=chat, headers=headers) as r:
                assert (r.status, r.content_type) == (500, "application/json")
                assert (await r.json())["error"] == "the backend answered 500 Internal Server Error"
            path = gateway.url + "/v1/chat/completions"
            async with session.post(path, json=chat, headers=headers) as r:
                assert r.status == 500
                assert (await r.json())["error"]["code"] == "backend_failed"

    async def test_an_unreachable_backend_is_not_named_to_the_client(
        self, start_gateway: StartGateway, unused_tcp_port: int
    ) -> None:
        """The 502 says what failed, not the backend's internal address."""
        gateway = await start_gateway(
            POLICY + one_backend(f"http://127.0.0.1:{unused_tcp_port}", slots=2)
        )
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                gateway.url + "/api/generate",
                data=CHAT,
                headers={"Authorization": "Bearer alice-key"},
            ) as reply,
        ):
            body = await reply.text()
        assert reply.status == 502 and str(unused_tcp_port) not in body
        assert json.loads(body)["error"] == "cannot reach the backend: connection refused"

    async def test_a_malformed_request_line_gets_a_400_that_echoes_nothing(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """The HTTP parser's refusal is short JSON, without the client's bytes, and closes."""
        _, url = await start_sim()
        gateway = await start_gateway(POLICY + one_backend(url, slots=2))
        reader, writer = await open_raw(gateway)
        garbage = b"GET /" + b"\x01SECRET" * 2000 + b" HTTP/1.1\r\n\r\n"
        writer.write(garbage)
        reply = await asyncio.wait_for(reader.read(), timeout=5)
        assert reply.split(b"\r\n")[0].endswith(b" 400 Bad Request") and b"SECRET" not in reply
        assert reply.endswith(b'{"error": "malformed HTTP request"}')
        writer.close()


def length_of(head: bytes) -> int:
    """The Content-Length a response head declares."""
    for line in head.decode().split("\r\n"):
        name, _, value = line.partition(":")
        if name.lower() == "content-length":
            return int(value)
    raise AssertionError(f"no Content-Length in {head!r}")


async def test_control_characters_from_a_client_are_escaped_in_the_console_log(
    start_sim: StartSim, start_gateway: StartGateway
) -> None:
    """A model name carrying a terminal escape is written as \\x1b in the console format."""
    _, url = await start_sim()
    gateway = await start_gateway(POLICY + one_backend(url, slots=2))
    body = json.dumps({"model": "x\x1b[2Jy", "prompt": "hi"}).encode()
    with structlog.testing.capture_logs() as logs:
        reader, writer = await open_raw(gateway)
        writer.write(request_bytes("/api/generate", body))
        assert (await head_of(reader)).startswith(b"HTTP/1.1 404")
        writer.close()
    event = next(entry for entry in logs if entry["event"] == "request")
    line = event
    for step in console_rendering():
        line = step(None, "info", line)
    assert "\x1b" not in str(line) and "model=x\\x1b[2Jy" in str(line)


async def test_a_model_name_no_backend_could_have_is_refused_and_kept_out_of_every_record(
    start_sim: StartSim, start_gateway: StartGateway
) -> None:
    """A chat, a /api/show and a /v1/models lookup naming a model of 8,000 characters get a
    short 400: the name is not echoed, logged or kept for the house page."""
    _, url = await start_sim()
    gateway = await start_gateway(POLICY + one_backend(url, slots=2))
    long_name = "m" * 8000
    bob = {"Authorization": "Bearer bob-key"}
    with structlog.testing.capture_logs() as logs:
        async with aiohttp.ClientSession(headers=bob) as session:
            for method, path, body in (
                ("POST", "/api/chat", {"model": long_name, "messages": []}),
                ("POST", "/api/show", {"model": long_name}),
                ("GET", f"/v1/models/{long_name}", None),
            ):
                async with session.request(method, gateway.url + path, json=body) as reply:
                    assert reply.status == 400, path
                    assert len(await reply.read()) < 300
    lines = [entry for entry in logs if entry["event"] == "request"]
    assert len(lines) == 3 and all(line["model"] is None for line in lines)
    assert all(len(r.model or "") < 1000 for r in gateway.services.history.snapshot().refusals)


async def test_a_model_name_with_half_a_surrogate_pair_is_a_400_not_a_5xx(
    start_sim: StartSim, start_gateway: StartGateway
) -> None:
    """JSON may escape a lone surrogate ("\\ud800"): no text, so no model's name. Refused
    before it reaches anything that must encode it (logs, Redis keys, the house's JSON)."""
    _, url = await start_sim()
    gateway = await start_gateway(POLICY + one_backend(url, slots=2))
    body = b'{"model": "llama\\ud800", "messages": []}'
    headers = {"Authorization": "Bearer bob-key", "Content-Type": "application/json"}
    async with (
        aiohttp.ClientSession() as session,
        session.post(gateway.url + "/api/chat", data=body, headers=headers) as reply,
    ):
        assert reply.status == 400
        assert "UTF-8" in (await reply.json())["error"]


class TestIdleConnections:
    async def test_a_head_sent_byte_by_byte_is_cut_at_the_idle_timeout(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """A client that never completes its request head loses the connection after
        idle_timeout, however it trickles bytes; a silent one too."""
        _, url = await start_sim()
        gateway = await start_gateway(POLICY + one_backend(url, slots=2), idle_timeout=0.5)
        trickler, trickle = await open_raw(gateway)
        silent, quiet = await open_raw(gateway)
        loop = asyncio.get_running_loop()
        started = loop.time()
        for byte in b"POST /api/generate HTTP/1.1\r\nHost: g\r\nX-Slow: ":
            trickle.write(bytes([byte]))
            if trickler.at_eof():
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(trickler.read(1), timeout=0.05)  # closed, or a tick
        assert await asyncio.wait_for(trickler.read(), timeout=5) == b""
        assert await asyncio.wait_for(silent.read(), timeout=5) == b""
        assert loop.time() - started < 3
        trickle.close()
        quiet.close()


class TestKeepAlive:
    async def test_a_stream_longer_than_the_idle_timeout_runs_to_its_end(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """The idle timeout counts only while a connection has no request: a reply that
        streams for longer is not cut, and the connection closes once idle that long."""
        _, url = await start_sim(decode_tokens_per_s=20.0)
        gateway = await start_gateway(POLICY + one_backend(url, slots=2), idle_timeout=0.5)
        reader, writer = await warm_raw(gateway)
        loop = asyncio.get_running_loop()
        started = loop.time()
        writer.write(request_bytes("/api/generate", _generate(tokens=20)))
        reply = await read_streamed(reader)
        ended = loop.time()
        assert ended - started > 0.5 and b'"done":true' in reply
        assert await asyncio.wait_for(reader.read(), timeout=5) == b""
        assert loop.time() - ended > 0.25
        writer.close()

    async def test_requests_pipelined_behind_a_stream_are_answered_in_order(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """Requests a client sends on one connection while a reply streams are answered
        after it, whole and in the order they were sent."""
        _, url = await start_sim(decode_tokens_per_s=50.0)
        gateway = await start_gateway(POLICY + one_backend(url, slots=2))
        reader, writer = await warm_raw(gateway)
        writer.write(request_bytes("/api/generate", _generate(tokens=10)))
        streaming = await head_of(reader)
        version = b"GET /api/version HTTP/1.1\r\nHost: gateway\r\n\r\n"
        writer.write(version + request_bytes("/api/generate", _generate(tokens=3)))
        first = await read_streamed(reader, streaming)
        assert first.startswith(b"HTTP/1.1 200") and first.count(b'"done":false') == 10
        head = await head_of(reader)
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        assert b'"version"' in await reader.readexactly(length)
        third = await read_streamed(reader)
        assert third.startswith(b"HTTP/1.1 200") and third.count(b'"done":false') == 3
        writer.close()

    async def test_a_hang_up_on_a_reused_connection_frees_the_slot_at_once(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """A client that closes a kept-alive connection mid-reply has its upstream request
        cancelled at once, not at the next token."""
        sim, url = await start_sim(decode_tokens_per_s=2.0)
        gateway = await start_gateway(POLICY + one_backend(url, slots=2))
        reader, writer = await warm_raw(gateway)
        writer.write(request_bytes("/api/generate", _generate(tokens=100)))
        await head_of(reader)
        assert sim.stats.running == 1
        writer.close()
        await sim.wait_for(lambda stats: stats.running == 0, timeout=0.2)

    async def test_a_request_that_asks_to_upgrade_leaves_the_one_behind_it_answered(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """A chat that asks to switch to websocket on a kept-alive connection (which the
        gateway does not do) is answered, and so is the request sent behind it, with no
        failure logged: as aiohttp's own path answers them."""
        _, url = await start_sim()
        gateway = await start_gateway(POLICY + one_backend(url, slots=2))
        chat = json.dumps({"model": MODEL, "prompt": "hi", "stream": False}).encode()
        version = b"GET /api/version HTTP/1.1\r\nHost: gateway\r\n\r\n"
        upgrade = "Connection: Upgrade\r\nUpgrade: websocket\r\n"
        for key in ("alice-key", "wrong-key"):
            with structlog.testing.capture_logs() as logs:
                reader, writer = await warm_raw(gateway)
                writer.write(request_bytes("/api/generate", chat, key=key, extra=upgrade) + version)
                first = await head_of(reader)
                await reader.readexactly(length_of(first))
                second = await head_of(reader)
                assert b'"version"' in await reader.readexactly(length_of(second))
                writer.close()
            assert first.startswith(b"HTTP/1.1 ") and second.startswith(b"HTTP/1.1 200")
            assert not [entry for entry in logs if entry["log_level"] == "error"]

    async def test_a_chat_that_asks_to_close_the_connection_has_it_closed(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """A request sent with ``Connection: close`` gets its reply, then the end of the
        connection."""
        _, url = await start_sim()
        gateway = await start_gateway(POLICY + one_backend(url, slots=2))
        reader, writer = await warm_raw(gateway)
        writer.write(
            request_bytes("/api/generate", _generate(tokens=2), extra="Connection: close\r\n")
        )
        reply = await read_streamed(reader)
        assert reply.startswith(b"HTTP/1.1 200") and b"Connection: close" in reply
        assert await asyncio.wait_for(reader.read(), timeout=5) == b""
        writer.close()


def _generate(tokens: int) -> bytes:
    options = {"num_predict": tokens}
    return json.dumps({"model": MODEL, "prompt": "hi", "options": options}).encode()


async def warm_raw(gateway: Gateway) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection that has had one reply: its next requests are each read while the
    connection waits for one (as from a client's pool), not with the connection's open."""
    reader, writer = await open_raw(gateway)
    writer.write(request_bytes("/api/generate", _generate(tokens=1)))
    await read_streamed(reader)
    return reader, writer


async def read_streamed(reader: asyncio.StreamReader, start: bytes = b"") -> bytes:
    """One chunked reply, head to its last chunk (``start``: what was read of it)."""
    reply = start
    while not reply.endswith(b"\r\n0\r\n\r\n"):
        data = await asyncio.wait_for(reader.read(65536), timeout=10)
        assert data, f"the connection ended within a reply: {reply[-200:]!r}"
        reply += data
    return reply


async def test_clients_probe_the_version_without_a_key(
    start_sim: StartSim, start_gateway: StartGateway
) -> None:
    """With users defined, /api/version and GET / still answer a client without a key."""
    _, url = await start_sim()
    gateway = await start_gateway(POLICY + one_backend(url, slots=2))
    async with aiohttp.ClientSession() as session:
        for path in ("/api/version", "/"):
            async with session.get(gateway.url + path) as reply:
                assert reply.status == 200, path
        async with session.get(gateway.url + "/api/tags") as reply:
            assert reply.status == 401
