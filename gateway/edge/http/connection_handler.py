"""A client connection's handler: aiohttp's, with generation requests started one turn of
the event loop sooner, and errors that echo nothing.

aiohttp serves a connection's requests from one coroutine per connection (``start``): the
parser queues a request and wakes that coroutine, which makes a task for the request and
waits for it, two turns of the event loop and the code of both before a handler runs. A
request for one of the hot routes (``edge/http/hot_routes.py``) whose head and body came whole, on a
connection where nothing else is queued or running, is given its task here, from the
parser's callback, and the reply is finished as ``start`` would finish it: prepared, ended,
the keep-alive deadline set again. Requests behind it on the connection (pipelined) wait
in aiohttp's queue and ``start`` takes them, in order, once it has ended; every other
request goes through ``start``, so what answers a request is the same either way.

A burst of such requests (a household's streams that ended on the same decode step and ask
again at once) is started a few per turn of the event loop (``Starts``), in the order they
came. The event loop runs everything ready before it looks at its sockets again: a hundred
requests made ready in one turn would each be taken to its upstream write before any reply
that came meanwhile is passed on, so every first token would wait for the last arrival's
way in. Started a few per turn, the replies of those already sent go out between them
(benchmarks/README.md has the measurements).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import deque
from typing import Any

import structlog
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.http_parser import RawRequestMessage
from aiohttp.http_writer import StreamWriter
from aiohttp.typedefs import Handler
from aiohttp.web_exceptions import HTTPException
from aiohttp.web_protocol import RequestHandler, RequestPayloadError
from aiohttp.web_server import Server

from gateway.edge.http.hot_routes import HotRoutes

__all__ = ["ARRIVED", "STARTS_PER_TURN", "ConnectionHandler", "Starts"]

log = structlog.get_logger("fairgate.connections")

ARRIVED = web.RequestKey("arrived", float)
"""When a request started here was read (``time.monotonic``): its record counts from then,
its wait for a turn (``Starts``) and for the loop included, not from when it began."""

# Hot requests started in one turn of the event loop, at most: each runs to its upstream
# write before the loop looks at its sockets again, so the more a turn starts, the longer a
# reply that came meanwhile waits. Fewer costs a look at the sockets (a syscall) for every
# few requests. Six serves a burst of 100 streams asking at once as well as one does (the
# values tried are in benchmarks/README.md).
STARTS_PER_TURN = 6


class Starts:
    """The hot requests of every connection, started at most ``per_turn`` in a turn of the
    event loop, first come first started (see the module's note)."""

    def __init__(self, per_turn: int = STARTS_PER_TURN) -> None:
        self._per_turn = per_turn
        self._starting = 0  # started this turn, not yet running
        self._waiting: deque[ConnectionHandler] = deque()
        self._settled: asyncio.Event | None = None  # made when a stop waits for the rest

    async def settled(self, within: float) -> None:
        """Wait, ``within`` seconds at most, until every request handed here has run its
        first step (or never will: its client left)."""
        if not self._starting and not self._waiting:
            return
        self._settled = settled = asyncio.Event()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(within):
                await settled.wait()

    def start(self, handler: ConnectionHandler) -> None:
        """Start ``handler``'s request now, or once those ahead of it have started."""
        if self._starting < self._per_turn and not self._waiting:
            self._starting += 1
            handler.begin()
        else:
            self._waiting.append(handler)

    def running(self) -> None:
        """A request started here runs (its first step): the next waiting one starts, and
        runs in the loop's next turn, after the loop has looked at its sockets."""
        self._starting -= 1
        waiting = self._waiting
        while waiting:
            if waiting.popleft().begin():
                self._starting += 1
                return
        if not self._starting and self._settled is not None:
            self._settled.set()


class ConnectionHandler(RequestHandler):
    """aiohttp's connection handler, with the hot routes' shorter start (above)."""

    def __init__(self, manager: Server, hot: HotRoutes, starts: Starts, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._hot = hot
        self._starts = starts
        self._serving: asyncio.Task[None] | None = None  # a request started here
        self._next: tuple[web.BaseRequest, Handler] | None = None  # its turn to start awaited
        self._begun = False  # started by Starts, not yet running: Starts counts it

    @property
    def handling(self) -> bool:
        """Whether a request started here runs or waits for its turn to start."""
        return self._serving is not None or self._next is not None

    def data_received(self, data: bytes) -> None:
        waiter = self._waiter
        if waiter is None or waiter.done():
            # start() is handling a request, or about to: it takes the next one in order.
            super().data_received(data)
            return
        # start() waits for a request: parse without waking it, then see who serves it.
        self._waiter = None
        try:
            super().data_received(data)
        finally:
            self._waiter = waiter
        if self.handling or not self._messages:
            return  # what is queued waits for the running request's end (_served)
        if len(self._messages) > 1 or not self._start_hot():
            waiter.set_result(None)

    def resume_reading(self, resume_parser: bool = True) -> None:
        # aiohttp's body reader asks for this after each read that leaves it under its low
        # water mark, paused or not (every chat body, read whole). Unpaused, nothing waits
        # to be resumed: no bytes held from the parser, the transport reading; so the parse
        # of nothing aiohttp would do on its way is left off every request's path.
        if self._reading_paused:
            super().resume_reading(resume_parser)

    def _start_hot(self) -> bool:
        """Start the one queued request here if it is a hot route's, whole; else False."""
        message, payload = self._messages[0]
        if not isinstance(message, RawRequestMessage) or not payload.is_eof():
            return False
        if message.upgrade or self._upgraded:
            # aiohttp's finish_response feeds on the bytes held behind a request that asks
            # to switch protocols, and asserts that start() is not waiting: start()'s own.
            return False
        hot = self._hot.chain_for(message.method, message.path, message.headers)
        manager, parser = self._manager, self._parser
        if hot is None or manager is None or parser is None or self._request_factory is None:
            return False
        self._messages.popleft()
        parser.message_consumed()  # as start() does: the parser counts what is queued
        manager.requests_count += 1
        loop = self._loop
        request = self._request_factory(
            message,
            payload,
            self,
            StreamWriter(self, loop),
            self._task_handler,  # type: ignore[arg-type]
        )
        chain, match = hot
        request._match_info = match  # type: ignore[attr-defined]  # as HotRoutes sets it
        request[ARRIVED] = time.monotonic()
        self._next = request, chain
        self._starts.start(self)
        return True

    def begin(self) -> bool:
        """Start the request that waits for its turn (``Starts``); False if its client is
        gone meanwhile."""
        waiting, self._next = self._next, None
        if waiting is None:
            return False
        self._serving = self._loop.create_task(self._serve(*waiting))
        self._begun = True
        return True

    def _running(self) -> None:
        """Tell ``Starts`` the request runs (or never will: cancelled before its first
        step, a task runs none of its code), once."""
        if self._begun:
            self._begun = False
            self._starts.running()

    async def _serve(self, request: web.BaseRequest, chain: Handler) -> None:
        """What start() and _handle_request do for one request: the handler, errors turned
        into replies, the reply prepared and ended, then the connection kept or closed."""
        self._running()
        self._request_in_progress = True
        self._current_request = request
        keep = False
        try:
            try:
                response = await chain(request)  # type: ignore[arg-type]
            except HTTPException as exc:
                response = exc
            except TimeoutError:
                response = self.handle_error(request, 504)
            except Exception as exc:
                response = self.handle_error(request, 500, exc)
            finally:
                self._current_request = None
            _, reset = await self.finish_response(request, response, None)
            keep = not reset and bool(response.keep_alive)
        except ConnectionError:
            pass  # the client is gone, or the reply had started before an error
        except Exception as exc:  # as start() does with what escapes a request's task
            self.log_exception("Unhandled exception", exc_info=exc)
            self.force_close()
        finally:
            self._request_in_progress = False
            if self._handler_waiter is not None:
                self._handler_waiter.set_result(None)
            self._serving = None
        self._served(keep)

    def _served(self, keep: bool) -> None:
        """After a request started here: the next queued one to start(), or the keep-alive
        deadline set again, or the connection closed."""
        if not keep or self._close or self._force_close:
            self._keepalive = False
            if self.transport is not None and not self._force_close:
                self.transport.close()
            return
        waiter = self._waiter
        if self._messages and waiter is not None and not waiter.done():
            waiter.set_result(None)
            return
        close_time = self._loop.time() + self._keepalive_timeout
        self._next_keepalive_close_time = close_time
        if self._keepalive_handle is None:
            self._keepalive_handle = self._loop.call_at(close_time, self._process_keepalive)

    def _process_keepalive(self) -> None:
        # aiohttp closes a connection whose start() is idle at the deadline; one serving a
        # request started here looks idle to it, and its deadline is set again at the end.
        if self.handling:
            self._keepalive_handle = None
            return
        super()._process_keepalive()

    def connection_lost(self, exc: BaseException | None) -> None:
        super().connection_lost(exc)
        # As aiohttp cancels its own request task when the client hangs up (the listener
        # runs with handler_cancellation).
        self._next = None  # not started: never will be
        if self._serving is not None:
            self._serving.cancel()
            self._running()

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        """A JSON error that echoes nothing the client sent, logged without a traceback
        unless it is a bug of ours."""
        transport = request.transport
        if isinstance(exc, ConnectionError) and (transport is None or transport.is_closing()):
            # The client left while the handler wrote to it (an interim 100 Continue):
            # nobody to answer, and no bug of ours; start() and _serve close quietly.
            raise ConnectionError("the client is gone") from exc
        if status >= 500:
            # A bug of ours reached the top: the traceback is for the admin, not the client.
            log.error("unhandled_error", status=status, exc_info=exc)
            text = "the gateway failed to handle this request"
        else:
            log.warning("bad_http", status=status, error=type(exc).__name__ if exc else None)
            text = "malformed HTTP request"
        if request.writer.output_size > 0:
            raise ConnectionError("the reply had started; the connection is closed instead")
        response = web.Response(
            status=status, body=json.dumps({"error": text}), content_type="application/json"
        )
        response.force_close()
        return response

    def log_exception(self, *args: Any, **kw: Any) -> None:
        """aiohttp's own failures around a request (a body that breaks while aiohttp reads
        it on to reach the next request): one line; a traceback only for the unexpected."""
        exc = kw.get("exc_info")
        if isinstance(exc, RequestPayloadError | HttpProcessingError | ConnectionError):
            log.warning("connection_failed", error=type(exc).__name__)
        else:
            log.error("connection_failed", exc_info=exc)
