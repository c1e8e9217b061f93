"""What relaying one streamed reply costs the gateway, from the permit to the end of the
request's bookkeeping, in microseconds of CPU per request.

One process, one uvloop loop, everything over loopback: a client asks, the gateway's app
(its middleware, reply-header hooks and listeners: access record, metrics, history, usage)
runs a handler that does what the generation handler does after the permit (the record's
fields, ``Relay.run``, ``record.add``), and a stub backend answers with Ollama's streamed
``/api/chat`` (64 tokens, Go's head, chunked), in one write or one write per token (the
gateway then reads and relays each token on its own). Client and stub are this file's and
the same for every tree, so a difference between trees is the relay path's. The CPU per
request at one read and at 65 gives the reply's fixed cost (head, start, end,
bookkeeping) and the cost of each further read.

``bare`` beside it: the same requests through a relay with no logic at all
(``benchmarks/bare_relay.py``'s aiohttp server with the gateway's backend client), the
floor of this stack.

    python -m benchmarks.relay_path [--requests 4000]

Old code against new, side by side (each tree in its own processes, taking turns; the
best of the rounds):

    git archive main | tar -x -C /tmp/old
    python -m benchmarks.relay_path --tree /tmp/old --tree . [--rounds 5]
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import cast

from aiohttp import web

from gateway.app import SERVICES, create_app, new_event_loop
from gateway.config.policy import parse_policy
from gateway.config.settings import Settings
from gateway.core.logs import configure_logging
from gateway.core.vocabulary import Lane, RequestClass
from gateway.edge.http.access_log import RECORD
from gateway.relay.relay import Relay, Target

_TOKENS = 64
_BODY = b'{"model":"llama3.2:3b","messages":[{"role":"user","content":"hi"}]}'
_POLICY = """\
users:
  alice: {keys: [alice-key]}
backends:
  - {name: stub, url: "http://127.0.0.1:%d", kind: ollama, slots: 4}
