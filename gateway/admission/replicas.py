"""This replica's side of the house shared in Redis: one waiting room, whichever replica.

A request that cannot start at once takes a place in the house's waiting room (its
user's ``max_queued`` and the house's ``max_depth`` counted across every replica), ranked
by a finish tag the store keeps (``holds/base.Place``). A turn is decided locally, among
this replica's waiting requests (``admission/local.py``); a hold in the store then confirms
it across the house: the user's cap, the backend's slots, and that no request ranked ahead
of it, on any replica, is asking for that slot now. A turn the house does not confirm is
given back (``Permit.withdraw``) and the request asks again after a release anywhere, or
half a second later, within the same ``max_wait``. Fair-share charges are exchanged with
the other replicas, and output added to the payers' tags. A single replica has no store
and none of this.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Callable
from typing import Literal, Protocol

from gateway.admission.holds.base import (
    BACKGROUND_HOLDER,
    Hold,
    HoldStore,
    Place,
    StoreUnavailable,
)
from gateway.admission.permit import Permit
from gateway.admission.refusals import Refusal, Refuse
from gateway.admission.room import WaitingRoom
from gateway.admission.tickets import Ticket
from gateway.core import BACKGROUND, Reason

__all__ = ["ReplicaHolds", "Turns"]

# While a request ranked ahead holds the house's room, look again at least this often (a
# release is announced at once; this bounds the wait if the announcement is lost, and
# keeps the request asking: ``holds/scripts.py``'s ASKING_MS is three times as long).
_SHARED_RETRY_SECONDS = 0.5

# Why the house would not let a place wait, as the refusal says it.
_NOT_JOINED = {"user": Reason.USER_QUEUE_FULL, "house": Reason.GATEWAY_BUSY}
_UNBOUNDED = 2**31  # a cap no count reaches


class Turns(Protocol):
    """This replica's turns (``local.LocalTurns``)."""

    def at_once(self, ticket: Ticket) -> Permit | None: ...

    async def take(self, ticket: Ticket, within: float) -> Permit | Refusal: ...


