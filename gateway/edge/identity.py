"""Who is asking: an API key (bearer, basic-auth password or X-API-Key), else the client address.

Keys are held as SHA-256 digests and the digest of what the client sent is compared with every
one of them in constant time, so neither the timing of a refusal nor a log line gives a key away.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gateway.config import (
    ANONYMOUS,
    BACKGROUND_ACCOUNT,
    PERSON_SEPARATOR,
    TOGETHER_ACCOUNT,
    Policy,
)
from gateway.core import GatewayError, Reason
from gateway.edge.forwarded import Address, ProxyTrust, address_of

if TYPE_CHECKING:  # the core loads without the web stack (test_vocabulary)
    from multidict import MultiMapping

__all__ = ["Caller", "Directory"]

_ANONYMOUS_CREDENTIAL = "anonymous"
_KEY_CREDENTIAL = "key:"  # then the key's SHA-256 digest, in hex
_MAX_PERSON = 200  # characters of a person's name from a front end's header
# Accounts of a front end's own, never a person's: its background work, its people's sum.
_ACCOUNTS = frozenset({BACKGROUND_ACCOUNT, TOGETHER_ACCOUNT})


@dataclass(frozen=True, slots=True)
class Caller:
    """Who is asking, and by which credential: ``key:<sha256 hex>``, ``client:<address>``
    or ``anonymous``; a later policy admits the same credential, or no longer does."""

    user: str
    credential: str

    @property
    def by_key(self) -> bool:
        """Known by a key it sent, not by where it comes from (an address, or anyone): a
        browser adds no key of its own to a page's request (``edge/http/cors.py``)."""
        return self.credential.startswith(_KEY_CREDENTIAL)


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
            self._digests += [
                (digest, Caller(name, _KEY_CREDENTIAL + digest.hex())) for digest in digests
            ]
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

    def identify(self, headers: MultiMapping[str], address: Address | None) -> Caller:
        """Who is asking, or GatewayError 401 when the request cannot be attributed."""
        key, named = _presented_key(headers)
        if key is not None:
            found = self._caller_of_digest(_digest_of_presented(key))
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
                return _ANONYMOUS_CALLER
            raise GatewayError(
                401,
                Reason.UNAUTHORIZED,
                "unknown API key: no user of the gateway's policy file has it (keys are "
                "under users:, as written or as its sha256: digest, which `echo KEY | fairgate "
                "keys hash` prints)",
            )
        user = self._user_of_address(address)
        if user is not None:
            return Caller(user, f"client:{address}")
        if self._anonymous:
            return _ANONYMOUS_CALLER
        # Say how to pass a key and where keys come from: the first curl of a new admin
        # lands here, and the example policy's key is easy to find once that is said.
        raise GatewayError(
            401,
            Reason.UNAUTHORIZED,
            "an API key is required: send Authorization: Bearer KEY "
            "(the keys are under users: in the gateway's policy file)",
        )

    def holds_key(self, headers: MultiMapping[str]) -> bool:
        """Whether a request carries a user's key (``/metrics`` asks no more of it)."""
        key, _ = _presented_key(headers)
        return key is not None and self._caller_of_digest(_digest_of_presented(key)) is not None

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

    def _person(self, user: str, headers: MultiMapping[str]) -> str:
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
        if person in _ACCOUNTS:  # a person named so would spend the front end's work's
            raise GatewayError(400, Reason.BAD_REQUEST, f"{person} is not a person's name")
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


def _digest_of_presented(key: str) -> bytes:
    # surrogateescape: the header's bytes as sent, even when they are not UTF-8.
    return hashlib.sha256(key.encode("utf-8", "surrogateescape")).digest()


def _digest_of_configured(key: str) -> bytes:
    if key.startswith("sha256:"):
        return bytes.fromhex(key[7:])
    if key.startswith("env:"):
        key = os.environ.get(key[4:], "")
    return hashlib.sha256(key.encode()).digest()


def _presented_key(headers: MultiMapping[str]) -> tuple[str | None, str | None]:
    """The key a request carries, and the user name that came with it (basic auth), if any.

    A key in ``Authorization`` and another in ``X-API-Key`` (Anthropic's SDK sends that one,
    Claude Code the bearer) is a 401: whichever were checked, something on the way (a
    proxy, a backend) could act on the other. So are two different values of one of them."""
    api_key = _single(headers, "X-API-Key")
    authorization = _single(headers, "Authorization")
    if authorization is not None:
        scheme, _, value = authorization.partition(" ")
        scheme, value = scheme.lower(), value.strip()
        found: tuple[str | None, str | None] = (None, None)
        if scheme == "bearer" and value:
            found = value, None
        elif scheme == "basic" and value:
            found = _basic_credentials(value)
        if found[0] is not None:
            if api_key is not None and api_key.strip() not in ("", found[0]):
                raise GatewayError(
                    401,
                    Reason.UNAUTHORIZED,
                    "the request carries two different keys (Authorization and X-API-Key): "
                    "send one",
                )
            return found
    api_key = (api_key or "").strip()
    return api_key or None, None


def _single(headers: MultiMapping[str], name: str) -> str | None:
    """The one value of header ``name``, or None. Sent twice with the same value, it is one
    key; with different values it is a 401, as a parser that keeps the last (or joins them)
    would act on another key than the one checked here, which is the first."""
    values = headers.getall(name, ())
    if len(values) < 2:  # nearly every request: no generator nor set on its path
        return values[0] if values else None
    if len({value.strip() for value in values}) > 1:
        raise GatewayError(
            401,
            Reason.UNAUTHORIZED,
            f"the request carries two different {name} headers: send one key",
        )
    return values[0]


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
