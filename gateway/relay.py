"""The relay: one upstream request, its reply passed to the client chunk by chunk, unchanged.

The failure rule (as in uvicorn): before the first byte went out, the client gets a JSON error
in its API's shape; after it, an in-band error line (Ollama's NDJSON convention, or an SSE
event) and the stream is closed. Either way the upstream request is closed, so the backend
frees its slot, and the caller's permit is released by its ``async with``.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp
import structlog
from aiohttp import web
from multidict import CIMultiDict

from gateway.errors import BackendFailure, GatewayError, error_body, inband_error
from gateway.headers import forwarded_headers, returned_headers
from gateway.policy import Timeouts
from gateway.tallies import TALLY_WINDOW, FinalCounts, final_counts
from gateway.vocabulary import Reason, api_of

__all__ = ["Interrupted", "Progress", "Relay", "Target"]

log = structlog.get_logger("fairgate.relay")

_METER_EVERY = 8  # tokens between charges to the fair scheduler


@dataclass(frozen=True, slots=True)
class Target:
    """Where a relay sends its request, and how it treats that backend."""

    url: str
    timeouts: Timeouts
    # With fail_fast, a 5xx reply raises BackendFailure instead of reaching the client, so
    # the caller can try another backend.
    fail_fast: bool = False
    # llama-server closes the connection after a streamed reply although it promised
    # keep-alive; a pooled connection would then fail on the next request.
    close_connection: bool = False


@dataclass(slots=True)
class Progress:
    """What happened to one relayed reply, for the handler to read when it ends."""

    first_byte_at: float | None = None
    bytes_out: int = 0
    gaps: list[float] = field(default_factory=list)  # seconds between chunks of the reply
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    load_seconds: float | None = None  # Ollama's load_duration: the reply paid for a load
    failure: Reason | None = None  # the reply was cut after its first byte
    client_gone: bool = False


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
        session: aiohttp.ClientSession,
        target: Target,
        meter: Callable[[int], None] | None = None,
    ) -> None:
        self.progress = Progress()
        self._reader: aiohttp.StreamReader | None = None  # the reply, once it has started
        self._session = session
        self._target = target
        # Told, every few tokens, how many more have streamed (one NDJSON line or one SSE
        # event per token), so that long replies are charged while they run.
        self._meter = meter

    async def run(self, request: web.Request, body: bytes | None) -> web.StreamResponse:
        """Send the request and stream the reply back; GatewayError before the first byte."""
        headers = forwarded_headers(request.headers)
        if self._target.close_connection:
            headers["Connection"] = "close"
        upstream, first = await _open(request, self._session, self._target, body, headers)
        self.progress.first_byte_at = time.monotonic()
        self._reader = upstream.content
        async with upstream:
            if upstream.status >= 400 and not _speaks_json(upstream):
                return await _wrapped_error(request, upstream, first)
            return await self._pump(request, upstream, first)

    async def _pump(
        self, request: web.Request, upstream: aiohttp.ClientResponse, chunk: bytes
    ) -> web.StreamResponse:
        progress, idle = self.progress, self._target.timeouts.idle
        response = _response_for(upstream)
        content_type = upstream.headers.get("Content-Type", "")
        tail = _Tail()
        meter = _Meter(self._meter, content_type) if self._meter is not None else None
        await response.prepare(request)
        loop = asyncio.get_running_loop()
        gaps, last = progress.gaps, loop.time()
        watch = _SilenceWatch(upstream.content, idle)
        stall = _StallWatch(request, self._target.timeouts.client_stall, progress)
        try:
            while chunk:
                stall.writing_since = loop.time()
                await response.write(chunk)
                stall.writing_since = None
                progress.bytes_out += len(chunk)
                tail.add(chunk)
                if meter is not None:
                    meter.add(chunk)
                # Only the backend's silence counts against `idle`: a client that reads
                # slowly (the write waits on it) must not look like a stalled backend.
                watch.waiting_since = loop.time()
                chunk = await upstream.content.readany()
                watch.waiting_since = None
                if chunk:
                    now = loop.time()
                    gaps.append(now - last)
                    last = now
            self._counted(tail.counts())
            stall.writing_since = loop.time()
            await response.write_eof()
        except ConnectionResetError:
            progress.client_gone = True
            return response
        except (aiohttp.ClientError, TimeoutError, Interrupted) as exc:
            await self._failed(request, response, content_type, exc)
            return response
        finally:
            watch.stop()
            stall.stop()
            if meter is not None:
                meter.flush()  # a reply without final counts is charged every token it sent
        return response

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
            reason = f"the backend failed mid-stream ({type(exc).__name__})"
        if not await _fail_inband(request, response, content_type, reason):
            self.progress.client_gone = True

    def interrupt(self, reason: Reason, message: str) -> None:
        """End a started reply now, with an in-band error saying ``message``; a reply not
        started yet is left to its handler's cancellation."""
        if self._reader is not None:
            self._reader.set_exception(Interrupted(reason, message))

    def _counted(self, counts: FinalCounts) -> None:
        progress = self.progress
        progress.prompt_tokens, progress.completion_tokens = (
            counts.prompt_tokens,
            counts.completion_tokens,
        )
        progress.load_seconds = counts.load_seconds


