"""The relay: one upstream request, its reply passed to the client as it arrives, unchanged.

The failure rule (as in uvicorn): before the first byte went out, the client gets a JSON error
in its API's shape; after it, an in-band error line (Ollama's NDJSON convention, or an SSE
event) and the stream is closed. Either way the upstream request is closed, so the backend
frees its slot, and the caller's permit is released by its ``async with``.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from typing import NamedTuple

import structlog
from aiohttp import web
from multidict import CIMultiDict

from gateway.config import Timeouts
from gateway.core import BackendFailure, GatewayError, Reason, api_of, inband_error
from gateway.edge import Progress
from gateway.edge.http import ReplyHeaders, error_response, forwarded_headers
from gateway.relay.client_reply import start
from gateway.relay.pump import pump
from gateway.relay.upstream_client import BackendClient, ConnectTimeout
from gateway.relay.upstream_connection import StreamCut, UpstreamError
from gateway.relay.upstream_reply import Reply
from gateway.wire import TokenEvents

__all__ = ["Interrupted", "Preempted", "Relay", "Target"]

log = structlog.get_logger("fairgate.relay")


# A NamedTuple rather than a frozen dataclass: one is made for every request, and a frozen
# dataclass sets each field through ``object.__setattr__``, a call per field.
class Target(NamedTuple):
    """Where a relay sends its request, and how it treats that backend."""

    url: str
    timeouts: Timeouts
    # With fail_fast, a 5xx reply raises BackendFailure instead of reaching the client, so
    # the caller can try another backend.
    fail_fast: bool = False
    # llama-server closes the connection after a streamed reply although it promised
    # keep-alive; a pooled connection would then fail on the next request.
    close_connection: bool = False
    # False where the gateway answers for CORS (origins listed): the browser's Origin is
    # then the gateway's business, and Ollama would refuse one it does not list itself.
    keep_origin: bool = True
    # How the route's stream says its tokens, when not a line or an SSE event each.
    events: TokenEvents | None = None


class Preempted(Exception):
    """The request gave its slot to a person before its reply began (background work):
    nothing has gone to its client, and it will run again."""


class Interrupted(Exception):
    """The gateway itself ends a running reply (it is shutting down)."""

    def __init__(self, reason: Reason, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class Relay:
    """One upstream request and its reply, streamed to the client; ``progress`` says how
    far it got, whatever the outcome (also when the handler is cancelled)."""

    def __init__(
        self,
        client: BackendClient,
        target: Target,
        reply_headers: ReplyHeaders,
        meter: Callable[[int], None] | None = None,
        begin: Callable[[], bool] | None = None,
    ) -> None:
        """``begin``: asked as the reply is about to go out; False (the request gave its
        slot up meanwhile) sends nothing and raises ``Preempted``."""
        self.progress = Progress()
        self._begin = begin
        self._reply: Reply | None = None  # once it has started
        self._client = client
        self._target = target
        # Told, every few tokens, how many more have streamed (one NDJSON line or one SSE
        # event per token), so that long replies are charged while they run.
        self._meter = meter
        self._reply_headers = reply_headers
        self._said: CIMultiDict[str] | None = None  # the gateway's own reply headers
        self._request: web.Request | None = None  # once it runs
        # The reply and its first bytes, once they have gone out from ``_arrived``.
        self._started: tuple[web.StreamResponse, bytes] | None = None

    async def run(self, request: web.Request, body: bytes | None) -> web.StreamResponse:
        """Send the request and stream the reply back; GatewayError before the first byte."""
        headers = forwarded_headers(request.headers, self._target.keep_origin)
        if self._target.close_connection:
            headers.append(("Connection", "close"))  # the client's was dropped
        # The gateway's own reply headers are worked out while the backend works: the client
        # calls ``_say`` once the request is out, off the path of its first byte.
        self._request = request
        client, target = self._client, self._target
        upstream = await _open(request, client, target, body, headers, self._say, self._arrived)
        self._reply = upstream
        try:  # not ``async with``: two coroutines less for every reply
            if self._started is not None:  # its head and first bytes are out (``_arrived``)
                response, first = self._started
            else:
                first = await _first(upstream, target)
                if self._begin is not None and not self._begin():
                    raise Preempted
                self.progress.first_byte_at = time.monotonic()
                if upstream.status >= 400 and not _speaks_json(upstream):
                    return await _wrapped_error(request, upstream, first)
                response = self._start(upstream, first)
            return await self._pump(request, upstream, response, first)
        finally:
            upstream.release()

    def _arrived(self, upstream: Reply) -> None:
        """The reply's head and first bytes, in the backend connection's callback: a stream's
        go to the client here, in one send, before the relay's task wakes (a turn of the
        event loop, and the coroutines' way back up, off the path of the first byte). An
        error, or a reply of a declared length, is left to the task."""
        if upstream.status >= 400 or upstream.content_length is not None:
            return
        if self._begin is not None and not self._begin():
            return  # it gave its slot up: the task, cancelled, sends nothing either
        first = upstream.first_if_here()
        assert first is not None  # the connection calls this with body bytes in
        self.progress.first_byte_at = time.monotonic()
        self._reply = upstream
        self._started = self._start(upstream, first), first

    def _start(self, upstream: Reply, first: bytes) -> web.StreamResponse:
        """The reply, prepared, its head and first bytes sent (relay/client_reply.py)."""
        assert self._request is not None
        said = self._said if self._said is not None else self._say()
        return start(self._request, upstream, said, first)

    async def _pump(
        self, request: web.Request, upstream: Reply, response: web.StreamResponse, first: bytes
    ) -> web.StreamResponse:
        try:
            await pump(
                request,
                response,
                upstream,
                first,
                self.progress,
                self._target.timeouts,
                self._meter,
                self._target.events,
            )
        except ConnectionResetError:
            self.progress.client_gone = True
        except (UpstreamError, TimeoutError, Interrupted) as exc:
            content_type = upstream.headers.get("Content-Type", "")
            await self._failed(request, response, content_type, exc)
        return response

    def _say(self) -> CIMultiDict[str]:
        assert self._request is not None
        said = self._said = self._reply_headers.said(self._request)
        return said

    async def _failed(
        self,
        request: web.Request,
        response: web.StreamResponse,
        content_type: str,
        exc: BaseException,
    ) -> None:
        self.progress.failure = Reason.BACKEND_FAILED_MID_STREAM
        if isinstance(exc, Interrupted):
            self.progress.failure, reason = exc.reason, str(exc)
        elif isinstance(exc, TimeoutError):
            reason = f"the backend sent nothing for {self._target.timeouts.idle:g}s"
        else:
            log.warning("backend_failed_mid_stream", url=self._target.url, error=repr(exc))
            said = exc if isinstance(exc, StreamCut) else type(exc).__name__
            reason = f"the backend failed mid-stream ({said})"
        failure = self.progress.failure
        if not await _fail_inband(request, response, content_type, reason, failure):
            self.progress.client_gone = True

    @property
    def started(self) -> bool:
        """Whether the reply's head has gone to the client (its writer has written)."""
        return self._request is not None and self._request.writer.output_size > 0

    def interrupt(self, reason: Reason, message: str) -> None:
        """End a started reply now, with an in-band error saying ``message``; a reply not
        started yet is left to its handler's cancellation."""
        if self._reply is not None:
            self._reply.set_exception(Interrupted(reason, message))


