"""Request bodies read off the connection: only for a request that may run, within a
deadline and a bound.

aiohttp would answer ``Expect: 100-continue`` itself, before any handler ran: a wrong key
would get ``100 Continue`` and then a 401, and a body too large ``100 Continue`` and then
be awaited. Here the interim answer goes out only once the request has passed every check
that needs no body.
"""

from __future__ import annotations

import asyncio

from aiohttp import StreamReader, hdrs, web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestPayloadError

from gateway.core import GatewayError, Reason

__all__ = ["body_size", "defer_continue", "read_body"]

_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


async def defer_continue(request: web.Request) -> None:
    """The routes' expect handler: say nothing yet; ``read_body`` decides."""


def body_size(request: web.Request, limit: int) -> int:
    """The most memory ``request``'s body may take once read: its declared length, unless
    it comes encoded (gzip decodes into more) or without one; at most ``limit``."""
    declared = request.content_length
    if declared is None or hdrs.CONTENT_ENCODING in request.headers:
        return limit
    return min(declared, limit)


async def read_body(request: web.Request, limit: int, deadline: float) -> bytes:
    """The whole body, or GatewayError: 413 over ``limit`` (before a byte of it is read),
    417 for an expectation other than 100-continue, 408 when it takes over ``deadline``."""
    declared = request.content_length
    if declared is not None and declared > limit:
        # The body on its way is not read: nothing after it on the connection can be.
        raise GatewayError(
            413,
            Reason.BODY_TOO_LARGE,
            f"the body is {declared} bytes; the limit is {limit}",
            close=True,
        )
    # hdrs' names: looked up without folding their case each time.
    expect = request.headers.get(hdrs.EXPECT)
    if expect is not None:
        if expect.lower() != "100-continue":
            raise GatewayError(417, Reason.BAD_REQUEST, "only Expect: 100-continue is supported")
        if request.version >= (1, 1):
            await request.writer.write(_CONTINUE)
            request.writer.output_size = 0  # the interim reply is not the reply's body
    content = request.content
    try:
        if content.is_eof():  # all here already (a chat's body comes with its head)
            if declared is not None and hdrs.CONTENT_ENCODING not in request.headers:
                # Exactly the declared bytes (none decoded into more), within the limit:
                # taken as they are, without read()'s copy and its two awaits.
                return content.read_nowait()
            return await _read_within(content, limit)  # decoded, maybe into more
        async with asyncio.timeout(deadline):
            return await _read_within(content, limit)
    except (HttpProcessingError, RequestPayloadError) as exc:
        # e.g. a Content-Encoding the bytes are not in: the rest of the connection's bytes
        # cannot be trusted to start the next request, so it is closed.
        raise GatewayError(
            400,
            Reason.BAD_REQUEST,
            "the body cannot be read as its headers describe it",
            close=True,
        ) from exc
    except TimeoutError:
        raise GatewayError(
            408,
            Reason.BODY_TIMEOUT,
            f"the request body did not arrive within {deadline:g}s",
            close=True,  # its rest may still come: nothing after it can be read
        ) from None


async def _read_within(content: StreamReader, limit: int) -> bytes:
    """The body's bytes (decoded, if it came encoded) up to ``limit``, else a 413. Kept as
    the pieces that came until the last, then joined: a body that never ends (a slow
    client's) holds what came of it and no more, not a buffer grown ahead of it."""
    pieces, size = [], 0
    while piece := await content.readany():
        size += len(piece)
        if size > limit:  # no length said (chunked), or more decoded than it said
            raise GatewayError(
                413,
                Reason.BODY_TOO_LARGE,
                f"the body is over the limit of {limit} bytes",
                close=True,  # its rest is not read: nothing after it on the connection can be
            )
        pieces.append(piece)
    return b"".join(pieces)
