"""The local turn: the quick yes, the bounds, then a bounded wait in this replica's room.

paddler's dispatch core: if a place is free now, take it; past a bound, say no at once;
else wait, for at most what is left of ``max_wait``, for the room to give this request its
turn (``admission/room.py`` dispatches a freed slot to whoever the ordering picks). A person
arriving at a full room may take the place of the newest background request.

The outcome is a value, a ``Permit`` or a ``Refusal``; a request turned away while it
waited (``refusals.turn_away``) comes back as its refusal. With several replicas, the turn is
confirmed afterwards (``admission/replicas.py``).
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

from gateway.admission.permit import Issuer, Permit
from gateway.admission.refusals import Refusal, Refuse, TurnedAway
from gateway.admission.room_snapshot import position_of
from gateway.admission.swap_waits import swap_wait
from gateway.admission.tickets import Ticket, Waiter
from gateway.admission.turns import cannot_start, over_bound
from gateway.admission.wait_estimates import WaitEstimates
from gateway.core import Lane, Reason

__all__ = ["LocalTurns"]


class LocalTurns:
    """This replica's turns, granted as permits of ``issuer``."""

    __slots__ = ("_clock", "_issuer", "_refuse", "_room", "_waits")

    def __init__(self, issuer: Issuer, waits: WaitEstimates, refuse: Refuse) -> None:
        self._issuer = issuer
        self._room = issuer.room  # the room is reconfigured in place, never replaced
        self._clock = issuer.clock
        self._waits = waits  # how long slots are held: a swap's estimate uses it
        self._refuse = refuse

    async def take(self, ticket: Ticket, within: float) -> Permit | Refusal:
        """A permit once ``ticket``'s turn comes, within ``within`` seconds, or a refusal."""
        permit = self.at_once(ticket)
        if permit is not None:
            return permit
        return await self.queue(ticket, within)

    def at_once(self, ticket: Ticket) -> Permit | None:
        """The quick yes: a permit now if a place is free and nobody waits, else None."""
        # No waiter, no future: a request that starts at once has no turn to wait for.
        now = self._clock()
        started = self._room.start_at_once(ticket)
        if started is None:
            return None
        backend, placement, weight = started
        return Permit(self._issuer, ticket, backend, placement, weight, now)

    async def queue(self, ticket: Ticket, within: float) -> Permit | Refusal:
        """What ``take`` does when the quick yes said no: the quick no, or the wait."""
        room, turn = self._room, asyncio.get_running_loop().create_future()
        # A task that gave its slot to a person waits again past the bounds: it was counted
        # when it came, and its client is owed a delay, not a newcomer's 503. (It held a
        # slot: the room grows past its bounds by no more than the slots.)
        bounded = not ticket.restarts
        reason = over_bound(room, ticket.user, ticket.lane, joining=True) if bounded else None
        if reason is not None and cannot_start(room, ticket):
            if reason is Reason.GATEWAY_BUSY and ticket.lane is Lane.INTERACTIVE:
                reason = self._displace_background(ticket)
            if reason is not None:
                # The quick no, under overload: no need to join the room only to leave it.
                return self._refuse(reason, ticket)
        waiter = room.join(ticket, self._clock(), turn)
        room.dispatch()
        if waiter.turn.done():  # a place was free, and its turn came first
            return Permit.queued(self._issuer, waiter, waiter.turn.result())
        reason = over_bound(room, ticket.user, ticket.lane, joining=False) if bounded else None
        if reason is not None:
            room.leave(waiter)
            return self._refuse(reason, ticket)
        waiter.position = position_of(room, waiter)
        return await self._wait(waiter, within)

    async def _wait(self, waiter: Waiter, within: float) -> Permit | Refusal:
        """The bounded wait: the turn, or a timeout, a turning away, or the client gone."""
        room, ticket = self._room, waiter.ticket
        try:
            async with asyncio.timeout(max(within, 0.0)):
                # Shielded: a timeout must not cancel a turn the room may grant meanwhile.
                backend = await asyncio.shield(waiter.turn)
        except TimeoutError:
            if waiter.turn.done():  # granted as the timer fired: take the turn after all
                return Permit.queued(self._issuer, waiter, waiter.turn.result())
            swap = swap_wait(room, ticket, self._waits.seconds)
            room.leave(waiter)
            room.dispatch()  # a swap it was the last to wait for is called off
            return self._refuse(Reason.WAIT_TIMEOUT, ticket, swap)
        except TurnedAway as away:
            return away.refusal
        except BaseException:
            self._abandon(waiter)
            raise
        return Permit.queued(self._issuer, waiter, backend)

    def _displace_background(self, ticket: Ticket) -> Reason | None:
        """Make room for a person: the newest background request waiting leaves with a 503;
        with none waiting, the person joins if running background work can give way."""
        room = self._room
        victim = room.lines.newest_background()
        if victim is None:  # none waits; one that runs may give its slot up once joined
            return None if room.could_give_way(ticket) else Reason.GATEWAY_BUSY
        room.leave(victim)
        refusal = self._refuse(Reason.GATEWAY_BUSY, victim.ticket)
        displaced = f"background work gave its place to {ticket.user}'s request; {refusal.message}"
        victim.turn.set_exception(TurnedAway(replace(refusal, message=displaced)))
        return over_bound(room, ticket.user, ticket.lane, joining=True)

    def _abandon(self, waiter: Waiter) -> None:
        """The client went away while waiting: give back a turn granted in the meantime."""
        room = self._room
        if waiter.turn.done() and not waiter.turn.cancelled():
            room.release(waiter.ticket, waiter.turn.result())
        else:
            waiter.turn.cancel()
            room.leave(waiter)
            room.dispatch()  # a swap it was the last to wait for is called off
