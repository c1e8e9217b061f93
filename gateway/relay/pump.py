"""A reply's body on its way from the backend to the client, and what is learned on the way.

Once the head and the first bytes have gone out through aiohttp, a chunked reply (every
stream) is passed on from the backend connection's own callback: each read's bytes, joined,
go to the client in one send (with the body's end, when it came in the same read), with no
task wake-up between; the relay's task wakes only at the end, on a failure, or when the
client's buffer is full. Per read, and not per token, the gaps between reads are noted
(ITL), the bytes counted, the tail kept for the tallies (and a stream's end event) and the
newlines counted for the fair scheduler's meter. Chunk boundaries are not part of NDJSON or
SSE, so joining reads changes no byte a client parses.

One timer watches every reply, waking once per period rather than per read: for the
backend's silence (``timeouts.idle``) and for a client that stops reading
(``timeouts.client_stall``).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from time import monotonic
from typing import cast

import structlog
from aiohttp import web
from aiohttp.http_writer import StreamWriter

from gateway.config import Timeouts
from gateway.core import Reason
from gateway.edge import Progress
from gateway.relay.upstream_connection import StreamCut
from gateway.relay.upstream_reply import Reply
from gateway.wire import (
    STREAM_END_BYTES,
    TALLY_WINDOW,
    FinalCounts,
    TokenEvents,
    final_counts,
    stream_end,
)

__all__ = ["pump"]

log = structlog.get_logger("fairgate.relay")

_METER_EVERY = 8  # tokens between charges to the fair scheduler
# Bytes the client's socket buffer may hold before the backend is paused (uvloop's and
# asyncio's high-water mark): a client that reads slowly holds the backend, not our memory.
_CLIENT_HIGH_WATER = 64 * 1024


async def pump(
    request: web.Request,
    response: web.StreamResponse,
    upstream: Reply,
    first: bytes,
    progress: Progress,
    timeouts: Timeouts,
    meter: Callable[[int], None] | None,
    events: TokenEvents | None = None,
) -> None:
    """The rest of the body and its end to ``response``, whose head and ``first`` bytes
    have gone out (relay/client_reply.py), the tallies into ``progress``; ``events``: how a
    stream of named events says its tokens. Raises what failed the reply
    (ConnectionResetError: the client has gone)."""
    # The watches and tallies are set up once the first bytes are out, off their path; a
    # client that is not reading them is waited for below, under the watch.
    writer = cast(StreamWriter, request.writer)  # aiohttp's server makes only these
    loop = upstream.loop
    now = loop.time()
    watch = _Watch(request, upstream, timeouts, progress, loop, now)
    passing = _Passing(request, writer, upstream, progress, meter, watch, loop, events)
    try:
        passing.count(first)
        watch.unread_since = now
        await writer.drain()
        watch.unread_since = None
        if writer.chunked:
            watch.silent_since = loop.time()
            upstream.pass_to(passing)
            while not await upstream.passed():
                # The client's buffer is full: the backend is paused until it drains. Only
                # the backend's silence counts against `idle`.
                watch.silent_since, watch.unread_since = None, loop.time()
                await request.writer.drain()
                watch.silent_since, watch.unread_since = loop.time(), None
                upstream.hold(False)
        else:  # a declared length (or an HTTP/1.0 client): aiohttp's writer keeps count
            while True:
                watch.silent_since = loop.time()
                chunk = await upstream.read()
                watch.silent_since = None
                if not chunk:
                    break
                passing.gap()
                watch.unread_since = loop.time()
                await response.write(chunk)
                watch.unread_since = None
                passing.count(chunk)
        _tallies(progress, passing.tail.counts(), first, request.path, events)
        if writer.chunked and passing.tail.cut():
            raise StreamCut("it ended the stream before its end event")
        watch.unread_since = loop.time()
        await response.write_eof()
    finally:
        watch.stop()
        if progress.prompt_tokens is None:
            # The client left as the reply ended (many close right after [DONE]): the
            # backend's tallies came all the same, and say what the request cost.
            _tallies(progress, passing.tail.counts(), first, request.path, events)
        if passing.meter is not None:
            passing.meter.flush()  # a reply without final counts is charged every token it sent


def _tallies(
    progress: Progress, counts: FinalCounts, first: bytes, path: str, events: TokenEvents | None
) -> None:
    """The reply's own counts into ``progress`` (a stream of named events may say its
    prompt's only at its start)."""
    prompt, cached = counts.prompt_tokens, counts.cached_tokens
    if prompt is None and events is not None and events.prompt_at_start:
        start = final_counts(first[:TALLY_WINDOW], path)
        prompt, cached = start.prompt_tokens, start.cached_tokens
    progress.prompt_tokens, progress.cached_tokens = prompt, cached
    progress.completion_tokens, progress.load_seconds = (
        counts.completion_tokens,
        counts.load_seconds,
    )


