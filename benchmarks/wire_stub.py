"""A fast Ollama stand-in for benchmarks: asyncio protocols, pre-rendered bytes.

The simulator in ``fairsim`` is faithful but costs about as much CPU per token as the
gateway does, so in a benchmark it, not the gateway, sets the pace. This stub answers only
what a streaming benchmark needs (``/``, ``/api/version``, ``/api/tags``, ``/api/ps`` and a
streamed ``/api/chat``) with the bytes Ollama sends: Go's headers, chunked transfer
encoding, one NDJSON line per chunk, the final line carrying the counts. Each token is its
own ``write``, so a reader that keeps up sees separate TCP segments, as it would from a GPU.

``interval`` paces the tokens like a batched decode step (every stream gets its next token
on the same tick); 0 streams them as fast as the event loop goes.

``GET /stamps`` answers, and forgets, when the stub read each streamed chat and when it
began to answer it (``time.perf_counter``, the system's monotonic clock, which the client's
stamps share): with the client's send and first-byte times, a request's way in and way back.

    python -m benchmarks.wire_stub --port 11434 [--tokens 50] [--interval 0.02]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import time
from collections import deque
from email.utils import formatdate

MODEL = "llama3.2:3b"
_CREATED = "2026-11-29T10:00:00.000000000Z"


def _chunk(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


def _line(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode() + b"\n"


def chat_chunks(tokens: int) -> list[bytes]:
    """The chunked-encoded body of a streamed /api/chat reply, one element per write."""
    head = {"model": MODEL, "created_at": _CREATED}
    lines = [
        _line({**head, "message": {"role": "assistant", "content": f" tok{n}"}, "done": False})
        for n in range(tokens)
    ]
    final = {
        **head,
        "message": {"role": "assistant", "content": ""},
        "done": True,
        "done_reason": "stop",
        "total_duration": 1_000_000,
        "load_duration": 0,
        "prompt_eval_count": 12,
        "prompt_eval_duration": 1000,
        "eval_count": tokens,
        "eval_duration": 1000,
    }
    # The final line and the end of the body go together, as when Ollama's handler returns.
    return [_chunk(line) for line in lines] + [_chunk(_line(final)) + b"0\r\n\r\n"]


def _head(content_type: str, length: int | None = None) -> bytes:
    size = f"Content-Length: {length}" if length is not None else "Transfer-Encoding: chunked"
    return (
        f"HTTP/1.1 200 OK\r\nContent-Type: {content_type}\r\n"
        f"Date: {formatdate(usegmt=True)}\r\n{size}\r\n\r\n"
    ).encode()


def _whole(content_type: str, body: bytes) -> bytes:
    return _head(content_type, len(body)) + body


_MODEL_ENTRY = {
    "name": MODEL,
    "model": MODEL,
    "size": 2019393189,
    "digest": "a80c4f17acd55265feec403c7aef86be0c25983ab279d83f3bcd3abbcb5b8b72",
    "details": {"format": "gguf", "family": "llama", "parameter_size": "3.2B"},
}
_GETS = {
    b"/": _whole("text/plain; charset=utf-8", b"Ollama is running"),
    b"/api/version": _whole("application/json; charset=utf-8", b'{"version":"0.12.6"}'),
    b"/api/tags": _whole("application/json; charset=utf-8", _line({"models": [_MODEL_ENTRY]})),
    b"/api/ps": _whole(
        "application/json; charset=utf-8",
        _line({"models": [{**_MODEL_ENTRY, "expires_at": "2318-03-11T10:00:00Z"}]}),
    ),
}
_STAMPS_KEPT = 200_000  # (read, answered) pairs held until asked for; the oldest go first
_NOT_FOUND = b"HTTP/1.1 404 Not Found\r\nContent-Length: 18\r\n\r\n404 page not found"


def content_length(head: list[str]) -> int | None:
    """The Content-Length of a message head (start line, then header lines), if it has one."""
    for field in head[1:]:
        name, _, value = field.partition(":")
        if name.strip().lower() == "content-length":
            return int(value)
    return None


class _Ticker:
    """One clock for every stream: with an interval, each stream's next token waits for it."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._tick = asyncio.Event()

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            self._tick.set()
            self._tick = asyncio.Event()

    async def wait(self) -> None:
        if self.interval:
            await self._tick.wait()
        else:
            await asyncio.sleep(0)


Stamps = deque[tuple[float, float]]


class _Connection(asyncio.Protocol):
    def __init__(self, body: list[bytes], ticker: _Ticker, stamps: Stamps) -> None:
        self.body = body
        self.ticker = ticker
        self.stamps = stamps
        self.buffer = b""
        self.transport: asyncio.Transport | None = None
        self.writable = asyncio.Event()
        self.writable.set()
        self.busy = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if not self.busy:
            self._next_request()

    def pause_writing(self) -> None:
        self.writable.clear()

    def resume_writing(self) -> None:
        self.writable.set()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.writable.set()

    def _next_request(self) -> None:
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            return
        head = self.buffer[:end].decode("latin-1").split("\r\n")
        length = content_length(head) or 0
        if len(self.buffer) < end + 4 + length:
            return
        self.buffer = self.buffer[end + 4 + length :]
        method, path, _ = head[0].split(" ", 2)
        assert self.transport is not None
        if method == "POST" and path == "/api/chat":
            self.busy = True
            asyncio.get_running_loop().create_task(self._stream(time.perf_counter()))
        elif path == "/stamps":
            self.transport.write(_whole("application/json", json.dumps(list(self.stamps)).encode()))
            self.stamps.clear()
            self._next_request()
        else:
            self.transport.write(_GETS.get(path.encode(), _NOT_FOUND))
            self._next_request()

    async def _stream(self, read_at: float) -> None:
        transport = self.transport
        assert transport is not None
        self.stamps.append((read_at, time.perf_counter()))
        transport.write(_head("application/x-ndjson"))
        for index, piece in enumerate(self.body):
            if index:  # the first token goes at once: prefill costs nothing here
                await self.ticker.wait()
            await self.writable.wait()
            if self.transport is None:
                return
            transport.write(piece)
        self.busy = False
        self._next_request()


async def serve(port: int, tokens: int, interval: float) -> None:
    loop = asyncio.get_running_loop()
    ticker = _Ticker(interval)
    body = chat_chunks(tokens)
    stamps: Stamps = deque(maxlen=_STAMPS_KEPT)
    server = await loop.create_server(
        lambda: _Connection(body, ticker, stamps), "127.0.0.1", port, backlog=4096
    )
    clock = loop.create_task(ticker.run()) if interval else None
    async with server:
        await server.serve_forever()
    if clock is not None:
        clock.cancel()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--tokens", type=int, default=50)
    parser.add_argument("--interval", type=float, default=0.0)
    args = parser.parse_args()
    asyncio.run(serve(args.port, args.tokens, args.interval))