"""
_REQUEST = (
    b"POST /relay HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: python-httpx/0.28.1\r\n"
    b"Accept: */*\r\nAccept-Encoding: gzip, deflate\r\nConnection: keep-alive\r\n"
    b"Authorization: Bearer alice-key\r\nContent-Type: application/json\r\n"
    b"Content-Length: %d\r\n\r\n%s" % (len(_BODY), _BODY)
)
_NOT_FOUND = b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n"
_READS = (1, _TOKENS + 1)
_ROWS = ("gateway, 1 read", "gateway, 65 reads", "bare, 1 read", "bare, 65 reads")


def _chunk(payload: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(payload), payload)


def _reply() -> list[bytes]:
    """Ollama's streamed /api/chat, one element per token (the last ends the body)."""
    line = b'{"model":"llama3.2:3b","created_at":"2026-11-29T10:00:00Z","message":'
    tokens = [
        _chunk(line + b'{"role":"assistant","content":" tok%d"},"done":false}\n' % n)
        for n in range(_TOKENS)
    ]
    final = (
        line + b'{"role":"assistant","content":""},"done":true,"done_reason":"stop",'
        b'"total_duration":1000000,"load_duration":0,"prompt_eval_count":12,'
        b'"prompt_eval_duration":1000,"eval_count":%d,"eval_duration":1000}\n' % _TOKENS
    )
    head = (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\n"
        b"Date: Sun, 29 Nov 2026 10:00:00 GMT\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    return [head + tokens[0], *tokens[1:], _chunk(final) + b"0\r\n\r\n"]


class _Stub(asyncio.Protocol):
    """The backend: each request's reply in ``reads`` writes, a loop turn between them."""

    def __init__(self, reads: int) -> None:
        pieces = _reply()
        if reads == 1:
            pieces = [b"".join(pieces)]
        self._pieces = pieces
        self._buffer = b""
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's are only alike

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        end = self._buffer.find(b"\r\n\r\n")
        if end < 0:
            return
        head = self._buffer[:end].lower()
        if not head.startswith(b"post"):  # the gateway's probes: nothing here
            self._buffer = b""
            assert self._transport is not None
            self._transport.write(_NOT_FOUND)
            return
        length = int(head.split(b"content-length: ")[1].split(b"\r")[0])
        if len(self._buffer) >= end + 4 + length:
            self._buffer = b""
            asyncio.get_running_loop().create_task(self._answer())

    async def _answer(self) -> None:
        assert self._transport is not None
        for index, piece in enumerate(self._pieces):
            if index:
                await asyncio.sleep(0)
            self._transport.write(piece)


class _Client(asyncio.Protocol):
    """Asks ``count`` times, one request after the other on one keep-alive connection."""

    def __init__(self, count: int) -> None:
        self.done = asyncio.get_running_loop().create_future()
        self._left = count
        self._tail = b""
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's are only alike
        self._transport.write(_REQUEST)

    def data_received(self, data: bytes) -> None:
        tail = self._tail + data[-5:]
        self._tail = tail[-5:]
        if tail.endswith(b"0\r\n\r\n"):  # the last chunk: the reply is whole
            self._left -= 1
            self._tail = b""
            assert self._transport is not None
            if self._left:
                self._transport.write(_REQUEST)
            elif not self.done.done():
                self.done.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_exception(exc or ConnectionError("closed"))


def _gateway(stub_port: int) -> web.Application:
    directory = tempfile.mkdtemp(prefix="relay-path-")
    settings = Settings(usage_db=Path(directory) / "usage.db")
    app = create_app(settings, parse_policy(_POLICY % stub_port))
    services = app[SERVICES]
    url = f"http://127.0.0.1:{stub_port}/api/chat"

    async def relay(request: web.Request) -> web.StreamResponse:
        """What the generation handler does after its permit, and what it writes."""
        body = await request.read()
        record = request[RECORD]
        record.user, record.model, record.backend = "alice", "llama3.2:3b", "stub"
        record.request_class, record.input_estimate = RequestClass.LIGHT, 12
        record.lane = Lane.INTERACTIVE
        now = time.monotonic()
        record.queue_wait, record.dispatched_at, record.queue_position = 0.0, now, 0
        target = Target(url, services.policy.current.policy.timeouts)
        run = Relay(services.upstream.replies, target, services.reply_headers, _charge)
        services.streams.add(run)
        try:
            return await run.run(request, body)
        finally:
            services.streams.discard(run)
            record.add(run.progress)

    app.router.add_post("/relay", relay)
    return app


def _charge(tokens: int) -> None:
    return None


def _bare(stub_port: int) -> web.Application:
    from benchmarks.bare_relay import CLIENT, UPSTREAM, aiohttp_server_relay
    from gateway.relay.upstream_client import BackendClient

    app = web.Application()
    app[UPSTREAM] = f"http://127.0.0.1:{stub_port}"

    async def lifetime(app: web.Application) -> AsyncIterator[None]:
        app[CLIENT] = BackendClient(16)
        yield
        await app[CLIENT].close()

    app.cleanup_ctx.append(lifetime)
    app.router.add_post("/relay", aiohttp_server_relay)
    return app


async def _run(stack: str, reads: int, requests: int) -> float:
    """CPU microseconds per request (client, stub and relay: one process)."""
    loop = asyncio.get_running_loop()
    stub = await loop.create_server(lambda: _Stub(reads), "127.0.0.1", 0)
    stub_port = stub.sockets[0].getsockname()[1]
    app = _gateway(stub_port) if stack == "gateway" else _bare(stub_port)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        # Warm up: the pool's connection, the caches, the first minute's counts.
        _, client = await loop.create_connection(lambda: _Client(200), "127.0.0.1", port)
        await client.done
        start = time.process_time()
        _, client = await loop.create_connection(lambda: _Client(requests), "127.0.0.1", port)
        await client.done
        return (time.process_time() - start) / requests * 1e6
    finally:
        await runner.cleanup()
        stub.close()


def measure(requests: int) -> dict[str, float]:
    """Each row's microseconds per request, in this process's ``gateway``."""
    # The gateway's logging at WARNING (no access line), its lines written to /dev/null.
    stderr = sys.stderr
    sys.stderr = open(os.devnull, "w")  # noqa: SIM115  # the logger writes to it until exit
    try:
        configure_logging("json", "WARNING")
    finally:
        sys.stderr = stderr
    figures = {}
    for row in _ROWS:
        stack, reads = row.split(", ")[0], _READS[0] if "1 read" in row else _READS[1]
        loop = new_event_loop("auto")
        try:
            figures[row] = loop.run_until_complete(_run(stack, reads, requests))
        finally:
            loop.close()
    return figures


def report(trees: list[str], best: list[dict[str, float]]) -> None:
    """The trees' figures, and what a further read and the logic cost in each."""
    from benchmarks.trees import print_header, print_row

    print_header("CPU us per request", trees)
    for row in _ROWS:
        print_row(row, [figures[row] for figures in best])
    per_read = [(f[_ROWS[1]] - f[_ROWS[0]]) / (_READS[1] - _READS[0]) for f in best]
    print_row("gateway, each further read", per_read)
    print_row("gateway over bare, 1 read", [f[_ROWS[0]] - f[_ROWS[2]] for f in best])


if __name__ == "__main__":
    from benchmarks.trees import run

    run(__file__, __doc__ or "", measure, report, requests=4000)
