"""``GET /status``: the gateway's snapshot as JSON, for admins (an admin key, or loopback);
``/healthz`` and ``/readyz`` for health checks, without a key.

Liveness and readiness differ on purpose: a gateway whose every backend is down is alive
(restarting it would not bring Ollama back) but not ready (it can only answer 503s)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from aiohttp import web

from gateway.backends import Backend
from gateway.errors import GatewayError
from gateway.services import Services
from gateway.snapshot import BackendSnapshot, GatewaySnapshot
from gateway.vocabulary import Reason

__all__ = ["Status", "answering", "render"]


class Status:
    def __init__(self, services: Services) -> None:
        self._services = services

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get("/status", self.status)
        app.router.add_get("/healthz", self.alive)
        app.router.add_get("/readyz", self.ready)

    async def alive(self, request: web.Request) -> web.Response:
        """Liveness: the process answers HTTP; nothing else is checked."""
        return web.json_response({"status": "alive"})

    async def ready(self, request: web.Request) -> web.Response:
        """Readiness: 200 while at least one backend is in rotation and has answered its
        probes, 503 otherwise. Counts only: the backends' names and errors are in /status."""
        backends = self._services.policy.current.pool.backends
        ready = sum(1 for _ in answering(backends))
        body = {
            "status": "ready" if ready else "not_ready",
            "backends_ready": ready,
            "backends": len(backends),
        }
        return web.json_response(body, status=200 if ready else 503)

    async def status(self, request: web.Request) -> web.Response:
        services = self._services
        if not services.is_admin(request, services.policy.current):
            raise GatewayError(
                403, Reason.ADMIN_ONLY, "/status needs an admin key or a loopback client"
            )
        return web.json_response(render(services.snapshot()))


def answering(backends: Iterable[Backend]) -> Iterable[Backend]:
    """Backends in rotation that have answered a probe. A backend is healthy until its
    probes say otherwise, so health alone would call a gateway ready whose only backend has
    never answered (a first run without Ollama)."""
    return (b for b in backends if b.state.healthy and b.state.models is not None)


def render(snapshot: GatewaySnapshot) -> dict[str, Any]:
    room, holds, reloads = snapshot.room, snapshot.holds, snapshot.reloads
    return {
        "backends": {b.name: _backend(b, snapshot) for b in snapshot.backends},
        "users": {
            name: {"running": running, "queued": queued}
            for name, (running, queued) in room.users.items()
        },
        "queue": {"depth": room.queue_depth, "oldest_wait_seconds": round(room.oldest_wait, 3)},
        "state": {
            "kind": holds.kind,
            "shared": holds.shared,
            "waiting_on_other_replicas": holds.others_waiting,
        },
        "policy": {
            "path": reloads.path,
            "reloads_ok": reloads.reloads_ok,
            "reloads_failed": reloads.reloads_failed,
            "last_error": reloads.last_error,
        },
    }


def _backend(backend: BackendSnapshot, snapshot: GatewaySnapshot) -> dict[str, Any]:
    warmth = snapshot.warmth
    return {
        "kind": backend.kind,
        "url": backend.url,
        "healthy": backend.healthy,
        "busy": backend.busy,
        "slots": backend.slots,
        "loaded": backend.loaded,  # model -> when Ollama unloads it
        "sleeping": backend.sleeping,
        "last_error": backend.last_error,
        "keep_warm_pings": {
            f"{model}:{outcome}": count
            for (name, model, outcome), count in warmth.pings.items()
            if name == backend.name
        },
        "cold_starts": {
            model: count
            for (name, model), count in warmth.cold_starts.items()
            if name == backend.name
        },
    }
