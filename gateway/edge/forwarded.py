"""Where a request comes from, when a reverse proxy (Caddy, nginx, Traefik for TLS) is in front.

Behind a proxy every connection comes from the proxy. The proxy says who its client was in a
header (``X-Forwarded-For``, or RFC 7239's ``Forwarded``), but a client can send that header
too, and proxies append to what they received rather than replace it. So the header is read
only when the connection comes from a proxy the policy trusts (``trusted_proxies:``), and then
from the right: each hop written by a trusted proxy is skipped, and the first hop that is not
a trusted proxy is the client. Anything to its left is whatever the client chose to send.

Only the header the admin names (``forwarded_header:``) is read: a proxy that writes one of
them passes the other through as the client sent it. A hop that names no address
(``unknown``, an obfuscated ``_id``, garbage) makes the client unknown: it then matches no
``clients:`` range and is not loopback.

Pure: no aiohttp, so the core stays free of the web framework.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network, ip_address
from typing import Protocol

from gateway.config import ForwardedHeader

__all__ = ["FORWARDING_HEADERS", "Client", "ProxyTrust", "address_of"]

Address = IPv4Address | IPv6Address
Network = IPv4Network | IPv6Network

FORWARDING_HEADERS = ("X-Forwarded-For", "Forwarded", "X-Real-IP")
"""Headers by which some proxy says it forwards for someone else."""


@dataclass(frozen=True, slots=True)
class Client:
    """Who the gateway believes the client is."""

    address: Address | None  # None: not an IP peer, or a trusted proxy could not say
    proxy: Address | None = None  # the trusted proxy the address came through, if any
    # Forwarding headers from a peer the policy does not trust: some proxy is in front that
    # the admin has not named, and its clients could be anywhere.
    unknown_proxy: bool = False

    @property
    def is_local(self) -> bool:
        """On this machine: a loopback address that no unnamed proxy stands in for."""
        return self.address is not None and self.address.is_loopback and not self.unknown_proxy

    def __str__(self) -> str:
        return "unknown" if self.address is None else str(self.address)


class ProxyTrust:
    """The proxies one policy trusts and the header they write, applied to each request."""

    def __init__(self, trusted: Sequence[Network], header: ForwardedHeader) -> None:
        self._trusted = tuple(trusted)
        self._header = header

    def client_of(self, peer: str | None, headers: _Headers) -> Client:
        """The client of a request that came over a connection from ``peer``."""
        # With no proxy trusted (a household's usual policy) the peer is the client,
        # whatever its address: not read here.
        address = address_of(peer) if self._trusted else None
        if address is None or not self._trusts(address):
            # Ignored, not believed: said only to keep an unnamed proxy's clients off loopback.
            return _peer_client(peer, _forwarding(headers))
        proxy = address
        values = headers.getall(self._header, [])
        for hop in reversed(_hops(values, self._header)):
            address = address_of(hop)
            if not self._trusts(address):
                break  # the first hop no trusted proxy wrote: the client (None if unreadable)
        return Client(address, proxy=proxy if address != proxy else None)

    def _trusts(self, address: Address | None) -> bool:
        if address is None or not self._trusted:  # no proxy in front: the common case
            return False
        return any(address in network for network in self._trusted)


class _Headers(Protocol):
    """What is read of a request's headers (aiohttp's CIMultiDictProxy is one)."""

    def __contains__(self, name: object, /) -> bool: ...
    def getall(self, name: str, default: list[str], /) -> list[str]: ...


@lru_cache(maxsize=4096)  # the same few peers and hops, request after request
def address_of(text: str | None) -> Address | None:
    """The IP address in a peer or a hop, without port, brackets or quotes; an IPv4-mapped
    IPv6 address (a dual-stack socket) as IPv4; None when there is none."""
    if not text:
        return None
    text = text.strip().strip('"')
    if text.startswith("["):  # [2001:db8::1]:4711
        text = text[1:].partition("]")[0]
    elif text.count(":") == 1:  # 192.0.2.60:4711
        text = text.partition(":")[0]
    try:
        address = ip_address(text)
    except ValueError:
        return None
    if isinstance(address, IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _forwarding(headers: _Headers) -> bool:
    # A loop, not any(): no generator made for each request.
    for name in FORWARDING_HEADERS:  # noqa: SIM110
        if name in headers:
            return True
    return False


# A frozen value: one for each peer, not one for each request. Keyed by the peer's text: an
# address's own hash is computed in Python, each time.
@lru_cache(maxsize=4096)
def _peer_client(peer: str | None, unknown_proxy: bool) -> Client:
    return Client(address_of(peer), unknown_proxy=unknown_proxy)


def _hops(values: Iterable[str], header: ForwardedHeader) -> list[str]:
    """The hops of every line of the header, in order (several lines are one list, RFC 9110)."""
    values = list(values)
    if not values:
        return []  # not forwarded: the trusted peer's own request
    joined = ",".join(values)
    if header == "x-forwarded-for":
        return [hop.strip() for hop in joined.split(",")]  # an empty header names nobody
    return _forwarded_fors(joined) or _UNREADABLE


# RFC 7239: forwarded-pair = token "=" ( token / quoted-string ), pairs joined by ";",
# elements by ",", whitespace around either.
_PAIR = re.compile(
    r'[ \t]*([!#$%&\'*+.^_`|~0-9A-Za-z-]+)=([!#$%&\'*+.^_`|~0-9A-Za-z-]+|"(?:[^"\\]|\\.)*")[ \t]*'
)
_GAP = re.compile(r"[ \t,]*")  # before an element: blanks, and empty elements (allowed)
_UNREADABLE = [""]  # one hop that names nobody: the client is then unknown


def _forwarded_fors(value: str) -> list[str]:
    """The ``for=`` of each element of a ``Forwarded`` value. A value that does not parse
    names nobody: the client's part comes first, and a stray quote in it could otherwise
    swallow the proxy's own element and leave the client's hop as the last one."""
    fors: list[str] = []
    element: dict[str, str] = {}
    position = _GAP.match(value).end()  # type: ignore[union-attr]  # matches the empty string
    while position < len(value):
        pair = _PAIR.match(value, position)
        if pair is None or pair.group(1).lower() in element:
            return _UNREADABLE
        text = pair.group(2)
        quoted = text.startswith('"')
        element[pair.group(1).lower()] = re.sub(r"\\(.)", r"\1", text[1:-1]) if quoted else text
        position = pair.end()
        if position == len(value) or value[position] == ",":
            fors.append(element.get("for", ""))
            element = {}
            position = _GAP.match(value, position).end()  # type: ignore[union-attr]
        elif value[position] == ";":
            position += 1
        else:
            return _UNREADABLE
    if element:  # ended with a ";"
        fors.append(element.get("for", ""))
    return fors
