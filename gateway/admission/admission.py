"""Admission: the gateway owns the queue.

A request waits for its turn in the local waiting room (``admission/room.py``) for at most
``max_wait``; past any bound it is refused at once with an estimate of when to retry
(``admission/refusals.py``). Backends never see more than their slots, so their own unbounded FIFO
queues (ollama/ollama#7758) stay empty.

The shape follows paddler's balancer: a quick path, a bound, then a bounded wait on a
"slot freed" signal (``admission/local.py``). With several replicas, a hold store (Redis)
confirms each local turn across all of them (``admission/replicas.py``); a single replica keeps
one ledger, the room's, and confirms nothing. This module puts the parts together and is
what the rest of the gateway calls: the permit (``admission/permit.py``), turning away requests that
wait (``refusals.turn_away``), and the loop's wake-ups (``admission/wakeups.py``) are its other
parts.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Mapping

from gateway.admission import house_view
from gateway.admission.arriving import Arriving
from gateway.admission.holds.base import HoldStore
from gateway.admission.local import LocalTurns
from gateway.admission.parallelism import Parallelism
from gateway.admission.permit import Permit
from gateway.admission.prompt_caches import Prefix
from gateway.admission.refusals import REVOKED, Refusal, refusal, turn_away
from gateway.admission.replicas import ReplicaHolds
from gateway.admission.room import WaitingRoom
from gateway.admission.room_snapshot import RoomSnapshot
from gateway.admission.tickets import Ticket
from gateway.admission.turns import refuses_unseen
from gateway.admission.wakeups import Changes, WakeTimer
from gateway.backends import Backend, BackendPool
from gateway.config import (
    Policy,
    background_account,
    is_background_account,
    is_together_account,
    key_of,
)
from gateway.core import Api, Lane, Reason
from gateway.swaps import SwapWait

__all__ = ["Admission", "Permit", "Refusal", "Ticket"]


class Admission:
    """Turns in the waiting room, confirmed across replicas when a hold store is shared."""

    def __init__(
        self,
        policy: Policy,
        pool: BackendPool,
        holds: HoldStore | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.clock = clock
        self.changes = Changes()
        self.wake_timer = WakeTimer(self.wake)
        self.room = WaitingRoom(policy, pool, self.changes.notify, wake_in=self.wake_timer.wake_in)
        self.parallelism = Parallelism()  # how many requests each backend really runs
        self.turns = LocalTurns(self, self.room.waits, self._refusal)
        self.replicas = (
            None
            if holds is None
            else ReplicaHolds(holds, self.room, clock, self._refusal, time.time)
        )
        self.closing: Refusal | None = None  # a stop's refusal: nobody waits for a turn now
        if holds is not None:
            holds.watch(self.changes.notify)  # the other replicas' requests are in the views

    @property
    def holds(self) -> HoldStore | None:
        """The hold store shared with the other replicas; None for a single replica."""
        return None if self.replicas is None else self.replicas.store

    def reconfigure(self, policy: Policy, pool: BackendPool) -> None:
        """Apply a new policy: new admissions follow it at once; held permits stay valid."""
        self.room.reconfigure(policy, pool)
        self.room.dispatch()

    def at_once(self, ticket: Ticket) -> Permit | None:
        """The quick yes of ``acquire``, without a coroutine to run: a permit now if a place
        is free and nobody waits, else None (then ``acquire``). None with several replicas:
        the hold store confirms every turn."""
        return self.turns.at_once(ticket) if self.replicas is None else None

    async def acquire(self, ticket: Ticket) -> Permit | Refusal:
        """Wait for a turn; a Permit to hold while the request runs, or a Refusal.

        The turn is decided here, among this replica's waiting requests; a shared hold store
        then confirms that the user's cap and the backend's slots have room across every
        replica, within the same ``max_wait``.
        """
        if self.closing is not None:
            # A request read before the stop, its body after: one with a place now starts,
            # one that would wait is refused (a turn later could start it after the drain).
            return self.at_once(ticket) or self.closing
        if self.replicas is None:
            # ``take``, as two steps: the quick yes of most requests needs no wait bounded.
            permit = self.turns.at_once(ticket)
            if permit is not None:
                return permit
            return await self.turns.queue(ticket, self.room.policy.max_wait_of(ticket.lane))
        deadline = self.clock() + self.room.policy.max_wait_of(ticket.lane)
        return await self.replicas.acquire(ticket, deadline, self.turns)

    def in_flight(self, account: str) -> int:
        """The requests charged to ``account`` running or waiting here: a person's own, or
        for a front end's background account (``Ticket.payer``) its background work."""
        room = self.room
        if is_together_account(account):
            return _together_in_flight(room, key_of(account))
        if not is_background_account(account):
            return room.running[account] + len(room.waiting.get(account, ()))
        running = room.background_running.items()
        waiting = ((user, len(queue)) for user, queue in room.background.items())
        giving_way = room.preemptions.giving_way.items()  # between their slot and the room
        counts = (*running, *waiting, *giving_way)
        return sum(n for user, n in counts if background_account(user) == account)

    def refuses_unseen(self, user: str, lanes: tuple[Lane, ...]) -> Refusal | None:
        """The quick no that needs no body (``turns.refuses_unseen``), or None."""
        reason = refuses_unseen(self.room, user, lanes)
        if reason is None:
            return None
        return self._refusal(reason, Ticket(user, "", Api.OLLAMA, lane=lanes[0]))

    def arriving(self, user: str, size: int, bound: int) -> Arriving:
        """While a request of ``user`` reads a body of up to ``size`` bytes (``with``):
        counted by ``refuses_unseen``, so that a burst cannot have more bodies read at once
        than the user could hold; GatewayError (503) at once when the bodies on their way
        with its key would pass ``bound`` bytes (times a front end's places: its people's
        uploads at once)."""
        at_once = self.room.policy.bodies_at_once(key_of(user))
        return Arriving(self.room.lines.arriving, user, size, bound * at_once)

    def release(self, permit: Permit) -> None:
        """Give back the permit's place, slot and hold, and let the next request in."""
        if self.replicas is not None:
            self.replicas.give_back(permit)
        permit.unpin()
        # A run cut short, or never begun, is no measure of how long slots are held.
        if not (permit.gave_way or permit.withdrawn):
            held = self.clock() - permit.granted_at
            waits, first = self.room.waits, permit.first_byte_after
            waits.observe(permit.backend.name, permit.ticket, held, permit.evaluated, first)
        self.parallelism.ended(permit.ticket, self.clock())
        self.room.release(permit.ticket, permit.backend)

    def made_room(self, backend: Backend) -> None:
        """A swap's victims are unloaded from ``backend``: requests for the model swapped
        in may go now (sent before, they would have found no room in Ollama)."""
        self.room.swaps.made_room(backend)
        self.room.dispatch()

    def can_reroute(self, permit: Permit) -> bool:
        """Whether another backend could take this permit's request right now."""
        if len(self.room.pool.backends) < 2:
            return False
        name = permit.backend.name
        return any(b.name != name for b in self.room.free_backends(permit.ticket))

    async def reroute(self, permit: Permit) -> bool:
        """Move a permit whose backend failed before replying to another free backend."""
        room, failed, old_hold = self.room, permit.backend, permit.hold
        if permit.released:  # it gave its slot to a person: nothing left to move
            return False
        others = [b for b in room.free_backends(permit.ticket) if b.name != failed.name]
        if not others:
            return False
        chosen = room.prefer(others, permit.ticket)
        permit.unpin()  # its slot on the failed backend
        permit.placement = room.take(permit.ticket, chosen)
        room.give_back(permit.ticket, failed)
        permit.backend, permit.hold = chosen, None
        if self.replicas is None:
            return True
        # If the hold store refuses, the permit still holds the new backend locally and
        # its release undoes that; the caller answers with the first backend's failure.
        return await self.replicas.moved(permit, old_hold)

    async def share(self) -> None:
        """Exchange fair-share charges and queue depth with the other replicas."""
        if self.replicas is not None:
            await self.replicas.share()

    def revoke(self, admits: Callable[[str, str], bool]) -> None:
        """Refuse at once the waiting requests whose credential the policy no longer admits
        (``admits(user, credential)``); running ones finish, as a reload promises."""
        turn_away(self.room, lambda ticket: not admits(ticket.user, ticket.credential), REVOKED)

    def turn_away_all(self, refusal: Refusal) -> None:
        """Refuse every waiting request now, and every one that would wait from now on (the
        gateway is shutting down)."""
        self.closing = refusal
        turn_away(self.room, lambda ticket: True, refusal)

    def cached_share(self, backends: Iterable[Backend], prefix: Prefix) -> float:
        """The part of ``prefix`` the best of ``backends`` likely holds in its prompt cache."""
        return self.room.prompts.cached_share(backends, prefix)

    @property
    def busy(self) -> Mapping[str, int]:
        """Requests running, by slot group (``Backend.group``)."""
        return self.room.busy

    @property
    def hold_seconds(self) -> float:
        """How long a request has recently held its slot."""
        return self.room.waits.seconds

    def wake(self) -> None:
        """Something outside changed (a backend came back, its slots became known)."""
        self.changes.notify()
        self.room.dispatch()

    def changed(self) -> asyncio.Future[None]:
        """A future resolved at the next change of counts (for /status watchers and tests)."""
        return self.changes.next()

    def snapshot(self, whole_house: bool = True) -> RoomSnapshot:
        """The room at this instant, for ``/status``, the house page and the metrics: with
        replicas sharing Redis, the whole house's (``house_view.py``) unless
        ``whole_house`` is False (metrics: each replica's own, summed by Prometheus)."""
        room = self.room.snapshot(self.clock())
        replicas = self.replicas
        if not whole_house or replicas is None or not replicas.store.shared:
            return room
        return house_view.whole_house(room, replicas.store.house, replicas.places, time.time())

    def _refusal(self, reason: Reason, ticket: Ticket, swap: SwapWait | None = None) -> Refusal:
        """``ticket``'s refusal, with the requests waiting on the other replicas ahead of it."""
        others = self.replicas.store.others_waiting if self.replicas is not None else 0
        return refusal(reason, ticket, self.room, self.room.waits, others, swap)


def _together_in_flight(room: WaitingRoom, front_end: str) -> int:
    """The requests running or waiting here that came with ``front_end``'s key: its people's,
    its own and its background work."""
    running = (*room.running.items(), *room.background_running.items())
    waiting = (
        (user, len(queue)) for user, queue in (*room.waiting.items(), *room.background.items())
    )
    return sum(n for user, n in (*running, *waiting) if key_of(user) == front_end)
