"""A backend's reply to one request, as the relay reads it: its head, and its body either
read (``Reply.read``: every byte since the last read, after at most one wake-up) or passed
on from the connection's own callback (``Reply.pass_to``: no wake-up at all).

Apart from the connection (relay/upstream_connection.py), which is the protocol and the parser's
state: this is the relay's side of it, what relay/relay.py and relay/pump.py call. A reply lends its
connection until ``release``, which gives it back to the pool (relay/upstream_client.py) when it
can serve another request, or closes it.
"""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType

from multidict import CIMultiDict

from gateway.edge.http import decoded
from gateway.relay.deadlines import Deadline
from gateway.relay.upstream_connection import Connection

__all__ = ["Reply"]


class Reply:
    """A backend's reply to one request: its head, and its body as it arrives."""

    __slots__ = (
        "_close",
        "_conn",
        "_deadline",
        "_headers",
        "content_length",
        "loop",
        "raw_headers",
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
        self.raw_headers = conn.raw_headers  # as they came (the connection's next is new)
        self._headers: CIMultiDict[str] | None = None
        length = next(
            (value for name, value in self.raw_headers if name.lower() == b"content-length"),
            None,
        )
        self.content_length = int(length) if length is not None and length.isdigit() else None

    @property
    def headers(self) -> CIMultiDict[str]:
        """The headers, decoded: made when first asked for (a stream's relayed head is
        written from ``raw_headers``, and its first bytes go out before anyone asks)."""
        if self._headers is None:
            self._headers = CIMultiDict(decoded(self.raw_headers))
        return self._headers

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
