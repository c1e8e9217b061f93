"""``GET /status``: what the gateway holds right now, for admins (an admin key, or loopback)."""

from __future__ import annotations

from ipaddress import ip_address

from aiohttp import web

from gateway.access import RECORD
from gateway.errors import GatewayError
from gateway.keys import ADMISSION, LIVE

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
    return web.json_response(
        {
            "backends": {
                name: {"busy": busy, "slots": slots}
                for name, (busy, slots) in snapshot.backends.items()
            },
            "users": {
                name: {"running": running, "queued": queued}
                for name, (running, queued) in snapshot.users.items()
            },
            "queue": {
                "depth": snapshot.queue_depth,
                "oldest_wait_seconds": round(snapshot.oldest_wait, 3),
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
