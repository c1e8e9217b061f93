"""What the gateway's own bookkeeping costs per request, piece by piece, in microseconds.

Every request passes the middlewares (access log, connection tracking, CORS), the
reply-header hooks, ``locate`` (where it came from) and, once finished, the listeners
that count it (history, usage). All of it runs on the request's critical path: with one
stream, the next request waits behind this one's bookkeeping. Here each piece runs on
requests shaped like a client's streamed ``/api/chat`` (its headers, a loopback peer), in
front of a handler that writes into the record what the real one writes and suspends as
often as a streamed reply does (3 times); the handler's own cost is timed alone and
taken off.

Logging is configured as the gateway does it (JSON lines, here into /dev/null), at
WARNING (no access line) or INFO (one line per request).

    python -m benchmarks.bookkeeping [--requests 20000] [--level WARNING]

Old code against new, side by side in one run (each tree in its own processes, taking
turns; the best of the rounds):

    git archive main | tar -x -C /tmp/old
    python -m benchmarks.bookkeeping --tree /tmp/old --tree . [--rounds 5]
"""

from __future__ import annotations

import asyncio
import gc
import os
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any

from aiohttp import HttpVersion11, web
from aiohttp.http_parser import RawRequestMessage
from aiohttp.streams import EMPTY_PAYLOAD
from multidict import CIMultiDict, CIMultiDictProxy, istr
from yarl import URL

from gateway.app import SERVICES, create_app
from gateway.config.policy import parse_policy
from gateway.config.settings import Settings
from gateway.core.logs import configure_logging
from gateway.core.vocabulary import Lane, RequestClass
from gateway.edge.http.access_log import RECORD
from gateway.edge.record import Progress, RequestRecord

_PEER = ("127.0.0.1", 51234)
_HEADERS = {
    "Host": "127.0.0.1:8080",
    "User-Agent": "python-httpx/0.28.1",
    "Accept": "*/*",
    "Accept-Encoding": "gzip, deflate",
    "Connection": "keep-alive",
    "Authorization": "Bearer alice-key",
    "Content-Type": "application/json",
    "Content-Length": "71",
}
_POLICY = """\
users:
  alice: {keys: [alice-key]}
backends:
  - {name: stub, url: "http://127.0.0.1:9", kind: ollama, slots: 4}
"""
_BATCHES = 20
_SUSPENSIONS = 3  # a streamed reply's handler, measured: 2 to 4 per request
# The middlewares' figure includes locate and the listeners, which they call.
_LISTENERS = ("metrics.observe", "history.observe", "usage.observe")
_LABELS = {piece: f"  of which {piece}" for piece in ("locate", *_LISTENERS)}
_PIECES = ("middlewares", "locate", *_LISTENERS, "reply headers")


def measure(requests: int, level: str) -> dict[str, float]:
    """Microseconds per request of each piece, in this process's ``gateway``."""
    return asyncio.run(_measure(requests, level))


async def _measure(requests: int, level: str) -> dict[str, float]:
    _configure(level)
    directory = tempfile.mkdtemp(prefix="bookkeeping-")
    settings = Settings(usage_db=Path(directory) / "usage.db")
    app = create_app(settings, parse_policy(_POLICY))
    services = app[SERVICES]
    history, ledger = services.history, services.usage
    metrics = services.on_finished[0]  # create_app's listeners: metrics, history, usage
    app.on_response_prepare.freeze()
    handler = _handler()
    chain: Callable[[web.Request], Awaitable[web.StreamResponse]] = handler
    for middleware in reversed(app.middlewares):
        chain = partial(middleware, handler=chain)

    loop = asyncio.get_running_loop()
    locate = services.locate
    runs: dict[str, list[float]] = {piece: [] for piece in ("handler", "loop", *_PIECES)}
    # In batches, each piece's least disturbed batch counts: the machine is shared, and
    # what others take only ever adds.
    for _ in range(_BATCHES):
        count = requests // _BATCHES
        alone = _fresh(count, loop)
        for request in alone:  # as the access log would have
            request[RECORD] = RequestRecord("0", "POST", "/api/chat")
        runs["handler"].append(await _timed(handler, alone))
        served = _fresh(count, loop)
        runs["middlewares"].append(await _timed(chain, served))
        replies = [web.StreamResponse() for _ in served]
        pairs = list(zip(served, replies, strict=True))
        runs["reply headers"].append(await _timed(_prepare(app), pairs))
        fresh = _fresh(count, loop)
        runs["loop"].append(_timed_sync(_nothing, fresh))
        runs["locate"].append(_timed_sync(locate, fresh))
        records = [request[RECORD] for request in served]
        runs["metrics.observe"].append(_timed_sync(metrics, records))
        runs["history.observe"].append(_timed_sync(history.observe, records))
        runs["usage.observe"].append(_timed_sync(ledger.observe, records))
    figures = {piece: min(values) for piece, values in runs.items()}
    figures["middlewares"] -= figures.pop("handler")
    loop_alone = figures.pop("loop")
    for piece in ("locate", *_LISTENERS):
        figures[piece] -= loop_alone
    return figures


