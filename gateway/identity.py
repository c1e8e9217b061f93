"""Who is asking: an API key (bearer, basic-auth password or X-API-Key), else the client address.

Keys are held as SHA-256 digests and the digest of what the client sent is compared with every
one of them in constant time, so neither the timing of a refusal nor a log line gives a key away.

An address (``clients:``) or an open gateway is authority a browser carries to every page it
opens: a page on any site can send a POST without a preflight (``Content-Type: text/plain``)
and run a chat as the household member whose machine it is, on their budget, though it cannot
read the reply. A request that a page on another origin sent (its browser says so in
``Origin``) is therefore refused with 403 ``origin_forbidden`` unless it carries a key or the
policy lists that origin (``cors.origins``), as Ollama refuses an origin it does not list;
extensions' and apps' own schemes are left to the backend, as before. A page on the
gateway's own host name is no exception: a site can rebind its name to the gateway's
address (DNS rebinding), and the gateway's own pages only read, which sends no Origin.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
from collections.abc import Mapping
from dataclasses import dataclass

import structlog

from gateway.errors import GatewayError
from gateway.forwarded import Address, ProxyTrust, address_of
from gateway.policy import Policy
from gateway.user_policy import ANONYMOUS, PERSON_SEPARATOR
from gateway.vocabulary import Reason

__all__ = ["Caller", "Directory"]

log = structlog.get_logger("fairgate.identity")

_ANONYMOUS_CREDENTIAL = "anonymous"
_MAX_PERSON = 200  # characters of a person's name from a front end's header
_ORIGIN_LOGGED = 200  # characters of a refused Origin header written to the log
# The origins a web page can have: a site's, or "null" (a sandboxed frame, a file, a data: URL).
_PAGE_SCHEMES = ("http://", "https://")
_OPAQUE_ORIGIN = "null"


@dataclass(frozen=True, slots=True)
class Caller:
    """Who is asking, and by which credential: ``key:<sha256 hex>``, ``client:<address>``
    or ``anonymous``; a later policy admits the same credential, or no longer does."""

    user: str
    credential: str


@dataclass(frozen=True, slots=True)
class _ClientRule:
    network: object  # IPv4Network | IPv6Network; typed loosely for the `in` test
    prefix: int
    user: str


_ANONYMOUS_CALLER = Caller(ANONYMOUS, _ANONYMOUS_CREDENTIAL)  # a value: one for every request


class Directory:
    """Resolves a request's credentials to a user name, built once per policy version."""

    def __init__(self, policy: Policy) -> None:
        # Each key's digest and the Caller it makes, built once: the same for each request.
        self._digests: list[tuple[bytes, Caller]] = []
        rules: list[_ClientRule] = []
        for name, user in policy.users.items():
            digests = map(_digest_of_configured, user.keys)
            self._digests += [(digest, Caller(name, "key:" + digest.hex())) for digest in digests]
            rules += [_ClientRule(net, net.prefixlen, name) for net in user.clients]
        # The most specific range wins: a /32 for the TV beats a /24 for the whole LAN.
        self._client_rules = sorted(rules, key=lambda rule: -rule.prefix)
        self._open = not policy.users
        self._anonymous = self._open or ANONYMOUS in policy.users
        self._names = frozenset(policy.users)
        self.admins = frozenset(name for name, user in policy.users.items() if user.admin)
        # Where requests come from, behind the proxies this policy trusts.
        self.proxies = ProxyTrust(policy.trusted_proxies, policy.forwarded_header)
        # Front ends that name the person they act for, and the header they name them in.
        self._on_behalf = {
            name: user.on_behalf.header
            for name, user in policy.users.items()
            if user.on_behalf is not None
        }
        self._origins = frozenset(policy.cors.origins)

    def identify(self, headers: Mapping[str, str], address: Address | None) -> Caller:
        """Who is asking, or GatewayError 401 when the request cannot be attributed."""
        key, named = _presented_key(headers)
        if key is not None:
            # surrogateescape: the header's bytes as sent, even when they are not UTF-8.
            digest = hashlib.sha256(key.encode("utf-8", "surrogateescape")).digest()
            found = self._caller_of_digest(digest)
            if found is not None:
                if named in self._names and named != found.user:
                    # http://bob:ALICEKEY@host must not run as alice: a name that is a
                    # user's is checked; any other name is a label, as clients need one.
                    raise GatewayError(
                        401, Reason.UNAUTHORIZED, "the user name and key do not match"
                    )
                if found.user not in self._on_behalf:
                    return found
                return Caller(self._person(found.user, headers), found.credential)
            if self._open:
                return self._unless_a_page_elsewhere(_ANONYMOUS_CALLER, headers)
            raise GatewayError(401, Reason.UNAUTHORIZED, "unknown API key")
        user = self._user_of_address(address)
        if user is not None:
            return self._unless_a_page_elsewhere(Caller(user, f"client:{address}"), headers)
        if self._anonymous:
            return self._unless_a_page_elsewhere(_ANONYMOUS_CALLER, headers)
        # Say how to pass a key and where keys come from: the first curl of a new admin
        # lands here, and the example policy's key is easy to find once that is said.
        raise GatewayError(
            401,
            Reason.UNAUTHORIZED,
            "an API key is required: send Authorization: Bearer KEY "
            "(the keys are under users: in the gateway's policy file)",
        )

    def _unless_a_page_elsewhere(self, caller: Caller, headers: Mapping[str, str]) -> Caller:
        """``caller``, known without a key, unless a web page on an origin the policy does
        not list sent the request (see the module's note): then 403."""
        origin = headers.get("Origin")
        if origin is None or origin in self._origins:
            return caller
        if origin != _OPAQUE_ORIGIN and not origin.startswith(_PAGE_SCHEMES):
            return caller  # an extension's or app's own scheme
        # Not even a page whose origin names the Host asked for: a site can rebind its own
        # name to the gateway's address (DNS rebinding) and pass for the gateway's page. The
        # gateway's own pages send no Origin (GETs only).
        log.warning("origin_forbidden", origin=origin[:_ORIGIN_LOGGED], user=caller.user)
        raise GatewayError(
            403,
            Reason.ORIGIN_FORBIDDEN,
            f"a page on {origin[:_ORIGIN_LOGGED]!r} cannot use the gateway without a key: "
            "list its origin under cors.origins to let it",
        )

    def admits(self, user: str, credential: str) -> bool:
        """Whether this policy still lets ``credential`` in as ``user`` (after a reload)."""
        kind, _, value = credential.partition(":")
        if kind == "key":
            found = self._caller_of_digest(bytes.fromhex(value))
            owner = None if found is None else found.user
            return owner is not None and (
                owner == user
                or (owner in self._on_behalf and user.startswith(owner + PERSON_SEPARATOR))
            )
        if kind == "client":
            return self._user_of_address(address_of(value)) == user
        return self._anonymous and user == ANONYMOUS

    def _person(self, user: str, headers: Mapping[str, str]) -> str:
        """``user``, or for a front end that names the person it acts for, that person as a
        user of their own: ``owui/alice@example.com``. Only a front end's own key is trusted
        with the header; from anyone else it means nothing."""
        header = self._on_behalf.get(user)
        person = headers.get(header, "").strip() if header is not None else ""
        if not person:
            return user
        if len(person) > _MAX_PERSON or not person.isprintable():
            raise GatewayError(
                400,
                Reason.BAD_REQUEST,
                f"the {header} header must name a person in at most {_MAX_PERSON} "
                "printable characters",
            )
        return f"{user}{PERSON_SEPARATOR}{person}"

    def _caller_of_digest(self, digest: bytes) -> Caller | None:
        caller = None
        for known, holder in self._digests:  # no early exit: the time taken says nothing
            if hmac.compare_digest(known, digest):
                caller = holder
        return caller

    def _user_of_address(self, address: Address | None) -> str | None:
        if address is not None:
            for rule in self._client_rules:
                if address in rule.network:  # type: ignore[operator]
                    return rule.user
        return None


