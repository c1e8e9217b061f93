"""What ``fairgate serve`` says before it serves: keys everybody knows or can guess, a port it
cannot have.

The shipped example policies carry keys that anyone who has read them can use: a gateway
started on one of them unchanged is open to the LAN. A short key (``1234``, ``alice``) is
open to whoever tries keys in turn: the gateway answers each wrong one at once. The warnings
are logged at start, where the admin looks when something is wrong, and cost nothing
afterwards.
"""

from __future__ import annotations

import errno
import hashlib
import socket
from collections.abc import Iterator

import structlog

from gateway.config import Policy

__all__ = [
    "EXAMPLE_KEYS",
    "SHORT_KEY",
    "example_keys_in",
    "listen_problem",
    "short_keys_in",
    "warn_about_weak_keys",
]

log = structlog.get_logger("fairgate")

EXAMPLE_KEYS = frozenset({"change-me-alice", "change-me-bob", "change-me-kids", "test"})
"""Every key written in the policy files under ``deploy/`` (``test`` as its sha256).

The files themselves are not installed with the package (the image ships the gateway alone),
so the list is kept here; ``tests/test_process.py`` checks it against those files."""

_BY_DIGEST = {hashlib.sha256(key.encode()).hexdigest(): key for key in EXAMPLE_KEYS}

SHORT_KEY = 12
"""A plain key with fewer characters is warned of as guessable (``fairgate keys new`` writes
46). A ``sha256:`` or ``env:`` key is held as a digest, whose key's length is unknown."""


def example_keys_in(policy: Policy) -> Iterator[tuple[str, str]]:
    """(user, example key) for each key of the policy that is one of the shipped examples,
    plain or ``sha256:`` (the policy holds an ``env:`` key as the digest of its value)."""
    for name, user in policy.users.items():
        for key in user.keys:
            example = _example(key)
            if example is not None:
                yield name, example


def _example(key: str) -> str | None:
    if key.startswith("sha256:"):
        return _BY_DIGEST.get(key.removeprefix("sha256:"))
    return key if key in EXAMPLE_KEYS else None


def short_keys_in(policy: Policy) -> Iterator[tuple[str, str]]:
    """(user, key) for each plain key of the policy shorter than ``SHORT_KEY``."""
    for name, user in policy.users.items():
        for key in user.keys:
            if not key.startswith("sha256:") and len(key) < SHORT_KEY:
                yield name, key


def warn_about_weak_keys(policy: Policy) -> None:
    for user, key in example_keys_in(policy):
        log.warning(
            "example_key",
            user=user,
            key=key,
            hint="this key is in Fairgate's shipped examples, so anyone may know it: "
            "replace it in the policy file",
        )
    for user, key in short_keys_in(policy):
        log.warning(
            "short_key",
            user=user,
            characters=len(key),
            hint=f"a key this short can be found by trying keys in turn: replace it "
            f"(fairgate keys new {user})",
        )


# What a failed bind means, for the errors a listening address commonly meets.
_BIND_ERRORS = {
    errno.EADDRINUSE: "address already in use",
    errno.EACCES: "permission denied (ports below 1024 need privileges)",
    errno.EADDRNOTAVAIL: "no such address on this machine",
}


def listen_problem(exc: OSError) -> str | None:
    """Why the listening socket could not be had, in a few words; None when ``exc`` is not
    a failure to bind (and should not be explained away as one)."""
    if isinstance(exc, socket.gaierror):
        return f"cannot resolve the host ({exc.strerror})"
    return _BIND_ERRORS.get(exc.errno or 0)
