"""A loopback backend that answers exactly the bytes a test writes, to see what the gateway
makes of replies no real server sends on a good day."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

__all__ = ["Answer", "RawBackend", "raw_backend"]

# One raw backend: given each request's head (and body) and the writer, answers as it likes.
Answer = Callable[[bytes, asyncio.StreamWriter], Awaitable[None]]


class RawBackend:
    """A loopback server that reads requests one after another on each connection."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.connections = 0
        self.requests: list[bytes] = []
        self.url = ""

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while head := await reader.readuntil(b"\r\n\r\n"):
                length = next(
                    (
                        int(line.split(b":")[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length:")
                    ),
                    0,
                )
                request = head + await reader.readexactly(length)
                self.requests.append(request)
                await self.answer(request, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@asynccontextmanager
async def raw_backend(answer: Answer) -> AsyncIterator[RawBackend]:
    backend = RawBackend(answer)
    server = await asyncio.start_server(backend._serve, "127.0.0.1", 0)
    backend.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    async with server:
        yield backend
        server.close()