class _Passing:
    """The sink of a chunked reply: each read's bytes to the client, framed as one chunk."""

    __slots__ = (
        "_gaps",
        "_last",
        "_loop",
        "_progress",
        "_transport",
        "_upstream",
        "_watch",
        "_writer",
        "meter",
        "tail",
    )

    def __init__(
        self,
        request: web.Request,
        writer: StreamWriter,
        upstream: Reply,
        progress: Progress,
        charge: Callable[[int], None] | None,
        watch: _Watch,
        loop: asyncio.AbstractEventLoop,
        events: TokenEvents | None,
    ) -> None:
        # Closed, not None, once the client has gone (aiohttp's request drops it then).
        self._transport = request.transport
        self._writer = writer
        self._upstream = upstream
        self._progress = progress
        self._gaps = progress.gaps
        self._loop = loop
        # The gaps on the system's clock: uvloop's loop.time() is in whole milliseconds,
        # read once a turn, which would make a 0.4 ms gap 0 or 1 ms and two reads of a turn 0.
        # The first from when the first bytes came (on that clock too), which may be a turn
        # of the loop before this: they went out from the backend's callback (relay/relay.py).
        first = progress.first_byte_at
        self._last = monotonic() if first is None else first
        self.tail = _Tail(request.path, upstream.headers.get("Content-Type", ""))
        self.meter: _Meter | _EventMeter | None = None
        if charge is not None and events is not None:
            self.meter = _EventMeter(charge, events.token)
        elif charge is not None:
            self.meter = _Meter(charge, upstream.headers.get("Content-Type", ""))
        self._watch = watch

    def __call__(self, data: bytes, last: bool) -> None:
        # Once per read: ``gap`` and ``count`` written out, a call each less.
        transport = self._transport
        if transport is None or transport.is_closing():
            raise ConnectionResetError("the client has gone")
        now = monotonic()
        self._gaps.append(now - self._last)
        self._last = now
        self._watch.silent_since = self._loop.time()  # the watch's own clock
        self._progress.bytes_out += len(data)
        self.tail.add(data)
        if self.meter is not None:
            self.meter.add(data)
        if last and not self.tail.cut():
            # The backend's end came with these bytes: the client gets both in one send
            # (a write less per reply, and the end a write sooner), and aiohttp's writer is
            # told that the end has gone out, so its write_eof writes nothing more. Last
            # in this call: once the end is out, nothing may fail the reply.
            transport.write(b"%x\r\n%b\r\n0\r\n\r\n" % (len(data), data))
            self._writer._eof = True
        else:
            transport.write(b"%x\r\n%b\r\n" % (len(data), data))
        if transport.get_write_buffer_size() > _CLIENT_HIGH_WATER:
            self._upstream.hold(True)

    def gap(self) -> None:
        now = monotonic()
        self._gaps.append(now - self._last)
        self._last = now

    def count(self, data: bytes) -> None:
        self._progress.bytes_out += len(data)
        self.tail.add(data)
        if self.meter is not None:
            self.meter.add(data)