async def _open(
    request: web.Request,
    client: BackendClient,
    target: Target,
    body: bytes | None,
    headers: list[tuple[str, str]],
    sent: Callable[[], object],
    arrived: Callable[[Reply], None],
) -> Reply:
    """The upstream reply, its head read, or a GatewayError saying what went wrong."""
    upstream, timeouts = None, target.timeouts
    try:
        upstream = await client.request(
            request.method,
            target.url,
            headers,
            body,
            connect_timeout=timeouts.connect,
            first_byte=timeouts.first_byte,
            close=target.close_connection,
            sent=sent,
            arrived=arrived,
        )
        if target.fail_fast and upstream.status >= 500:
            detail = (await upstream.read_up_to(300)).decode("utf-8", "replace")[:300]
            raise BackendFailure(
                502, Reason.BACKEND_FAILED, f"the backend answered {upstream.status}: {detail}"
            )
        return upstream
    except BaseException as exc:
        if upstream is not None:
            upstream.release()
        raise _open_error(exc, target) from exc


async def _first(upstream: Reply, target: Target) -> bytes:
    """The reply's first body bytes, or a GatewayError saying what went wrong."""
    first = upstream.first_if_here()
    if first is not None:
        return first
    try:
        return await upstream.first()
    except BaseException as exc:
        raise _open_error(exc, target) from exc


