"""``GET /status``: what the gateway holds right now, for admins (an admin key, or loopback)."""

from __future__ import annotations

from ipaddress import ip_address

from aiohttp import web

from gateway.access import RECORD
from gateway.errors import GatewayError
from gateway.keys import ADMISSION, LIVE, WARMTH

__all__ = ["add_status_route"]


def add_status_route(app: web.Application) -> None:
    app.router.add_get("/status", status)


async def status(request: web.Request) -> web.Response:
    view = request.app[LIVE].current
    if not _from_loopback(request.remote):
        user = view.directory.identify(request.headers, request.remote)
        request[RECORD].user = user
        if user not in view.directory.admins:
            raise GatewayError(403, "admin_only", "/status needs an admin key or a loopback client")
    live = request.app[LIVE]
    snapshot = request.app[ADMISSION].snapshot()
    warmth = request.app[WARMTH]
    backends = {}
    for backend in view.pool.backends:
        busy, slots = snapshot.backends.get(backend.name, (0, backend.slots))
        backends[backend.name] = {
            "kind": backend.kind,
            "url": backend.url,
            "healthy": backend.state.healthy,
            "busy": busy,
            "slots": slots,
            "loaded": backend.state.loaded,  # model -> when Ollama unloads it
            "sleeping": backend.state.sleeping,
            "last_error": backend.state.last_error,
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
    return web.json_response(
        {
            "backends": backends,
            "users": {
                name: {"running": running, "queued": queued}
                for name, (running, queued) in snapshot.users.items()
            },
            "queue": {
                "depth": snapshot.queue_depth,
                "oldest_wait_seconds": round(snapshot.oldest_wait, 3),
            },
            "state": {
                "kind": type(request.app[ADMISSION].state).__name__,
                "shared": request.app[ADMISSION].state.shared,
                "waiting_on_other_replicas": request.app[ADMISSION].state.others_waiting,
            },
            "policy": {
                "path": str(live.path) if live.path else None,
                "reloads_ok": live.reloads_ok,
                "reloads_failed": live.reloads_failed,
                "last_error": live.last_error,
            },
        }
    )


def _from_loopback(remote: str | None) -> bool:
    try:
        return remote is not None and ip_address(remote).is_loopback
    except ValueError:
        return False
