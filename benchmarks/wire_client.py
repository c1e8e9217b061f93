"""A fast HTTP/1.1 client for benchmarks: asyncio protocols, no HTTP library.

K keep-alive connections each send a streamed /api/chat, read the reply to its end, and send
the next, for a fixed time: at once (a closed loop, as fast as the path goes), or with
``--rate`` on a schedule (the same load on every path, so their latencies compare). Per
request it records the time to the first NDJSON line (TTFT), the gaps between reads that
carried lines (ITL), the lines and the status. An aiohttp client costs about as much per
chunk as the gateway, so it would measure itself; this one costs a few microseconds per
read. Prints one JSON document (with ``--timeline``, each counted request's send and first
line too, ``time.perf_counter`` seconds).

    python -m benchmarks.wire_client --url http://127.0.0.1:8080 [--concurrency 100]
        [--seconds 5] [--warmup 1] [--keys KEY,KEY] [--pause 0] [--spread 0] [--rate 0]
        [--timeline]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from benchmarks.wire_stub import content_length

_CHUNKED_END = b"\r\n0\r\n\r\n"


@dataclass
class Tally:
    """What the connections saw between ``start`` and ``stop`` (perf_counter seconds)."""

    start: float
    stop: float
    pause: float = 0.0  # seconds a refused client waits before asking again
    # With a rate: seconds between one connection's requests (sent on that schedule, not
    # when the last reply ends, unless it ends late), so every path gets the same load.
    interval: float = 0.0
    ttfts: list[float] = field(default_factory=list)
    gaps: list[float] = field(default_factory=list)
    latencies: dict[int, list[float]] = field(default_factory=dict)  # by status
    lines: int = 0
    # (sent, first line) of each counted request, for a timeline (``--timeline``)
    sends: list[tuple[float, float]] = field(default_factory=list)


class _Connection(asyncio.Protocol):
    def __init__(self, request: bytes, tally: Tally, closed: asyncio.Future[None]) -> None:
        self.request = request
        self.tally = tally
        self.closed = closed
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self._send()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)

    def _send(self) -> None:
        assert self.transport is not None
        if time.perf_counter() >= self.tally.stop:
            self.transport.close()
            return
        self.sent = time.perf_counter()
        self.head = b""
        self.status = 0
        self.remaining: int | None = None  # body bytes left when Content-Length is given
        self.tail = b""
        self.first = self.last = 0.0
        self.lines = 0
        self.gaps: list[float] = []
        self.transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()
        if not self.status:
            self.head += data
            end = self.head.find(b"\r\n\r\n")
            if end < 0:
                return
            head, data = self.head[:end].decode("latin-1").split("\r\n"), self.head[end + 4 :]
            self.status = int(head[0].split(" ", 2)[1])
            self.remaining = content_length(head)
        lines = data.count(b"}\n") if self.status == 200 else 0
        if lines:
            if self.lines:
                self.gaps.append(now - self.last)
            else:
                self.first = now
            self.lines += lines
            self.last = now
        if self.remaining is not None:
            self.remaining -= len(data)
            finished = self.remaining <= 0
        else:
            self.tail = (self.tail + data)[-len(_CHUNKED_END) :]
            finished = self.tail == _CHUNKED_END
        if finished:
            self._finish(now)

    def _finish(self, now: float) -> None:
        tally = self.tally
        if self.sent >= tally.start and now <= tally.stop:
            tally.latencies.setdefault(self.status, []).append(now - self.sent)
            if self.lines:
                tally.ttfts.append(self.first - self.sent)
                tally.sends.append((self.sent, self.first))
                tally.gaps += self.gaps
                tally.lines += self.lines
        loop = asyncio.get_running_loop()
        if self.status != 200 and tally.pause:
            loop.call_later(tally.pause, self._send)
        elif tally.interval and self.sent + tally.interval > now:
            loop.call_later(self.sent + tally.interval - now, self._send)
        else:
            self._send()


def _request(url: str, key: str) -> bytes:
    parts = urlsplit(url)
    body = b'{"model":"llama3.2:3b","messages":[{"role":"user","content":"bench"}]}'
    auth = f"Authorization: Bearer {key}\r\n" if key else ""
    return (
        f"POST /api/chat HTTP/1.1\r\nHost: {parts.netloc}\r\n{auth}"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body


async def run(
    url: str,
    concurrency: int,
    seconds: float,
    warmup: float,
    keys: list[str],
    pause: float = 0.0,
    spread: float = 0.0,
    rate: float = 0.0,
) -> Tally:
    """``rate``: requests a second from all connections together, each connection on its
    own schedule (0: each sends its next request when its last reply ends)."""
    started = time.perf_counter()
    interval = concurrency / rate if rate else 0.0
    tally = Tally(started + warmup, started + warmup + seconds, pause, interval=interval)
    spread = spread or interval  # on a schedule, the connections take turns evenly
    requests = [_request(url, key) for key in keys or [""]]
    await asyncio.wait_for(
        asyncio.gather(
            *(
                _keep_connected(url, requests[n % len(requests)], tally, n * spread / concurrency)
                for n in range(concurrency)
            )
        ),
        timeout=warmup + seconds + 60,
    )
    return tally


async def _keep_connected(url: str, request: bytes, tally: Tally, delay: float) -> None:
    """One client: after ``delay``, a connection sending requests back to back, reopened if
    the server closes it, until the tally's stop time."""
    await asyncio.sleep(delay)
    loop = asyncio.get_running_loop()
    parts = urlsplit(url)
    while time.perf_counter() < tally.stop:
        closed: asyncio.Future[None] = loop.create_future()
        connection = _Connection(request, tally, closed)
        await loop.create_connection(lambda c=connection: c, parts.hostname, parts.port)
        await closed


def _cut(values: list[float], at: int) -> float:
    if len(values) < 2:
        return values[0] if values else 0.0
    return statistics.quantiles(values, n=100)[at - 1]


def summary(tally: Tally, timeline: bool = False) -> dict[str, object]:
    seconds = tally.stop - tally.start
    sends = {"sends": tally.sends} if timeline else {}
    return sends | {
        "requests_per_s": sum(map(len, tally.latencies.values())) / seconds,
        "lines_per_s": tally.lines / seconds,
        "statuses": {
            status: {"count": len(times), "p50": _cut(times, 50), "p99": _cut(times, 99)}
            for status, times in sorted(tally.latencies.items())
        },
        "ttft_p50": _cut(tally.ttfts, 50),
        "ttft_p99": _cut(tally.ttfts, 99),
        "itl_p50": _cut(tally.gaps, 50),
        "itl_p99": _cut(tally.gaps, 99),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument(
        "--keys", default="", help="comma-separated API keys, one per connection in turn"
    )
    parser.add_argument("--pause", type=float, default=0.0, help="after a refusal, wait this long")
    parser.add_argument(
        "--spread",
        type=float,
        default=0.0,
        help="start the connections evenly over this many seconds (0: all at once)",
    )
    parser.add_argument(
        "--rate",
        type=float,
        default=0.0,
        help="requests a second in all, each connection on a schedule (0: closed loop)",
    )
    parser.add_argument("--timeline", action="store_true", help="each request's send and reply")
    args = parser.parse_args()
    keys = [key for key in args.keys.split(",") if key]
    figures = asyncio.run(
        run(
            args.url,
            args.concurrency,
            args.seconds,
            args.warmup,
            keys,
            args.pause,
            args.spread,
            args.rate,
        )
    )
    json.dump(summary(figures, args.timeline), sys.stdout)
