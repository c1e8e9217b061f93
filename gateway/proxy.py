"""The request handlers: the path of a request, top to bottom."""

from __future__ import annotations

import json
from typing import Any

import orjson
import structlog
from aiohttp import web

from gateway.access import RECORD
from gateway.admission import Permit, Refusal, Ticket
from gateway.backends import BackendPool
from gateway.classify import classify
from gateway.errors import Api, BackendFailure, GatewayError, api_of
from gateway.keys import ADMISSION, LIVE, MONITOR, SESSION, WARMTH
from gateway.listings import add_listing_routes, model_not_found
from gateway.policy import Policy, Timeouts
from gateway.streaming import relay
from gateway.warmth import apply_keep_alive_policy

__all__ = ["add_routes"]

log = structlog.get_logger("fairgate.proxy")

GENERATION_PATHS = (
    "/api/chat",
    "/api/generate",
    "/api/embed",
    "/api/embeddings",
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
)
# Model management changes what every user of the box gets; not through a shared gateway.
MANAGEMENT_PATHS = ("/api/pull", "/api/push", "/api/create", "/api/copy", "/api/delete")


def add_routes(app: web.Application) -> None:
    for path in GENERATION_PATHS:
        app.router.add_post(path, generate)
    add_listing_routes(app)
    for path in MANAGEMENT_PATHS:
        app.router.add_route("*", path, refuse_management)
    app.router.add_route("*", "/api/blobs/{digest}", refuse_management)
    app.router.add_get("/", root)


async def generate(request: web.Request) -> web.StreamResponse:
    """A generation or embedding request: identify, classify, admit, relay, release."""
    record = request[RECORD]
    view = request.app[LIVE].current
    api = api_of(request.path)
    record.user = view.directory.identify(request.headers, request.remote)
    body = await request.read()
    fields = _json_object(body)
    record.model = _model_name(fields)
    _check_model_allowed(view.policy, record.user, record.model)
    _check_model_served(view.pool, api, record.model)
    if api is Api.OLLAMA and apply_keep_alive_policy(fields, view.policy.keep_alive):
        body = _encoded(fields)
    estimate = classify(fields, view.policy)
    record.klass, record.input_estimate = estimate.klass, estimate.input_tokens
    ticket = Ticket(
        record.user,
        record.model,
        api,
        input_tokens=estimate.input_tokens,
        heavy=estimate.klass == "heavy",
        class_weight=estimate.weight,
    )
    outcome = await request.app[ADMISSION].acquire(ticket)
    if isinstance(outcome, Refusal):
        raise GatewayError(503, outcome.reason, outcome.message, outcome.retry_after)
    async with outcome as permit:
        record.queue_wait, record.dispatched_at = permit.queue_wait, permit.granted_at
        record.backend = permit.backend.name
        response = await _relay_with_failover(request, permit, body, view.policy.timeouts)
        permit.settle(record.prompt_tokens, record.completion_tokens)
    request.app[WARMTH].note_load(record.backend, record.model, record.load_seconds)
    return response


async def _relay_with_failover(
    request: web.Request, permit: Permit, body: bytes, timeouts: Timeouts
) -> web.StreamResponse:
    """Relay on the permit's backend; if it fails before any byte, once more on another."""
    record = request[RECORD]

    async def attempt(fail_fast: bool) -> web.StreamResponse:
        backend = permit.backend
        return await relay(
            request,
            request.app[SESSION],
            backend.url + request.path_qs,
            body,
            timeouts,
            record,
            meter=permit.add_output,
            fail_fast=fail_fast,
            # llama-server closes the connection after a streamed reply although it
            # promised keep-alive; a pooled connection would then fail on the next request.
            close_connection=backend.kind == "llamacpp",
        )

    admission = request.app[ADMISSION]
    try:
        # With nowhere else to go, the backend's own error reaches the client as it is.
        return await attempt(fail_fast=admission.can_reroute(permit))
    except BackendFailure as failure:
        failed = permit.backend.name
        if failure.reason == "backend_unreachable":
            request.app[MONITOR].report_failure(failed, failure.message)
        if not await admission.reroute(permit):
            raise
        log.warning("failover", failed=failed, to=permit.backend.name, error=failure.message)
        record.backend, record.retried = permit.backend.name, True
        return await attempt(fail_fast=False)


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


def _encoded(fields: dict[str, Any]) -> bytes:
    # orjson: json.dumps holds the event loop 30-40 ms for a 4 MB image body, orjson 5 ms.
    try:
        return orjson.dumps(fields)
    except orjson.JSONEncodeError:  # an integer beyond 64 bits, which json.loads accepts
        return json.dumps(fields, ensure_ascii=False).encode()


def _model_name(fields: dict[str, Any]) -> str:
    model = fields.get("model")
    if not isinstance(model, str) or not model:
        raise GatewayError(400, "bad_request", "model is required")
    return model


def _check_model_served(pool: BackendPool, api: Api, model: str) -> None:
    if pool.serving(api, model):
        return
    if pool.known_nowhere(api, model):
        raise model_not_found(model)
    raise GatewayError(
        503, "no_backend", f"no healthy backend serves {model!r} right now", retry_after=10.0
    )


def _check_model_allowed(policy: Policy, user: str, model: str) -> None:
    user_config = policy.users.get(user)
    allowed = user_config.models if user_config is not None else None
    if allowed is not None and model not in allowed:
        raise GatewayError(403, "model_forbidden", f"user {user} may not use model {model!r}")
