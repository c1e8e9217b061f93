"""Unloading a planned swap's victims, each kind of backend its own way, before the request
that needs their room is sent.

- Ollama: an empty ``POST /api/generate`` with ``keep_alive: 0`` per model. Ollama then has
  room, and unloads nothing of its own choosing.
- llama-server's router: ``POST /models/unload`` per model, then ``GET /models`` until each
  says ``unloaded``. The router answers the unload at once, while its child is still
  stopping; a load asked for in that window is refused with 500 "model limit reached, try
  again later" (``server_models::load`` counts the stopping child as running). So the
  request for the incoming model goes only once the room is really there, or the deadline
  has passed.

A failure is logged, not raised: the request then goes anyway, and the backend makes room
its own way, as it would have without the gateway.
"""

from __future__ import annotations

import asyncio
import time

import aiohttp
import structlog

from gateway.backends.pool import Backend
from gateway.backends.watch.probes import entries_of

__all__ = ["ROUTER_UNLOAD_SECONDS", "unload_models"]

log = structlog.get_logger("fairgate.swaps")

# How long a router's child may take to stop: the router kills it after its stop timeout
# (10 s unless a preset says otherwise), and says ``unloaded`` once it has exited.
ROUTER_UNLOAD_SECONDS = 15.0
_ROUTER_POLL_SECONDS = 0.05  # between two reads of the router's /models while one stops


async def unload_models(
    session: aiohttp.ClientSession, backend: Backend, models: tuple[str, ...], within: float
) -> None:
    """Unload ``models`` (model keys) from ``backend``; ``within``: each request's deadline."""
    for model in models:
        try:
            if backend.router:
                await _router_unload(session, backend, backend.state.names.get(model, model))
            else:
                await _ollama_unload(session, backend, model, within)
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            log.warning("model_unload_failed", backend=backend.name, model=model, error=repr(exc))


async def _ollama_unload(
    session: aiohttp.ClientSession, backend: Backend, model: str, within: float
) -> None:
    body = {"model": model, "keep_alive": 0}
    timeout = aiohttp.ClientTimeout(within)
    async with session.post(backend.url + "/api/generate", json=body, timeout=timeout) as reply:
        await reply.read()
        log.info("model_unloaded", backend=backend.name, model=model, status=reply.status)


async def _router_unload(session: aiohttp.ClientSession, backend: Backend, name: str) -> None:
    deadline = time.monotonic() + ROUTER_UNLOAD_SECONDS
    timeout = aiohttp.ClientTimeout(ROUTER_UNLOAD_SECONDS)
    url = backend.url + "/models/unload"
    async with session.post(url, json={"model": name}, timeout=timeout) as reply:
        said = await reply.read()
        # 400 "model is not running": gone already, which is what was wanted.
        log.info("model_unloading", backend=backend.name, model=name, status=reply.status)
    while time.monotonic() < deadline:
        async with session.get(backend.url + "/models", timeout=timeout) as reply:
            status = _status_of(await reply.json(content_type=None), name)
        if status in (None, "unloaded", "failed"):
            log.info("model_unloaded", backend=backend.name, model=name)
            return
        await asyncio.sleep(_ROUTER_POLL_SECONDS)  # polling the router: it pushes nothing
    log.warning(
        "model_unload_slow",
        backend=backend.name,
        model=name,
        said=said[:200].decode(errors="replace"),
    )


def _status_of(document: object, name: str) -> str | None:
    """The router's status word for ``name`` in its /models reply; None if not listed."""
    for entry in entries_of(document, "data") or ():
        if entry.get("id") == name:
            status = entry.get("status")
            return str(status.get("value")) if isinstance(status, dict) else None
    return None
