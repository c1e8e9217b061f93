"""Which headers cross the gateway, in each direction.

RFC 9110 section 7.6.1 (hop-by-hop headers, and every header the Connection header names),
plus what must not cross the gateway: the client's credentials, ``Expect`` (the gateway
answers it), the client's claims of where it is (``X-Forwarded-For``, ``Forwarded``,
``X-Real-IP``: the gateway judges them, ``edge/forwarded.py``, and a backend must not take a
client's word for the gateway's), and lengths and encodings that the two separate
connections settle for themselves. aiohttp hands the handler a body already
decompressed, so the client's ``Content-Encoding`` no longer describes the bytes forwarded.
"""

from __future__ import annotations

from functools import lru_cache

from multidict import CIMultiDict, CIMultiDictProxy

__all__ = ["NO_STORE", "decoded", "forwarded_headers", "returned_pairs"]

# On a reply that is one caller's (their page, the models they may use) or the admin's (the
# gateway's state): no cache between the gateway and the browser keeps it, nor the browser.
NO_STORE = {"Cache-Control": "no-store"}

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
        "x-forwarded-for",
        "forwarded",
        "x-real-ip",
    }
)
_NOT_RETURNED = _NOT_FORWARDED | {"server", "date", "set-cookie"}
_NOT_FORWARDED_NOR_ORIGIN = _NOT_FORWARDED | {"origin"}
_NOT_RETURNED_RAW = frozenset(name.encode() for name in _NOT_RETURNED)


def forwarded_headers(
    headers: CIMultiDictProxy[str], keep_origin: bool = True
) -> list[tuple[str, str]]:
    """The request's headers that go on to the backend, as pairs: the backend client writes
    them into the head as they are (a CIMultiDict made of them would be one more copy on
    every request's path).
    Without ``keep_origin``, a browser's Origin stays here too (the gateway answers for
    CORS: Ollama would refuse every origin its own OLLAMA_ORIGINS does not list)."""
    dropped = _dropped(_NOT_FORWARDED if keep_origin else _NOT_FORWARDED_NOR_ORIGIN, headers)
    forwarded = [(k, v) for k, v in headers.items() if k.lower() not in dropped]
    # Uncompressed replies keep the relay byte-faithful and the final counts readable
    # (Accept-Encoding itself is dropped above: this is the one).
    forwarded.append(("Accept-Encoding", "identity"))
    return forwarded


def returned_pairs(raw: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """The reply's headers that go on to the client, as the backend sent them: a relayed
    head of the gateway's making writes them as they came, aiohttp's prepare is given them
    ``decoded`` (relay/client_reply.py). A value that is not UTF-8 stays behind: aiohttp's
    writer would drop its odd bytes (or, without its C extensions, fail the reply), so the
    two ways of writing a head would differ; no backend of ours sends one."""
    dropped = _NOT_RETURNED_RAW
    for name, value in raw:
        if name.lower() == b"connection":
            named = {
                item.encode("latin-1") for item in _named_by_connection(value.decode("latin-1"))
            }
            dropped = dropped | named
    return [
        (name, value)
        for name, value in raw
        if name.lower() not in dropped and (value.isascii() or _is_utf8(value))
    ]


def _is_utf8(value: bytes) -> bool:
    try:
        value.decode()
    except UnicodeDecodeError:
        return False
    return True


def decoded(raw: list[tuple[bytes, bytes]]) -> list[tuple[str, str]]:
    """Header bytes as text: UTF-8, any other byte kept (surrogateescape), so that a
    backend's odd header can still be read (``Reply.headers``); ``returned_pairs`` passes
    no such value on."""
    return [
        (name.decode("utf-8", "surrogateescape"), value.decode("utf-8", "surrogateescape"))
        for name, value in raw
    ]


def _dropped(
    always: frozenset[str], headers: CIMultiDict[str] | CIMultiDictProxy[str]
) -> frozenset[str]:
    """``always``, and the headers a Connection header names: they were meant for this hop
    only. Mostly it names none but itself (``keep-alive``, ``close``): ``always`` as it is."""
    dropped = always
    for value in headers.getall("Connection", ()):
        named = _named_by_connection(value)
        if not named <= dropped:
            dropped = dropped | named
    return dropped


@lru_cache(maxsize=64)
def _named_by_connection(value: str) -> frozenset[str]:
    """The header names one Connection header lists (a client sends the same few values,
    each split once)."""
    return frozenset(name.strip().lower() for name in value.split(",") if name.strip())
