"""The request handlers: the path of a request, top to bottom."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from gateway.access import RECORD
from gateway.admission import Refusal, Ticket
from gateway.errors import GatewayError, api_of
from gateway.keys import ADMISSION, LIVE, SESSION
from gateway.policy import Policy
from gateway.streaming import relay

__all__ = ["add_routes"]

GENERATION_PATHS = (
    "/api/chat",
    "/api/generate",
    "/api/embed",
    "/api/embeddings",
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
)
READ_PATHS = (
    ("GET", "/api/tags"),
    ("GET", "/api/ps"),
    ("GET", "/api/version"),
    ("POST", "/api/show"),
    ("GET", "/v1/models"),
)
# Model management changes what every user of the box gets; not through a shared gateway.
MANAGEMENT_PATHS = ("/api/pull", "/api/push", "/api/create", "/api/copy", "/api/delete")


def add_routes(app: web.Application) -> None:
    for path in GENERATION_PATHS:
        app.router.add_post(path, generate)
    for method, path in READ_PATHS:
        app.router.add_route(method, path, read_only)
    for path in MANAGEMENT_PATHS:
        app.router.add_route("*", path, refuse_management)
    app.router.add_route("*", "/api/blobs/{digest}", refuse_management)
    app.router.add_get("/", root)


async def generate(request: web.Request) -> web.StreamResponse:
    """A generation or embedding request: identify, admit, wait for a turn, relay, release."""
    record = request[RECORD]
    view = request.app[LIVE].current
    api = api_of(request.path)
    record.user = view.directory.identify(request.headers, request.remote)
    body = await request.read()
    record.model = _model_name(_json_object(body))
    _check_model_allowed(view.policy, record.user, record.model)
    outcome = await request.app[ADMISSION].acquire(Ticket(record.user, record.model, api))
    if isinstance(outcome, Refusal):
        raise GatewayError(503, outcome.reason, outcome.message, outcome.retry_after)
    async with outcome as permit:
        record.queue_wait = permit.queue_wait
        record.backend = permit.backend.name
        url = permit.backend.url + request.path_qs
        return await relay(request, request.app[SESSION], url, body, view.policy.timeouts, record)


async def read_only(request: web.Request) -> web.StreamResponse:
    """Listings and metadata: identified, never queued, relayed as they are."""
    record = request[RECORD]
    view = request.app[LIVE].current
    record.user = view.directory.identify(request.headers, request.remote)
    backend = view.pool.for_reads(api_of(request.path))
    record.backend = backend.name
    body = await request.read() if request.can_read_body else None
    url = backend.url + request.path_qs
    return await relay(request, request.app[SESSION], url, body, view.policy.timeouts, record)


async def refuse_management(request: web.Request) -> web.StreamResponse:
    raise GatewayError(
        403,
        "management_forbidden",
        "model management (pull, push, create, copy, delete) is disabled on this gateway",
    )


async def root(request: web.Request) -> web.StreamResponse:
    # Ollama clients probe GET / (and HEAD /) to see whether the server is up.
    return web.Response(text="Ollama is running")


def _json_object(body: bytes) -> dict[str, Any]:
    try:
        fields = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise GatewayError(
            400, "bad_request", f"the request body is not valid JSON: {exc}"
        ) from exc
    if not isinstance(fields, dict):
        raise GatewayError(400, "bad_request", "the request body must be a JSON object")
    return fields


def _model_name(fields: dict[str, Any]) -> str:
    model = fields.get("model")
    if not isinstance(model, str) or not model:
        raise GatewayError(400, "bad_request", "model is required")
    return model


def _check_model_allowed(policy: Policy, user: str, model: str) -> None:
    user_config = policy.users.get(user)
    allowed = user_config.models if user_config is not None else None
    if allowed is not None and model not in allowed:
        raise GatewayError(403, "model_forbidden", f"user {user} may not use model {model!r}")
