"""One keep-alive connection to a backend and the state of the reply it is reading: an
asyncio protocol on llhttp (httptools, the parser uvicorn uses), for the relay's client
(relay/upstream_client.py), and the ways a backend fails a reply (``UpstreamError``).

The parser's callbacks gather the body's bytes as they arrive; the relay takes them through
a ``Reply`` (relay/upstream_reply.py): read, after at most one wake-up, or passed on from
``data_received`` itself (its ``sink``), with no wake-up at all. The head and the first body
bytes, when they come in one read (a stream's first token mostly does), can be taken there
too (``arrived``): a relay's first byte then goes out before its task wakes. The bytes are
the body as the backend sent it, de-chunked: NDJSON lines and SSE events cross unchanged,
only chunk boundaries (no part of either format) may differ.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import cast

import httptools

__all__ = ["BackendClosed", "Connection", "MalformedReply", "UpstreamError"]

_HIGH_WATER = 64 * 1024  # body bytes held for a slow relay before the backend is paused
_MAX_HEAD = 64 * 1024  # a reply's status line and headers, at most


class UpstreamError(Exception):
    """The backend's connection failed, or what it sent is not an HTTP reply."""


class BackendClosed(UpstreamError):
    """The backend closed the connection before its reply was complete."""


class StreamCut(UpstreamError):
    """The backend ended a stream cleanly, but before its API's end (``wire/stream_ends.py``)."""


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
        self.trailer_bytes = 0
        self.paused = False
        # Given each read's body bytes, and whether the body ends with them.
        self.sink: Callable[[bytes, bool], None] | None = None
        self.delivered = False  # the sink has had the whole body
        # Told, once, from data_received, when the head and the first body bytes are here.
        self.arrived: Callable[[], None] | None = None
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
        if in_head:  # counted before the parse, whose end of the head reads it
            self.head_bytes += len(data)
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            # What a callback of ours raised comes back wrapped: its own words say more.
            said = exc.__context__
            broken = said if isinstance(said, MalformedReply) else None
            self._broken(broken or MalformedReply(f"not an HTTP reply: {exc}"))
            return
        except httptools.HttpParserUpgrade:  # 101: no request of ours asks to switch
            self._broken(MalformedReply("the backend switched protocols"))
            return
        if in_head and not self.headers_done and self.head_bytes > _MAX_HEAD:
            self._broken(MalformedReply("the reply's head is over 64 KiB"))
            return
        if self.sink is not None:
            if self.pieces:
                self.pass_on()
            if self.complete:  # else the relay has nothing to do until the next read
                self._wake()
            return
        if self.arrived is not None and self.pieces:
            self._arrive()
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
        if self.headers_done:
            # A trailer, after a chunked body: none is passed on, and none is kept, but an
            # endless run of them would be read forever without a bound of its own.
            self.trailer_bytes += len(name) + len(value)
            if self.trailer_bytes > _MAX_HEAD:
                raise MalformedReply("the reply's trailers are over 64 KiB")
            return
        self.raw_headers.append((name, value))

    def on_headers_complete(self) -> None:
        status = self._parser.get_status_code()
        if status < 100:  # three digits to llhttp, but no status HTTP has, nor a client reads
            raise MalformedReply(f"the reply's status is {status}")
        if 100 <= status < 200:  # an interim reply (100 Continue, 103): the real one follows
            self.raw_headers = []
            return
        # The reads so far count body bytes too (a whole non-streamed reply, however long,
        # often comes with its head): past 64 KiB of them, the head's own lines are measured,
        # as a backend may write 200 KiB of them at once.
        if self.head_bytes > _MAX_HEAD and _size(self.raw_headers) > _MAX_HEAD:
            raise MalformedReply("the reply's head is over 64 KiB")
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

    def _arrive(self) -> None:
        arrived, self.arrived = self.arrived, None
        assert arrived is not None
        try:
            arrived()
        except Exception as exc:  # the relay's failure, reported where it waits
            self.fail(exc)

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
        # The body bytes read before the fault are the client's, and so is the end when it
        # came before them (bytes after a reply's end): passed on first, then the failure.
        if self.sink is not None and self.pieces:
            self.pass_on()
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


def _size(headers: list[tuple[bytes, bytes]]) -> int:
    """The bytes of ``headers`` as a head carries them (``Name: value\r\n``)."""
    return sum(len(name) + len(value) + 4 for name, value in headers)
