"""Bodies on their way: each user's requests past the quick refusal that are still reading
their bodies, how many and how many bytes.

A body arrives as slowly as its client sends it (up to ``FAIRGATE_BODY_TIMEOUT``), and
until it has arrived the gateway holds what came of it. Counted as the user's waiting
requests (``turns.refuses_unseen``; for a front end's people, as theirs together too), a
user cannot have more read at once than they could hold. Bounded in bytes by key (a front
end's people together: a header naming a new person each time gets no more), the bodies
of one key hold no more memory than one body of the largest size
(``FAIRGATE_MAX_BODY_BYTES``), so many big bodies sent slowly are refused from their
headers rather than read side by side.
"""

from __future__ import annotations

from gateway.admission.slot_ledger import decrement, increment
from gateway.config import key_of
from gateway.core import GatewayError, Reason

__all__ = ["Arriving", "ArrivingBodies"]

_MIB = 1024 * 1024


class ArrivingBodies:
    """The bodies being read by user, and by key (the front end of a person it names): how
    many, and the bytes they may come to."""

    def __init__(self) -> None:
        self.count: dict[str, int] = {}  # by user
        self.people: dict[str, int] = {}  # by front end: those of the people it names
        self.bytes: dict[str, int] = {}  # by key

    def together(self, front_end: str) -> int:
        """The bodies on their way with ``front_end``'s key: its people's and its own."""
        return self.people.get(front_end, 0) + self.count.get(front_end, 0)


class Arriving:
    """``with``: a request of ``user`` reading a body of up to ``size`` bytes, counted while
    in the block; entering raises a 503 when the bodies on their way with its key would
    pass ``bound`` bytes (one body of any size is always read)."""

    # A class rather than a generator-based context manager: every request enters one.
    __slots__ = ("_bodies", "_key", "_size", "_user")

    def __init__(self, bodies: ArrivingBodies, user: str, size: int, bound: int) -> None:
        self._bodies, self._user, self._size = bodies, user, size
        self._key = key = key_of(user)
        already = bodies.bytes.get(key, 0)
        if already and already + size > bound:
            raise GatewayError(
                503,
                Reason.USER_QUEUE_FULL,
                f"{already / _MIB:.1f} MiB of other requests with this key (for a front end, "
                f"its people's) are still arriving, and {size / _MIB:.1f} MiB more would pass "
                f"{bound / _MIB:.0f} MiB; send it once they have",
                retry_after=1.0,
            )

    def __enter__(self) -> None:
        bodies, user, key = self._bodies, self._user, self._key
        increment(bodies.count, user)
        if key is not user:  # a person a front end names
            increment(bodies.people, key)
        increment(bodies.bytes, key, self._size)

    def __exit__(self, *exc_info: object) -> None:
        bodies, user, key = self._bodies, self._user, self._key
        decrement(bodies.count, user)
        if key is not user:
            decrement(bodies.people, key)
        decrement(bodies.bytes, key, self._size)
