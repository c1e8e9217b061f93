"""What the gateway says on every reply: the request's id, its wait for a turn, a listed
origin's CORS headers (``ReplyHeaders``); and how a relayed reply is given them (``put``).

Apart from the access log (``access_log.py``), which fills the request's record and writes it
when the request ends: this only reads the record, as a reply is made, and its callers are the
app's hook (app.py) and the relay (relay/relay.py), not the middleware.
"""

from __future__ import annotations

from aiohttp import hdrs, web
from multidict import CIMultiDict, istr

from gateway.edge.http.access_log import RECORD, X_REQUEST_ID
from gateway.edge.http.cors import Cors, without_cors

__all__ = ["ReplyHeaders", "put"]

# istr: header names set without case folding each time.
_X_QUEUE_WAIT = istr("X-Fairgate-Queue-Wait")
_X_QUEUE_POSITION = istr("X-Fairgate-Queue-Position")


class ReplyHeaders:
    """What the gateway says on every reply: it names its request, as the access log does;
    one that waited for its turn says how long and from which place (people ask "was it
    the gateway or the model?", and a front end can show it); a reply to a listed origin
    gets its CORS headers (``cors``).

    Said by the app's one on_response_prepare hook (``hook``: each hook is a coroutine of
    its own for every reply), except in a relayed reply: the relay works them out while the
    backend works (``said``), builds the reply with them (``put``) and prepares it without
    the hooks, off the path of its first byte."""

    def __init__(self, cors: Cors) -> None:
        self._cors = cors

    def add(self, request: web.Request, headers: CIMultiDict[str]) -> None:
        record = request.get(RECORD)
        if record is not None:  # else a reply aiohttp made without the middleware
            headers[X_REQUEST_ID] = record.request_id
            if record.queue_wait is not None:
                headers[_X_QUEUE_WAIT] = f"{record.queue_wait:.3f}"
                headers[_X_QUEUE_POSITION] = str(record.queue_position or 0)
        self._cors.add_headers(request, headers)

    def said(self, request: web.Request) -> CIMultiDict[str]:
        """What ``add`` says on ``request``'s reply, on its own: a relay works it out while
        the backend works, and ``put`` gives it to the reply once it has one."""
        said: CIMultiDict[str] = CIMultiDict()
        self.add(request, said)
        return said

    async def hook(self, request: web.Request, response: web.StreamResponse) -> None:
        self.add(request, response.headers)


def put(said: CIMultiDict[str], headers: CIMultiDict[str]) -> None:
    """``said`` (``ReplyHeaders.said``) in ``headers`` as ``add`` would have put it there:
    each replaces a header of its name, but Vary, a list, is added to (``Cors``). Where
    the gateway answers for CORS, the backend's own CORS headers go (``without_cors``)."""
    if hdrs.VARY in said:  # said only where the gateway's CORS is on and asked for
        without_cors(headers)
    for name, value in said.items():
        if name == hdrs.VARY:
            headers.add(name, value)
        else:
            headers[name] = value