class _Tail:
    """The reply's last TALLY_WINDOW bytes (or a little more), where the tallies are."""

    __slots__ = ("_chunks", "_end", "_path", "_size")

    def __init__(self, path: str, content_type: str) -> None:
        self._chunks: deque[bytes] = deque()
        self._size = 0
        self._path = path  # whose names the tallies have
        self._end = stream_end(path, content_type)  # its last bytes, if it ends

    def add(self, chunk: bytes) -> None:
        self._chunks.append(chunk)
        self._size += len(chunk)
        while self._size - len(self._chunks[0]) >= TALLY_WINDOW:
            self._size -= len(self._chunks.popleft())

    def counts(self) -> FinalCounts:
        return final_counts(b"".join(self._chunks), self._path)

    def cut(self) -> bool:
        """Whether the stream, if it ends here, ended before its API's end event."""
        end, chunks = self._end, self._chunks
        last = chunks[-1] if end is not None and chunks else b""  # the end event, nearly always
        if end is not None and len(last) < STREAM_END_BYTES and len(chunks) > 1:
            last = b"".join(chunks)
        return end is not None and end not in last[-STREAM_END_BYTES:]


class _Meter:
    """Counts tokens by the newlines that end them and charges them in batches."""

    __slots__ = ("_charge", "_per_token", "_unmetered")

    def __init__(self, charge: Callable[[int], None], content_type: str) -> None:
        self._charge = charge
        self._per_token = 2 if content_type.startswith("text/event-stream") else 1
        self._unmetered = 0

    def add(self, chunk: bytes) -> None:
        self._unmetered += chunk.count(b"\n")
        if self._unmetered >= _METER_EVERY * self._per_token:
            self._charge(self._unmetered // self._per_token)
            self._unmetered %= self._per_token

    def flush(self) -> None:
        if self._unmetered >= self._per_token:
            self._charge(self._unmetered // self._per_token)
        self._unmetered = 0


class _EventMeter:
    """Counts tokens by the events that carry them (``token``, the line that starts one),
    and charges them in batches; an event line cut between two reads is counted once."""

    __slots__ = ("_carry", "_charge", "_token", "_unmetered")

    def __init__(self, charge: Callable[[int], None], token: bytes) -> None:
        self._charge = charge
        self._token = token
        self._carry = b""  # the end of the last read, shorter than one event line
        self._unmetered = 0

    def add(self, chunk: bytes) -> None:
        joined = self._carry + chunk
        self._unmetered += joined.count(self._token)
        self._carry = joined[-(len(self._token) - 1) :]
        if self._unmetered >= _METER_EVERY:
            self._charge(self._unmetered)
            self._unmetered = 0

    def flush(self) -> None:
        if self._unmetered:
            self._charge(self._unmetered)
        self._unmetered = 0


class _Watch:
    """Two waits watched by one timer: the backend's silence while the relay waits on it
    (``idle``: the reply fails with TimeoutError) and a client that leaves the reply
    unread (``client_stall``: its connection is aborted). ``silent_since`` and
    ``unread_since`` are when the current wait began, None when there is none.

    Re-arming a timer on every read would cost a timer handle per token; this one wakes at
    most once per period and looks at when the current waits began.

    A write waits only when the socket and the transport's buffer are full, so the bytes
    held for one stream stay bounded (the transport's high-water mark plus a read); a
    client that stops reading would otherwise hold its slot, and the backend's, forever.
    Aborting the transport (a close would wait to flush what cannot be flushed) cancels the
    handler, which closes the upstream request and releases the permit.
    """

    def __init__(
        self,
        request: web.Request,
        reply: Reply,
        timeouts: Timeouts,
        progress: Progress,
        loop: asyncio.AbstractEventLoop,
        now: float,
    ) -> None:
        self.silent_since: float | None = None
        self.unread_since: float | None = None
        self._request = request
        self._reply = reply
        self._idle, self._stall = timeouts.idle, timeouts.client_stall
        self._progress = progress
        self._loop = loop
        self._timer = loop.call_at(now + min(self._idle, self._stall), self._check)

    def _check(self) -> None:
        now = self._loop.time()
        silent, unread = self.silent_since, self.unread_since
        if silent is not None and now - silent >= self._idle:
            self._reply.set_exception(TimeoutError())
            return
        if unread is not None and now - unread >= self._stall:
            log.warning("client_stalled", unread_for=round(now - unread, 1))
            self._progress.failure = Reason.CLIENT_STALLED
            self._progress.client_gone = True
            if self._request.transport is not None:
                self._request.transport.abort()
            return
        self._timer = self._loop.call_at(
            min(
                (now if silent is None else silent) + self._idle,
                (now if unread is None else unread) + self._stall,
            ),
            self._check,
        )

    def stop(self) -> None:
        self._timer.cancel()
