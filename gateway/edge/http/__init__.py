"""The client side as aiohttp serves it: connections and their cap, the connection handler
and the hot routes, the access-log middleware (where a refusal becomes HTTP), the headers in
both directions, CORS, and reading a request's body.

One of the two packages that may touch aiohttp's private modules (the relay is the other).

May import: ``edge``, ``config``, ``wire``, ``core``.
"""

from gateway.edge.http.access_log import RECORD, access_log, error_response
from gateway.edge.http.connections import Connections, Listener
from gateway.edge.http.cors import Cors
from gateway.edge.http.headers import NO_STORE, decoded, forwarded_headers, returned_pairs
from gateway.edge.http.hot_routes import HOT_PATHS
from gateway.edge.http.reply_headers import ReplyHeaders, put
from gateway.edge.http.request_body import body_size, defer_continue, read_body

__all__ = [
    "HOT_PATHS",
    "NO_STORE",
    "RECORD",
    "Connections",
    "Cors",
    "Listener",
    "ReplyHeaders",
    "access_log",
    "body_size",
    "decoded",
    "defer_continue",
    "error_response",
    "forwarded_headers",
    "put",
    "read_body",
    "returned_pairs",
]
