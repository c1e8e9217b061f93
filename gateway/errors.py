"""Errors in each API's own shape, decided in this one place.

Ollama answers ``{"error": "..."}``; the OpenAI API answers
``{"error": {"message", "type", "code"}}``. A client library only shows the user a helpful
message when the error has the shape it expects.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import Enum

from aiohttp import web

__all__ = [
    "Api",
    "BackendFailure",
    "GatewayError",
    "api_of",
    "error_body",
    "error_response",
    "inband_error",
]


class Api(Enum):
    """Which wire protocol a request speaks, and so which error shape it expects."""

    OLLAMA = "ollama"
    OPENAI = "openai"


def api_of(path: str) -> Api:
    return Api.OPENAI if path.startswith("/v1/") else Api.OLLAMA


@dataclass(eq=False)
class GatewayError(Exception):
    """A request the gateway answers itself, before any byte of a reply went out.

    ``reason`` is a short machine name (``body_too_large``, ``backend_unreachable``...) used in
    the OpenAI ``code`` field, in logs and in metrics.
    """

    status: int
    reason: str
    message: str
    retry_after: float | None = None

    def __str__(self) -> str:
        return self.message


class BackendFailure(GatewayError):
    """The backend refused the connection or answered 5xx before any byte reached the
    client: the request can safely go to another backend."""


_OPENAI_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    503: "service_unavailable_error",
}


def error_body(api: Api, status: int, reason: str, message: str) -> bytes:
    if api is Api.OLLAMA:
        return json.dumps({"error": message}).encode()
    kind = _OPENAI_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return json.dumps({"error": {"message": message, "type": kind, "code": reason}}).encode()


def error_response(api: Api, error: GatewayError) -> web.Response:
    headers = {}
    if error.retry_after is not None:
        # Retry-After takes whole seconds; rounding up never invites a retry too early.
        headers["Retry-After"] = str(max(1, int(-(-error.retry_after // 1))))
    return web.Response(
        status=error.status,
        body=error_body(api, error.status, error.reason, error.message),
        content_type="application/json",
        headers=headers,
    )


def inband_error(content_type: str, message: str) -> bytes:
    """The error to write once a stream has started: Ollama's NDJSON line or an SSE event."""
    if content_type.startswith("text/event-stream"):
        payload = {"error": {"message": message, "type": "server_error", "code": "stream_failed"}}
        return b"data: " + json.dumps(payload).encode() + b"\n\n"
    return json.dumps({"error": message}).encode() + b"\n"