def _open_error(exc: BaseException, target: Target) -> BaseException:
    """What the client is told of a failure before the reply's first byte."""
    if isinstance(exc, UpstreamError | OSError):
        # The backend's address and our request's headers are for the log only.
        log.warning("backend_request_failed", url=target.url, error=repr(exc))
    timeouts = target.timeouts
    if isinstance(exc, GatewayError):
        return exc
    if isinstance(exc, OSError) and not isinstance(exc, TimeoutError):
        # Not str(exc): asyncio's message names the backend's address, which is for the log.
        if isinstance(exc, socket.gaierror):
            why = exc.strerror or "the name does not resolve"
        else:
            why = os.strerror(exc.errno) if exc.errno else type(exc).__name__
        return BackendFailure(
            502, Reason.BACKEND_UNREACHABLE, f"cannot reach the backend: {why.lower()}"
        )
    if isinstance(exc, ConnectTimeout):
        return GatewayError(
            504,
            Reason.BACKEND_TIMEOUT,
            f"cannot connect to the backend within {timeouts.connect:g}s",
        )
    if isinstance(exc, TimeoutError):
        return GatewayError(
            504,
            Reason.BACKEND_TIMEOUT,
            f"the backend sent nothing within {timeouts.first_byte:g}s",
        )
    if isinstance(exc, UpstreamError):
        return GatewayError(
            502,
            Reason.BACKEND_FAILED,
            f"the backend failed before replying ({type(exc).__name__})",
        )
    return exc


_ERROR_EXCERPT = 2048  # bytes of a backend's non-JSON error page kept for the log


def _speaks_json(upstream: Reply) -> bool:
    kind = upstream.headers.get("Content-Type", "")
    return "json" in kind or kind.startswith("text/event-stream")


async def _wrapped_error(request: web.Request, upstream: Reply, first: bytes) -> web.Response:
    """A backend's error page (HTML, plain text) in the API's error shape, status kept: a
    client library shows its user a JSON error, and only garbles a page."""
    excerpt = first[:_ERROR_EXCERPT]
    log.warning(
        "backend_error_page",
        status=upstream.status,
        content_type=upstream.headers.get("Content-Type"),
        excerpt=excerpt.decode("utf-8", "replace"),
    )
    message = f"the backend answered {upstream.status} {upstream.reason or ''}".rstrip()
    error = GatewayError(upstream.status, Reason.BACKEND_FAILED, message)
    return error_response(api_of(request.path), error)


async def _fail_inband(
    request: web.Request,
    response: web.StreamResponse,
    content_type: str,
    reason: str,
    failure: Reason,
) -> bool:
    """End a started reply with an in-band error saying ``reason`` (``failure``, in the
    vocabulary); False if the client was gone."""
    log.warning("stream_failed", reason=reason)
    if response.content_length is not None or request.transport is None:
        # A reply with a declared length cannot carry an error line: cut the connection,
        # which the client reports as an incomplete body.
        if request.transport is not None:
            request.transport.close()
        return True
    try:
        await response.write(inband_error(api_of(request.path), content_type, reason, failure))
        await response.write_eof()
    except ConnectionResetError:
        return False
    return True
