"""Reads that never queue: model listings (the union over healthy backends), show, version.

Listings are asked of every healthy backend at once, when a client asks: ``/api/ps`` must
say what is loaded now, not at the last probe. A backend that does not answer in time is
left out of the list rather than failing it.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import structlog
from aiohttp import web

from gateway.access import RECORD
from gateway.backends import Backend, model_key
from gateway.errors import Api, GatewayError
from gateway.keys import LIVE, SESSION
from gateway.streaming import relay

__all__ = ["add_listing_routes", "model_not_found"]

log = structlog.get_logger("fairgate.listings")

# path -> (the list's key in the reply, the field naming an entry, the API it belongs to)
_LISTINGS = {
    "/api/tags": ("models", "name", Api.OLLAMA),
    "/api/ps": ("models", "name", Api.OLLAMA),
    "/v1/models": ("data", "id", Api.OPENAI),
}


def add_listing_routes(app: web.Application) -> None:
    for path in _LISTINGS:
        app.router.add_get(path, listing)
    app.router.add_post("/api/show", show)
    app.router.add_get("/api/version", version)


async def listing(request: web.Request) -> web.Response:
    """The union of every healthy backend's list, each model once."""
    view = request.app[LIVE].current
    request[RECORD].user = view.directory.identify(request.headers, request.remote)
    key, field, api = _LISTINGS[request.path]
    session, within = request.app[SESSION], view.policy.monitoring.timeout
    lists = await asyncio.gather(
        *(_entries(session, b.url + request.path, key, within) for b in view.pool.healthy(api))
    )
    entries: dict[str, dict[str, Any]] = {}
    for listed in lists:
        for entry in listed:
            entries.setdefault(str(entry.get(field)), entry)
    body: dict[str, Any] = {key: list(entries.values())}
    if api is Api.OPENAI:
        body = {"object": "list", **body}
    return web.json_response(body)


async def show(request: web.Request) -> web.StreamResponse:
    """Model details from a backend that has the model."""
    view = request.app[LIVE].current
    record = request[RECORD]
    record.user = view.directory.identify(request.headers, request.remote)
    body = await request.read()
    try:
        fields = json.loads(body)
        model = str(fields.get("model") or fields.get("name") or "")
    except (ValueError, AttributeError):
        model = ""  # the backend answers malformed requests in its own words
    record.model = model or None
    candidates = view.pool.serving(Api.OLLAMA, model) if model else view.pool.healthy(Api.OLLAMA)
    if not candidates and model and view.pool.known_nowhere(Api.OLLAMA, model):
        raise model_not_found(model)
    backend = _first(candidates, model)
    record.backend = backend.name
    timeouts = view.policy.timeouts
    return await relay(
        request, request.app[SESSION], backend.url + "/api/show", body, timeouts, record
    )


async def version(request: web.Request) -> web.StreamResponse:
    view = request.app[LIVE].current
    record = request[RECORD]
    backend = _first(view.pool.healthy(Api.OLLAMA), "")
    record.backend = backend.name
    url = backend.url + "/api/version"
    return await relay(request, request.app[SESSION], url, None, view.policy.timeouts, record)


async def _entries(
    session: aiohttp.ClientSession, url: str, key: str, within: float
) -> list[dict[str, Any]]:
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=within)) as reply:
            document = await reply.json(content_type=None) if reply.status == 200 else {}
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        log.warning("listing_failed", url=url, error=repr(exc))
        return []
    entries = document.get(key) if isinstance(document, dict) else None
    return [e for e in entries if isinstance(e, dict)] if isinstance(entries, list) else []


def model_not_found(model: str) -> GatewayError:
    # Ollama's own wording since v0.5 (server/routes.go).
    return GatewayError(404, "model_not_found", f"model '{model}' not found")


def _first(candidates: list[Backend], model: str) -> Backend:
    if not candidates:
        raise GatewayError(503, "no_backend", "no healthy backend can answer this request now")
    loaded = [b for b in candidates if model and model_key(model) in b.state.loaded]
    return (loaded or candidates)[0]
