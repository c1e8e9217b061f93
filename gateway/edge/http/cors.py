"""Browser apps on other origins (a web chat served from elsewhere): CORS, for listed origins.

A browser lets a page read a reply from another origin only when the reply says that origin
may, and before a request with a key in a header (or a JSON body) it first asks, with an
``OPTIONS`` preflight, whether it may send it at all. Off by default: every origin listed
under ``cors.origins`` can have its visitors' browsers use the gateway with whatever key or
address they have, so the admin names them one by one (no wildcard).

The preflight is answered here, before identity (browsers send no key with it); the reply to
the request itself gets its headers as it is prepared, so a stream carries them from its
first byte, and so does a refusal. A preflight from an origin not listed is refused with a
403 that says so, in the log too: that is where an admin looks when a web app "cannot
connect". Requests from unlisted origins get no CORS headers; their pages cannot read them.

An address (``clients:``) or an open gateway is authority a browser carries to every page it
opens: a page on any site can send a POST without a preflight (``Content-Type: text/plain``)
and run a chat as the household member whose machine it is, on their budget, though it
cannot read the reply. A request that a page on another origin sent (its browser says so in
``Origin``) is therefore refused with 403 ``origin_forbidden`` unless it carries a key or the
policy lists that origin, as Ollama refuses an origin it does not list; extensions' and
apps' own schemes are left to the backend to judge. A page on the gateway's own host name
is no exception: a site can rebind its name to the gateway's address (DNS rebinding), and
the gateway's own pages only read, which sends no Origin.
"""

from __future__ import annotations

from collections.abc import Callable

import structlog
from aiohttp import hdrs, web
from multidict import CIMultiDict

from gateway.config import CorsPolicy
from gateway.core import GatewayError, Reason
from gateway.edge.identity import Caller

__all__ = ["Cors", "without_cors"]

log = structlog.get_logger("fairgate.cors")

_METHODS = "GET, HEAD, POST"
_ORIGIN_LOGGED = 200  # characters of a refused Origin header written to the log
# The origins a web page can have: a site's, or "null" (a sandboxed frame, a file, a data: URL).
_PAGE_SCHEMES = ("http://", "https://")
_MAX_AGE = "600"  # seconds a browser may reuse a preflight's answer (Chromium caps it at 7200)
# Headers a page may read from a reply, beyond the few every browser exposes.
_EXPOSED = "Retry-After, X-Request-Id, X-Fairgate-Queue-Wait, X-Fairgate-Queue-Position"


class Cors:
    """Preflights, and the CORS headers of replies to listed origins."""

    def __init__(self, policy: Callable[[], CorsPolicy]) -> None:
        # Asked per request: a reload changes the origins without a new Cors.
        self._policy = policy

    def preflight(self, request: web.Request) -> web.Response | None:
        """The answer to a preflight (403 for an origin not listed); None for any other
        request, after one comparison (every request asks)."""
        if request.method != hdrs.METH_OPTIONS or not _is_preflight(request):
            return None
        origin = request.headers[hdrs.ORIGIN]
        if not self._allows(origin):
            # Where an admin looks when a web app "cannot connect": the origin to list
            # (cut to a length an origin has; the log's renderers escape the rest).
            log.warning("origin_forbidden", origin=origin[:_ORIGIN_LOGGED])
            raise GatewayError(403, Reason.ORIGIN_FORBIDDEN, _refusal(origin))
        asked = request.headers.get(hdrs.ACCESS_CONTROL_REQUEST_HEADERS, "")
        headers = {
            hdrs.ACCESS_CONTROL_ALLOW_METHODS: _METHODS,
            hdrs.ACCESS_CONTROL_MAX_AGE: _MAX_AGE,
        }
        if asked:
            # What the page's client sends (the openai SDK adds its x-stainless-* headers):
            # nothing a header can do here is more than the origin was trusted with.
            headers[hdrs.ACCESS_CONTROL_ALLOW_HEADERS] = asked
        return web.Response(status=204, headers=headers)

    def add_headers(self, request: web.Request, headers: CIMultiDict[str]) -> None:
        """A reply to a listed origin says it may read it (as the reply is prepared)."""
        origin = request.headers.get(hdrs.ORIGIN)
        if origin is None or not self._policy().origins:
            return
        # Caches must not give one origin's reply to another.
        headers.add(hdrs.VARY, hdrs.ORIGIN)
        if self._allows(origin):
            headers[hdrs.ACCESS_CONTROL_ALLOW_ORIGIN] = origin
            if not _is_preflight(request):
                headers[hdrs.ACCESS_CONTROL_EXPOSE_HEADERS] = _EXPOSED

    def refuse_pages_without_key(self, request: web.Request, caller: Caller) -> None:
        """403 for a request without a key that a web page on an origin the policy does not
        list sent (see the module's note); nothing for any other."""
        if caller.by_key:
            return
        origins = request.headers.getall(hdrs.ORIGIN, ())
        if not origins:
            return
        # One Origin, as a browser sends: of two, each reader (aiohttp, Go, a proxy) may act
        # on another, so neither is taken as the page's.
        origin = origins[0] if len(origins) == 1 else ", ".join(origins)
        if len(origins) == 1 and (self._allows(origin) or _app_scheme(origin)):
            return  # listed, or an extension's or app's own scheme: the backend's to judge
        log.warning("origin_forbidden", origin=origin[:_ORIGIN_LOGGED], user=caller.user)
        raise GatewayError(
            403,
            Reason.ORIGIN_FORBIDDEN,
            f"a page on {origin[:_ORIGIN_LOGGED]!r} cannot use the gateway without a key: "
            "list its origin under cors.origins to let it",
        )

    def _allows(self, origin: str) -> bool:
        return origin in self._policy().origins


def without_cors(headers: CIMultiDict[str]) -> None:
    """``headers`` without a backend's own CORS headers. With origins listed, the gateway
    alone says which may read a reply: Ollama allows localhost origins of its own accord
    (OLLAMA_ORIGINS) and would let a page on one read replies the gateway keeps from it."""
    for name in [name for name in headers if name.lower().startswith("access-control-")]:
        del headers[name]


def _app_scheme(origin: str) -> bool:
    """Whether ``origin`` is an extension's or app's (``chrome-extension://...``): a scheme of
    its own, neither a web page's (http, https, in any case) nor a sandbox's ``null``, nor
    none at all (an empty or made-up Origin is no app's)."""
    scheme, separator, _ = origin.partition("://")
    if not separator or not scheme.isascii() or not scheme[:1].isalpha():
        return False
    return (scheme + separator).lower() not in _PAGE_SCHEMES


def _is_preflight(request: web.Request) -> bool:
    return (
        request.method == hdrs.METH_OPTIONS
        and hdrs.ORIGIN in request.headers
        and hdrs.ACCESS_CONTROL_REQUEST_METHOD in request.headers
    )


def _refusal(origin: str) -> str:
    # The origin is the page's, not a secret; repr() keeps a control character from
    # reaching the error body unescaped.
    return f"cross-origin requests from {origin!r} are not allowed: list it under cors.origins"
