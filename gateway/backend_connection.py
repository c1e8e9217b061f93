"""One keep-alive connection to a backend and the reply it is reading: an asyncio protocol
on llhttp (httptools, the parser uvicorn uses), for the relay's client (backend_client.py).

A read returns every body byte that has arrived since the last one, joined, after at most
one wake-up; or the reply is passed on from ``data_received`` itself (``Reply.pass_to``),
with no wake-up at all. The bytes are the body as the backend sent it, de-chunked: NDJSON
lines and SSE events cross unchanged, only chunk boundaries (no part of either format) may
differ.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from types import TracebackType
from typing import cast

import httptools
from multidict import CIMultiDict

from gateway.deadlines import Deadline

__all__ = ["BackendClosed", "Connection", "MalformedReply", "Reply", "UpstreamError"]

_HIGH_WATER = 64 * 1024  # body bytes held for a slow relay before the backend is paused
_MAX_HEAD = 64 * 1024  # a reply's status line and headers, at most


class UpstreamError(Exception):
    """The backend's connection failed, or what it sent is not an HTTP reply."""


class BackendClosed(UpstreamError):
    """The backend closed the connection before its reply was complete."""


class MalformedReply(UpstreamError):
    """The backend sent bytes that are not an HTTP/1.1 reply (or a head over 64 KiB)."""


class Connection(asyncio.Protocol):
    """One keep-alive connection and the state of the reply it is reading; its parser
    calls it back (``on_*``) from inside ``data_received``. ``put_back`` is the pool's:
    it takes the connection once its reply is done (and whether it can serve another);
    ``lost`` is told when it closes."""

    def __init__(
        self,
        key: tuple[str, int, bool],
        put_back: Callable[[Connection, bool], None],
        lost: Callable[[Connection], None],
    ) -> None:
        self.put_back = put_back
        self._lost = lost
        self.key = key
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.active = False  # a request is under way (else any byte received is an error)
        self.idle_since = 0.0  # when it was last given back to the pool (loop time)
        self._parser = httptools.HttpResponseParser(self)
        # Taken once: each get_running_loop() costs a getpid() system call (CPython 3.11).
        self.loop = asyncio.get_running_loop()
        self.reset(False)

    def reset(self, head_only: bool) -> None:
        """Ready for the next request (a HEAD request's reply has no body)."""
        self.head_only = head_only
        self.status = 0
        self.reason = ""
        self.raw_headers: list[tuple[bytes, bytes]] = []
        self.headers_done = False
        self.complete = False
        self.keep_alive = False
        self.exception: BaseException | None = None
        self.pieces: list[bytes] = []
        self.buffered = 0
        self.head_bytes = 0
        self.paused = False
        # Given each read's body bytes, and whether the body ends with them.
        self.sink: Callable[[bytes, bool], None] | None = None
        self.delivered = False  # the sink has had the whole body
        self.held = False  # the sink asked for a pause (its client's buffer is full)
        self.waiter: asyncio.Future[None] | None = None

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not subclasses of asyncio.Transport, only alike.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if not self.active:
            self.close()
            return
        in_head = not self.headers_done
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._broken(MalformedReply(f"not an HTTP reply: {exc}"))
            return
        except httptools.HttpParserUpgrade:  # 101: no request of ours asks to switch
            self._broken(MalformedReply("the backend switched protocols"))
            return
        if in_head and not self.headers_done:
            # Counted only while the head is not over: the body's first bytes often come in
            # the same read as the head (a whole non-streamed reply, however long).
            self.head_bytes += len(data)
            if self.head_bytes > _MAX_HEAD:
                self._broken(MalformedReply("the reply's head is over 64 KiB"))
                return
        if self.sink is not None:
            if self.pieces:
                self.pass_on()
            if self.complete:  # else the relay has nothing to do until the next read
                self._wake()
            return
        if self.buffered > _HIGH_WATER and not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()
        self._wake()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.transport = None
        if not self.complete and self.exception is None:
            if self.headers_done and self._until_eof():
                self.complete = True  # a body without a length ends where the connection does
            else:
                closed = BackendClosed("the backend closed the connection")
                closed.__cause__ = exc
                self.exception = closed
        self._wake()
        self._lost(self)

    # the parser's callbacks

    def on_message_begin(self) -> None:
        if self.complete:  # bytes after the reply: this connection cannot be trusted again
            raise MalformedReply("bytes after the end of the reply")

    def on_status(self, reason: bytes) -> None:
        self.reason = reason.decode("latin-1")

    def on_header(self, name: bytes, value: bytes) -> None:
        self.raw_headers.append((name, value))

    def on_headers_complete(self) -> None:
        status = self._parser.get_status_code()
        if 100 <= status < 200:  # an interim reply (100 Continue, 103): the real one follows
            self.raw_headers = []
            return
        self.status = status
        self.headers_done = True
        self.keep_alive = self._parser.should_keep_alive() and not self.head_only
        if self.head_only:  # its Content-Length is the length a GET would have had
            self.complete = True

    def on_body(self, body: bytes) -> None:
        self.pieces.append(body)
        self.buffered += len(body)

    def on_message_complete(self) -> None:
        if self.headers_done:
            self.complete = True

    # the relay's side

    async def wait(self) -> None:
        """Until something new: the head, body bytes, the end, or a failure."""
        self.waiter = self.loop.create_future()
        try:
            await self.waiter
        finally:
            self.waiter = None

    def pass_on(self) -> None:
        """The body bytes read so far, joined, to the sink (with the end, if it came)."""
        assert self.sink is not None
        pieces, self.pieces, self.buffered = self.pieces, [], 0
        last = self.complete
        try:
            self.sink(pieces[0] if len(pieces) == 1 else b"".join(pieces), last)
        except Exception as exc:  # the relay's failure, reported where it waits
            self.fail(exc)
        else:
            self.delivered = last

    def fail(self, exc: BaseException) -> None:
        # Once the sink has had the whole body (and sent its end), a failure has nothing
        # left to fail: an error after the end would be bytes after the reply.
        if self.exception is None and not self.delivered:
            self.exception = exc
        self.sink = None  # nothing more reaches the client after a failure
        self._wake()

    def time_out(self) -> None:
        """The first byte's deadline has passed (the exception made only then)."""
        self.fail(TimeoutError())

    def hold(self, held: bool) -> None:
        """Stop reading from the backend (and wake the relay), or read again."""
        self.held = held
        if self.transport is not None:
            if held:
                self.transport.pause_reading()
            else:
                self.transport.resume_reading()
        if held:
            self._wake()

    def resume(self) -> None:
        self.paused = False
        if self.transport is not None:
            self.transport.resume_reading()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def _broken(self, exc: UpstreamError) -> None:
        if not self.complete:
            self.fail(exc)
        self.keep_alive = False
        self.close()

    def _until_eof(self) -> bool:
        return not any(
            name.lower() in (b"content-length", b"transfer-encoding")
            for name, _ in self.raw_headers
        )

    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


