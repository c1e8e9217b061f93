"""The local waiting room: who runs, who waits, and who goes next when a slot frees.

Synchronous and without I/O: every method runs to completion on the event loop, so the
counts it keeps are never seen half-updated. It is the one ledger of this replica's
running requests and busy slots; the cross-replica hold store only confirms them.

A request runs only when its user has fewer than ``max_concurrent`` running and a backend
that serves it has a free slot (heavy requests: a free heavy slot too, and no light request
running there, for at most ``classes.heavy.wait_for_light``: ``prefill_gate.py``). Dispatch
looks only at users with requests waiting, and the ordering (FIFO or fair) picks among them.

Two lanes (``lanes.py``): each user has an interactive and a background queue, with their
own bounds. A slot goes to background work only when no interactive request can take it,
and background work holds at most ``lanes.background.max_slots`` of a backend.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass

from gateway.backends.pool import Backend, BackendPool, model_key
from gateway.policy import Policy
from gateway.prefill_gate import PrefillGate
from gateway.room_snapshot import RoomSnapshot, in_order, room_snapshot
from gateway.scheduler import Candidate, Fair, Fifo, Ordering
from gateway.swaps import RESIDENT, Placement, SwapPlanner, SwapWait
from gateway.vocabulary import Api, Lane, Reason, RequestClass

__all__ = ["Ticket", "Waiter", "WaitingRoom", "ordering_for"]


@dataclass(frozen=True, slots=True)
class Ticket:
    """What admission needs to know about a request."""

    user: str
    model: str
    api: Api
    input_tokens: float = 0.0  # estimated prompt tokens, charged at dispatch
    request_class: RequestClass = RequestClass.LIGHT
    class_weight: float = 1.0
    credential: str = ""  # how the user was identified (identity.Caller), for revocation
    lane: Lane = Lane.INTERACTIVE
    num_ctx: int | None = None  # the options.num_ctx forwarded (Ollama loads with it)

    @property
    def heavy(self) -> bool:
        return self.request_class is RequestClass.HEAVY


@dataclass(eq=False, slots=True)
class Waiter:
    """A request in the room; ``turn`` resolves to its backend when it is dispatched."""

    ticket: Ticket
    candidate: Candidate
    arrived: float
    turn: asyncio.Future[Backend]
    position: int = 0  # where it stood in the room when it arrived (0: it started at once)
    placement: Placement = RESIDENT  # how its dispatch found the model (swaps.py)


class WaitingRoom:
    """Caps, the bounded waiting room, and the dispatch of freed slots."""

    def __init__(
        self,
        policy: Policy,
        pool: BackendPool,
        on_change: Callable[[], None],
        clock: Callable[[], float] = time.monotonic,
        wake_in: Callable[[float], None] = lambda delay: None,
    ) -> None:
        """``wake_in(delay)``: call ``dispatch`` again after ``delay`` seconds (when a held
        heavy request may start anyway; nothing else changes then)."""
        self.policy = policy
        self.pool = pool
        self.ordering = ordering_for(policy)
        self.depth = 0  # waiting requests of both lanes
        self.waiting: dict[str, deque[Waiter]] = {}  # interactive, by user
        self.background: dict[str, deque[Waiter]] = {}  # background, by user
        self.running: Counter[str] = Counter()  # interactive, by user
        self.background_running: Counter[str] = Counter()
        # Requests past the quick refusal that are still reading their bodies, by user.
        self.arriving: Counter[str] = Counter()
        # By slot group (Backend.group: the server's URL, and on Ollama the model): a reload
        # that renames a backend keeps what runs there.
        self.busy: Counter[str] = Counter()
        self.heavy: Counter[str] = Counter()  # heavy requests, by slot group
        self._background_busy: Counter[str] = Counter()  # background requests, by slot group
        self._seq = itertools.count()
        self._on_change = on_change
        self._clock = clock
        self.swaps = SwapPlanner(clock)  # what each Ollama backend holds, loads and unloads
        self._wake_in = wake_in
        self._gate = PrefillGate()
        # Who holds each busy slot, and since when, for the house page: by the ticket's
        # identity, since two requests can be alike field for field. The ticket is kept so
        # that its id stays unique while it is here.
        self.holders: dict[int, tuple[Ticket, str, float]] = {}

    def reconfigure(self, policy: Policy, pool: BackendPool) -> None:
        """New admissions follow the new policy at once; running requests stay counted."""
        if (policy.scheduling, policy.costs) != (self.policy.scheduling, self.policy.costs):
            self.ordering = ordering_for(policy)
        self.policy, self.pool = policy, pool

    def join(self, ticket: Ticket, now: float, turn: asyncio.Future[Backend]) -> Waiter:
        waiter = self._arrival(ticket, now, turn)
        self.queues(ticket.lane).setdefault(ticket.user, deque()).append(waiter)
        self.depth += 1
        self._on_change()
        return waiter

    def start_at_once(
        self, ticket: Ticket, now: float, turn: asyncio.Future[Backend]
    ) -> Waiter | None:
        """The quick yes: with nobody waiting, a request that can start takes its slot now,
        its ``turn`` resolved; None if it would have to wait. What ``join`` and ``dispatch``
        would do, the request being the only one to choose from, without queueing it only
        to take it out again: this is the path of every request on a gateway with room."""
        if self.waiting or self.background or not self._has_free_slot():
            return None
        if self.runs(ticket.lane)[ticket.user] >= self.caps(ticket.user, ticket.lane)[0]:
            return None
        # As dispatch does first, the waiting requests being this one alone.
        self.swaps.keep_only({(b.key, model_key(ticket.model)) for b in self._serving(ticket)})
        free = self._free_to_start(ticket)
        if not free:
            return None
        waiter = self._arrival(ticket, now, turn)
        self.runs(ticket.lane)[ticket.user] += 1
        self._start(waiter, self.prefer(free, ticket))
        self._on_change()
        self._wake_for_held()
        return waiter

    def _arrival(self, ticket: Ticket, now: float, turn: asyncio.Future[Backend]) -> Waiter:
        user = ticket.user
        if user not in self.waiting and user not in self.background:
            # VTC's rule: a user whose queue was empty is lifted to the least-served user
            # still waiting, so idle (or merely running) time cannot be banked into a burst.
            self.ordering.on_arrival(user, self.waiting.keys() | self.background.keys())
        weight = self.policy.limits_of(user).weight * ticket.class_weight
        candidate = Candidate(next(self._seq), user, weight, ticket.input_tokens)
        return Waiter(ticket, candidate, now, turn)

    def leave(self, waiter: Waiter) -> None:
        user, queues = waiter.ticket.user, self.queues(waiter.ticket.lane)
        queue = queues.get(user)
        if queue is None or waiter not in queue:
            return
        queue.remove(waiter)
        self.depth -= 1
        if not queue:
            del queues[user]
            self._idle_check(user)
        self._on_change()

    def queues(self, lane: Lane) -> dict[str, deque[Waiter]]:
        """The waiting requests of ``lane``, by user."""
        return self.background if lane is Lane.BACKGROUND else self.waiting

    def runs(self, lane: Lane) -> Counter[str]:
        """The running requests of ``lane``, by user."""
        return self.background_running if lane is Lane.BACKGROUND else self.running

    def caps(self, user: str, lane: Lane) -> tuple[int, int]:
        """(max_concurrent, max_queued) of ``user`` in ``lane``."""
        if lane is Lane.BACKGROUND:
            background = self.policy.lanes.background
            return background.max_concurrent, background.max_queued
        limits = self.policy.limits_of(user)
        return limits.max_concurrent, limits.max_queued

    def cannot_start(self, ticket: Ticket) -> bool:
        """Whether a request arriving now would have to wait."""
        if self.runs(ticket.lane)[ticket.user] >= self.caps(ticket.user, ticket.lane)[0]:
            return True
        return not self.free_backends(ticket)

    def over_bound(self, user: str, lane: Lane, joining: bool) -> Reason | None:
        """Which bound the room passes with this request in it (``joining``: not yet)."""
        return self._over_bound(user, lane, extra=1 if joining else 0)

    def _over_bound(self, user: str, lane: Lane, extra: int) -> Reason | None:
        if len(self.queues(lane).get(user, ())) + extra > self.caps(user, lane)[1]:
            return Reason.USER_QUEUE_FULL
        if self.depth + extra > self.policy.queue.max_depth:
            return Reason.GATEWAY_BUSY
        return None

    def newest_background(self) -> Waiter | None:
        """The background request that came last: the first to go when a person needs room."""
        waiting = [w for queue in self.background.values() for w in queue if not w.turn.done()]
        return max(waiting, key=lambda waiter: waiter.candidate.seq, default=None)

    def refuses_unseen(self, user: str, lanes: tuple[Lane, ...]) -> Reason | None:
        """The bound a request of ``user`` would pass, when it would pass it whatever its
        body says: the user's own places are all taken, or no backend has a free slot.
        Checked before the body is read, so a user at cap cannot make the gateway read,
        and hold, body after body only to refuse each. Requests of the user still reading
        their bodies count as waiting. ``lanes``: those the request may turn out to be in
        (its lane may depend on its prompt); only what every one of them would refuse."""
        reasons = [self._refuses_unseen_in(user, lane) for lane in lanes]
        return reasons[0] if all(reasons) else None

    def _refuses_unseen_in(self, user: str, lane: Lane) -> Reason | None:
        reason = self._over_bound(user, lane, extra=1 + self.arriving[user])
        if reason is None:
            return None
        if reason is Reason.GATEWAY_BUSY and lane is Lane.INTERACTIVE and self.background:
            return None  # a person's request would displace background work
        if self.runs(lane)[user] >= self.caps(user, lane)[0]:
            return reason
        if all(self.busy_on(b) >= b.capacity for b in self.pool.backends):
            return reason
        return None

    def dispatch(self) -> None:
        """Give every free slot that a waiting request can use to the one the ordering picks."""
        self.swaps.keep_only(self._waits())
        if not self._has_free_slot():
            return  # every slot is taken: nobody waiting can start (the common overload case)
        while self.waiting or self.background:
            choice = self._next_turn()
            if choice is None:
                break
            waiter, backend = choice
            self.runs(waiter.ticket.lane)[waiter.ticket.user] += 1  # the user stays active
            self.leave(waiter)
            self._start(waiter, backend)
        self._wake_for_held()

    def _has_free_slot(self) -> bool:
        return any(self.busy_on(b) < b.capacity for b in self.pool.backends)

    def _start(self, waiter: Waiter, backend: Backend) -> None:
        """``waiter``'s turn: its slot on ``backend`` taken and charged, its turn resolved."""
        waiter.placement = self.take(waiter.ticket, backend)
        self.ordering.on_dispatch(waiter.candidate)
        waiter.turn.set_result(backend)

    def _wake_for_held(self) -> None:
        wait = self.policy.classes.heavy.wait_for_light
        opens = self._gate.opens_at(wait)
        if opens is None:
            return
        queues = (*self.waiting.values(), *self.background.values())
        if not any(waiter.ticket.heavy for queue in queues for waiter in queue):
            self._gate.clear()  # the held request went away: the next is held afresh
            return
        now = self._clock()
        if opens > now:  # else open already: the next release or arrival dispatches
            self._wake_in(opens - now)

    def free_backends(self, ticket: Ticket) -> list[Backend]:
        heavy_slots = self.policy.classes.heavy.slots_on
        background_slots = self.policy.lanes.background.slots_on
        background = ticket.lane is Lane.BACKGROUND
        # People first: background work does not start on a backend a person waits for, even
        # one who cannot take this slot (the heavy lane is full): the slot is theirs when the
        # lane frees, and background work would slow their stream meanwhile.
        wanted = self._wanted_by_people() if background else frozenset()
        model = ticket.model
        return [
            backend
            for backend in self.pool.serving(ticket.api, model)
            if self.busy[group := backend.group(model)] < backend.slots
            and backend.key not in wanted
            and not (ticket.heavy and self.heavy[group] >= heavy_slots(backend.slots))
            and not (background and self._background_busy[group] >= background_slots(backend.slots))
            and self.swaps.admits(backend, model, ticket.num_ctx, self.busy)
        ]

    def busy_on(self, backend: Backend, counter: Counter[str] | None = None) -> int:
        """Requests running on ``backend`` (of ``counter``: busy, heavy), every model."""
        counter = self.busy if counter is None else counter
        if not backend.per_model:
            return counter[backend.key]
        return sum(self.by_model(backend, counter).values())

    def by_model(self, backend: Backend, counter: Counter[str] | None = None) -> dict[str, int]:
        """Requests running on an Ollama ``backend`` by model key (of ``counter``)."""
        counter = self.busy if counter is None else counter
        prefix = backend.key + " "
        return {g[len(prefix) :]: n for g, n in counter.items() if g.startswith(prefix)}

    def take(self, ticket: Ticket, backend: Backend) -> Placement:
        """Count ``ticket``'s request as running on ``backend``; how it finds its model."""
        group = backend.group(ticket.model)
        placement = self.swaps.placed(backend, ticket.model, ticket.num_ctx, self.busy)
        self.busy[group] += 1
        if ticket.heavy:
            self.heavy[group] += 1
            self._gate.started(group)
        if ticket.lane is Lane.BACKGROUND:
            self._background_busy[group] += 1
        self._hold(ticket, backend)
        return placement

    def give_back(self, ticket: Ticket, backend: Backend) -> None:
        group = backend.group(ticket.model)
        self.swaps.residency.ran(backend, ticket.model)
        _decrement(self.busy, group)
        if ticket.heavy:
            _decrement(self.heavy, group)
        if ticket.lane is Lane.BACKGROUND:
            _decrement(self._background_busy, group)
        held = self.holders.get(id(ticket))
        if held is not None and held[1] == backend.name:
            del self.holders[id(ticket)]

    def release(self, ticket: Ticket, backend: Backend) -> None:
        """A running request ended: its user's place and its slot are free again."""
        _decrement(self.runs(ticket.lane), ticket.user)
        self.give_back(ticket, backend)
        self._idle_check(ticket.user)
        self._on_change()
        self.dispatch()

    def snapshot(self, now: float) -> RoomSnapshot:
        """The room at ``now``, for /status, metrics and the house page."""
        return room_snapshot(self, now)

    def position_of(self, waiter: Waiter) -> int:
        """Where ``waiter`` stands in the order the room would dispatch (1: next), or 0."""
        for position, other in enumerate(in_order(self), start=1):
            if other is waiter:
                return position
        return 0

    def _hold(self, ticket: Ticket, backend: Backend) -> None:
        # A request moved to another backend (failover) keeps the time it started.
        held = self.holders.get(id(ticket))
        started = self._clock() if held is None else held[2]
        self.holders[id(ticket)] = (ticket, backend.name, started)

    def _next_turn(self) -> tuple[Waiter, Backend] | None:
        # People first: background work gets a slot only when no interactive request can.
        return self._offer(Lane.INTERACTIVE) or self._offer(Lane.BACKGROUND)

    def _offer(self, lane: Lane) -> tuple[Waiter, Backend] | None:
        offers: dict[int, tuple[Waiter, Backend]] = {}
        swapping: set[int] = set()  # offers whose model needs a swap first
        running = self.runs(lane)
        for user, queue in self.queues(lane).items():
            if running[user] >= self.caps(user, lane)[0]:
                continue
            for waiter in queue:
                if waiter.turn.done():  # cancelled; its task is about to remove it
                    continue
                free = self._free_to_start(waiter.ticket)
                if free:
                    offers[waiter.candidate.seq] = (waiter, self.prefer(free, waiter.ticket))
                    break
                # Only a person's request may have a model unloaded for it.
                swap = self._swap_for(waiter.ticket) if lane is Lane.INTERACTIVE else None
                if swap is not None:
                    offers[waiter.candidate.seq] = (waiter, swap)
                    swapping.add(waiter.candidate.seq)
                    break
        if not offers:
            return None
        chosen = self.ordering.choose([waiter.candidate for waiter, _ in offers.values()])
        if chosen.seq in swapping:
            # Its turn: drain the victims now, so that it goes as soon as they are idle
            # (at once if they are); meanwhile the others' requests keep their turns.
            waiter, backend = offers[chosen.seq]
            ticket = waiter.ticket
            self.swaps.plan(backend, ticket.model, ticket.num_ctx, self.busy, self._waits())
            self._on_change()
            return self._offer(lane)
        return offers[chosen.seq]

    def _free_to_start(self, ticket: Ticket) -> list[Backend]:
        """The backends ``ticket``'s request may start on now: a free slot, and for a heavy
        request an open prefill gate."""
        free = self.free_backends(ticket)
        if ticket.heavy:
            free = [backend for backend in free if self._heavy_may_start(backend, ticket.model)]
        return free

    def _serving(self, ticket: Ticket) -> list[Backend]:
        return self.pool.serving(ticket.api, ticket.model)

    def _swap_for(self, ticket: Ticket) -> Backend | None:
        """A backend where a swap would make room for ``ticket``'s model, if one would."""
        backends = self._serving(ticket)
        return self.swaps.room_for(backends, ticket.model, ticket.num_ctx, self.busy, self._waits())

    def swap_wait(self, ticket: Ticket, hold: float) -> SwapWait | None:
        """Why ``ticket``'s model keeps it waiting, if memory does (for its refusal)."""
        backends = self._serving(ticket)
        return self.swaps.wait_for(backends, ticket.model, ticket.num_ctx, self.busy, hold)

    def _waits(self) -> Counter[tuple[str, str]]:
        """Waiting requests by (backend key, model key), for each backend serving them."""
        queues = (*self.waiting.values(), *self.background.values())
        return Counter(
            (backend.key, model_key(w.ticket.model))
            for queue in queues
            for w in queue
            if not w.turn.done()
            for backend in self._serving(w.ticket)
        )

    def _wanted_by_people(self) -> frozenset[str]:
        """The backends an interactive request waits for (its user has a free place): on
        Ollama too, whatever the model, as they share one GPU."""
        return frozenset(
            backend.key
            for user, queue in self.waiting.items()
            if self.running[user] < self.caps(user, Lane.INTERACTIVE)[0]
            for waiter in queue
            if not waiter.turn.done()
            for backend in self._serving(waiter.ticket)
        )

    def _heavy_may_start(self, backend: Backend, model: str) -> bool:
        # One batch per slot group: on Ollama each model's runner batches its own slots.
        group = backend.group(model)
        light_running = self.busy[group] - self.heavy[group]
        wait = self.policy.classes.heavy.wait_for_light
        return self._gate.may_start(group, light_running, wait, self._clock())

    def prefer(self, free: list[Backend], ticket: Ticket) -> Backend:
        return self.pool.prefer(free, ticket.model, self.busy)

    def _idle_check(self, user: str) -> None:
        lanes = (self.waiting, self.background, self.running, self.background_running)
        if all(user not in each for each in lanes):
            self.ordering.on_idle(user)


def _decrement(counter: Counter[str], key: str) -> None:
    # Keys at zero are dropped so that state stays proportional to what is active.
    if counter[key] <= 1:
        counter.pop(key, None)
    else:
        counter[key] -= 1


def ordering_for(policy: Policy) -> Ordering:
    """The ordering policy the YAML asks for."""
    if policy.scheduling == "fifo":
        return Fifo()
    return Fair(w_in=policy.costs.input, w_out=policy.costs.output)
