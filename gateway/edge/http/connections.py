"""Client connections: how many may be open, how long one may idle, and what a client that
does not speak HTTP gets.

aiohttp alone keeps every connection it accepts, for 75 s after its last request, and a
process under systemd has 1,024 descriptors: 1,015 idle connections that never send a key
make a real request fail with a reset, and nothing is logged. Here:

- at most ``FAIRGATE_MAX_CONNECTIONS`` client connections are open (fewer if the process
  cannot have that many descriptors); at the cap the oldest connection that is not
  handling a request is closed for the new one (as nginx reuses idle keep-alive
  connections), and when every one is busy the new one gets a 503 and is closed, logged;
- a connection that has not completed a request head ``FAIRGATE_IDLE_TIMEOUT`` seconds
  after it opened, or after its last reply, is closed (aiohttp's keep-alive timer, which
  also covers a head sent byte by byte);
- a request line or header the HTTP parser refuses gets a short JSON 400 that echoes
  nothing the client sent, and one log line without a traceback.
"""

from __future__ import annotations

import asyncio
import resource
import time
from collections.abc import Iterable
from typing import cast

import structlog
from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from gateway.config import Settings
from gateway.core import shutting_down
from gateway.edge.http.connection_handler import STARTS_PER_TURN, ConnectionHandler, Starts
from gateway.edge.http.hot_routes import HOT_PATHS, HotRoutes

__all__ = ["Connections", "Listener", "descriptor_cap"]

log = structlog.get_logger("fairgate.connections")

# Descriptors kept for what is not a client connection: backend connections are pooled
# separately (FAIRGATE_UPSTREAM_POOL_SIZE), plus Redis, the policy file and the logs.
_RESERVED_DESCRIPTORS = 64
_REFUSAL_LOG_EVERY = 5.0  # seconds: a flood of refusals is one line per period, with a count
# A bound on the turns the requests waiting for theirs take to start at a stop (a few each).
_SETTLE_SECONDS = 1.0
# Watching a drain must stay possible; everything else is refused while it lasts.
_SERVED_WHILE_DRAINING = frozenset({"/metrics", "/status"})
_FULL_BODY = b'{"error": "the gateway has too many connections open; retry"}'
_FULL = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
    b"Retry-After: 1\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s"
    % (len(_FULL_BODY), _FULL_BODY)
)
# A refused connection is closed once its client, having read the 503, closes its side, or
# after this long: a socket closed with the client's request still unread sends a reset,
# which can reach the client before the 503 and make it discard the reply.
_LINGER_SECONDS = 1.0
# At most this many linger at once (each holds a descriptor); more are closed at once.
_MAX_LINGERING = _RESERVED_DESCRIPTORS // 2


class Connections:
    """Which client connections are handling a request now, and whether the gateway is
    draining (shutting down: requests still arriving get 503 and a closed connection)."""

    def __init__(self) -> None:
        # Each connection handling a request: the request, and the task that handles it.
        self.busy: dict[object, tuple[web.Request, asyncio.Task[object] | None]] = {}
        self._cut: set[object] = set()  # the requests ``cut_unanswered`` ended
        self.draining = False
        # Made when someone waits for the last request to end (a drain): not an event
        # cleared and set by every request.
        self._idle: asyncio.Event | None = None

    def enter(self, request: web.Request) -> None:
        """``request``'s connection is busy until ``leave`` (so neither closed for a newcomer
        nor left out of a drain); a 503 instead while draining. The access log calls both,
        ``leave`` in a ``finally``: a guard object for a ``with`` would add an object and its
        two calls to every request's path."""
        if self.draining and request.path not in _SERVED_WHILE_DRAINING:
            raise shutting_down()
        self.busy[request.protocol] = (request, asyncio.current_task())

    def leave(self, request: web.Request) -> None:
        """``request`` has ended; a no-op if ``enter`` refused it (a connection handles one
        request at a time, so its protocol was not busy with another)."""
        self.busy.pop(request.protocol, None)
        self._cut.discard(request.protocol)
        if not self.busy and self._idle is not None:
            self._idle.set()

    def cut_unanswered(self) -> int:
        """At the drain's deadline, end each request whose reply has not begun (its body still
        coming, its model loading, a whole reply still being made) by cancelling its handler;
        the access log answers it 503 (``was_cut``). How many were."""
        cut = 0
        for request, task in list(self.busy.values()):
            if task is not None and not task.done() and request.writer.output_size == 0:
                self._cut.add(request.protocol)
                task.cancel()
                cut += 1
        return cut

    def was_cut(self, request: web.Request) -> bool:
        """Whether ``request``'s handler was cancelled by ``cut_unanswered``."""
        return request.protocol in self._cut

    @property
    def in_request(self) -> int:
        return len(self.busy)

    async def until_idle(self, within: float) -> bool:
        """Wait until no connection is handling a request; False if ``within`` ran out."""
        if not self.busy:
            return True
        if self._idle is None or self._idle.is_set():
            self._idle = asyncio.Event()
        idle = self._idle
        try:
            async with asyncio.timeout(within):
                await idle.wait()
        except TimeoutError:
            return False
        return True


