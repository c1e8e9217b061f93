"""The house page (``/ui``) and "where am I" (``/ui/me``): the gateway's snapshot, in a browser.

The pages are static files (``gateway/routes/ui``: HTML, CSS and a little script; no build step, no
CDN). They hold no data: the house page polls ``/status`` (admins: loopback or an admin key,
routes/status.py), and the personal page polls ``/ui/me.json``, which any key holder may read for
themselves. A browser cannot send a header when it navigates, so the key is typed once,
kept in the tab's sessionStorage and sent as ``Authorization`` on each fetch, never in a URL.
"""

from __future__ import annotations

from collections import Counter
from importlib import resources
from typing import Any

from aiohttp import web

from gateway.config import ANONYMOUS, PERSON_SEPARATOR
from gateway.edge.http import NO_STORE
from gateway.observe import GatewaySnapshot
from gateway.routes.status import render_budget, render_today
from gateway.services import Services

__all__ = ["House", "render_me"]

_TYPES = {
    ".html": "text/html",
    ".css": "text/css",
    ".js": "text/javascript",
    ".svg": "image/svg+xml",
}
_HEADERS = {
    # Everything comes from the gateway itself; nothing inline, no frames.
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        "img-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


class House:
    """The pages, their files, and the caller's own view."""

    def __init__(self, services: Services) -> None:
        self._services = services
        # Read once: a handful of small files, served from memory.
        folder = resources.files("gateway.routes") / "ui"
        self._files = {
            item.name: item.read_bytes()
            for item in folder.iterdir()
            if any(item.name.endswith(suffix) for suffix in _TYPES)
        }

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get("/ui", self.house_page)
        app.router.add_get("/ui/me", self.me_page)
        app.router.add_get("/ui/me.json", self.me)
        app.router.add_get("/ui/static/{name}", self.static)

    async def house_page(self, request: web.Request) -> web.Response:
        return self._file("house.html")

    async def me_page(self, request: web.Request) -> web.Response:
        return self._file("me.html")

    async def static(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name.endswith(".html") or name not in self._files:
            raise web.HTTPNotFound()
        return self._file(name)

    def _file(self, name: str) -> web.Response:
        suffix = name[name.rindex(".") :]
        return web.Response(
            body=self._files[name], content_type=_TYPES[suffix], charset="utf-8", headers=_HEADERS
        )

    async def me(self, request: web.Request) -> web.Response:
        """The caller's requests, limits and day, and how busy the house is (401 if unknown)."""
        services = self._services
        view = services.policy.current
        user = services.caller(request, view).user
        body = render_me(services.snapshot(), user)
        body["admin"] = services.is_admin(request, view)
        return web.json_response(body, headers=NO_STORE)


def render_me(snapshot: GatewaySnapshot, user: str) -> dict[str, Any]:
    """``user``'s part of the snapshot, and the sentence that sums up the house for them."""
    room = snapshot.room
    limits = snapshot.limits.get(user)
    mine = [w for w in room.waiting if w.user == user]
    return {
        "user": user,
        "summary": summary(snapshot, user),
        "running": [
            {
                "model": run.model,
                "backend": run.backend,
                "class": run.request_class,
                "lane": run.lane,
                "seconds": round(run.seconds, 3),
            }
            for run in room.running
            if run.user == user
        ],
        "waiting": [
            {
                "position": waiter.position,
                "ahead": waiter.position - 1,
                "model": waiter.model,
                "class": waiter.request_class,
                "lane": waiter.lane,
                "waited_seconds": round(waiter.waited, 3),
                "estimated_start_seconds": round(waiter.starts_in, 3),
            }
            for waiter in mine
        ],
        "limits": {
            "max_concurrent": limits and limits.max_concurrent,
            "max_queued": limits and limits.max_queued,
            "weight": limits and limits.weight,
        },
        "today": render_today(snapshot.usage.get(user)),
        "budget": render_budget(snapshot.usage.get(user)),
        "house": {
            "busy": snapshot.busy,
            "slots": snapshot.slots,
            "running_users": _running_users(snapshot, user),
            "waiting": room.queue_depth,
        },
    }


def summary(snapshot: GatewaySnapshot, user: str) -> str:
    """Why it is slow, in one line: "2 of 2 slots busy: bob, agent; 1 ahead of you"."""
    busy, slots = snapshot.busy, snapshot.slots
    names = _running_users(snapshot, user)
    head = f"{busy} of {slots} slot{'' if slots == 1 else 's'} busy"
    if names:
        head += ": " + ", ".join(names)
    room = snapshot.room
    mine = [w for w in room.waiting if w.user == user]
    if mine:
        ahead = mine[0].position - 1
        tail = f"{ahead} ahead of you" if ahead else "you are next"
    elif any(run.user == user for run in room.running):
        tail = "yours is running"
    else:
        tail = f"{room.queue_depth} waiting" if room.queue_depth else "nobody waiting"
    return f"{head}; {tail}"


def _running_users(snapshot: GatewaySnapshot, viewer: str) -> list[str]:
    """Who holds the busy slots, longest running first; "bob (2)" for two of bob's. Told
    to the household's own users only: ``anonymous`` is anyone who can reach the gateway.
    A person a front end names (``owui/alice@example.com``) shows as the front end: their
    address is theirs to give, as in the metrics."""
    if viewer == ANONYMOUS:
        return []
    counts = Counter(run.user.partition(PERSON_SEPARATOR)[0] for run in snapshot.room.running)
    return [name if count == 1 else f"{name} ({count})" for name, count in counts.items()]
