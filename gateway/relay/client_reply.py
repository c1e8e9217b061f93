"""A relayed reply on its way to the client: prepared, and its head sent with its first
bytes in one send (``start``), in the common case with a head the gateway writes itself.

aiohttp's ``prepare`` gathers a reply's headers into a CIMultiDict, looks up each of its
own in it (keep-alive, length, type, date, server) and then serializes them: with the
backend's headers decoded into one CIMultiDict and copied into another, all before a
stream's first byte reaches the client. The head written here is the same bytes: the
backend's headers that go on (``edge/http/headers.py``, as they came), the gateway's own
(``edge/http/reply_headers.py``), then aiohttp's Transfer-Encoding, Date and Server. What would make
aiohttp write anything else (HTTP/1.0, a connection to close, a declared length, an empty
body, a CORS reply whose Vary joins the backend's, a header of the gateway's the backend
also sent, no Content-Type) is left to aiohttp's ``prepare``.
"""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any, cast

from aiohttp import hdrs, web
from aiohttp.abc import AbstractStreamWriter
from aiohttp.helpers import must_be_empty_body, rfc822_formatted_time
from aiohttp.http import SERVER_SOFTWARE, HttpVersion11
from aiohttp.http_writer import StreamWriter
from aiohttp.web_response import REASON_PHRASES
from multidict import CIMultiDict

from gateway.edge.http import decoded, put, returned_pairs
from gateway.relay.upstream_reply import Reply

__all__ = ["Relayed", "start"]


class Relayed(web.StreamResponse):
    """A relayed reply: its head goes out with its first bytes, in one send, as aiohttp's
    own web.Response does (a StreamResponse sends its head alone, at prepare). Neither its
    ``prepare`` nor its first write ever waits (``_at_once``)."""

    _send_headers_immediately = False

    async def _start(self, request: web.BaseRequest) -> AbstractStreamWriter:
        # aiohttp's own, without its call of the app's on_response_prepare hooks (the
        # gateway's one hook, ReplyHeaders.hook): this reply was given their headers when
        # it was built, and the hooks' coroutines would be on the path of its first byte.
        self._req = request
        writer = self._payload_writer = request._payload_writer
        await self._prepare_headers()
        await self._write_headers()
        return writer

    def sent(self, request: web.BaseRequest, head: bytes, first: bytes) -> None:
        """Send ``head`` (``_head``'s) and ``first`` as the chunked reply's start, and leave
        the reply and its writer as aiohttp's prepare and first write would have."""
        writer = cast(StreamWriter, request._payload_writer)
        self._req, self._payload_writer = request, writer
        self._keep_alive, self._must_be_empty_body = True, False
        writer.enable_chunking()
        writer._headers_written = True
        # No bytes, no chunk: an empty one is the body's end, which write_eof sends.
        start = b"%b%x\r\n%b\r\n" % (head, len(first), first) if first else head
        writer._write(start)  # counts its bytes


def start(
    request: web.Request, upstream: Reply, said: CIMultiDict[str], first: bytes
) -> web.StreamResponse:
    """The reply to ``upstream``, with the gateway's own headers (``said``): prepared, its
    head and ``first`` sent in one send, unless the client has gone (its pump finds that)."""
    transport = request.transport
    if transport is not None and not transport.is_closing():
        head = _head(request, upstream, said)
        if head is not None:
            response = Relayed(status=upstream.status)
            response.sent(request, head, first)
            return response
    response = Relayed(
        status=upstream.status, headers=decoded(returned_pairs(upstream.raw_headers))
    )
    put(said, response.headers)
    if upstream.content_length is not None:
        response.content_length = upstream.content_length
    elif request.version < HttpVersion11:
        # Its end is the connection's: aiohttp leaves one the client asked to keep open,
        # and the client would wait for the keep-alive timeout to know the reply had ended.
        response.force_close()
    _at_once(response.prepare(request))
    if transport is not None and not transport.is_closing():
        writer = cast(StreamWriter, request.writer)  # aiohttp's server makes only these
        _at_once(writer.write(first, drain=False))
    return response


def _head(request: web.Request, upstream: Reply, said: CIMultiDict[str]) -> bytes | None:
    """The head aiohttp would write for a chunked reply to ``upstream``, or None when aiohttp
    would write another kind (see the module's note)."""
    status = upstream.status
    if (
        upstream.content_length is not None
        or request.version != HttpVersion11
        or not request.keep_alive
        or hdrs.VARY in said
        or must_be_empty_body(request.method, status)
    ):
        return None
    head = b"HTTP/1.1 %d %s\r\n" % (status, REASON_PHRASES.get(status, "").encode())
    typed = False
    for name, value in returned_pairs(upstream.raw_headers):
        text = name.decode("latin-1")
        if text in said:
            return None  # said in its place, not after the backend's (``put``)
        typed = typed or text.lower() == "content-type"
        head += b"%b: %b\r\n" % (name, value)
    if not typed:
        return None  # aiohttp would say application/octet-stream
    for said_name, said_value in said.items():
        head += f"{said_name}: {said_value}\r\n".encode()
    head += b"Transfer-Encoding: chunked\r\nDate: %s\r\nServer: %s\r\n\r\n" % (
        rfc822_formatted_time().encode(),
        _SERVER,
    )
    # Each line ends in the one CRLF put there above (as aiohttp checks in its own).
    lines = head.count(b"\n")
    if head.count(b"\r") != lines or head.count(b"\r\n") != lines:
        return None
    return head


_SERVER = SERVER_SOFTWARE.encode()


def _at_once(step: Coroutine[Any, Any, object]) -> None:
    """Run ``step`` to its end, here: aiohttp's ``prepare`` and ``write`` are coroutines for
    what can wait (the app's hooks, compression, a full buffer with ``drain``), and none of
    it is in a relayed reply's prepare (``Relayed``) or its first write (``drain=False``)."""
    try:
        step.send(None)
    except StopIteration:
        return
    step.close()
    raise RuntimeError("a step that never waits has waited: aiohttp changed")
