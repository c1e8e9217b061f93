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
from dataclasses import dataclass

import structlog

from gateway.config import Policy

__all__ = [
    "EXAMPLE_KEYS",
    "SHORT_KEY",
    "WeakKey",
    "listen_problem",
    "warn_about_weak_keys",
    "weak_keys",
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


@dataclass(frozen=True, slots=True)
class WeakKey:
    """A key of the policy that others may know or guess, said the same by serve's log and
    by check-config."""

    user: str
    event: str  # the log's word: example_key, short_key
    why: str  # what is wrong with it, and the fix
    example: str | None = None  # the shipped key it is, which anyone may read anyway


def weak_keys(policy: Policy) -> Iterator[WeakKey]:
    """Each key of the policy that is one of the shipped examples (plain or ``sha256:``; the
    policy holds an ``env:`` key as the digest of its value), or a plain key shorter than
    ``SHORT_KEY``."""
    for name, user in policy.users.items():
        fix = f"replace it (fairgate keys new {name})"
        for key in user.keys:
            if (example := _example(key)) is not None:
                why = f"the key {example!r} is one of Fairgate's shipped examples, so anyone "
                yield WeakKey(name, "example_key", f"{why}may know it: {fix}", example)
            elif not key.startswith("sha256:") and len(key) < SHORT_KEY:
                why = f"a key of {len(key)} characters can be found by trying keys in turn"
                yield WeakKey(name, "short_key", f"{why}: {fix}")


def _example(key: str) -> str | None:
    if key.startswith("sha256:"):
        return _BY_DIGEST.get(key.removeprefix("sha256:"))
    return key if key in EXAMPLE_KEYS else None


def warn_about_weak_keys(policy: Policy) -> None:
    for weak in weak_keys(policy):
        shown = {"key": weak.example} if weak.example else {}
        log.warning(weak.event, user=weak.user, hint=weak.why, **shown)


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
