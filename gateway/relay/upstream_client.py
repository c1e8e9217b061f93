"""The relay's HTTP/1.1 client: pooled keep-alive connections to the backends, each an
asyncio protocol on llhttp (relay/upstream_connection.py), and a reply read through one
(relay/upstream_reply.py).

aiohttp's client does far more than a relay needs: per request a ClientRequest, a
ClientResponse, a StreamReader and their timers; per chunk the StreamReader's bookkeeping
and a wake-up. This client keeps what a relay needs: the request goes out in one send with
a head of our making, one timer covers the first byte, and the reply is parsed in C.
"""

from __future__ import annotations

import asyncio
import base64
import ssl
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from urllib.parse import unquote, urlsplit

from multidict import CIMultiDict

from gateway.relay.deadlines import Deadline, Deadlines
from gateway.relay.upstream_connection import Connection
from gateway.relay.upstream_reply import Reply

__all__ = ["BackendClient", "ConnectTimeout"]

_IDLE_SECONDS = 15.0  # an unused pooled connection is closed after this (aiohttp's default)


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
    # Basic credentials written in the backend's URL (an Ollama behind an authenticating
    # proxy): sent with every request, as aiohttp did.
    authorization: str | None = None


# The request's headers: the relay's pairs (``forwarded_headers``), or a CIMultiDict.
Headers = list[tuple[str, str]] | CIMultiDict[str]


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
    authorization = None
    if parts.username is not None:
        pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
        authorization = "Basic " + base64.b64encode(pair.encode()).decode()
    host_header = parts.netloc.rpartition("@")[2]
    return _Origin((host, port, tls), host, port, tls, host_header, target, authorization)


def _head(method: str, origin: _Origin, headers: Headers, body: bytes | None) -> bytes:
    text = f"{method} {origin.target} HTTP/1.1\r\nHost: {origin.host_header}\r\n"
    # One string grown in place, not a list of lines joined, and the type looked for on the
    # way: the head is made on every request's way to its upstream write.
    ends, typed = 3, False  # the request line, the Host line and the blank line, so far
    for name, value in headers if isinstance(headers, list) else headers.items():
        text += f"{name}: {value}\r\n"
        typed = typed or name.lower() == "content-type"
        ends += 1
    if origin.authorization is not None:
        text += f"Authorization: {origin.authorization}\r\n"
        ends += 1
    if body is not None:
        if not typed:
            text += "Content-Type: application/octet-stream\r\n"
            ends += 1
        text += f"Content-Length: {len(body)}\r\n"
        ends += 1
    text += "\r\n"
    # Each line ends in the one CRLF put there above: a CR or LF inside a name or a value
    # would start a header (or a request) of the sender's choosing.
    if text.count("\n") != ends or text.count("\r") != ends:
        raise ValueError("a header holds a line break")
    return text.encode("utf-8", "surrogateescape")


