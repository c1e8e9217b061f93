"""Ollama's check of a browser's Origin, before any handler runs.

Ollama puts gin-contrib/cors in front of every route (server/routes.go) with the origins of
envconfig.AllowedOrigins: OLLAMA_ORIGINS, then http(s)://localhost, 127.0.0.1 and 0.0.0.0
with or without a port, and app://, file://, tauri://, vscode-webview://, vscode-file://.
A request whose Origin is none of these, nor the server's own (``http://`` + Host), gets a
bare 403 (cors.applyCors: AbortWithStatus); an allowed one gets its origin back in
Access-Control-Allow-Origin. A web chat's page on another origin, relayed with its Origin,
is refused this way unless OLLAMA_ORIGINS lists it.
"""

from __future__ import annotations

from aiohttp import web
from aiohttp.typedefs import Handler

__all__ = ["allow_origin", "check_origin"]

_LOCAL_HOSTS = ("localhost", "127.0.0.1", "0.0.0.0")
_EXACT = frozenset(f"{scheme}://{host}" for scheme in ("http", "https") for host in _LOCAL_HOSTS)
# The wildcard entries ("http://localhost:*", "app://*"): what comes before the star.
_PREFIXES = (
    *(f"{scheme}://{host}:" for scheme in ("http", "https") for host in _LOCAL_HOSTS),
    "app://",
    "file://",
    "tauri://",
    "vscode-webview://",
    "vscode-file://",
)


def allowed(origin: str, host: str) -> bool:
    """Whether Ollama, with OLLAMA_ORIGINS unset, lets a request from ``origin`` through."""
    if origin in (f"http://{host}", f"https://{host}"):
        return True  # not a cross-origin request to gin
    return origin in _EXACT or origin.startswith(_PREFIXES)


@web.middleware
async def check_origin(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The 403 for an origin not allowed; the handler for any other request."""
    origin = request.headers.get("Origin")
    if origin and not allowed(origin, request.host):
        return web.Response(status=403)
    return await handler(request)


async def allow_origin(request: web.Request, response: web.StreamResponse) -> None:
    """An allowed origin's reply says so (an on_response_prepare hook: streams too)."""
    origin = request.headers.get("Origin")
    if origin and allowed(origin, request.host):
        response.headers["Access-Control-Allow-Origin"] = origin
