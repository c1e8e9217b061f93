"""The relay's HTTP/1.1 client: pooled keep-alive connections to the backends, each an
asyncio protocol on llhttp (httptools, the parser uvicorn uses).

aiohttp's client cost the relay more than all of the gateway's own logic (issue #22's
profile): per request a ClientRequest, a ClientResponse, a StreamReader and their timers; per
chunk the StreamReader's bookkeeping and a wake-up. This client keeps what a relay needs: the
request goes out in one send, the reply is parsed in C, and a read returns every body byte
that has arrived since the last one, joined, after at most one wake-up. The bytes are the
body as the backend sent it, de-chunked: NDJSON lines and SSE events cross unchanged, only
chunk boundaries (no part of either format) may differ.
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from types import TracebackType
from typing import cast
from urllib.parse import urlsplit

import httptools
from multidict import CIMultiDict

__all__ = [
    "BackendClient",
    "BackendClosed",
    "ConnectTimeout",
    "MalformedReply",
    "Reply",
    "UpstreamError",
]

_HIGH_WATER = 64 * 1024  # body bytes held for a slow relay before the backend is paused
_MAX_HEAD = 64 * 1024  # a reply's status line and headers, at most
_IDLE_SECONDS = 15.0  # an unused pooled connection is closed after this (aiohttp's default)


class UpstreamError(Exception):
    """The backend's connection failed, or what it sent is not an HTTP reply."""


class BackendClosed(UpstreamError):
    """The backend closed the connection before its reply was complete."""


class MalformedReply(UpstreamError):
    """The backend sent bytes that are not an HTTP/1.1 reply (or a head over 64 KiB)."""


class ConnectTimeout(TimeoutError):
    """No connection to the backend within the connect timeout."""


@dataclass(frozen=True, slots=True)
class _Origin:
    key: tuple[str, int, bool]  # host, port, TLS: which pooled connections can serve it
    host: str
    port: int
    tls: bool
    host_header: str
    target: str  # the request target: path and query


@lru_cache(maxsize=512)
def _origin(url: str) -> _Origin:
    """``url`` split once: a relay sends to a handful of URLs, again and again."""
    parts = urlsplit(url)
    tls = parts.scheme == "https"
    host = parts.hostname or ""
    port = parts.port or (443 if tls else 80)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    if " " in target or not host:
        raise ValueError(f"not a request URL: {url!r}")
    return _Origin((host, port, tls), host, port, tls, parts.netloc.rpartition("@")[2], target)


def _head(method: str, origin: _Origin, headers: CIMultiDict[str], body: bytes | None) -> bytes:
    lines = [f"{method} {origin.target} HTTP/1.1\r\nHost: {origin.host_header}\r\n"]
    lines += [f"{name}: {value}\r\n" for name, value in headers.items()]
    if body is not None:
        if "Content-Type" not in headers:
            lines.append("Content-Type: application/octet-stream\r\n")
        lines.append(f"Content-Length: {len(body)}\r\n")
    text = "".join(lines) + "\r\n"
    # Each line ends in the one CRLF put there above: a CR or LF inside a name or a value
    # would start a header (or a request) of the sender's choosing.
    ends = len(lines) + 2  # the request line, the Host line, the headers, the blank line
    if text.count("\n") != ends or text.count("\r") != ends:
        raise ValueError("a header holds a line break")
    return text.encode("utf-8", "surrogateescape")


