"""The local waiting room: who runs, who waits, and who goes next when a slot frees.

Synchronous and without I/O: every method runs to completion on the event loop, so the
counts it keeps are never seen half-updated. It is the one ledger of this replica's
running requests and busy slots; the cross-replica hold store only confirms them.

A request runs only when its user has fewer than ``max_concurrent`` running and a backend
that serves it has a free slot (heavy requests: a free heavy slot too). Dispatch looks only
at users with requests waiting, and the ordering (FIFO or fair) picks among them.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from gateway.backends.pool import Backend, BackendPool
from gateway.policy import Policy
from gateway.scheduler import Candidate, Fair, Fifo, Ordering
from gateway.vocabulary import Api, Reason, RequestClass

__all__ = [
    "RoomSnapshot",
    "RunningRequest",
    "Ticket",
    "Waiter",
    "WaitingRequest",
    "WaitingRoom",
    "ordering_for",
]


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


@dataclass(frozen=True, slots=True)
class RunningRequest:
    """A request holding a slot: who runs what where, for how long so far (seconds)."""

    user: str
    model: str
    backend: str
    request_class: RequestClass
    seconds: float


@dataclass(frozen=True, slots=True)
class WaitingRequest:
    """A request in the room; ``position`` 1 is the next the ordering would pick."""

    user: str
    model: str
    request_class: RequestClass
    waited: float
    position: int


@dataclass(frozen=True, slots=True)
class RoomSnapshot:
    """The room at one instant, for /status, metrics and the house page."""

    backends: dict[str, tuple[int, int]]  # name -> (busy, slots)
    users: dict[str, tuple[int, int]]  # name -> (running, queued)
    queue_depth: int
    oldest_wait: float
    heavy_running: dict[str, int] = field(default_factory=dict)  # backend -> heavy requests
    queued_by_class: dict[tuple[str, RequestClass], int] = field(default_factory=dict)
    fair_counters: dict[str, float] = field(default_factory=dict)  # user -> virtual tokens
    running: tuple[RunningRequest, ...] = ()  # oldest first
    waiting: tuple[WaitingRequest, ...] = ()  # in the order the ordering would pick them


class WaitingRoom:
    """Caps, the bounded waiting room, and the dispatch of freed slots."""

    def __init__(
        self,
        policy: Policy,
        pool: BackendPool,
        on_change: Callable[[], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.policy = policy
        self.pool = pool
        self.ordering = ordering_for(policy)
        self.depth = 0
        self.waiting: dict[str, deque[Waiter]] = {}
        self.running: Counter[str] = Counter()  # by user
        # By backend key (its URL): a reload that renames a backend keeps what runs there.
        self.busy: Counter[str] = Counter()
        self._heavy: Counter[str] = Counter()  # heavy requests, by backend key
        self._seq = itertools.count()
        self._on_change = on_change
        self._clock = clock
        # Who holds each busy slot, and since when, for the house page: by the ticket's
        # identity, since two requests can be alike field for field. The ticket is kept so
        # that its id stays unique while it is here.
        self._holders: dict[int, tuple[Ticket, str, float]] = {}

    def reconfigure(self, policy: Policy, pool: BackendPool) -> None:
        """New admissions follow the new policy at once; running requests stay counted."""
        if (policy.scheduling, policy.costs) != (self.policy.scheduling, self.policy.costs):
            self.ordering = ordering_for(policy)
        self.policy, self.pool = policy, pool

    def join(self, ticket: Ticket, now: float, turn: asyncio.Future[Backend]) -> Waiter:
        user = ticket.user
        if user not in self.waiting:
            # VTC's rule: a user whose queue was empty is lifted to the least-served user
            # still waiting, so idle (or merely running) time cannot be banked into a burst.
            self.ordering.on_arrival(user, self.waiting.keys())
        weight = self.policy.limits_of(user).weight * ticket.class_weight
        candidate = Candidate(next(self._seq), user, weight, ticket.input_tokens)
        waiter = Waiter(ticket, candidate, now, turn)
        self.waiting.setdefault(user, deque()).append(waiter)
        self.depth += 1
        self._on_change()
        return waiter

    def leave(self, waiter: Waiter) -> None:
        queue = self.waiting.get(waiter.ticket.user)
        if queue is None or waiter not in queue:
            return
        queue.remove(waiter)
        self.depth -= 1
        if not queue:
            del self.waiting[waiter.ticket.user]
            self._idle_check(waiter.ticket.user)
        self._on_change()

    def cannot_start(self, ticket: Ticket) -> bool:
        """Whether a request arriving now would have to wait."""
        if self.running[ticket.user] >= self.policy.limits_of(ticket.user).max_concurrent:
            return True
        return not self.free_backends(ticket)

    def over_bound(self, user: str, joining: bool) -> Reason | None:
        """Which bound the room passes with this request in it (``joining``: not yet)."""
        extra = 1 if joining else 0
        if len(self.waiting.get(user, ())) + extra > self.policy.limits_of(user).max_queued:
            return Reason.USER_QUEUE_FULL
        if self.depth + extra > self.policy.queue.max_depth:
            return Reason.GATEWAY_BUSY
        return None

    def refuses_unseen(self, user: str) -> Reason | None:
        """The bound a request of ``user`` would pass, when it would pass it whatever its
        body says: the user's own places are all taken, or no backend has a free slot.
        Checked before the body is read, so a user at cap cannot make the gateway read,
        and hold, body after body only to refuse each."""
        reason = self.over_bound(user, joining=True)
        if reason is None:
            return None
        if self.running[user] >= self.policy.limits_of(user).max_concurrent:
            return reason
        if all(self.busy[b.key] >= b.slots for b in self.pool.backends):
            return reason
        return None

    def dispatch(self) -> None:
        """Give every free slot that a waiting request can use to the one the ordering picks."""
        if not any(self.busy[b.key] < b.slots for b in self.pool.backends):
            return  # every slot is taken: nobody waiting can start (the common overload case)
        while self.waiting:
            choice = self._next_turn()
            if choice is None:
                return
            waiter, backend = choice
            self.running[waiter.ticket.user] += 1  # before leaving: the user stays active
            self.leave(waiter)
            self.take(waiter.ticket, backend)
            self.ordering.on_dispatch(waiter.candidate)
            waiter.turn.set_result(backend)

    def free_backends(self, ticket: Ticket) -> list[Backend]:
        heavy_slots = self.policy.classes.heavy.slots_on
        return [
            backend
            for backend in self.pool.serving(ticket.api, ticket.model)
            if self.busy[backend.key] < backend.slots
            and not (ticket.heavy and self._heavy[backend.key] >= heavy_slots(backend.slots))
        ]

    def take(self, ticket: Ticket, backend: Backend) -> None:
        self.busy[backend.key] += 1
        if ticket.heavy:
            self._heavy[backend.key] += 1
        self._hold(ticket, backend)

    def give_back(self, ticket: Ticket, backend: Backend) -> None:
        _decrement(self.busy, backend.key)
        if ticket.heavy:
            _decrement(self._heavy, backend.key)
        held = self._holders.get(id(ticket))
        if held is not None and held[1] == backend.name:
            del self._holders[id(ticket)]

    def release(self, ticket: Ticket, backend: Backend) -> None:
        """A running request ended: its user's place and its slot are free again."""
        _decrement(self.running, ticket.user)
        self.give_back(ticket, backend)
        self._idle_check(ticket.user)
        self._on_change()
        self.dispatch()

    def snapshot(self, now: float) -> RoomSnapshot:
        users = {user: (count, 0) for user, count in self.running.items()}
        by_class: Counter[tuple[str, RequestClass]] = Counter()
        oldest = now
        for user, queue in self.waiting.items():
            users[user] = (self.running[user], len(queue))
            oldest = min(oldest, queue[0].arrived)
            for waiter in queue:
                by_class[user, waiter.ticket.request_class] += 1
        return RoomSnapshot(
            backends={b.name: (self.busy[b.key], b.slots) for b in self.pool.backends},
            users=users,
            queue_depth=self.depth,
            oldest_wait=now - oldest,
            heavy_running={b.name: self._heavy[b.key] for b in self.pool.backends},
            queued_by_class=dict(by_class),
            fair_counters=dict(self.ordering.counters()),
            running=self._running(),
            waiting=self._in_order(now),
        )

    def _hold(self, ticket: Ticket, backend: Backend) -> None:
        # A request moved to another backend (failover) keeps the time it started.
        held = self._holders.get(id(ticket))
        started = self._clock() if held is None else held[2]
        self._holders[id(ticket)] = (ticket, backend.name, started)

    def _running(self) -> tuple[RunningRequest, ...]:
        now = self._clock()
        return tuple(
            RunningRequest(ticket.user, ticket.model, name, ticket.request_class, now - started)
            for ticket, name, started in sorted(self._holders.values(), key=_started)
        )

    def position_of(self, waiter: Waiter) -> int:
        """Where ``waiter`` stands in ``in_order`` (1: next), or 0 if it is not waiting."""
        for position, other in enumerate(self.in_order(), start=1):
            if other is waiter:
                return position
        return 0

    def in_order(self) -> Iterator[Waiter]:
        """The waiting requests in the order the ordering would pick them if slots freed one
        by one now, played on a copy of it. Caps and heavy slots are left out: an estimate."""
        ordering = copy.deepcopy(self.ordering)
        queues = [deque(w for w in queue if not w.turn.done()) for queue in self.waiting.values()]
        queues = [queue for queue in queues if queue]
        while queues:
            chosen = ordering.choose([queue[0].candidate for queue in queues])
            ordering.on_dispatch(chosen)
            index = next(i for i, queue in enumerate(queues) if queue[0].candidate is chosen)
            yield queues[index].popleft()
            if not queues[index]:
                del queues[index]

    def _in_order(self, now: float) -> tuple[WaitingRequest, ...]:
        return tuple(
            WaitingRequest(
                waiter.ticket.user,
                waiter.ticket.model,
                waiter.ticket.request_class,
                now - waiter.arrived,
                position,
            )
            for position, waiter in enumerate(self.in_order(), start=1)
        )

    def _next_turn(self) -> tuple[Waiter, Backend] | None:
        offers: dict[int, tuple[Waiter, Backend]] = {}
        for user, queue in self.waiting.items():
            if self.running[user] >= self.policy.limits_of(user).max_concurrent:
                continue
            for waiter in queue:
                if waiter.turn.done():  # cancelled; its task is about to remove it
                    continue
                free = self.free_backends(waiter.ticket)
                if free:
                    offers[waiter.candidate.seq] = (waiter, self.prefer(free, waiter.ticket))
                    break
        if not offers:
            return None
        chosen = self.ordering.choose([waiter.candidate for waiter, _ in offers.values()])
        return offers[chosen.seq]

    def prefer(self, free: list[Backend], ticket: Ticket) -> Backend:
        return self.pool.prefer(free, ticket.model, self.busy)

    def _idle_check(self, user: str) -> None:
        if user not in self.waiting and user not in self.running:
            self.ordering.on_idle(user)


def _started(held: tuple[Ticket, str, float]) -> float:
    return held[2]


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
