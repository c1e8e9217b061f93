"""What a client gets through the gateway when a backend's reply bends HTTP: an empty stream,
a fault after the last bytes, endless trailers, an impossible status, header bytes that are
not text, and an HTTP/1.0 client that asked to keep its connection."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable

import aiohttp
import pytest
from yarl import URL

from tests.conftest import StartGateway, one_backend
from tests.raw_backend import raw_backend

MODEL = "m:1"
CHAT = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}).encode()
_STREAM_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\nTransfer-Encoding: chunked\r\n"
)
_LISTED = {
    b"/api/version": {"version": "0.9.0"},
    b"/api/tags": {"models": [{"name": MODEL, "model": MODEL, "size": 1000}]},
    b"/api/ps": {"models": []},
}
Post = Callable[[asyncio.StreamWriter], Awaitable[None]]


def ollama(post: Post) -> Callable[[bytes, asyncio.StreamWriter], Awaitable[None]]:
    """A raw backend's answer: Ollama's listings for the gateway's probes, ``post`` for a
    chat."""

    async def answer(request: bytes, writer: asyncio.StreamWriter) -> None:
        method, path = request.split(b" ", 2)[:2]
        if method == b"GET":
            body = json.dumps(_LISTED.get(path, {})).encode()
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n%b" % (len(body), body)
            )
            return
        await post(writer)

    return answer


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(data), data)


async def _raw_chat(url: str, version: str = "1.1", connection: str = "keep-alive") -> bytes:
    """A chat sent on a socket of its own: every byte of the reply, to the connection's end."""
    address = URL(url)
    reader, writer = await asyncio.open_connection(address.host, address.port)
    writer.write(
        f"POST /api/chat HTTP/{version}\r\nHost: localhost\r\nConnection: {connection}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(CHAT)}\r\n\r\n".encode()
        + CHAT
    )
    try:
        async with asyncio.timeout(10):
            return await reader.read(-1)
    finally:
        writer.close()


