"""The names the gateway answers to for a request without a key: the defence against DNS
rebinding.

A site a household member opens can point its own name at the gateway's address once the
page has loaded (DNS rebinding). The page's requests then go to the gateway as requests to
the site itself: same origin, so a read carries no ``Origin`` (``edge/http/cors.py`` refuses a write
from a page without a key by the ``Origin`` it carries) and the page reads the reply. A key
is something such a page does not have. An address (``clients:``), this machine's loopback
(``/status``, the house page), an open gateway (no users) and ``/metrics`` are what its
browser carries. So a request without a key is answered only when its ``Host`` names the
gateway in a way no outside site can: an IP address, ``localhost``, a name of one label
(``gpubox``, a compose service), a name under a suffix kept for local networks, or a name
the policy lists under ``hosts:`` (the public name a TLS proxy in front passes on). Any other
is refused with 403 ``host_forbidden``, which says where to list it. Ollama refuses such
names the same way on loopback (``allowedHostsMiddleware`` in its server/routes.go).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from functools import lru_cache

import structlog

from gateway.config import ANY_HOST, is_host_name
from gateway.core import GatewayError, Reason, printable

__all__ = ["names_gateway", "refuse_unknown_host"]

log = structlog.get_logger("fairgate.hosts")

# Suffixes no public DNS name can have: RFC 6761 (localhost), RFC 6762 (local, mDNS),
# RFC 8375 (home.arpa), ICANN's private-use internal, and what home routers name hosts.
_LOCAL_SUFFIXES = (".localhost", ".local", ".home.arpa", ".internal", ".lan", ".localdomain")
_HOST = "Host"  # looked up in a case-insensitive mapping (the request's headers)
_LOGGED = 100  # characters of a refused name kept for the log and the error


def names_gateway(headers: Mapping[str, str], listed: tuple[str, ...]) -> bool:
    """Whether a request's ``Host`` is a name the gateway answers to without a key."""
    host = headers.get(_HOST, "").strip()
    return not host or answers_to(host, listed)  # no name (HTTP/1.0): nothing to rebind


def refuse_unknown_host(headers: Mapping[str, str], listed: tuple[str, ...]) -> None:
    """403 ``host_forbidden`` for a request (without a key: the caller's to know) whose
    ``Host`` is not a name the gateway answers to (see the module's note)."""
    if names_gateway(headers, listed):
        return
    shown = printable(headers[_HOST].strip()[:_LOGGED])
    log.warning("host_forbidden", host=shown)
    raise GatewayError(
        403,
        Reason.HOST_FORBIDDEN,
        f"the gateway does not answer to {shown!r} without a key: a site can take that name "
        "for its own (DNS rebinding); list it under hosts: in the policy if it is the gateway's",
    )


@lru_cache(maxsize=256)  # a few names a household uses; a flood of others only evicts
def answers_to(host: str, listed: tuple[str, ...]) -> bool:
    """Whether a ``Host`` header (``name[:port]``, ``[v6]:port``) names the gateway."""
    if ANY_HOST in listed:
        return True
    name = _name_of(host)
    if name is None:
        return False
    if _is_address(name) or "." not in name or name == "localhost":
        return True
    if name.endswith(_LOCAL_SUFFIXES):
        return True
    return any(_matches(name, entry) for entry in listed)


def _name_of(host: str) -> str | None:
    """The name of a Host header, lower case, without its port or a trailing dot; None
    for one that is not ``name[:port]`` or ``[address][:port]``."""
    host = host.strip().lower()
    if host.startswith("["):
        address, bracket, port = host[1:].partition("]")
        if not bracket or (port and (port[0] != ":" or not port[1:].isdigit())):
            return None
        return address if _is_address(address) else None
    name, colon, port = host.partition(":")
    if colon and not port.isdigit():
        return None
    name = name.rstrip(".")
    return name if is_host_name(name) else None


def _is_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def _matches(name: str, entry: str) -> bool:
    if entry.startswith("*."):
        return name.endswith(entry[1:])
    return name == entry