class Reply:
    """A backend's reply to one request: its head, and its body as it arrives."""

    __slots__ = (
        "_close",
        "_conn",
        "_deadline",
        "content_length",
        "headers",
        "loop",
        "reason",
        "status",
    )

    def __init__(self, conn: Connection, close: bool, deadline: Deadline) -> None:
        self._conn: Connection | None = conn
        self._close = close
        self._deadline: Deadline | None = deadline
        self.loop = conn.loop  # the loop its connection reads on: for the relay's timers
        self.status = conn.status
        self.reason = conn.reason
        self.headers: CIMultiDict[str] = CIMultiDict(
            [
                (name.decode("utf-8", "surrogateescape"), value.decode("utf-8", "surrogateescape"))
                for name, value in conn.raw_headers
            ]
        )
        length = self.headers.get("Content-Length")
        self.content_length = int(length) if length is not None and length.isdigit() else None

    async def read(self) -> bytes:
        """Every body byte that has arrived since the last read (waiting for one if none
        has); b"" at the end of the body. Raises what failed the reply, once the bytes that
        came before the failure are read."""
        conn = self._conn
        if conn is None:
            raise RuntimeError("a reply read after its release")
        while True:
            if conn.pieces:
                return _taken(conn)
            if conn.exception is not None:
                raise conn.exception
            if conn.complete:
                return b""
            await conn.wait()

    async def first(self) -> bytes:
        """The first body bytes (b"" for an empty body), still within the first-byte
        deadline; from then on only the relay's own watches time the reply."""
        try:
            return await self.read()
        finally:
            self._disarm()

    def first_if_here(self) -> bytes | None:
        """``first``, when its bytes have arrived (mostly they come with the head): no
        coroutine, no wait. None when there are none yet: then await ``first``."""
        conn = self._conn
        if conn is None or not conn.pieces:
            return None
        self._disarm()
        return _taken(conn)

    async def read_up_to(self, limit: int) -> bytes:
        """The body, or its first ``limit`` bytes or a little more."""
        data = b""
        while len(data) < limit and (more := await self.read()):
            data += more
        return data

    def pass_to(self, sink: Callable[[bytes, bool], None]) -> None:
        """From now on, hand every read's body bytes to ``sink`` as they arrive (in the
        connection's callback, with no wake-up), and whether the body ends with them;
        ``passed`` waits for the end. ``sink`` may call ``hold`` when its client cannot
        take more."""
        conn = self._conn
        if conn is None:
            raise RuntimeError("a reply passed on after its release")
        conn.sink = sink
        if conn.pieces:
            conn.pass_on()

    async def passed(self) -> bool:
        """Once the sink has had the whole body: True; False as soon as it holds the reply
        (``hold(False)`` after its client has drained). Raises what failed the reply."""
        conn = self._conn
        if conn is None:
            raise RuntimeError("a reply read after its release")
        while True:
            if conn.exception is not None:
                raise conn.exception
            if conn.held:
                return False
            if conn.complete:
                return True
            await conn.wait()

    def hold(self, held: bool) -> None:
        """Pause the backend's side (True) while the sink's client drains, or resume it."""
        if self._conn is not None:
            self._conn.hold(held)

    def set_exception(self, exc: BaseException) -> None:
        """Fail the reply: a read waiting now, or the next one, raises ``exc``."""
        if self._conn is not None:
            self._conn.fail(exc)

    def release(self) -> None:
        """Done with the reply: its connection goes back to the pool if it can serve
        another request, else it is closed (which tells the backend to stop)."""
        self._disarm()
        conn, self._conn = self._conn, None
        if conn is None:
            return
        reusable = conn.complete and conn.keep_alive and conn.exception is None
        conn.put_back(conn, reusable and not self._close)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    async def __aenter__(self) -> Reply:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()


def _taken(conn: Connection) -> bytes:
    """The body bytes that have arrived, joined, taken from the connection."""
    pieces, conn.pieces, conn.buffered = conn.pieces, [], 0
    if conn.paused:
        conn.resume()
    return pieces[0] if len(pieces) == 1 else b"".join(pieces)