class BackendClient:
    """Keep-alive connections to every backend, ``limit`` open at most (busy or idle); an
    idle one is closed after ``idle_seconds``."""

    def __init__(self, limit: int, idle_seconds: float = _IDLE_SECONDS) -> None:
        self._limit = limit
        self._idle_seconds = idle_seconds
        self._open = 0  # connections open or being opened
        # Oldest first in each list (given back at the end, taken from the end).
        self._idle: dict[tuple[str, int, bool], list[Connection]] = {}
        # One timer for the pool, at the time the oldest idle connection is due to close,
        # rather than a timer armed and cancelled for every request.
        self._sweep: asyncio.TimerHandle | None = None
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._tls: ssl.SSLContext | None = None
        self._first_bytes = Deadlines()  # every request's first-byte deadline, one timer

    @property
    def waiting(self) -> int:
        """Requests waiting for a connection (the pool is at its limit)."""
        return len(self._waiters)

    async def request(
        self,
        method: str,
        url: str,
        headers: Headers,
        body: bytes | None,
        *,
        connect_timeout: float,
        first_byte: float,
        close: bool = False,
        sent: Callable[[], object] | None = None,
        arrived: Callable[[Reply], None] | None = None,
    ) -> Reply:
        """Send the request and wait for the reply's head; ``sent`` is called once the
        request has gone out (work that need not delay it: the backend is working), and
        ``arrived``, from the connection's callback, with the reply this returns, if its
        head and first body bytes come in one read (before this wakes: its first bytes can
        be passed on at once).

        OSError if the backend cannot be reached (ConnectTimeout: not within
        ``connect_timeout``), UpstreamError if it fails before its head, TimeoutError if the
        head, and then the first body bytes (``Reply.first``), take over ``first_byte``.
        """
        origin = _origin(url)
        head = _head(method, origin, headers, body)
        conn = self._idle_connection(origin.key)
        # The loop a pooled connection reads on; asked of asyncio (a getpid() call in
        # CPython 3.11) only when a connection is to be opened.
        loop = asyncio.get_running_loop() if conn is None else conn.loop
        deadline = loop.time() + first_byte
        if conn is None:
            async with asyncio.timeout_at(deadline):
                conn = await self._connection(origin, connect_timeout)
        conn.reset(method == "HEAD")
        conn.active = True
        expiry: Deadline | None = None
        reply: Reply | None = None
        try:
            assert conn.transport is not None
            conn.transport.write(head if body is None else head + body)
            # One deadline for the whole first byte, lighter than an asyncio.timeout (a context
            # manager and a timer of its own); armed once the request is out (the same
            # deadline, off the path).
            expiry = self._first_bytes.arm(loop, deadline, conn.time_out)
            if sent is not None:
                sent()
            if arrived is not None:

                def head_here() -> None:
                    nonlocal reply
                    reply = Reply(conn, close, expiry)
                    arrived(reply)

                conn.arrived = head_here
            while not conn.headers_done:
                if conn.exception is not None:
                    raise conn.exception
                await conn.wait()
        except BaseException:
            if expiry is not None:
                expiry.cancel()
            conn.close()
            self.put_back(conn, False)
            raise
        finally:
            conn.arrived = None  # a head that came alone: the caller reads its first bytes
        return Reply(conn, close, expiry) if reply is None else reply

    def _idle_connection(self, key: tuple[str, int, bool]) -> Connection | None:
        idle = self._idle.get(key)
        while idle:
            conn = idle.pop()
            if not conn.closed:
                return conn
        return None

    async def _connection(self, origin: _Origin, connect_timeout: float) -> Connection:
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
                    lambda: Connection(origin.key, self.put_back, self.lost),
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

    def put_back(self, conn: Connection, reusable: bool) -> None:
        """A connection its reply is done with: pooled if ``reusable``, else closed."""
        conn.active = False
        if not reusable or conn.closed:
            conn.close()
            return
        if (conn.paused or conn.held) and conn.transport is not None:
            conn.transport.resume_reading()
        conn.reset(False)
        loop = conn.loop
        conn.idle_since = loop.time()
        self._idle.setdefault(conn.key, []).append(conn)
        if self._sweep is None:
            self._sweep = loop.call_at(conn.idle_since + self._idle_seconds, self._close_idle)
        self._wake_one()

    def _close_idle(self) -> None:
        """Close the connections idle for ``idle_seconds``; again when the next one is."""
        loop = asyncio.get_running_loop()
        now, due = loop.time(), None
        for idle in self._idle.values():
            while idle and idle[0].idle_since + self._idle_seconds <= now:
                idle.pop(0).close()
            if idle and (due is None or idle[0].idle_since < due):
                due = idle[0].idle_since
        self._sweep = (
            None if due is None else loop.call_at(due + self._idle_seconds, self._close_idle)
        )

    def lost(self, conn: Connection) -> None:
        """A connection has closed (either end)."""
        self._open -= 1
        idle = self._idle.get(conn.key)
        if idle and conn in idle:
            idle.remove(conn)
        self._wake_one()

    async def close(self) -> None:
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
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
