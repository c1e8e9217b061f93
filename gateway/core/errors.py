"""Errors in each API's own shape, decided in this one place: the body and the headers.

The edge turns them into HTTP (``gateway.edge.http.access_log.error_response``), and the relay
into a reply's last event when its bytes have begun (``inband_error``).

Ollama answers ``{"error": "..."}``; the OpenAI API answers
``{"error": {"message", "type", "code"}}``; Anthropic's Messages API answers
``{"type": "error", "error": {"type", "message"}}``. A client library only shows the user a
helpful message when the error has the shape it expects (the ``anthropic`` SDK raises its
error class by the status, and shows the message).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from gateway.core.vocabulary import Api, Reason

__all__ = [
    "STOPPING_MESSAGE",
    "STOPPING_RETRY_AFTER",
    "BackendFailure",
    "GatewayError",
    "error_body",
    "error_headers",
    "inband_error",
    "retry_after_header",
    "shutting_down",
]

# What every request the gateway turns away as it stops is told.
STOPPING_MESSAGE = "the gateway is shutting down; retry in a moment"
STOPPING_RETRY_AFTER = 5.0


@dataclass(eq=False)
class GatewayError(Exception):
    """A request the gateway answers itself, before any byte of a reply went out.

    ``reason`` is used in the OpenAI ``code`` field, in logs and in metrics.
    """

    status: int
    reason: Reason
    message: str
    retry_after: float | None = None
    close: bool = False  # the connection cannot serve another request after this answer

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


# Anthropic's error types by status (docs.anthropic.com, "Errors"; Ollama's
# anthropic.NewError says 503 as overloaded_error too).
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    504: "timeout_error",
}


def shutting_down() -> GatewayError:
    """The answer to a request the gateway will not finish because it is stopping: 503,
    retry in a moment (another replica, or this one restarted), and the connection closed."""
    return GatewayError(
        503, Reason.SHUTTING_DOWN, STOPPING_MESSAGE, STOPPING_RETRY_AFTER, close=True
    )


def error_body(api: Api, status: int, reason: Reason, message: str) -> bytes:
    if api is Api.OLLAMA:
        return json.dumps({"error": message}).encode()
    if api is Api.ANTHROPIC:
        return json.dumps(_anthropic_error(status, message)).encode()
    kind = _OPENAI_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return json.dumps({"error": {"message": message, "type": kind, "code": reason}}).encode()


_WORTH_WAITING = 60.0  # seconds: a client may well wait for a minute's budget to renew


def error_headers(error: GatewayError) -> dict[str, str]:
    """The headers a refusal carries beside its body."""
    headers = {}
    if error.retry_after is not None:
        headers["Retry-After"] = retry_after_header(error.retry_after)
        if error.status == 429 and error.retry_after > _WORTH_WAITING:
            # The anthropic SDK sleeps through any Retry-After before it tries again (a
            # budget that renews at midnight: hours), the openai SDK tries again at once:
            # both obey this header, and the 429's text says when the budget renews.
            headers["X-Should-Retry"] = "false"
    return headers


def retry_after_header(seconds: float) -> str:
    # Retry-After takes whole seconds; rounding up never invites a retry too early.
    return str(max(1, int(-(-seconds // 1))))


def _anthropic_error(status: int, message: str) -> dict[str, object]:
    kind = _ANTHROPIC_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def inband_error(api: Api, content_type: str, message: str, reason: Reason) -> bytes:
    """The error to write once a stream has started: Ollama's NDJSON line or an SSE event,
    whose ``code`` says why, as a refusal's does. On Anthropic's stream, its ``error``
    event (which its SDK raises): overloaded when the gateway stops, else an API error."""
    if api is Api.ANTHROPIC and content_type.startswith("text/event-stream"):
        status = 503 if reason is Reason.SHUTTING_DOWN else 500
        event = json.dumps(_anthropic_error(status, message)).encode()
        return b"event: error\ndata: " + event + b"\n\n"
    if content_type.startswith("text/event-stream"):
        payload = {"error": {"message": message, "type": "server_error", "code": reason}}
        return b"data: " + json.dumps(payload).encode() + b"\n\n"
    return json.dumps({"error": message}).encode() + b"\n"
