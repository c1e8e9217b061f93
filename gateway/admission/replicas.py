"""This replica's side of the shared hold store: each local turn confirmed across replicas.

A turn is decided here, among this replica's waiting requests (``admission/local.py``); a hold
in the store then confirms that the user's cap and the backend's slots have room across
every replica. If another replica got there first, the turn is given back and the request
waits for a release anywhere, within the same ``max_wait``. Fair-share charges and queue
depth are exchanged with the other replicas, so that the ordering and Retry-After see them.
A single replica has no store and none of this: its room is its only ledger.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Awaitable, Callable

from gateway.admission.holds.base import Hold, HoldStore, StoreUnavailable
from gateway.admission.permit import Permit
from gateway.admission.refusals import Refusal, Refuse
from gateway.admission.room import WaitingRoom
from gateway.admission.tickets import Ticket
from gateway.core import Lane, Reason

__all__ = ["LocalTurn", "ReplicaHolds"]

# While another replica holds the room, look again at least this often (a release there
# is announced at once; this bounds the wait if the announcement is lost).
_SHARED_RETRY_SECONDS = 0.5

# A turn in this replica's room: ``local.LocalTurns.take``.
LocalTurn = Callable[[Ticket, float], Awaitable[Permit | Refusal]]


class ReplicaHolds:
    """Local turns confirmed in ``store``, and this replica's charges not yet sent."""

    __slots__ = ("_clock", "_refuse", "_room", "_unsent", "store")

    def __init__(
        self, store: HoldStore, room: WaitingRoom, clock: Callable[[], float], refuse: Refuse
    ) -> None:
        self.store = store
        self._room = room  # the room is reconfigured in place, never replaced
        self._clock = clock
        self._refuse = refuse
        self._unsent: defaultdict[str, float] = defaultdict(float)

    async def acquire(
        self, ticket: Ticket, deadline: float, local_turn: LocalTurn
    ) -> Permit | Refusal:
        """A local turn held across replicas, taken again after each release anywhere
        until ``deadline``; or a refusal."""
        while True:
            outcome = await local_turn(ticket, deadline - self._clock())
            if isinstance(outcome, Refusal):
                return outcome
            try:
                confirmed = await self.confirm(outcome)
            except BaseException:
                outcome.release()
                raise
            if confirmed is True:
                return outcome
            outcome.release()
            if confirmed is not False:
                return confirmed
            remaining = deadline - self._clock()
            if remaining <= 0:
                return self._refuse(Reason.WAIT_TIMEOUT, ticket)
            await self.store.released(min(remaining, _SHARED_RETRY_SECONDS))

    async def confirm(self, permit: Permit) -> bool | Refusal:
        """True: held across replicas (or Redis is away and the policy says carry on);
        False: another replica holds the room; a Refusal when the policy says fail closed."""
        hold = self._hold_for(permit)
        try:
            taken = await self.store.take(hold)
        except StoreUnavailable:
            if self._room.policy.redis.on_failure == "closed":
                return Refusal(
                    Reason.STATE_UNAVAILABLE,
                    "the shared state (Redis) is unreachable and the policy fails closed",
                    _SHARED_RETRY_SECONDS * 10,
                )
            return True  # per-replica limits only, until Redis is back
        if taken:
            if permit.released:  # it gave its slot up while the store took the hold
                self.store.give_back(hold)
                return False
            permit.hold = hold
        return taken

    def _hold_for(self, permit: Permit) -> Hold:
        ticket, backend, room = permit.ticket, permit.backend, self._room
        # Background work has its own cap per user, so its own holder name across replicas.
        background = ticket.lane is Lane.BACKGROUND
        return Hold(
            id=uuid.uuid4().hex,
            user=f"{ticket.user}/background" if background else ticket.user,
            user_cap=room.caps(ticket.user, ticket.lane)[0],
            backend=backend.group(ticket.model),
            slots=backend.slots,
            heavy=ticket.heavy,
            heavy_slots=room.policy.classes.heavy.slots_on(backend.slots),
        )

    def give_back(self, permit: Permit) -> None:
        """The permit is released: its hold, if it was confirmed, frees a place everywhere."""
        if permit.hold is not None:
            self.store.give_back(permit.hold)

    async def moved(self, permit: Permit, old_hold: Hold | None) -> bool:
        """``permit`` moved to another backend (``Admission.reroute``): the old backend's
        hold is given back and the new one confirmed; False if the store refuses it."""
        if old_hold is not None:
            self.store.give_back(old_hold)
        return await self.confirm(permit) is True

    async def share(self) -> None:
        """Exchange fair-share charges and queue depth with the other replicas."""
        ordering = self._room.ordering
        for user, amount in ordering.take_charges().items():
            self._unsent[user] += amount
        totals = await self.store.exchange(dict(self._unsent), self._room.depth)
        if totals is not None:  # else kept, and sent when the shared state is back
            self._unsent.clear()
            ordering.adopt(totals)