def _prepare(
    app: web.Application,
) -> Callable[[tuple[web.Request, web.StreamResponse]], Awaitable[None]]:
    async def prepare(pair: tuple[web.Request, web.StreamResponse]) -> None:
        await app.on_response_prepare.send(*pair)

    return prepare


def _configure(level: str) -> None:
    """The gateway's logging, its lines written to /dev/null."""
    stderr = sys.stderr
    sys.stderr = open(os.devnull, "w")  # noqa: SIM115  # the logger writes to it until exit
    try:
        configure_logging("json", level)
    finally:
        sys.stderr = stderr


def _fresh(count: int, loop: asyncio.AbstractEventLoop) -> list[Any]:
    """Requests not yet seen by anyone, each with its own headers and URL as aiohttp's
    parser makes them (header names as istr): what a request computes once and caches (its
    decoded path) is then paid for each request, as in the gateway."""
    raw = tuple((name.encode(), value.encode()) for name, value in _HEADERS.items())
    requests = []
    for _ in range(count):
        headers = CIMultiDictProxy(CIMultiDict((istr(k), v) for k, v in _HEADERS.items()))
        url = URL.build(path="/api/chat", query_string="", fragment="", encoded=True)
        message = RawRequestMessage(
            "POST", "/api/chat", HttpVersion11, headers, raw, False, None, False, False, url
        )
        requests.append(web.Request(message, EMPTY_PAYLOAD, _Protocol(), None, None, loop))  # type: ignore[arg-type]
    return requests


def _handler() -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """What the generation handler writes into the record, and its suspensions."""
    gaps = [0.0001] * 64

    async def generate(request: web.Request) -> web.StreamResponse:
        record = request[RECORD]
        record.user = "alice"
        record.model = "llama3.2:3b"
        record.request_class, record.input_estimate = RequestClass.LIGHT, 12
        record.lane = Lane.INTERACTIVE
        now = time.monotonic()
        record.queue_wait, record.dispatched_at, record.queue_position = 0.0, now, 0
        record.backend = "stub"
        for _ in range(_SUSPENSIONS):
            await asyncio.sleep(0)
        progress = Progress(now + 0.0005, 8780, list(gaps), 12, 64, 0.0)
        record.add(progress)
        return web.Response(status=200)

    return generate


async def _timed(call: Callable[[Any], Awaitable[object]], args: list[Any]) -> float:
    """Microseconds per call."""
    gc.collect()
    start = time.perf_counter()
    for arg in args:
        await call(arg)
    return (time.perf_counter() - start) / len(args) * 1e6


def _timed_sync(call: Callable[[Any], object], args: list[Any]) -> float:
    """Microseconds per call, the loop's own included (``_nothing`` times that)."""
    gc.collect()
    start = time.perf_counter()
    for arg in args:
        call(arg)
    return (time.perf_counter() - start) / len(args) * 1e6


def _nothing(arg: object) -> None:
    return None


class _Transport:
    def get_extra_info(self, name: str, default: object = None) -> object:
        return _PEER if name == "peername" else default

    def is_closing(self) -> bool:
        return False


class _Protocol:
    """What a request reads of its connection's handler."""

    max_field_size = 8190
    max_line_length = 8190
    max_headers = 128
    peername = _PEER
    sockname = ("127.0.0.1", 8080)
    ssl_context = None

    def __init__(self) -> None:
        self.transport = _Transport()
        self.writer = None


def report(trees: list[str], best: list[dict[str, float]]) -> None:
    """The trees' microseconds per request, piece by piece."""
    from benchmarks.trees import print_header, print_row

    print_header("us per request", trees)
    for piece in _PIECES:
        print_row(_LABELS.get(piece, piece), [figures[piece] for figures in best])
    print_row("total", [_total(figures) for figures in best])


def _total(figures: dict[str, float]) -> float:
    return figures["middlewares"] + figures["reply headers"]  # the others are inside


if __name__ == "__main__":
    from benchmarks.trees import run

    level = {"default": "WARNING", "choices": ["WARNING", "INFO"]}
    run(__file__, __doc__ or "", measure, report, requests=20_000, options={"level": level})
