"""Request bodies: read only for a request that may run, within a deadline and a bound, and
parsed the way every backend will read them, a big one in a thread beside the event loop.

aiohttp would answer ``Expect: 100-continue`` itself, before any handler ran: a wrong key
got ``100 Continue`` and then a 401, and a body too large got ``100 Continue`` and was then
awaited. Here the interim answer goes out only once the request has passed every check
that needs no body.

Parsing is Python's C parser, which holds the loop (and every other user's stream) while
it runs: a chat message's few KB take tens of microseconds and are parsed in place, but an
image's 32 MiB take over 100 ms. So a body over ``ON_LOOP_BYTES`` is parsed in the worker
thread the services own, one body at a time, and the loop relays other streams meanwhile.
"""

from __future__ import annotations

import asyncio
import functools
import json
from concurrent.futures import Executor
from typing import Any

import orjson
from aiohttp import hdrs, web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestPayloadError

from gateway.core import GatewayError, Reason
from gateway.wire import (
    AmbiguousField,
    NotAnObject,
    TooManyObjects,
    TooManyValues,
    canonical_keys,
    field_type_error,
    load_checked,
    option_type_error,
)

__all__ = [
    "ON_LOOP_BYTES",
    "Fields",
    "defer_continue",
    "encoded",
    "json_fields",
    "parsed",
    "read_body",
]

# Parsed on the loop up to this size: the worst body this long (33k token ids, their
# types checked too) holds it about 2 ms. A chat message parses in 5 us: the thread would
# add 20 us to the 300 us the gateway adds to a request (issue #22), and nothing that
# matters to a body this big (0.3 ms and more to parse).
ON_LOOP_BYTES = 64 * 1024

_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


async def defer_continue(request: web.Request) -> None:
    """The routes' expect handler: say nothing yet; ``read_body`` decides."""


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
            return await request.read()
        async with asyncio.timeout(deadline):
            return await request.read()
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


class Fields:
    """A body's JSON object as every backend reads it, and the bytes to forward for it;
    given Ollama's ``struct`` for the route, Go's error for a field it cannot hold."""

    __slots__ = ("body", "type_error", "values")

    def __init__(self, body: bytes, struct: str | None = None, *, in_thread: bool = False) -> None:
        values = json_fields(body, in_thread=in_thread)
        canonical = canonical_keys(values)
        if canonical is not None:  # e.g. a lone KEEP_ALIVE: checked and sent as keep_alive
            values, body = canonical, encoded(canonical)
        self.values: dict[str, Any] = values
        self.body = body
        # Found with the parse, so that a million token ids are checked beside the loop
        # too (60 ms of it otherwise); the handler decides when it is said.
        self.type_error = (
            None
            if struct is None
            else field_type_error(struct, values) or option_type_error(values.get("options"))
        )

    def changed(self) -> None:
        """The gateway rewrote a value (a keep_alive policy): forward the new encoding."""
        self.body = encoded(self.values)


async def parsed(body: bytes, parser: Executor, struct: str | None = None) -> Fields:
    """The body's ``Fields``: parsed here when it is small, else in ``parser`` (one thread,
    so one big body at a time), while the loop goes on relaying."""
    if len(body) <= ON_LOOP_BYTES:
        return Fields(body, struct)
    loop = asyncio.get_running_loop()
    parse = functools.partial(Fields, body, struct, in_thread=True)
    return await loop.run_in_executor(parser, parse)


def json_fields(body: bytes, *, in_thread: bool = False) -> dict[str, Any]:
    """The body's JSON object, as every backend would read it, or a 400 saying why not."""
    try:
        return load_checked(body, in_thread=in_thread)
    except AmbiguousField as exc:
        # Ollama would act on another value than the one the policy checks (the last of
        # keys that differ only in case): refuse rather than guess.
        raise GatewayError(400, Reason.AMBIGUOUS_FIELD, str(exc)) from exc
    except NotAnObject as exc:
        raise GatewayError(
            400, Reason.BAD_REQUEST, "the request body must be a JSON object"
        ) from exc
    except (TooManyObjects, TooManyValues) as exc:
        raise GatewayError(400, Reason.BAD_REQUEST, str(exc)) from exc
    except ValueError as exc:  # not JSON, not UTF-8, or nested too deeply
        raise GatewayError(
            400, Reason.BAD_REQUEST, f"the request body is not valid JSON: {exc}"
        ) from exc


def encoded(fields: dict[str, Any]) -> bytes:
    # orjson: json.dumps holds the event loop 30-40 ms for a 4 MB image body, orjson 5 ms.
    try:
        return orjson.dumps(fields)
    except orjson.JSONEncodeError:
        # An integer beyond 64 bits, or a lone surrogate escape ("\ud83d", half an emoji
        # cut by a JavaScript client): both stay as the client wrote them, in ASCII escapes,
        # and Go reads the surrogate as U+FFFD, as it would have from the original body.
        return json.dumps(fields).encode()
