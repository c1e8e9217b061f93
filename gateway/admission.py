"""Admission: the gateway owns the queue.

A request waits for its turn in the local waiting room (``waiting_room.py``) for at most
``max_wait``; past any bound it is refused at once with an estimate of when to retry
(``refusals.py``). Backends never see more than their slots, so their own unbounded FIFO
queues (ollama/ollama#7758) stay empty.

The shape follows paddler's balancer: a quick path, a bound, then a bounded wait on a
"slot freed" signal. With several replicas, a hold store (Redis) confirms each local turn
across all of them; a single replica keeps one ledger, the room's, and confirms nothing.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from types import TracebackType

from gateway.backends.pool import Backend, BackendPool
from gateway.holds import Hold, HoldStore, StoreUnavailable
from gateway.policy import Policy
from gateway.refusals import HoldTimer, Refusal, refusal
from gateway.room_snapshot import RoomSnapshot
from gateway.swaps import SwapWait
from gateway.vocabulary import Api, Lane, Reason
from gateway.waiting_room import Ticket, Waiter, WaitingRoom

__all__ = ["Admission", "Permit", "Refusal", "Ticket"]

# While another replica holds the room, look again at least this often (a release there
# is announced at once; this bounds the wait if the announcement is lost).
_SHARED_RETRY_SECONDS = 0.5


class _TurnedAway(Exception):
    """The request was refused while it waited (its key was revoked, or a shutdown)."""

    def __init__(self, refusal: Refusal) -> None:
        super().__init__(refusal.message)
        self.refusal = refusal


_REVOKED = Refusal(
    Reason.KEY_REVOKED,
    "this key or user was removed from the policy while the request waited",
    retry_after=0.0,
    status=401,
)


class Permit:
    """A held turn: one of the user's running places and one backend slot.

    Use it with ``async with``; leaving the block releases both, on every path, and lets
    the next waiting request in.
    """

    __slots__ = (
        "_admission",
        "_released",
        "backend",
        "granted_at",
        "hold",
        "output_charged",
        "placement",
        "queue_position",
        "queue_wait",
        "ticket",
        "weight",
    )

    def __init__(self, admission: Admission, waiter: Waiter, backend: Backend):
        self._admission = admission
        self._released = False
        self.ticket = waiter.ticket
        self.weight = waiter.candidate.weight
        self.backend = backend
        self.granted_at = admission.clock()
        self.queue_wait = self.granted_at - waiter.arrived
        self.queue_position = waiter.position
        self.output_charged = 0.0
        self.hold: Hold | None = None  # the claim in the hold store, once confirmed
        self.placement = waiter.placement  # how it finds its model: held, loaded, swapped

    def add_output(self, tokens: float) -> None:
        """Charge tokens as they stream, so a long reply counts before it ends."""
        self.output_charged += tokens
        self._admission.room.ordering.on_output(self.ticket.user, self.weight, tokens)

    def settle(self, input_tokens: int | None, output_tokens: int | None) -> None:
        """Correct the charges with the backend's own counts, when it reported them."""
        ordering, user = self._admission.room.ordering, self.ticket.user
        if input_tokens is not None:
            ordering.on_correction(user, self.weight, input_tokens - self.ticket.input_tokens)
        if output_tokens is not None:
            self.add_output(output_tokens - self.output_charged)

    def loaded(self, seconds: float | None) -> None:
        """The reply says its model took ``seconds`` to load. If this request caused the
        load (a load, swap or reload), its user pays for the time (``costs.load``
        generated tokens a second) and the time is remembered for the next estimates."""
        if seconds is None or not self.placement.loads:
            return
        room = self._admission.room
        room.swaps.loaded(self.backend, self.ticket.model, seconds)
        tokens = room.policy.costs.load * seconds
        room.ordering.on_output(self.ticket.user, self.weight, tokens)

    async def __aenter__(self) -> Permit:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._admission.release(self)


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
        self.holds = holds
        self.room = WaitingRoom(policy, pool, self._notify, wake_in=self._wake_in)
        self.hold_timer = HoldTimer()
        self._change: asyncio.Future[None] | None = None
        self._wake_timer: asyncio.TimerHandle | None = None
        self._unsent: defaultdict[str, float] = defaultdict(float)

    def reconfigure(self, policy: Policy, pool: BackendPool) -> None:
        """Apply a new policy: new admissions follow it at once; held permits stay valid."""
        self.room.reconfigure(policy, pool)
        self.room.dispatch()

    async def acquire(self, ticket: Ticket) -> Permit | Refusal:
        """Wait for a turn; a Permit to hold while the request runs, or a Refusal.

        The turn is decided here, among this replica's waiting requests; a shared hold store
        then confirms that the user's cap and the backend's slots have room across every
        replica. If another replica got there first, the turn is given back and the request
        waits for a release anywhere, within the same ``max_wait``.
        """
        deadline = self.clock() + self.room.policy.max_wait_of(ticket.lane)
        while True:
            outcome = await self._local_turn(ticket, deadline - self.clock())
            if isinstance(outcome, Refusal) or self.holds is None:
                return outcome
            try:
                confirmed = await self._confirm(outcome)
            except BaseException:
                outcome.release()
                raise
            if confirmed is True:
                return outcome
            outcome.release()
            if confirmed is not False:
                return confirmed
            remaining = deadline - self.clock()
            if remaining <= 0:
                return self._refusal(Reason.WAIT_TIMEOUT, ticket)
            await self.holds.released(min(remaining, _SHARED_RETRY_SECONDS))

    def in_flight(self, user: str) -> int:
        """``user``'s requests running or waiting here, in either lane."""
        room = self.room
        running = room.running[user] + room.background_running[user]
        return running + len(room.waiting.get(user, ())) + len(room.background.get(user, ()))

    def refuses_unseen(self, user: str, lanes: tuple[Lane, ...]) -> Refusal | None:
        """The quick no that needs no body (``WaitingRoom.refuses_unseen``), or None."""
        reason = self.room.refuses_unseen(user, lanes)
        unseen = Ticket(user, "", Api.OLLAMA, lane=lanes[0])
        return None if reason is None else self._refusal(reason, unseen)

    @contextmanager
    def arriving(self, user: str) -> Iterator[None]:
        """While a request of ``user`` reads its body: counted by ``refuses_unseen``, so
        that a burst cannot have more bodies read at once than the user could queue."""
        self.room.arriving[user] += 1
        try:
            yield
        finally:
            self.room.arriving[user] -= 1
            if not self.room.arriving[user]:
                del self.room.arriving[user]

    async def _local_turn(self, ticket: Ticket, within: float) -> Permit | Refusal:
        room, turn = self.room, asyncio.get_running_loop().create_future()
        started = room.start_at_once(ticket, self.clock(), turn)
        if started is not None:  # the quick yes: a place was free and nobody waits
            return Permit(self, started, turn.result())
        reason = room.over_bound(ticket.user, ticket.lane, joining=True)
        if reason is not None and room.cannot_start(ticket):
            if reason is Reason.GATEWAY_BUSY and ticket.lane is Lane.INTERACTIVE:
                reason = self._displace_background(ticket)
            if reason is not None:
                # The quick no, under overload: no need to join the room only to leave it.
                return self._refusal(reason, ticket)
        waiter = room.join(ticket, self.clock(), turn)
        room.dispatch()
        if waiter.turn.done():  # a place was free, and its turn came first
            return Permit(self, waiter, waiter.turn.result())
        reason = room.over_bound(ticket.user, ticket.lane, joining=False)
        if reason is not None:
            room.leave(waiter)
            return self._refusal(reason, ticket)
        waiter.position = room.position_of(waiter)
        try:
            async with asyncio.timeout(max(within, 0.0)):
                backend = await asyncio.shield(waiter.turn)
        except TimeoutError:
            if waiter.turn.done():  # granted as the timer fired: take the turn after all
                return Permit(self, waiter, waiter.turn.result())
            swap = room.swap_wait(ticket, self.hold_timer.seconds)
            room.leave(waiter)
            room.dispatch()  # a swap it was the last to wait for is called off
            return self._refusal(Reason.WAIT_TIMEOUT, ticket, swap)
        except _TurnedAway as away:
            return away.refusal
        except BaseException:
            self._abandon(waiter)
            raise
        return Permit(self, waiter, backend)

    def _displace_background(self, ticket: Ticket) -> Reason | None:
        """Make room for a person: the newest background request leaves with a 503."""
        victim = self.room.newest_background()
        if victim is None:
            return Reason.GATEWAY_BUSY
        self.room.leave(victim)
        refusal = self._refusal(Reason.GATEWAY_BUSY, victim.ticket)
        displaced = f"background work gave its place to {ticket.user}'s request; {refusal.message}"
        victim.turn.set_exception(_TurnedAway(replace(refusal, message=displaced)))
        return self.room.over_bound(ticket.user, ticket.lane, joining=True)

    async def _confirm(self, permit: Permit) -> bool | Refusal:
        """True: held across replicas (or Redis is away and the policy says carry on);
        False: another replica holds the room; a Refusal when the policy says fail closed."""
        assert self.holds is not None
        hold = self._hold_for(permit)
        try:
            taken = await self.holds.take(hold)
        except StoreUnavailable:
            if self.room.policy.redis.on_failure == "closed":
                return Refusal(
                    Reason.STATE_UNAVAILABLE,
                    "the shared state (Redis) is unreachable and the policy fails closed",
                    _SHARED_RETRY_SECONDS * 10,
                )
            return True  # per-replica limits only, until Redis is back
        if taken:
            permit.hold = hold
        return taken

    def _hold_for(self, permit: Permit) -> Hold:
        ticket, backend, policy = permit.ticket, permit.backend, self.room.policy
        # Background work has its own cap per user, so its own holder name across replicas.
        background = ticket.lane is Lane.BACKGROUND
        return Hold(
            id=uuid.uuid4().hex,
            user=f"{ticket.user}/background" if background else ticket.user,
            user_cap=self.room.caps(ticket.user, ticket.lane)[0],
            backend=backend.group(ticket.model),
            slots=backend.slots,
            heavy=ticket.heavy,
            heavy_slots=policy.classes.heavy.slots_on(backend.slots),
        )

    def release(self, permit: Permit) -> None:
        """Give back the permit's place, slot and hold, and let the next request in."""
        if permit.hold is not None and self.holds is not None:
            self.holds.give_back(permit.hold)
        self.hold_timer.observe(self.clock() - permit.granted_at)
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
        others = [b for b in room.free_backends(permit.ticket) if b.name != failed.name]
        if not others:
            return False
        chosen = room.prefer(others, permit.ticket)
        permit.placement = room.take(permit.ticket, chosen)
        room.give_back(permit.ticket, failed)
        permit.backend, permit.hold = chosen, None
        if self.holds is None:
            return True
        if old_hold is not None:
            self.holds.give_back(old_hold)
        # If the hold store refuses, the permit still holds the new backend locally and
        # its release undoes that; the caller answers with the first backend's failure.
        return await self._confirm(permit) is True

    async def share(self) -> None:
        """Exchange fair-share charges and queue depth with the other replicas."""
        if self.holds is None:
            return
        ordering = self.room.ordering
        for user, amount in ordering.take_charges().items():
            self._unsent[user] += amount
        totals = await self.holds.exchange(dict(self._unsent), self.room.depth)
        if totals is not None:  # else kept, and sent when the shared state is back
            self._unsent.clear()
            ordering.adopt(totals)

    def revoke(self, admits: Callable[[str, str], bool]) -> None:
        """Refuse at once the waiting requests whose credential the policy no longer admits
        (``admits(user, credential)``); running ones finish, as a reload promises."""
        self._turn_away(lambda ticket: not admits(ticket.user, ticket.credential), _REVOKED)

    def turn_away_all(self, refusal: Refusal) -> None:
        """Refuse every waiting request now (the gateway is shutting down)."""
        self._turn_away(lambda ticket: True, refusal)

    def _turn_away(self, refused: Callable[[Ticket], bool], refusal: Refusal) -> None:
        for queue in list(self.room.waiting.values()):
            for waiter in list(queue):
                if not waiter.turn.done() and refused(waiter.ticket):
                    self.room.leave(waiter)
                    waiter.turn.set_exception(_TurnedAway(refusal))
        self.room.dispatch()

    def wake(self) -> None:
        """Something outside changed (a backend came back, its slots became known)."""
        self._notify()
        self.room.dispatch()

    def _wake_in(self, delay: float) -> None:
        """Dispatch again in ``delay`` seconds: one timer, the earliest asked for."""
        loop = asyncio.get_running_loop()
        timer = self._wake_timer
        if timer is not None and timer.when() <= loop.time() + delay:
            return
        if timer is not None:
            timer.cancel()
        self._wake_timer = loop.call_later(delay, self._woken)

    def _woken(self) -> None:
        self._wake_timer = None
        self.wake()

    def changed(self) -> asyncio.Future[None]:
        """A future resolved at the next change of counts (for /status watchers and tests)."""
        if self._change is None or self._change.done():
            self._change = asyncio.get_running_loop().create_future()
        return self._change

    def snapshot(self) -> RoomSnapshot:
        return self.room.snapshot(self.clock())

    def _notify(self) -> None:
        if self._change is not None and not self._change.done():
            self._change.set_result(None)

    def _abandon(self, waiter: Waiter) -> None:
        """The client went away while waiting: give back a turn granted in the meantime."""
        if waiter.turn.done() and not waiter.turn.cancelled():
            self.room.release(waiter.ticket, waiter.turn.result())
        else:
            waiter.turn.cancel()
            self.room.leave(waiter)
            self.room.dispatch()  # a swap it was the last to wait for is called off

    def _refusal(self, reason: Reason, ticket: Ticket, swap: SwapWait | None = None) -> Refusal:
        others = self.holds.others_waiting if self.holds is not None else 0
        room, hold = self.room, self.hold_timer
        return refusal(reason, ticket.user, ticket.lane, room, hold, others, swap)
