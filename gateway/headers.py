"""Which headers cross the gateway, in each direction.

RFC 9110 section 7.6.1 (hop-by-hop headers), plus what must not cross the gateway: the
client's credentials, and lengths and encodings that the two separate connections settle
for themselves.
"""

from __future__ import annotations

import aiohttp
from multidict import CIMultiDict, CIMultiDictProxy

__all__ = ["forwarded_headers", "returned_headers"]

_NOT_FORWARDED = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
        "accept-encoding",
        "authorization",
        "x-api-key",
        "cookie",
    }
)
_NOT_RETURNED = _NOT_FORWARDED | {"server", "date", "set-cookie"}


def forwarded_headers(headers: CIMultiDictProxy[str]) -> CIMultiDict[str]:
    forwarded = CIMultiDict((k, v) for k, v in headers.items() if k.lower() not in _NOT_FORWARDED)
    # Uncompressed replies keep the relay byte-faithful and the final counts readable.
    forwarded["Accept-Encoding"] = "identity"
    return forwarded


def returned_headers(upstream: aiohttp.ClientResponse) -> CIMultiDict[str]:
    return CIMultiDict(
        (k, v) for k, v in upstream.headers.items() if k.lower() not in _NOT_RETURNED
    )