async def _open(
    request: web.Request,
    session: aiohttp.ClientSession,
    target: Target,
    body: bytes | None,
    headers: CIMultiDict[str],
) -> tuple[aiohttp.ClientResponse, bytes]:
    """The upstream reply and its first chunk, or a GatewayError saying what went wrong."""
    upstream, timeouts = None, target.timeouts
    try:
        async with asyncio.timeout(timeouts.first_byte):
            upstream = await session.request(
                request.method,
                target.url,
                data=body,
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=timeouts.connect),
                allow_redirects=False,
            )
            if target.fail_fast and upstream.status >= 500:
                detail = (await upstream.text(errors="replace"))[:300]
                raise BackendFailure(
                    502, Reason.BACKEND_FAILED, f"the backend answered {upstream.status}: {detail}"
                )
            return upstream, await upstream.content.readany()
    except BaseException as exc:
        if upstream is not None:
            upstream.close()
        if isinstance(exc, aiohttp.ClientError):
            # The backend's address and our request's headers are for the log only.
            log.warning("backend_request_failed", url=target.url, error=repr(exc))
        raise _open_error(exc, timeouts) from exc


def _open_error(exc: BaseException, timeouts: Timeouts) -> BaseException:
    if isinstance(exc, GatewayError):
        return exc
    if isinstance(exc, aiohttp.ClientConnectorError):
        number = exc.os_error.errno
        why = os.strerror(number) if number else type(exc.os_error).__name__
        return BackendFailure(
            502, Reason.BACKEND_UNREACHABLE, f"cannot reach the backend: {why.lower()}"
        )
    if isinstance(exc, aiohttp.ServerTimeoutError):
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
    if isinstance(exc, aiohttp.ClientError):
        return GatewayError(
            502,
            Reason.BACKEND_FAILED,
            f"the backend failed before replying ({type(exc).__name__})",
        )
    return exc


_ERROR_EXCERPT = 2048  # bytes of a backend's non-JSON error page kept for the log


def _speaks_json(upstream: aiohttp.ClientResponse) -> bool:
    kind = upstream.headers.get("Content-Type", "")
    return "json" in kind or kind.startswith("text/event-stream")


async def _wrapped_error(
    request: web.Request, upstream: aiohttp.ClientResponse, first: bytes
) -> web.Response:
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
    return web.Response(
        status=upstream.status,
        body=error_body(api_of(request.path), upstream.status, Reason.BACKEND_FAILED, message),
        content_type="application/json",
    )


class _Tail:
    """The reply's last TALLY_WINDOW bytes (or a little more), where the tallies are."""

    __slots__ = ("_chunks", "_size")

    def __init__(self) -> None:
        self._chunks: deque[bytes] = deque()
        self._size = 0

    def add(self, chunk: bytes) -> None:
        self._chunks.append(chunk)
        self._size += len(chunk)
        while self._size - len(self._chunks[0]) >= TALLY_WINDOW:
            self._size -= len(self._chunks.popleft())

    def counts(self) -> FinalCounts:
        return final_counts(b"".join(self._chunks))


