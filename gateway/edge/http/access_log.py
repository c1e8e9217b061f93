"""One record per request, filled along its path and written as one access log line, by
the gateway's one middleware (which also turns refusals into HTTP: ``error_response``).
What every reply says of its request is edge/http/reply_headers.py's."""

from __future__ import annotations

import asyncio
import logging
import random
import re
import time
from collections.abc import Callable
from typing import Any

import structlog
from aiohttp import web
from aiohttp.typedefs import Handler, Middleware
from multidict import istr

from gateway.core import (
    REQUEST_ID,
    Api,
    GatewayError,
    Reason,
    api_of,
    error_body,
    error_headers,
    info_writer,
    printable,
    shutting_down,
)
from gateway.edge.forwarded import Client
from gateway.edge.http.connection_handler import ARRIVED
from gateway.edge.http.connections import Connections
from gateway.edge.http.cors import Cors
from gateway.edge.record import RecordListener, RequestRecord

__all__ = ["RECORD", "X_REQUEST_ID", "access_log", "error_response"]

_LOGGER_NAME = "fairgate.access"
log = structlog.get_logger(_LOGGER_NAME)

RECORD = web.RequestKey("record", RequestRecord)
Locate = Callable[[web.Request], Client]


def error_response(api: Api, error: GatewayError) -> web.Response:
    """A refusal as HTTP, its body and headers as ``gateway.core.errors`` shapes them."""
    return web.Response(
        status=error.status,
        body=error_body(api, error.status, error.reason, error.message),
        content_type="application/json",
        headers=error_headers(error),
    )


# A client's request id is used as ours (so both sides' logs join up) only in a form that
# cannot forge a log field or a header: letters, digits and . _ : - , at most 64.
_SAFE_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,64}")
# istr: a header name looked up and set without case folding each time. Read from a
# client here, said on every reply (edge/http/reply_headers.py).
X_REQUEST_ID = istr("X-Request-Id")


def _request_ids(given: str | None) -> tuple[str, str | None]:
    """The request's id, and the client's own (escaped) when it is not fit to be ours."""
    if given is not None and _SAFE_REQUEST_ID.fullmatch(given):
        return given, None
    return _new_id(), None if given is None else printable(given[:64])


def _new_id() -> str:
    # Ids tell requests apart in the logs; they guard nothing, so no urandom call each.
    # 16 hex digits (to_bytes, lighter than a format string, as this runs for each request).
    return random.getrandbits(64).to_bytes(8, "big").hex()


def access_log(
    listeners: list[RecordListener], locate: Locate, connections: Connections, cors: Cors
) -> Middleware:
    """The gateway's one middleware. It places the client (``locate``: behind trusted
    proxies), names the request in the logs, counts it on its connection (``connections``:
    a 503 instead while draining), answers CORS preflights (``cors``), maps errors to the
    API's shape, logs the request once and tells ``listeners`` (metrics) about it.

    One middleware that calls each concern's own code rather than a middleware for each,
    and maps errors itself rather than in a coroutine of its own: every layer around the
    handler is one more call on every request's path."""
    line = _AccessLine()
    # An id made once the last request was logged, for the next that brings none of its
    # own: made then, not on that request's way to its upstream write.
    ahead: list[str] = []

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        given = request.headers.get(X_REQUEST_ID)
        if given is None and ahead:
            request_id, client_request_id = ahead.pop(), None
        else:
            request_id, client_request_id = _request_ids(given)
        arrived = request.get(ARRIVED) or time.monotonic()  # read, or only now handled
        record = RequestRecord(request_id, request.method, request.path, locate(request), arrived)
        if client_request_id is not None:
            record.client_request_id = client_request_id
        request[RECORD] = record
        named = REQUEST_ID.set(request_id)  # for every line logged on its way
        response: web.StreamResponse
        try:
            connections.enter(request)
            preflight = cors.preflight(request)  # answered before anyone is identified
            response = await handler(request) if preflight is None else preflight
        except GatewayError as error:
            response = _refused(request, record, error)
        except web.HTTPException as exc:
            # aiohttp's own refusals (no such route, wrong method, body over client_max_size).
            if exc.status < 400:
                raise
            response = _refused(request, record, _refusal_of(exc), may_close=False)
        except asyncio.CancelledError:
            if not connections.was_cut(request) or request.transport is None:
                record.client_gone = record.client_gone or request.transport is None
                record.status = record.status or 499
                raise
            # Ended by the drain's deadline before its reply began: answered as a request
            # arriving now is, rather than closed on (the cancellation was for this alone).
            current = asyncio.current_task()
            if current is not None:
                current.uncancel()
            response = _refused(request, record, shutting_down())
        except BaseException:
            # Gone, or going: a write to a transport the client closed raises before aiohttp
            # has seen the connection lost.
            transport = request.transport
            record.client_gone = record.client_gone or transport is None or transport.is_closing()
            # Anything else escaping here is a failure of the gateway's own, which its
            # connection handler answers with a 500 (unless the client has gone: 499).
            record.status = record.status or (499 if record.client_gone else 500)
            raise
        else:
            record.status = record.status or response.status
        finally:
            connections.leave(request)
            record.finished = time.monotonic()
            for listener in listeners:  # counted and charged first, whatever the log does
                listener(record)
            line.write(record)
            REQUEST_ID.reset(named)
            if not ahead:
                ahead.append(_new_id())
        return response

    return middleware


class _AccessLine:
    """The access log line, its fields built only when it is written.

    Logging is configured before the first request, so whether INFO is written, and the
    writer of the line (``info_writer``: the configured pipeline without structlog's
    bound logger around it), are looked up once, then."""

    def __init__(self) -> None:
        self._write: Callable[[str, dict[str, Any]], None] | None = None
        self._writes = False

    def write(self, record: RequestRecord) -> None:
        if self._write is None:
            self._writes = log.bind().is_enabled_for(logging.INFO)
            self._write = info_writer(_LOGGER_NAME)
        if self._writes:
            self._write("request", record.fields())


def _refused(
    request: web.Request, record: RequestRecord, error: GatewayError, may_close: bool = True
) -> web.Response:
    record.status, record.reason = error.status, error.reason
    response = error_response(api_of(request.path), error)
    if may_close and (error.close or _body_withheld(request)):
        # Refused before 100 Continue: the client may never send the body, so the
        # connection cannot be read to its next request; close it. (A body that is
        # being sent is read to its end and dropped by aiohttp, in bounded pieces.)
        response.force_close()
    return response


def _refusal_of(exc: web.HTTPException) -> GatewayError:
    return GatewayError(
        exc.status,
        _HTTP_REASONS.get(exc.status, Reason.BAD_REQUEST),
        _HTTP_MESSAGES.get(exc.status, exc.text or exc.reason),
    )


def _body_withheld(request: web.Request) -> bool:
    return (
        request.headers.get("Expect", "").lower() == "100-continue"
        and request.can_read_body
        and not request.content.is_eof()
        and request.content.total_bytes == 0
    )


_HTTP_REASONS = {
    404: Reason.NOT_FOUND,
    405: Reason.METHOD_NOT_ALLOWED,
    413: Reason.BODY_TOO_LARGE,
}
_HTTP_MESSAGES = {
    404: "no such endpoint on this gateway",
    405: "method not allowed on this endpoint",
}