class ReplicaHolds:
    """Local turns confirmed in ``store``, and this replica's charges not yet sent."""

    __slots__ = ("_clock", "_output", "_refuse", "_room", "_unsent", "_wall", "places", "store")

    def __init__(
        self,
        store: HoldStore,
        room: WaitingRoom,
        clock: Callable[[], float],
        refuse: Refuse,
        wall: Callable[[], float],
    ) -> None:
        self.store = store
        self._room = room  # the room is reconfigured in place, never replaced
        self._clock = clock
        self._wall = wall  # places' arrival times compare across replicas
        self._refuse = refuse
        self._unsent: defaultdict[str, float] = defaultdict(float)
        self._output: defaultdict[str, float] = defaultdict(float)  # for the house's tags
        self.places: dict[int, Place] = {}  # this replica's places in the house, by ticket

    async def acquire(self, ticket: Ticket, deadline: float, turns: Turns) -> Permit | Refusal:
        """A turn confirmed by the house, asked again after each release anywhere until
        ``deadline``; or a refusal."""
        place, asking = self._place(ticket), ""
        permit = turns.at_once(ticket)
        if permit is not None:
            confirmed = await self._confirmed(permit, place, waited=0.0)
            if confirmed is not False:
                return confirmed
            asking = permit.backend.group(ticket.model)  # refused there: it asks for it
        started = self._clock()
        try:
            joined = await self._join(place, ticket, asking)
            if isinstance(joined, Refusal):
                return joined
            place = self.places[id(ticket)] = joined
            outcome = await self._wait(ticket, place, deadline, turns, started)
            if isinstance(outcome, Permit):  # its wait in the house, not its last local one
                outcome.queue_wait = self._clock() - started
            return outcome
        finally:
            self.store.leave(place)  # taken, refused or never joined: then nothing
            self.places.pop(id(ticket), None)

    async def _wait(
        self, ticket: Ticket, place: Place, deadline: float, turns: Turns, started: float
    ) -> Permit | Refusal:
        while True:
            outcome = await turns.take(ticket, deadline - self._clock())
            if isinstance(outcome, Refusal):
                return outcome
            confirmed = await self._confirmed(outcome, place, self._clock() - started)
            if confirmed is not False:
                return confirmed
            remaining = deadline - self._clock()
            if remaining <= 0:
                return self._refuse(Reason.WAIT_TIMEOUT, ticket)
            await self.store.released(min(remaining, _SHARED_RETRY_SECONDS))

    async def _confirmed(
        self, permit: Permit, place: Place, waited: float
    ) -> Permit | Refusal | Literal[False]:
        """The permit, confirmed; a refusal (the policy fails closed without Redis); or
        False, the turn given back: a request ahead of it, or the room, is elsewhere."""
        try:
            confirmed = await self.confirm(permit, place, waited)
        except BaseException:
            permit.withdraw()
            raise
        if confirmed is True:
            return permit
        permit.withdraw()
        return False if confirmed is False else confirmed

    async def confirm(
        self, permit: Permit, place: Place | None = None, waited: float | None = None
    ) -> bool | Refusal:
        """True: held across replicas (or Redis is away and the policy says carry on);
        False: the house has no room for it now; a Refusal when the policy fails closed.
        ``waited``: seconds it has waited (None: it ran already, and moves)."""
        hold = self._hold_for(permit, place, waited)
        try:
            taken = await self.store.take(hold)
        except StoreUnavailable:
            return self._without_redis()
        if taken:
            if permit.released:  # it gave its slot up while the store took the hold
                self.store.give_back(hold)
                return False
            permit.hold = hold
        return taken

    def _without_redis(self) -> bool | Refusal:
        if self._room.policy.redis.on_failure == "closed":
            return Refusal(
                Reason.STATE_UNAVAILABLE,
                "the shared state (Redis) is unreachable and the policy fails closed",
                _SHARED_RETRY_SECONDS * 10,
            )
        return True  # per-replica limits only, until Redis is back

    async def _join(self, place: Place, ticket: Ticket, asking: str) -> Place | Refusal:
        """``place`` waits in the house, ranked; the refusal if the house is full for it
        (or Redis is away and the policy fails closed; open, it waits here alone)."""
        room = self._room
        max_queued, max_depth = room.caps(ticket.user, ticket.lane)[1], room.policy.queue.max_depth
        if ticket.restarts:  # gave its slot to a person: waits again past the bounds (local.py)
            max_queued = max_depth = _UNBOUNDED
        try:
            joined = await self.store.join(place, max_queued, max_depth, asking)
        except StoreUnavailable:
            without = self._without_redis()
            return without if isinstance(without, Refusal) else place
        return joined if isinstance(joined, Place) else self._refuse(_NOT_JOINED[joined], ticket)

    def _place(self, ticket: Ticket) -> Place:
        """``ticket``'s place in the house, before the store ranks it."""
        room = self._room
        weight = room.policy.limits_of(ticket.user).weight * ticket.class_weight
        holder, cap = _holder(ticket), room.caps(ticket.user, ticket.lane)[0]
        groups = tuple(b.group(ticket.model) for b in room.pool.serving(ticket.api, ticket.model))
        together, together_cap, together_queued = _together(room, ticket)
        return Place(
            id=uuid.uuid4().hex,
            holder=holder,
            cap=cap,
            lane=ticket.lane,
            payer=ticket.payer,
            cost=room.ordering.cost(weight, ticket.input_tokens),
            arrived=self._wall(),
            heavy=ticket.heavy,
            groups=groups,
            user=ticket.user,
            model=ticket.model,
            together=together,
            together_cap=together_cap,
            together_queued=together_queued,
        )

    def _hold_for(self, permit: Permit, place: Place | None, waited: float | None) -> Hold:
        ticket, backend, room = permit.ticket, permit.backend, self._room
        heavy = room.policy.classes.heavy
        # The prefill gate, house-wide: a long prompt that has not waited ``wait_for_light``
        # does not start beside a person's light request on any replica.
        gate_open = waited is None or waited >= heavy.wait_for_light
        together, together_cap, _ = _together(room, ticket)
        return Hold(
            id=uuid.uuid4().hex,
            user=_holder(ticket),
            user_cap=room.caps(ticket.user, ticket.lane)[0],
            backend=backend.group(ticket.model),
            slots=backend.slots,
            heavy=ticket.heavy,
            heavy_slots=heavy.slots_on(backend.slots),
            place=place,
            backend_name=backend.name,
            model=ticket.model,
            light=not ticket.heavy and ticket.lane is not BACKGROUND,
            prefill_may_start=gate_open,
            together=together,
            together_cap=together_cap,
        )

    def give_back(self, permit: Permit) -> None:
        """The permit is released: its hold, if it was confirmed, frees a place everywhere."""
        if permit.hold is not None:
            self.store.give_back(permit.hold)

    async def moved(self, permit: Permit, old_hold: Hold | None) -> bool:
        """``permit`` moved to another backend (``Admission.reroute``): the old backend's
        hold is given back and the new one confirmed; False if the store refuses it."""
        if old_hold is not None:  # given back first: the new hold is counted without it
            await self.store.give_back_now(old_hold)
        return await self.confirm(permit, None, None) is True

    async def share(self) -> None:
        """Exchange fair-share charges and queue depth with the other replicas."""
        ordering = self._room.ordering
        for user, amount in ordering.take_charges().items():
            self._unsent[user] += amount
        for payer, amount in ordering.take_output().items():
            self._output[payer] += amount
        totals = await self.store.exchange(dict(self._unsent), dict(self._output))
        if totals is not None:  # else kept, and sent when the shared state is back
            self._unsent.clear()
            self._output.clear()
            ordering.adopt(totals)


def _holder(ticket: Ticket) -> str:
    """Whose running places a request takes across replicas: background work has its own
    cap per user, so its own holder name."""
    return ticket.user + BACKGROUND_HOLDER if ticket.lane is BACKGROUND else ticket.user


_NOT_TOGETHER = ("", -1, -1)


def _together(room: WaitingRoom, ticket: Ticket) -> tuple[str, int, int]:
    """Where ``ticket``'s request counts with the other people of its front end across the
    house (``owui/(all)``), and its total's ``max_concurrent`` and ``max_queued`` (-1:
    none); nowhere for background work (its lane's own caps bound it) or anyone else."""
    found = None if ticket.lane is BACKGROUND else room.policy.together_of(ticket.user)
    if found is None:
        return _NOT_TOGETHER
    account, total = found
    running, waiting = total.max_concurrent, total.max_queued
    return account, -1 if running is None else running, -1 if waiting is None else waiting
