"""A client connection's handler: aiohttp's, with generation requests started one turn of
the event loop sooner, and errors that echo nothing.

aiohttp serves a connection's requests from one coroutine per connection (``start``): the
parser queues a request and wakes that coroutine, which makes a task for the request and
waits for it, two turns of the event loop and the code of both before a handler runs. A
request for one of the hot routes (``hot_routes.py``) whose head and body came whole, on a
connection where nothing else is queued or running, is given its task here, from the
parser's callback, and the reply is finished as ``start`` would finish it: prepared, ended,
the keep-alive deadline set again. Requests behind it on the connection (pipelined) wait
in aiohttp's queue and ``start`` takes them, in order, once it has ended; every other
request goes through ``start`` as before, so what answers a request is the same either way.
"""

from __future__ import annotations

import asyncio
import json
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

from gateway.hot_routes import HotRoutes

__all__ = ["ConnectionHandler"]

log = structlog.get_logger("fairgate.connections")


class ConnectionHandler(RequestHandler):
    """aiohttp's connection handler, with the hot routes' shorter start (above)."""

    def __init__(self, manager: Server, hot: HotRoutes, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._hot = hot
        self._serving: asyncio.Task[None] | None = None  # a request started here

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
        if self._serving is not None or not self._messages:
            return  # what is queued waits for the running request's end (_served)
        if len(self._messages) > 1 or not self._start_hot():
            waiter.set_result(None)

    def _start_hot(self) -> bool:
        """Start the one queued request here if it is a hot route's, whole; else False."""
        message, payload = self._messages[0]
        if not isinstance(message, RawRequestMessage) or not payload.is_eof():
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
        self._serving = loop.create_task(self._serve(request, chain))
        return True

    async def _serve(self, request: web.BaseRequest, chain: Handler) -> None:
        """What start() and _handle_request do for one request: the handler, errors turned
        into replies, the reply prepared and ended, then the connection kept or closed."""
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
        if self._serving is not None:
            self._keepalive_handle = None
            return
        super()._process_keepalive()

    def connection_lost(self, exc: BaseException | None) -> None:
        super().connection_lost(exc)
        # As aiohttp cancels its own request task when the client hangs up (the listener
        # runs with handler_cancellation).
        if self._serving is not None:
            self._serving.cancel()

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        """A JSON error that echoes nothing the client sent, logged without a traceback
        unless it is a bug of ours."""
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