def _digest_of_configured(key: str) -> bytes:
    if key.startswith("sha256:"):
        return bytes.fromhex(key[7:])
    if key.startswith("env:"):
        key = os.environ.get(key[4:], "")
    return hashlib.sha256(key.encode()).digest()


def _presented_key(headers: Mapping[str, str]) -> tuple[str | None, str | None]:
    """The key a request carries, and the user name that came with it (basic auth), if any."""
    authorization = headers.get("Authorization")
    if authorization is not None:
        scheme, _, value = authorization.partition(" ")
        scheme, value = scheme.lower(), value.strip()
        if scheme == "bearer" and value:
            return value, None
        if scheme == "basic" and value:
            return _basic_credentials(value)
    api_key = headers.get("X-API-Key", "").strip()
    return api_key or None, None


def _basic_credentials(value: str) -> tuple[str | None, str | None]:
    """http://alice:KEY@host sends alice:KEY; the password is the key. http://KEY@host sends
    KEY: with no password (curl, browsers), and then the user part is the key."""
    try:
        decoded = base64.b64decode(value, validate=True).decode()
    except (ValueError, UnicodeDecodeError):
        raise GatewayError(401, Reason.UNAUTHORIZED, "malformed basic credentials") from None
    name, _, password = decoded.partition(":")
    if password:
        return password, name or None
    return name or None, None
