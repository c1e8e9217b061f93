"""What ``fairgate serve`` says before it serves: keys everybody knows, a port it cannot have.

The shipped example policies carry keys that anyone who has read them can use: a gateway
started on one of them unchanged is open to the LAN. The warning is logged at start, where
the admin looks when something is wrong, and costs nothing afterwards.
"""

from __future__ import annotations

import errno
import hashlib
import socket
from collections.abc import Iterator

import structlog

from gateway.config import Policy

__all__ = ["EXAMPLE_KEYS", "example_keys_in", "listen_problem", "warn_about_example_keys"]

log = structlog.get_logger("fairgate")

EXAMPLE_KEYS = frozenset({"change-me-alice", "change-me-bob", "change-me-kids", "test"})
"""Every key written in the policy files under ``deploy/`` (``test`` as its sha256).

The files themselves are not installed with the package (the image ships the gateway alone),
so the list is kept here; ``tests/test_process.py`` checks it against those files."""

_BY_DIGEST = {hashlib.sha256(key.encode()).hexdigest(): key for key in EXAMPLE_KEYS}


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


def warn_about_example_keys(policy: Policy) -> None:
    for user, key in example_keys_in(policy):
        log.warning(
            "example_key",
            user=user,
            key=key,
            hint="this key is in Fairgate's shipped examples, so anyone may know it: "
            "replace it in the policy file",
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