class TestOddReplies:
    async def test_an_empty_stream_ends_once_and_its_connection_serves_the_next_request(
        self, start_gateway: StartGateway
    ) -> None:
        """A streamed reply with no bytes gets one end: the kept-alive connection's next
        reply is read where it begins."""

        async def empty(writer: asyncio.StreamWriter) -> None:
            writer.write(_STREAM_HEAD + b"\r\n0\r\n\r\n")

        async with raw_backend(ollama(empty)) as backend:
            gateway = await start_gateway(one_backend(backend.url))
            connector = aiohttp.TCPConnector(limit=1)  # one connection, two requests on it
            async with aiohttp.ClientSession(connector=connector) as session:
                for _ in range(2):
                    async with session.post(gateway.url + "/api/chat", data=CHAT) as reply:
                        assert reply.status == 200
                        assert await reply.read() == b""

    @pytest.mark.parametrize(
        ("fault", "ends_cleanly"), [(b"0\r\n\r\nGARBAGE", True), (b"ZZZ\r\n", False)]
    )
    async def test_the_bytes_before_a_fault_reach_the_client(
        self, start_gateway: StartGateway, fault: bytes, ends_cleanly: bool
    ) -> None:
        """A read that holds the reply's last bytes and then bytes no reply may hold passes
        those last bytes on: with the end when it came first, else before an in-band
        error."""
        first, last = b'{"n":1}\n', b'{"n":2,"done":true}\n'
        received_first = asyncio.Event()

        async def faulty(writer: asyncio.StreamWriter) -> None:
            writer.write(_STREAM_HEAD + b"\r\n" + _chunk(first))
            await received_first.wait()  # the rest in a read of its own, while it streams
            writer.write(_chunk(last) + fault)

        async with raw_backend(ollama(faulty)) as backend:
            gateway = await start_gateway(one_backend(backend.url))
            async with (
                aiohttp.ClientSession() as session,
                session.post(gateway.url + "/api/chat", data=CHAT) as reply,
            ):
                assert await reply.content.readline() == first
                received_first.set()
                rest = await reply.content.read()
        assert rest.startswith(last)
        if ends_cleanly:
            assert rest == last
        else:
            assert "error" in json.loads(rest[len(last) :])

    async def test_endless_trailers_are_cut_off_and_not_kept(
        self, start_gateway: StartGateway
    ) -> None:
        """Trailers after a stream's last chunk are read up to a bound, then the backend's
        connection is closed and the client's stream ends with an in-band error."""
        written, limit = 0, 16 * 1024 * 1024
        line = b"X-T: " + b"a" * 1000 + b"\r\n"

        async def trailers(writer: asyncio.StreamWriter) -> None:
            nonlocal written
            writer.write(_STREAM_HEAD + b"\r\n" + _chunk(b'{"n":1}\n') + b"0\r\n")
            while written < limit:  # a gateway that keeps reading takes all of it
                writer.write(line * 64)
                written += len(line) * 64
                await writer.drain()
            await asyncio.Future()  # and then waits for the gateway to give up

        async with raw_backend(ollama(trailers)) as backend:
            gateway = await start_gateway(one_backend(backend.url))
            async with (
                aiohttp.ClientSession() as session,
                session.post(gateway.url + "/api/chat", data=CHAT) as reply,
            ):
                async with asyncio.timeout(20):
                    body = await reply.content.read()
        assert body.startswith(b'{"n":1}\n') and b"error" in body
        assert written < limit

    async def test_a_status_below_100_is_a_bad_gateway(self, start_gateway: StartGateway) -> None:
        """A status line that llhttp reads but no client can (099) is the backend's failure:
        502, not a status line passed on."""

        async def odd(writer: asyncio.StreamWriter) -> None:
            writer.write(b"HTTP/1.1 099 Odd\r\nContent-Length: 2\r\n\r\n{}")

        async with raw_backend(ollama(odd)) as backend:
            gateway = await start_gateway(one_backend(backend.url))
            async with (
                aiohttp.ClientSession() as session,
                session.post(gateway.url + "/api/chat", data=CHAT) as reply,
            ):
                assert reply.status == 502

    @pytest.mark.parametrize("connection", ["keep-alive", "close"])
    async def test_header_values_go_on_as_utf_8_or_not_at_all(
        self, start_gateway: StartGateway, connection: str
    ) -> None:
        """A backend's header value in UTF-8 reaches the client byte for byte; one that is
        not text stays behind; the same whichever way the head is written (a kept-alive
        stream's is the gateway's own, one that closes is aiohttp's)."""

        async def headers(writer: asyncio.StreamWriter) -> None:
            writer.write(
                _STREAM_HEAD + b"X-Utf8: caf\xc3\xa9\r\nX-Latin: caf\xe9\r\n"
                b"X-Surrogate: \xed\xa0\x80\r\n\r\n" + _chunk(b'{"n":1}\n') + b"0\r\n\r\n"
            )

        async with raw_backend(ollama(headers)) as backend:
            gateway = await start_gateway(one_backend(backend.url))
            if connection == "keep-alive":
                reply = await _kept_alive_reply(gateway.url)
            else:
                reply = await _raw_chat(gateway.url, connection="close")
        head = reply.partition(b"\r\n\r\n")[0].split(b"\r\n")
        assert b"X-Utf8: caf\xc3\xa9" in head
        assert not [line for line in head if line.lower().startswith((b"x-latin", b"x-surr"))]

    async def test_an_http_1_0_stream_ends_with_its_connection(
        self, start_gateway: StartGateway
    ) -> None:
        """An HTTP/1.0 client that asked to keep its connection gets a streamed reply whose
        end is the connection's: closed once the stream is over, not at the idle timeout."""

        async def stream(writer: asyncio.StreamWriter) -> None:
            writer.write(_STREAM_HEAD + b"\r\n" + _chunk(b'{"n":1}\n') + b"0\r\n\r\n")

        async with raw_backend(ollama(stream)) as backend:
            gateway = await start_gateway(one_backend(backend.url), idle_timeout=300)
            reply = await _raw_chat(gateway.url, version="1.0")
        assert reply.startswith(b"HTTP/1.0 200") and reply.endswith(b'{"n":1}\n')


async def _kept_alive_reply(url: str) -> bytes:
    """A kept-alive chat's reply, read to its end (the chunked terminator)."""
    address = URL(url)
    reader, writer = await asyncio.open_connection(address.host, address.port)
    writer.write(
        b"POST /api/chat HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%b" % (len(CHAT), CHAT)
    )
    try:
        async with asyncio.timeout(10):
            return await reader.readuntil(b"\r\n0\r\n\r\n")
    finally:
        writer.close()
