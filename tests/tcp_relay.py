"""A loopback TCP relay in front of a real server, that can hold back a reply.

It forwards bytes both ways. Armed with ``hold_replies(n, marker)``, it lets the next ``n``
requests that contain ``marker`` through to the server, and keeps everything the server
answers on those connections from the client until the client gives up and closes: the
server has acted, the client never hears so. That is a slow Redis (a fsync stall, a lost
packet) as its client sees it, so that the client's own retry happens for real.
"""

from __future__ import annotations

import asyncio
import contextlib

__all__ = ["Relay"]

_CHUNK = 65536


class Relay:
    """Forwards connections to ``port`` on loopback; ``url`` is where clients connect."""

    def __init__(self, port: int) -> None:
        self._port = port
        self._server: asyncio.Server | None = None
        self._to_hold = 0
        self._marker = b""
        self._tasks: set[asyncio.Task[None]] = set()
        self.held = 0  # answers the server gave that the client never got
        self.url = ""

    async def __aenter__(self) -> Relay:
        await self.start()
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"redis://127.0.0.1:{port}/0"

    def hold_replies(self, count: int, marker: bytes) -> None:
        """Withhold the answers to the next ``count`` requests that contain ``marker``."""
        self._to_hold, self._marker = count, marker

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._server is not None:
            await self._server.wait_closed()

    async def _serve(
        self, client_in: asyncio.StreamReader, client_out: asyncio.StreamWriter
    ) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        server_in, server_out = await asyncio.open_connection("127.0.0.1", self._port)
        holding = asyncio.Event()
        withheld = False
        upstream = asyncio.ensure_future(self._requests(client_in, server_out, holding))
        try:
            while chunk := await server_in.read(_CHUNK):
                if holding.is_set():
                    self.held += not withheld  # the server acted: its answer is here
                    withheld = True
                else:
                    client_out.write(chunk)
                    await client_out.drain()
            await upstream
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            upstream.cancel()
            with contextlib.suppress(asyncio.CancelledError, ConnectionError):
                await upstream
            server_out.close()
            client_out.close()
            self._tasks.discard(task)

    async def _requests(
        self,
        client_in: asyncio.StreamReader,
        server_out: asyncio.StreamWriter,
        holding: asyncio.Event,
    ) -> None:
        while chunk := await client_in.read(_CHUNK):
            if self._to_hold and not holding.is_set() and self._marker in chunk:
                self._to_hold -= 1
                holding.set()  # before the server can answer: the whole answer is held
            server_out.write(chunk)
            await server_out.drain()
        server_out.close()  # the client gave up: the server's side goes too, as with a real hang-up
