"""The generation routes found without aiohttp's router: every chat, completion and
embedding is a POST to one of a few fixed paths, on the path of its first byte.

aiohttp's ``Application._handle`` resolves each request's route anew, asks the event loop
for itself (a getpid() syscall on CPython 3.11) and looks up the middleware chain in a
cache. Here those routes, their middleware chain and their match info are worked out once,
when the server starts, and a request for one of them is handed straight to its chain.
Anything else (another path or method, a path written with escapes, an ``Expect`` header
whose answer the route decides) goes through ``Application._handle``, so what answers a
request is the same either way.
"""

from __future__ import annotations

from functools import partial

from aiohttp import hdrs, web
from aiohttp.typedefs import Handler
from aiohttp.web_urldispatcher import UrlMappingMatchInfo
from multidict import CIMultiDictProxy

__all__ = ["HOT_PATHS", "HotRoutes"]

HOT_PATHS = web.AppKey("hot_paths", tuple[str, ...])
"""The paths whose POST routes skip the router, set by whoever adds those routes."""


class HotRoutes:
    """The server's request handler: ``paths``' POST routes straight to their chain, every
    other request to the app."""

    def __init__(self, app: web.Application, paths: tuple[str, ...]) -> None:
        self._app = app
        self._routes: dict[str, tuple[Handler, UrlMappingMatchInfo]] = {}
        for route in app.router.routes():
            path = route.resource.canonical if route.resource is not None else None
            if route.method == hdrs.METH_POST and path in paths:
                self._routes[path] = _chain(app, route)

    async def __call__(self, request: web.BaseRequest) -> web.StreamResponse:
        hot = self.chain_for(request.method, request.raw_path, request.headers)
        if hot is None:
            return await self._app._handle(request)  # type: ignore[arg-type]
        chain, match = hot
        # What Application._handle sets: replies are prepared with the app's hooks.
        request._match_info = match  # type: ignore[attr-defined]
        return await chain(request)  # type: ignore[arg-type]

    def chain_for(
        self, method: str, raw_path: str, headers: CIMultiDictProxy[str]
    ) -> tuple[Handler, UrlMappingMatchInfo] | None:
        """The chain and match info of a hot route's request; None for any other."""
        # The raw path, not the decoded one: "/api%2Fchat" is not a route to aiohttp's router,
        # and must not be one here.
        hot = self._routes.get(raw_path) if method == hdrs.METH_POST else None
        if hot is None or hdrs.EXPECT in headers:
            return None
        return hot


def _chain(app: web.Application, route: web.AbstractRoute) -> tuple[Handler, UrlMappingMatchInfo]:
    """The route's handler inside the app's middlewares, and its match info, frozen (a
    request reads it, nothing changes it), as Application._handle makes them."""
    match = UrlMappingMatchInfo({}, route)
    match.add_app(app)
    match.freeze()
    chain: Handler = route.handler
    for middleware in reversed(app.middlewares):
        chain = partial(middleware, handler=chain)
    return chain, match
