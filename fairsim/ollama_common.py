"""Request parsing and replies shared by Ollama's native and OpenAI-compatible routes,
with the error wording of Ollama's Go server."""

from __future__ import annotations

import contextlib
import json
import time
from typing import Any

from aiohttp import web

from gateway.wire import STRUCTS, NestedTooDeeply, field_type_error, go_int64

from .config import LoadOptions
from .gojson import go_decode
from .wire import (
    embedding_for,
    go_json,
    go_time,
    go_type_name,
    json_error_message,
    parse_keep_alive,
)

__all__ = [
    "JSON_UTF8",
    "MAX_QUEUE_MESSAGE",
    "NDJSON",
    "RequestError",
    "chat_text",
    "cut_connection",
    "embed_text",
    "error_response",
    "json_response",
    "keep_alive_of",
    "load_options_of",
    "message_text",
    "now_utc",
    "output_budget",
    "read_body",
]

JSON_UTF8 = "application/json; charset=utf-8"
NDJSON = "application/x-ndjson"
MAX_QUEUE_MESSAGE = "server busy, please try again.  maximum pending requests exceeded"


class RequestError(Exception):
    """An error reply: ``status`` and Ollama's ``{"error": message}`` text."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def json_response(value: Any, status: int = 200, content_type: str = JSON_UTF8) -> web.Response:
    return web.Response(status=status, body=go_json(value), headers={"Content-Type": content_type})


def error_response(error: RequestError) -> web.Response:
    return json_response({"error": error.message}, error.status)


async def cut_connection(request: web.Request, stream: web.StreamResponse | None) -> None:
    """End the connection mid-response, as a crashed backend would (no final chunk).

    A stream cut before its first token still sends its 200 and headers first, so the client
    always sees a reply that started and broke off; a whole reply just never arrives."""
    if stream is not None and not stream.prepared:
        with contextlib.suppress(ConnectionError):
            writer = await stream.prepare(request)
            if writer is not None:
                writer.send_headers()  # a stream's head waits for its first bytes (TapStream)
    if request.transport is not None:
        request.transport.close()


async def read_body(request: web.Request, go_struct: str) -> dict[str, Any]:
    """The JSON object body as Go's decoder fills Ollama's structs (keys matched
    case-insensitively, the last one winning: see gojson), or Go's own error wording for a
    malformed one (400)."""
    raw = await request.read()
    text = raw.decode(errors="replace")
    if not text.strip():
        raise RequestError(400, "missing request body")
    try:
        value = go_decode(text)
    except json.JSONDecodeError as exc:
        raise RequestError(400, json_error_message(text, exc)) from None
    except NestedTooDeeply:
        raise RequestError(400, "exceeded max depth") from None
    if not isinstance(value, dict):
        kind = go_type_name(value)
        raise RequestError(400, f"json: cannot unmarshal {kind} into Go value of type {go_struct}")
    if go_struct in STRUCTS and (error := field_type_error(go_struct, value)) is not None:
        raise RequestError(400, error)
    return value


def keep_alive_of(body: dict[str, Any]) -> float | None:
    value = body.get("keep_alive")
    if value is None:
        return None
    try:
        return parse_keep_alive(value)
    except ValueError as exc:
        raise RequestError(400, str(exc)) from None


def load_options_of(options: Any) -> LoadOptions:
    """The load-time options of a request's ``options`` map, as ``Options.FromMap`` reads
    them (api/types.go): a JSON number is truncated to an integer, null is skipped, any
    other type fails the request (with a 500: routes.go handleScheduleError)."""
    if not isinstance(options, dict):
        return LoadOptions()

    def integer(name: str) -> int | None:
        value = options.get(name)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise RequestError(500, f'option "{name}" must be of type integer')
        return go_int64(value)

    use_mmap = options.get("use_mmap")
    if use_mmap is not None and not isinstance(use_mmap, bool):
        raise RequestError(500, 'option "use_mmap" must be of type boolean')
    return LoadOptions(
        num_ctx=integer("num_ctx"),
        num_batch=integer("num_batch"),
        num_gpu=integer("num_gpu"),
        num_thread=integer("num_thread"),
        main_gpu=integer("main_gpu"),
        use_mmap=use_mmap,
    )


def message_text(content: Any) -> str:
    """Text of a message's content: a string, or OpenAI-style parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def chat_text(system: Any, messages: Any) -> str:
    """The text a chat is rendered from: its system text (a string, or text parts), then
    each message's, one a line."""
    parts = [message_text(system)]
    for message in messages if isinstance(messages, list) else ():
        if isinstance(message, dict):
            parts.append(message_text(message.get("content")))
    return "\n".join(part for part in parts if part)


def output_budget(limit: Any, default: int) -> tuple[int, bool]:
    """(tokens to emit, whether the request's own limit cut the reply)."""
    if isinstance(limit, int | float) and not isinstance(limit, bool) and limit >= 0:
        return int(limit), True
    return default, False


def now_utc() -> str:
    return go_time(time.time_ns(), utc=True)


def embed_text(text: str, dims: int, wanted: Any) -> list[float]:
    """The text's unit vector, cut to ``dimensions`` when the request asks for fewer."""
    if isinstance(wanted, int) and 0 < wanted < dims:
        dims = wanted
    return embedding_for(text, dims)
