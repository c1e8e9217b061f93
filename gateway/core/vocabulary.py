"""The gateway's words, spelled once: which API a request speaks, why it was refused or
failed, and its class. Logs, metrics, `/status`, error bodies and docs/errors.md all
derive from these enums, so they cannot drift apart.
"""

from __future__ import annotations

from enum import Enum, StrEnum

__all__ = [
    "API_PREFIXES",
    "BACKGROUND",
    "EMBEDDING_PATHS",
    "GENERATION_PATHS",
    "REFUSALS",
    "Api",
    "Lane",
    "Reason",
    "RequestClass",
    "api_of",
]


class Api(Enum):
    """Which wire protocol a request speaks, and so which error shape it expects."""

    OLLAMA = "ollama"
    OPENAI = "openai"
    ANTHROPIC = "anthropic"  # Anthropic's Messages API (/v1/messages), as Ollama serves it


GENERATION_PATHS = (
    "/api/chat",
    "/api/generate",
    "/api/embed",
    "/api/embeddings",
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
    "/v1/messages",
    "/v1/responses",
)
"""The routes that run a model: the ones admitted, queued and relayed, and the paths a lane
rule may name."""

EMBEDDING_PATHS = frozenset(("/api/embed", "/api/embeddings", "/v1/embeddings"))
"""Of those, the ones that embed: no prompt cache serves them from one request to the next."""


def api_of(path: str) -> Api:
    if not path.startswith("/v1/"):
        return Api.OLLAMA
    # Not the path's prefix alone: /v1/messagesX is a /v1 route the gateway does not know.
    if path == "/v1/messages" or path.startswith("/v1/messages/"):
        return Api.ANTHROPIC
    return Api.OPENAI


class RequestClass(StrEnum):
    """Light requests may use every slot; heavy ones (long prompts, long contexts) only
    ``classes.heavy.max_slots`` of a backend."""

    LIGHT = "light"
    HEAVY = "heavy"


class Lane(StrEnum):
    """Interactive: a person is waiting for it. Background: a front end's or an agent's own
    work (titles, tags, summaries), which must never cost a person their place."""

    INTERACTIVE = "interactive"
    BACKGROUND = "background"


BACKGROUND = Lane.BACKGROUND
"""``Lane.BACKGROUND``, for the room's code that asks it of every request: read through its
class, a 3.11 enum member costs a descriptor call each time."""


class Reason(StrEnum):
    """Why the gateway answered a request itself, or why its reply was cut.

    The value is the OpenAI ``code`` field, the access log's ``reason`` and the
    ``reason`` label of ``fairgate_rejections_total``.
    """

    # The request is not one the gateway will take.
    BAD_REQUEST = "bad_request"
    AMBIGUOUS_FIELD = "ambiguous_field"
    UNAUTHORIZED = "unauthorized"
    KEY_REVOKED = "key_revoked"
    MODEL_FORBIDDEN = "model_forbidden"
    MANAGEMENT_FORBIDDEN = "management_forbidden"
    ADMIN_ONLY = "admin_only"
    ORIGIN_FORBIDDEN = "origin_forbidden"
    HOST_FORBIDDEN = "host_forbidden"
    MODEL_NOT_FOUND = "model_not_found"
    NOT_FOUND = "not_found"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    BODY_TOO_LARGE = "body_too_large"
    BODY_TIMEOUT = "body_timeout"
    TOO_MANY_READS = "too_many_reads"
    # The user has used up a budget (tokens, requests, slot time) until its window renews.
    BUDGET_EXHAUSTED = "budget_exhausted"
    # No room for it now.
    USER_QUEUE_FULL = "user_queue_full"
    GATEWAY_BUSY = "gateway_busy"
    WAIT_TIMEOUT = "wait_timeout"
    STATE_UNAVAILABLE = "state_unavailable"
    NO_BACKEND = "no_backend"
    SHUTTING_DOWN = "shutting_down"
    # The backend failed it.
    BACKEND_UNREACHABLE = "backend_unreachable"
    BACKEND_TIMEOUT = "backend_timeout"
    BACKEND_FAILED = "backend_failed"
    BACKEND_FAILED_MID_STREAM = "backend_failed_mid_stream"
    # The client failed it.
    CLIENT_STALLED = "client_stalled"


# What the gateway refused on its own account: counted in fairgate_rejections_total.
# A backend's failure is not a rejection; fairgate_stream_failures_total and the request
# counter's status code tell those apart.
REFUSALS = frozenset(Reason) - {
    Reason.BACKEND_UNREACHABLE,
    Reason.BACKEND_TIMEOUT,
    Reason.BACKEND_FAILED,
    Reason.BACKEND_FAILED_MID_STREAM,
    Reason.CLIENT_STALLED,
}

API_PREFIXES = ("/api/", "/v1/")
"""Ollama's and OpenAI's routes: what a household's apps call. A refusal elsewhere (a
scanner's /wp-login.php, a page's poll before its key is typed) is no one's refusal."""
