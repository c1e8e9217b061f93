"""The relay: one upstream request, its reply passed to the client chunk by chunk, unchanged.

The failure rule (as in uvicorn): before the first byte went out, the client gets a JSON error
in its API's shape; after it, an in-band error line (Ollama's NDJSON convention, or an SSE
event) and the stream is closed. Either way the upstream request is closed, so the backend
frees its slot, and the caller's permit is released by its ``async with``.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable

import aiohttp
import structlog
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

from gateway.access import RequestRecord
from gateway.errors import BackendFailure, GatewayError, inband_error
from gateway.policy import Timeouts
from gateway.usage import TALLY_WINDOW, final_counts

__all__ = ["relay"]

log = structlog.get_logger("fairgate.relay")

# RFC 9110 section 7.6.1, plus what must not cross the gateway: the client's credentials,
# and lengths/encodings that the two separate connections settle for themselves.
_NOT_FORWARDED = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
        "accept-encoding",
        "authorization",
        "x-api-key",
        "cookie",
    }
)
_NOT_RETURNED = _NOT_FORWARDED | {"server", "date", "set-cookie"}
_METER_EVERY = 8  # tokens between charges to the fair scheduler


async def relay(
    request: web.Request,
    session: aiohttp.ClientSession,
    url: str,
    body: bytes | None,
    timeouts: Timeouts,
    record: RequestRecord,
    meter: Callable[[int], None] | None = None,
    fail_fast: bool = False,
    close_connection: bool = False,
) -> web.StreamResponse:
    """Send the request to ``url`` and stream the reply back to the client.

    ``meter`` is told, every few tokens, how many more have streamed (one NDJSON line or
    one SSE event per token), so that long replies are charged while they run. With
    ``fail_fast``, a 5xx reply raises BackendFailure instead of reaching the client, so the
    caller can try another backend. ``close_connection`` keeps the connection out of the
    pool after this request.
    """
    headers = _forward_headers(request.headers)
    if close_connection:
        headers["Connection"] = "close"
    upstream, first = await _open(request, session, url, body, headers, timeouts, fail_fast)
    record.first_byte_at = time.monotonic()
    async with upstream:
        return await _pump(request, upstream, first, timeouts.idle, record, meter)


async def _open(
    request: web.Request,
    session: aiohttp.ClientSession,
    url: str,
    body: bytes | None,
    headers: CIMultiDict[str],
    timeouts: Timeouts,
    fail_fast: bool,
) -> tuple[aiohttp.ClientResponse, bytes]:
    """The upstream reply and its first chunk, or a GatewayError saying what went wrong."""
    upstream = None
    try:
        async with asyncio.timeout(timeouts.first_byte):
            upstream = await session.request(
                request.method,
                url,
                data=body,
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=timeouts.connect),
                allow_redirects=False,
            )
            if fail_fast and upstream.status >= 500:
                detail = (await upstream.text(errors="replace"))[:300]
                raise BackendFailure(
                    502, "backend_failed", f"the backend answered {upstream.status}: {detail}"
                )
            return upstream, await upstream.content.readany()
    except BaseException as exc:
        if upstream is not None:
            upstream.close()
        raise _open_error(exc, timeouts) from exc


def _open_error(exc: BaseException, timeouts: Timeouts) -> BaseException:
    if isinstance(exc, GatewayError):
        return exc
    if isinstance(exc, aiohttp.ClientConnectorError):
        return BackendFailure(502, "backend_unreachable", f"cannot reach the backend: {exc}")
    if isinstance(exc, aiohttp.ServerTimeoutError):
        return GatewayError(
            504, "backend_timeout", f"cannot connect to the backend within {timeouts.connect:g}s"
        )
    if isinstance(exc, TimeoutError):
        return GatewayError(
            504, "backend_timeout", f"the backend sent nothing within {timeouts.first_byte:g}s"
        )
    if isinstance(exc, aiohttp.ClientError):
        return GatewayError(502, "backend_failed", f"the backend failed before replying: {exc!r}")
    return exc


async def _pump(
    request: web.Request,
    upstream: aiohttp.ClientResponse,
    chunk: bytes,
    idle: float,
    record: RequestRecord,
    meter: Callable[[int], None] | None,
) -> web.StreamResponse:
    response = web.StreamResponse(status=upstream.status, headers=_return_headers(upstream))
    response.headers["X-Request-Id"] = record.request_id
    if upstream.content_length is not None:
        response.content_length = upstream.content_length
    content_type = upstream.headers.get("Content-Type", "")
    tail: deque[bytes] = deque()  # the reply's last TALLY_WINDOW bytes, or a little more
    tail_size = 0
    newlines_per_token = 2 if content_type.startswith("text/event-stream") else 1
    unmetered = 0
    await response.prepare(request)
    loop = asyncio.get_running_loop()
    gaps, last = record.gaps, loop.time()
    watch = _SilenceWatch(upstream.content, idle)
    try:
        while chunk:
            await response.write(chunk)
            record.bytes_out += len(chunk)
            tail.append(chunk)
            tail_size += len(chunk)
            while tail_size - len(tail[0]) >= TALLY_WINDOW:
                tail_size -= len(tail.popleft())
            if meter is not None:
                unmetered += chunk.count(b"\n")
                if unmetered >= _METER_EVERY * newlines_per_token:
                    meter(unmetered // newlines_per_token)
                    unmetered %= newlines_per_token
            # Only the backend's silence counts against `idle`: a client that reads
            # slowly (the write waits on it) must not look like a stalled backend.
            watch.waiting_since = loop.time()
            chunk = await upstream.content.readany()
            watch.waiting_since = None
            if chunk:
                now = loop.time()
                gaps.append(now - last)
                last = now
    except ConnectionResetError:
        record.client_gone = True
        record.status = 499
        return response
    except (aiohttp.ClientError, TimeoutError) as exc:
        reason = (
            f"the backend sent nothing for {idle:g}s"
            if isinstance(exc, TimeoutError)
            else f"the backend failed mid-stream: {exc!r}"
        )
        await _fail_inband(request, response, content_type, reason, record)
        return response
    finally:
        watch.stop()
    counts = final_counts(b"".join(tail))
    record.prompt_tokens, record.completion_tokens = counts.prompt_tokens, counts.completion_tokens
    record.load_seconds = counts.load_seconds
    await response.write_eof()
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


async def _fail_inband(
    request: web.Request,
    response: web.StreamResponse,
    content_type: str,
    reason: str,
    record: RequestRecord,
) -> None:
    record.reason = "backend_failed_mid_stream"
    log.warning("stream_failed", reason=reason, backend=record.backend, model=record.model)
    if response.content_length is not None or request.transport is None:
        # A reply with a declared length cannot carry an error line: cut the connection,
        # which the client reports as an incomplete body.
        if request.transport is not None:
            request.transport.close()
        return
    try:
        await response.write(inband_error(content_type, reason))
        await response.write_eof()
    except ConnectionResetError:
        record.client_gone = True


def _forward_headers(headers: CIMultiDictProxy[str]) -> CIMultiDict[str]:
    forwarded = CIMultiDict((k, v) for k, v in headers.items() if k.lower() not in _NOT_FORWARDED)
    # Uncompressed replies keep the relay byte-faithful and the final counts readable.
    forwarded["Accept-Encoding"] = "identity"
    return forwarded


def _return_headers(upstream: aiohttp.ClientResponse) -> CIMultiDict[str]:
    return CIMultiDict(
        (k, v) for k, v in upstream.headers.items() if k.lower() not in _NOT_RETURNED
    )
