"""Bodies on their way: each user's requests past the quick refusal that are still reading
their bodies, how many and how many bytes.

A body arrives as slowly as its client sends it (up to ``FAIRGATE_BODY_TIMEOUT``), and
until it has arrived the gateway holds what came of it. Counted as the user's waiting
requests (``turns.refuses_unseen``), a user cannot have more read at once than they could
hold; bounded in bytes, a user's bodies together hold no more memory than one body of the
largest size (``FAIRGATE_MAX_BODY_BYTES``), so many big bodies sent slowly by one user are
refused from their headers rather than read side by side.
"""

from __future__ import annotations

from collections import Counter

from gateway.admission.slot_ledger import decrement, increment
from gateway.core import GatewayError, Reason

__all__ = ["Arriving", "ArrivingBodies"]

_MIB = 1024 * 1024


class ArrivingBodies:
    """By user: the bodies being read, and the bytes they may come to."""

    def __init__(self) -> None:
        self.count: Counter[str] = Counter()
        self.bytes: Counter[str] = Counter()


class Arriving:
    """``with``: a request of ``user`` reading a body of up to ``size`` bytes, counted while
    in the block; entering raises a 503 when the user's bodies on their way would pass
    ``bound`` bytes (one body of any size is always read)."""

    # A class rather than a generator-based context manager: every request enters one.
    __slots__ = ("_bodies", "_size", "_user")

    def __init__(self, bodies: ArrivingBodies, user: str, size: int, bound: int) -> None:
        self._bodies, self._user, self._size = bodies, user, size
        already = bodies.bytes.get(user, 0)
        if already and already + size > bound:
            raise GatewayError(
                503,
                Reason.USER_QUEUE_FULL,
                f"{already / _MIB:.1f} MiB of this user's other requests are still arriving, "
                f"and {size / _MIB:.1f} MiB more would pass {bound / _MIB:.0f} MiB; send "
                "it once they have",
                retry_after=1.0,
            )

    def __enter__(self) -> None:
        bodies, user = self._bodies, self._user
        increment(bodies.count, user)
        bodies.bytes[user] = bodies.bytes.get(user, 0) + self._size

    def __exit__(self, *exc_info: object) -> None:
        bodies, user = self._bodies, self._user
        decrement(bodies.count, user)
        left = bodies.bytes[user] - self._size
        if left > 0:
            bodies.bytes[user] = left
        else:
            del bodies.bytes[user]
