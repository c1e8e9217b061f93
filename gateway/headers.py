"""Which headers cross the gateway, in each direction.

RFC 9110 section 7.6.1 (hop-by-hop headers, and every header the Connection header names),
plus what must not cross the gateway: the client's credentials, ``Expect`` (the gateway
answers it), and lengths and encodings that the two separate connections settle for
themselves. aiohttp hands the handler a body already decompressed, so the client's
``Content-Encoding`` no longer describes the bytes forwarded.
"""

from __future__ import annotations

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
        "expect",
        "content-encoding",
    }
)
_NOT_RETURNED = _NOT_FORWARDED | {"server", "date", "set-cookie"}


def forwarded_headers(headers: CIMultiDictProxy[str]) -> CIMultiDict[str]:
    dropped = _NOT_FORWARDED | _named_by_connection(headers)
    forwarded = CIMultiDict((k, v) for k, v in headers.items() if k.lower() not in dropped)
    # Uncompressed replies keep the relay byte-faithful and the final counts readable.
    forwarded["Accept-Encoding"] = "identity"
    return forwarded


def returned_headers(upstream: CIMultiDict[str]) -> CIMultiDict[str]:
    dropped = _NOT_RETURNED | _named_by_connection(upstream)
    return CIMultiDict((k, v) for k, v in upstream.items() if k.lower() not in dropped)


def _named_by_connection(headers: CIMultiDict[str] | CIMultiDictProxy[str]) -> frozenset[str]:
    """The headers a Connection header names: they were meant for this hop only."""
    return frozenset(
        name.strip().lower()
        for value in headers.getall("Connection", ())
        for name in value.split(",")
        if name.strip()
    )