class Listener:
    """The gateway's listening socket, with the cap and deadlines above."""

    def __init__(
        self,
        app: web.Application,
        settings: Settings,
        connections: Connections,
        starts_per_turn: int = STARTS_PER_TURN,
    ) -> None:
        self._settings = settings
        self._starts = Starts(starts_per_turn)
        self._connections = connections
        self._cap = descriptor_cap(settings.max_connections)
        # The drain is ours (app.py); aiohttp's own wait at cleanup only closes what is left.
        self._runner = web.AppRunner(
            app, access_log=None, handler_cancellation=True, shutdown_timeout=1.0
        )
        self._server: asyncio.Server | None = None
        self._refused = 0
        self._lingering: set[_Refuse] = set()  # refused connections not closed yet
        self._refusals_logged_at = 0.0
        self._hot: HotRoutes | None = None  # once started

    async def start(self, port: int | None = None) -> None:
        """Start the app (probes, policy watch), then listen on the settings' address (or
        on ``port``: 0 picks a free one); OSError if the address cannot be bound."""
        await self._runner.setup()
        server = self._runner.server
        assert server is not None
        app = self._runner.app
        self._hot = server.request_handler = HotRoutes(app, app.get(HOT_PATHS, ()))
        loop = asyncio.get_running_loop()
        settings = self._settings
        try:
            self._server = await loop.create_server(
                self._accept,
                settings.host,
                settings.port if port is None else port,
                reuse_address=True,
                backlog=1024,
            )
        except BaseException:
            await self._runner.cleanup()
            raise

    @property
    def url(self) -> str:
        assert self._server is not None
        host, port = self._server.sockets[0].getsockname()[:2]
        return f"http://{host}:{port}"

    @property
    def open_connections(self) -> int:
        return _count_open(self._runner.server.connections if self._runner.server else ())

    async def close(self) -> None:
        """Stop listening, close every connection, stop the app."""
        if self._server is not None:
            self._server.close()
        # aiohttp gives the requests that came before a stop one turn to start, then closes
        # each connection whose request has not, unanswered; a burst waiting for its turns
        # (Starts) takes a few. Started, a request is answered (refused while draining)
        # before its connection is closed.
        await self._starts.settled(_SETTLE_SECONDS)
        await self._runner.cleanup()

    def _accept(self) -> asyncio.BaseProtocol:
        server = self._runner.server
        assert server is not None
        handlers = server.connections
        if _count_open(handlers) >= self._cap and not self._close_idle(handlers):
            self._note_refusal()
            return _Refuse(self._lingering)
        assert self._hot is not None
        return ConnectionHandler(
            server,
            self._hot,
            self._starts,
            loop=asyncio.get_running_loop(),
            keepalive_timeout=self._settings.idle_timeout,
            access_log=None,  # aiohttp's own line is off
        )

    def _close_idle(self, handlers: Iterable[RequestHandler]) -> bool:
        """Close the oldest connection not handling a request; False if there is none."""
        for handler in handlers:  # in the order they were opened
            if handler.transport is not None and not _handling(handler, self._connections):
                handler.force_close()
                return True
        return False

    def _note_refusal(self) -> None:
        self._refused += 1
        now = time.monotonic()
        if now - self._refusals_logged_at >= _REFUSAL_LOG_EVERY:
            log.warning(
                "connection_refused",
                reason="every connection is handling a request",
                max_connections=self._cap,
                refused_since_last=self._refused,
            )
            self._refused, self._refusals_logged_at = 0, now


def descriptor_cap(wanted: int) -> int:
    """``wanted`` client connections, or fewer if the process cannot have that many open
    descriptors even after raising its soft limit to the hard one (as Go does at start)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = wanted + _RESERVED_DESCRIPTORS
    if soft != resource.RLIM_INFINITY and soft < needed:
        raised = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
            soft = raised
        except (ValueError, OSError):
            pass
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return wanted
    cap = max(1, soft - _RESERVED_DESCRIPTORS)
    log.warning(
        "connections_limited",
        max_connections=wanted,
        allowed=cap,
        descriptors=soft,
        hint="raise the descriptor limit (LimitNOFILE= in the systemd unit, ulimit -n)",
    )
    return cap


def _handling(handler: RequestHandler, connections: Connections) -> bool:
    """Whether a connection has a request under way (or about to start: ``Starts``)."""
    starting = isinstance(handler, ConnectionHandler) and handler.handling
    return starting or handler in connections.busy


def _count_open(handlers: Iterable[RequestHandler]) -> int:
    # A connection closed for a newcomer stays listed until its close completes.
    return sum(1 for handler in handlers if handler.transport is not None)


class _Refuse(asyncio.Protocol):
    """A connection over the cap: one 503, then closed (see ``_LINGER_SECONDS``)."""

    def __init__(self, lingering: set[_Refuse]) -> None:
        self._lingering = lingering
        self._closer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # Not an isinstance check: uvloop's transports are not asyncio's classes.
        stream = cast(asyncio.Transport, transport)
        stream.write(_FULL)
        if len(self._lingering) >= _MAX_LINGERING:
            stream.close()
            return
        self._lingering.add(self)
        # Our side ends after the 503; what the client sends meanwhile is read and dropped
        # (data_received), and its end closes the transport (eof_received).
        stream.write_eof()
        self._closer = asyncio.get_running_loop().call_later(_LINGER_SECONDS, stream.close)

    def connection_lost(self, exc: Exception | None) -> None:
        self._lingering.discard(self)
        if self._closer is not None:
            self._closer.cancel()