class _Meter:
    """Counts tokens by the newlines that end them and charges them in batches."""

    __slots__ = ("_charge", "_per_token", "_unmetered")

    def __init__(self, charge: Callable[[int], None], content_type: str) -> None:
        self._charge = charge
        self._per_token = 2 if content_type.startswith("text/event-stream") else 1
        self._unmetered = 0

    def add(self, chunk: bytes) -> None:
        self._unmetered += chunk.count(b"\n")
        if self._unmetered >= _METER_EVERY * self._per_token:
            self._charge(self._unmetered // self._per_token)
            self._unmetered %= self._per_token

    def flush(self) -> None:
        if self._unmetered >= self._per_token:
            self._charge(self._unmetered // self._per_token)
        self._unmetered = 0


def _response_for(upstream: aiohttp.ClientResponse) -> web.StreamResponse:
    response = web.StreamResponse(status=upstream.status, headers=returned_headers(upstream))
    if upstream.content_length is not None:
        response.content_length = upstream.content_length
    return response


class _SilenceWatch:
    """Fails the upstream read with TimeoutError once the backend has been silent for
    ``idle`` seconds while the relay waited on it.

    Re-arming a timer on every chunk would cost a timer handle per token; this one wakes at
    most once per ``idle`` period and looks at when the current wait began.
    """

    def __init__(self, reader: aiohttp.StreamReader, idle: float) -> None:
        self.waiting_since: float | None = None
        self._reader = reader
        self._idle = idle
        self._loop = asyncio.get_running_loop()
        self._timer = self._loop.call_at(self._loop.time() + idle, self._check)

    def _check(self) -> None:
        now = self._loop.time()
        since = self.waiting_since
        if since is not None and now - since >= self._idle:
            self._reader.set_exception(TimeoutError())
            return
        self._timer = self._loop.call_at(
            (now if since is None else since) + self._idle, self._check
        )

    def stop(self) -> None:
        self._timer.cancel()


class _StallWatch:
    """Ends a reply whose client has left it unread for ``stall`` seconds.

    A write waits only when the socket and the transport's buffer are full, so the bytes
    held for one stream stay bounded (the transport's high-water mark plus a chunk); a
    client that stops reading would otherwise hold its slot, and the backend's, forever.
    Aborting the transport (a close would wait to flush what cannot be flushed) cancels the
    handler, which closes the upstream request and releases the permit.
    """

    def __init__(self, request: web.Request, stall: float, progress: Progress) -> None:
        self.writing_since: float | None = None
        self._request = request
        self._stall = stall
        self._progress = progress
        self._loop = asyncio.get_running_loop()
        self._timer = self._loop.call_at(self._loop.time() + stall, self._check)

    def _check(self) -> None:
        now = self._loop.time()
        since = self.writing_since
        if since is not None and now - since >= self._stall:
            transport = self._request.transport
            log.warning("client_stalled", unread_for=round(now - since, 1))
            self._progress.failure = Reason.CLIENT_STALLED
            self._progress.client_gone = True
            if transport is not None:
                transport.abort()
            return
        self._timer = self._loop.call_at(
            (now if since is None else since) + self._stall, self._check
        )

    def stop(self) -> None:
        self._timer.cancel()


async def _fail_inband(
    request: web.Request, response: web.StreamResponse, content_type: str, reason: str
) -> bool:
    """End a started reply with an in-band error; False if the client was gone."""
    log.warning("stream_failed", reason=reason)
    if response.content_length is not None or request.transport is None:
        # A reply with a declared length cannot carry an error line: cut the connection,
        # which the client reports as an incomplete body.
        if request.transport is not None:
            request.transport.close()
        return True
    try:
        await response.write(inband_error(content_type, reason))
        await response.write_eof()
    except ConnectionResetError:
        return False
    return True
