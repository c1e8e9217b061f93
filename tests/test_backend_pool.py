"""The relay client's pool of idle keep-alive connections, against a raw loopback server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from multidict import CIMultiDict

from gateway.relay.upstream_client import BackendClient

_REPLY = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"


class _Backend:
    """Answers each request with ``{}``; notes when the client closes a connection."""

    def __init__(self) -> None:
        self.url = ""
        self.connections = 0
        self.closed: asyncio.Future[float] = asyncio.get_running_loop().create_future()

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        while await reader.readuntil(b"\r\n\r\n") and await reader.readexactly(2):
            writer.write(_REPLY)
        # readuntil raises at the client's close; the loop never ends otherwise


@asynccontextmanager
async def _backend() -> AsyncIterator[_Backend]:
    backend = _Backend()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await backend.serve(reader, writer)
        except asyncio.IncompleteReadError:
            if not backend.closed.done():
                backend.closed.set_result(asyncio.get_running_loop().time())
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    backend.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/api/chat"
    async with server:
        yield backend


async def _ask(client: BackendClient, url: str) -> bytes:
    headers = CIMultiDict({"Content-Type": "application/json"})
    async with await client.request(
        "POST", url, headers, b"{}", connect_timeout=5, first_byte=5
    ) as reply:
        return await reply.read_up_to(100)


async def test_an_idle_connection_is_closed_after_the_idle_time() -> None:
    """A connection nobody takes again is closed once idle_seconds have passed, so a
    backend is not left holding sockets for requests that never come."""
    client = BackendClient(limit=4, idle_seconds=0.05)
    try:
        async with _backend() as backend:
            given_back = asyncio.get_running_loop().time()
            assert await _ask(client, backend.url) == b"{}"
            async with asyncio.timeout(5):  # closed by the pool, or never
                closed = await backend.closed
            assert closed - given_back >= 0.05 and backend.connections == 1
    finally:
        await client.close()


async def test_a_connection_used_again_stays_open_for_a_whole_idle_time() -> None:
    """Each time a connection is given back its idle time starts again: the close due
    for its earlier idle spell does not happen, the one for its last does."""
    client = BackendClient(limit=4, idle_seconds=0.6)
    loop = asyncio.get_running_loop()
    try:
        async with _backend() as backend:
            await _ask(client, backend.url)
            # Idle a third of the idle time: the scenario's time passing, not a wait for
            # anything (a machine held up 0.4 s more would close it before its reuse).
            await asyncio.sleep(0.2)
            again = loop.time()
            await _ask(client, backend.url)
            assert backend.connections == 1  # the same connection, reused
            async with asyncio.timeout(5):
                closed = await backend.closed
            assert closed - again >= 0.6 and backend.connections == 1
    finally:
        await client.close()
