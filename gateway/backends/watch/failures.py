"""What went wrong with a backend, in words an admin can act on.

aiohttp's exceptions print as reprs of connection keys (``ClientConnectorError(ConnectionKey(
host='127.0.0.1', port=11434, ...))``); the log, ``/status`` and the ``no_backend`` 503 say
instead what failed and what to check: ``connection refused - is Ollama running?``. (A plain
hyphen, not a dash: JSON log lines would show a dash as ``\u2014``.)
"""

from __future__ import annotations

import errno

import aiohttp

from gateway.config import BackendKind

__all__ = ["cause_of", "http_cause", "sentence"]

_SERVERS: dict[BackendKind, str] = {
    "ollama": "Ollama",
    "llamacpp": "llama-server",
    "llamacpp-router": "llama-server's router",
    "openai": "the server",
}


def cause_of(exc: BaseException, kind: BackendKind, within: float) -> str:
    """A short phrase for a request to a backend of ``kind`` that raised ``exc``."""
    server = _SERVERS.get(kind, "the server")
    if isinstance(exc, aiohttp.ClientConnectorDNSError):
        return f"cannot resolve the host {exc.host} - is the name right?"
    if isinstance(exc, aiohttp.ClientConnectorError):
        if _refused(exc.os_error):
            return f"connection refused - is {server} running?"
        return f"cannot connect ({exc.os_error.strerror or exc.os_error}) - is {server} running?"
    if isinstance(exc, TimeoutError):
        return f"no answer within {within:g}s - is {server} stuck, or the address wrong?"
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return f"closed the connection without answering - is it {server}?"
    if isinstance(exc, aiohttp.InvalidURL):  # a ValueError too, but nothing was asked
        return f"its address is no URL a request can go to ({exc}) - check url: in the policy"
    if isinstance(exc, ValueError):
        return f"answered with something that is not JSON - is it {server}?"
    return f"{type(exc).__name__}: {exc}"


def _refused(error: OSError) -> bool:
    if error.errno == errno.ECONNREFUSED:
        return True
    # A name with several addresses (localhost: ::1 and 127.0.0.1) that all refused comes
    # back as one OSError("Multiple exceptions: ...") without an errno (asyncio's
    # base_events.create_connection).
    return error.errno is None and f"[Errno {errno.ECONNREFUSED}]" in str(error)


def http_cause(path: str, status: int, text: str, kind: BackendKind) -> str:
    """A probe answered with another status than 200: which request, what it said."""
    said = " ".join(text.split())[:200]
    cause = f"GET {path} answered HTTP {status}" + (f": {said}" if said else "")
    if status == 404:  # a server of another kind answers some other set of paths
        cause += f" - is it {_SERVERS.get(kind, 'the server')} (kind: {kind})?"
    return cause


def sentence(name: str, url: str, cause: str) -> str:
    """``backend gpu at http://127.0.0.1:11434: connection refused - is Ollama running?``"""
    return f"backend {name} at {url}: {cause}"