class _Connection(asyncio.Protocol):
    """One keep-alive connection and the state of the reply it is reading; its parser
    calls it back (``on_*``) from inside ``data_received``."""

    def __init__(self, client: BackendClient, origin: _Origin) -> None:
        self._client = client
        self.key = origin.key
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.active = False  # a request is under way (else any byte received is an error)
        self.idle_timer: asyncio.TimerHandle | None = None
        self._parser = httptools.HttpResponseParser(self)
        self._loop = asyncio.get_running_loop()
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
        self.sink: Callable[[bytes], None] | None = None  # given each read's body bytes
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
        if not self.headers_done:
            self.head_bytes += len(data)
            if self.head_bytes > _MAX_HEAD:
                self._broken(MalformedReply("the reply's head is over 64 KiB"))
                return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._broken(MalformedReply(f"not an HTTP reply: {exc}"))
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
        self._client.lost(self)

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
        self.waiter = self._loop.create_future()
        try:
            await self.waiter
        finally:
            self.waiter = None

    def pass_on(self) -> None:
        """The body bytes read so far, joined, to the sink."""
        assert self.sink is not None
        pieces, self.pieces, self.buffered = self.pieces, [], 0
        try:
            self.sink(pieces[0] if len(pieces) == 1 else b"".join(pieces))
        except Exception as exc:  # the relay's failure, reported where it waits
            self.fail(exc)

    def fail(self, exc: BaseException) -> None:
        if self.exception is None:
            self.exception = exc
        self.sink = None  # nothing more reaches the client after a failure
        self._wake()

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

    __slots__ = ("_close", "_conn", "_deadline", "content_length", "headers", "reason", "status")

    def __init__(self, conn: _Connection, close: bool, deadline: asyncio.TimerHandle) -> None:
        self._conn: _Connection | None = conn
        self._close = close
        self._deadline: asyncio.TimerHandle | None = deadline
        self.status = conn.status
        self.reason = conn.reason
        self.headers: CIMultiDict[str] = CIMultiDict(
            (name.decode("utf-8", "surrogateescape"), value.decode("utf-8", "surrogateescape"))
            for name, value in conn.raw_headers
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
            pieces = conn.pieces
            if pieces:
                conn.pieces, conn.buffered = [], 0
                if conn.paused:
                    conn.resume()
                return pieces[0] if len(pieces) == 1 else b"".join(pieces)
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

    async def read_up_to(self, limit: int) -> bytes:
        """The body, or its first ``limit`` bytes or a little more."""
        data = b""
        while len(data) < limit and (more := await self.read()):
            data += more
        return data

    def pass_to(self, sink: Callable[[bytes], None]) -> None:
        """From now on, hand every read's body bytes to ``sink`` as they arrive (in the
        connection's callback, with no wake-up); ``passed`` waits for the end.
        ``sink`` may call ``hold`` when its client cannot take more."""
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
        conn._client.put_back(conn, reusable and not self._close)

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


class BackendClient:
    """Keep-alive connections to every backend, ``limit`` open at most (busy or idle)."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._open = 0  # connections open or being opened
        self._idle: dict[tuple[str, int, bool], list[_Connection]] = {}
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._tls: ssl.SSLContext | None = None

    @property
    def waiting(self) -> int:
        """Requests waiting for a connection (the pool is at its limit)."""
        return len(self._waiters)

    async def request(
        self,
        method: str,
        url: str,
        headers: CIMultiDict[str],
        body: bytes | None,
        connect_timeout: float,
        first_byte: float,
        close: bool = False,
    ) -> Reply:
        """Send the request and wait for the reply's head.

        OSError if the backend cannot be reached (ConnectTimeout: not within
        ``connect_timeout``), UpstreamError if it fails before its head, TimeoutError if the
        head, and then the first body bytes (``Reply.first``), take over ``first_byte``.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + first_byte
        origin = _origin(url)
        head = _head(method, origin, headers, body)
        conn = self._idle_connection(origin.key)
        if conn is None:
            async with asyncio.timeout_at(deadline):
                conn = await self._connection(origin, connect_timeout)
        conn.reset(method == "HEAD")
        conn.active = True
        # One timer for the whole first byte, where asyncio.timeout costs a few times more.
        expiry = loop.call_at(deadline, conn.fail, TimeoutError())
        try:
            assert conn.transport is not None
            conn.transport.write(head if body is None else head + body)
            while not conn.headers_done:
                if conn.exception is not None:
                    raise conn.exception
                await conn.wait()
        except BaseException:
            expiry.cancel()
            conn.close()
            self.put_back(conn, False)
            raise
        return Reply(conn, close, expiry)

    def _idle_connection(self, key: tuple[str, int, bool]) -> _Connection | None:
        idle = self._idle.get(key)
        while idle:
            conn = idle.pop()
            if conn.idle_timer is not None:
                conn.idle_timer.cancel()
            if not conn.closed:
                return conn
        return None

    async def _connection(self, origin: _Origin, connect_timeout: float) -> _Connection:
        """An idle connection, once one is given back, or a new one once there is room."""
        loop = asyncio.get_running_loop()
        while True:
            conn = self._idle_connection(origin.key)
            if conn is not None:
                return conn
            if self._open < self._limit:
                break
            self._close_an_idle_one()  # its ``lost`` wakes a waiter
            waiter = loop.create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            finally:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
        self._open += 1
        try:
            async with asyncio.timeout(connect_timeout):
                _, conn = await loop.create_connection(
                    lambda: _Connection(self, origin),
                    origin.host,
                    origin.port,
                    ssl=self._tls_context() if origin.tls else None,
                )
        except BaseException as exc:
            self._open -= 1
            self._wake_one()
            if isinstance(exc, TimeoutError):  # this timeout's, not the caller's (a cancel)
                raise ConnectTimeout(f"no connection within {connect_timeout:g}s") from exc
            raise
        return conn

    def put_back(self, conn: _Connection, reusable: bool) -> None:
        """A connection its reply is done with: pooled if ``reusable``, else closed."""
        conn.active = False
        if not reusable or conn.closed:
            conn.close()
            return
        if (conn.paused or conn.held) and conn.transport is not None:
            conn.transport.resume_reading()
        conn.reset(False)
        self._idle.setdefault(conn.key, []).append(conn)
        conn.idle_timer = asyncio.get_running_loop().call_later(_IDLE_SECONDS, conn.close)
        self._wake_one()

    def lost(self, conn: _Connection) -> None:
        """A connection has closed (either end)."""
        self._open -= 1
        if conn.idle_timer is not None:
            conn.idle_timer.cancel()
        idle = self._idle.get(conn.key)
        if idle and conn in idle:
            idle.remove(conn)
        self._wake_one()

    async def close(self) -> None:
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
        self._idle.clear()

    def _close_an_idle_one(self) -> None:
        """At the limit, make room by closing an idle connection to another backend."""
        for idle in self._idle.values():
            while idle:
                conn = idle.pop(0)
                if not conn.closed:
                    conn.close()
                    return

    def _wake_one(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def _tls_context(self) -> ssl.SSLContext:
        if self._tls is None:
            self._tls = ssl.create_default_context()
        return self._tls
