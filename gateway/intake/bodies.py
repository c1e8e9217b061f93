"""Request bodies parsed the way every backend will read them, a big one in a thread beside
the event loop. (Reading them off the connection is ``gateway.edge.http.request_body``.)

Parsing is Python's C parser, which holds the loop (and every other user's stream) while
it runs: a chat message's few KB are parsed in place, too quickly to matter, but an image's
32 MiB would stall every stream. So a body over ``ON_LOOP_BYTES`` is parsed in the worker
thread the services own, one body at a time, and the loop relays other streams meanwhile.
"""

from __future__ import annotations

import asyncio
import functools
import json
from concurrent.futures import Executor
from typing import Any

import orjson

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
    "encoded",
    "json_fields",
    "parsed",
]

# Parsed on the loop up to this size: even the worst body this long (33k token ids, their
# types checked too) holds it only briefly. A chat message parses in a fraction of what
# the hand-off to the thread and back would add to its request; to a body this big, the
# hand-off adds nothing that matters beside its parse.
ON_LOOP_BYTES = 64 * 1024


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
        # too, not on it; the handler decides when it is said.
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
    # orjson: json.dumps holds the event loop several times longer for an image body.
    try:
        return orjson.dumps(fields)
    except orjson.JSONEncodeError:
        # An integer beyond 64 bits, or a lone surrogate escape ("\ud83d", half an emoji
        # cut by a JavaScript client): both stay as the client wrote them, in ASCII escapes,
        # and Go reads the surrogate as U+FFFD, as it would have from the original body.
        return json.dumps(fields).encode()
