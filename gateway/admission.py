"""Admission: the gateway owns the queue.

A request runs only when its user has fewer than ``max_concurrent`` running and a backend
that serves it has a free slot. Otherwise it waits in a short waiting room, bounded per user
and in total, for at most ``max_wait``; past any bound it is refused at once with an
estimate of when to retry. Backends never see more than their slots, so their own unbounded
FIFO queues (ollama/ollama#7758) stay empty.

The shape follows paddler's balancer: a quick path, a bound, then a bounded wait on a
"slot freed" signal. Dispatch is event-driven: it runs when a request arrives, when a permit
is released and when the policy changes, and it looks only at users who have requests waiting.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from collections import Counter, defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Literal

from gateway.backends import Backend, BackendPool
from gateway.errors import Api
from gateway.live import PolicyView
from gateway.policy import Policy
from gateway.scheduler import Candidate, Fair, Fifo, Ordering
from gateway.state import Hold, MemoryState, SharedState, StateUnavailable

__all__ = ["Admission", "AdmissionSnapshot", "Permit", "Refusal", "Ticket"]

RefusalReason = Literal["user_queue_full", "gateway_busy", "wait_timeout", "state_unavailable"]

# While another replica holds the room, look again at least this often (a release there
# is announced at once; this bounds the wait if the announcement is lost).
_SHARED_RETRY_SECONDS = 0.5


@dataclass(frozen=True, slots=True)
class Ticket:
    """What admission needs to know about a request."""

    user: str
    model: str
    api: Api
    input_tokens: float = 0.0  # estimated prompt tokens, charged at dispatch
    heavy: bool = False  # may hold only classes.heavy.max_slots of a backend
    class_weight: float = 1.0


@dataclass(frozen=True, slots=True)
class Refusal:
    """The request will not run; ``retry_after`` is when a slot is likely, in seconds."""

    reason: RefusalReason
    message: str
    retry_after: float


@dataclass(eq=False, slots=True)
class _Waiter:
    ticket: Ticket
    candidate: Candidate
    arrived: float
    turn: asyncio.Future[Backend]


@dataclass(frozen=True, slots=True)
class AdmissionSnapshot:
    """A consistent view for /status and metrics."""

    backends: dict[str, tuple[int, int]]  # name -> (busy, slots)
    users: dict[str, tuple[int, int]]  # name -> (running, queued)
    queue_depth: int
    oldest_wait: float
    heavy_running: dict[str, int] = field(default_factory=dict)  # backend -> heavy requests
    queued_by_class: dict[tuple[str, str], int] = field(default_factory=dict)  # (user, class)
    fair_counters: dict[str, float] = field(default_factory=dict)  # user -> virtual tokens


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
        "queue_wait",
        "ticket",
        "weight",
    )

    def __init__(self, admission: Admission, waiter: _Waiter, backend: Backend):
        self._admission = admission
        self._released = False
        self.ticket = waiter.ticket
        self.weight = waiter.candidate.weight
        self.backend = backend
        self.granted_at = admission.clock()
        self.queue_wait = self.granted_at - waiter.arrived
        self.output_charged = 0.0
        self.hold: Hold | None = None  # the claim in the shared state, once confirmed

    def add_output(self, tokens: float) -> None:
        """Charge tokens as they stream, so a long reply counts before it ends."""
        self.output_charged += tokens
        self._admission.ordering.on_output(self.ticket.user, self.weight, tokens)

    def settle(self, input_tokens: int | None, output_tokens: int | None) -> None:
        """Correct the charges with the backend's own counts, when it reported them."""
        ordering, user = self._admission.ordering, self.ticket.user
        if input_tokens is not None:
            ordering.on_correction(user, self.weight, input_tokens - self.ticket.input_tokens)
        if output_tokens is not None:
            self.add_output(output_tokens - self.output_charged)

    async def __aenter__(self) -> Permit:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()

    def release(self) -> None:
        if not self._released:
            self._released = True
            if self.hold is not None:
                self._admission.state.give_back(self.hold)
            self._admission._release(self.ticket, self.backend, self.granted_at)


# Until real requests have been timed, assume a reply holds its slot this long.
_DEFAULT_HOLD_SECONDS = 5.0


@dataclass
class Admission:
    """Caps, the bounded waiting room, and dispatch of freed slots."""

    policy: Policy
    pool: BackendPool
    clock: Callable[[], float] = time.monotonic
    state: SharedState = field(default_factory=MemoryState)
    ordering: Ordering = field(init=False)
    _waiting: dict[str, deque[_Waiter]] = field(default_factory=dict)
    _running: Counter[str] = field(default_factory=Counter)  # by user
    _busy: Counter[str] = field(default_factory=Counter)  # by backend name
    _heavy: Counter[str] = field(default_factory=Counter)  # heavy requests, by backend name
    _seq: itertools.count[int] = field(default_factory=itertools.count)
    _depth: int = 0
    _hold_estimate: float = _DEFAULT_HOLD_SECONDS
    _change: asyncio.Future[None] | None = None
    _unsent: defaultdict[str, float] = field(default_factory=lambda: defaultdict(float))

    def __post_init__(self) -> None:
        self.ordering = ordering_for(self.policy)

    def reconfigure(self, view: PolicyView) -> None:
        """Apply a new policy: new admissions follow it at once; held permits stay valid."""
        old, new = self.policy, view.policy
        if (new.scheduling, new.costs) != (old.scheduling, old.costs):
            self.ordering = ordering_for(new)
        self.policy, self.pool = view.policy, view.pool
        self._dispatch()

    async def acquire(self, ticket: Ticket) -> Permit | Refusal:
        """Wait for a turn; a Permit to hold while the request runs, or a Refusal.

        The turn is decided here, among this replica's waiting requests; the shared state
        then confirms that the user's cap and the backend's slots have room across every
        replica. If another replica got there first, the turn is given back and the request
        waits for a release anywhere, within the same ``max_wait``.
        """
        deadline = self.clock() + self.policy.queue.max_wait
        while True:
            outcome = await self._local_turn(ticket, deadline - self.clock())
            if isinstance(outcome, Refusal):
                return outcome
            try:
                shared = await self._hold_shared(outcome)
            except BaseException:
                outcome.release()
                raise
            if shared is True:
                return outcome
            outcome.release()
            if shared is not False:
                return shared
            remaining = deadline - self.clock()
            if remaining <= 0:
                return self._refusal("wait_timeout", ticket.user)
            await self.state.released(min(remaining, _SHARED_RETRY_SECONDS))

    async def _local_turn(self, ticket: Ticket, within: float) -> Permit | Refusal:
        reason = self._over_bound(ticket.user, joining=True)
        if reason is not None and self._cannot_start(ticket):
            # The quick no, under overload: no need to join the room only to leave it.
            return self._refusal(reason, ticket.user)
        waiter = self._enqueue(ticket)
        self._dispatch()
        if waiter.turn.done():  # the quick yes: a place was free
            return Permit(self, waiter, waiter.turn.result())
        reason = self._over_bound(ticket.user, joining=False)
        if reason is not None:
            self._leave(waiter)
            return self._refusal(reason, ticket.user)
        try:
            async with asyncio.timeout(max(within, 0.0)):
                backend = await asyncio.shield(waiter.turn)
        except TimeoutError:
            if waiter.turn.done():  # granted as the timer fired: take the turn after all
                return Permit(self, waiter, waiter.turn.result())
            self._leave(waiter)
            return self._refusal("wait_timeout", ticket.user)
        except BaseException:
            self._abandon(waiter)
            raise
        return Permit(self, waiter, backend)

    async def _hold_shared(self, permit: Permit) -> bool | Refusal:
        """True: held across replicas (or Redis is away and the policy says carry on);
        False: another replica holds the room; a Refusal when the policy says fail closed."""
        hold = self._hold_for(permit.ticket, permit.backend)
        try:
            taken = await self.state.take(hold)
        except StateUnavailable:
            if self.policy.redis.on_failure == "closed":
                return Refusal(
                    "state_unavailable",
                    "the shared state (Redis) is unreachable and the policy fails closed",
                    _SHARED_RETRY_SECONDS * 10,
                )
            return True  # per-replica limits only, until Redis is back
        if taken:
            permit.hold = hold
        return taken

    def _hold_for(self, ticket: Ticket, backend: Backend) -> Hold:
        return Hold(
            id=uuid.uuid4().hex,
            user=ticket.user,
            user_cap=self.policy.limits_of(ticket.user).max_concurrent,
            backend=backend.name,
            slots=backend.slots,
            heavy=ticket.heavy,
            heavy_slots=self.policy.classes.heavy.slots_on(backend.slots),
        )

    def can_reroute(self, permit: Permit) -> bool:
        """Whether another backend could take this permit's request right now."""
        if len(self.pool.backends) < 2:
            return False
        return any(b.name != permit.backend.name for b in self._free_backends(permit.ticket))

    async def reroute(self, permit: Permit) -> bool:
        """Move a permit whose backend failed before replying to another free backend."""
        failed, old_hold = permit.backend, permit.hold
        others = [b for b in self._free_backends(permit.ticket) if b.name != failed.name]
        if not others:
            return False
        chosen = self.pool.prefer(others, permit.ticket.model, self._busy)
        self._take(permit.ticket, chosen)
        self._give_back(permit.ticket, failed)
        permit.backend, permit.hold = chosen, None
        if old_hold is not None:
            self.state.give_back(old_hold)
        # If the shared state refuses, the permit still holds the new backend locally and
        # its release undoes that; the caller answers with the first backend's failure.
        return await self._hold_shared(permit) is True

    async def share(self) -> None:
        """Exchange fair-share charges and queue depth with the other replicas."""
        for user, amount in self.ordering.take_charges().items():
            self._unsent[user] += amount
        totals = await self.state.exchange(dict(self._unsent), self._depth)
        if totals is not None:  # else kept, and sent when the shared state is back
            self._unsent.clear()
            self.ordering.adopt(totals)

    def wake(self) -> None:
        """Something outside changed (a backend came back, its slots became known)."""
        self._notify()
        self._dispatch()

    def changed(self) -> asyncio.Future[None]:
        """A future resolved at the next change of counts (for /status watchers and tests)."""
        if self._change is None or self._change.done():
            self._change = asyncio.get_running_loop().create_future()
        return self._change

    def _notify(self) -> None:
        if self._change is not None and not self._change.done():
            self._change.set_result(None)

    def snapshot(self) -> AdmissionSnapshot:
        now = self.clock()
        users = {user: (count, 0) for user, count in self._running.items()}
        by_class: Counter[tuple[str, str]] = Counter()
        oldest = now
        for user, queue in self._waiting.items():
            users[user] = (self._running[user], len(queue))
            oldest = min(oldest, queue[0].arrived)
            for waiter in queue:
                by_class[user, "heavy" if waiter.ticket.heavy else "light"] += 1
        return AdmissionSnapshot(
            backends={b.name: (self._busy[b.name], b.slots) for b in self.pool.backends},
            users=users,
            queue_depth=self._depth,
            oldest_wait=now - oldest,
            heavy_running=dict(self._heavy),
            queued_by_class=dict(by_class),
            fair_counters=dict(self.ordering.counters()),
        )

    # -- the waiting room --------------------------------------------------------------

    def _enqueue(self, ticket: Ticket) -> _Waiter:
        user = ticket.user
        if user not in self._waiting:
            # VTC's rule: a user whose queue was empty is lifted to the least-served user
            # still waiting, so idle (or merely running) time cannot be banked into a burst.
            self.ordering.on_arrival(user, self._waiting.keys())
        weight = self.policy.limits_of(user).weight * ticket.class_weight
        candidate = Candidate(next(self._seq), user, weight, ticket.input_tokens)
        loop = asyncio.get_running_loop()
        waiter = _Waiter(ticket, candidate, self.clock(), loop.create_future())
        self._waiting.setdefault(ticket.user, deque()).append(waiter)
        self._depth += 1
        self._notify()
        return waiter

    def _leave(self, waiter: _Waiter) -> None:
        queue = self._waiting.get(waiter.ticket.user)
        if queue is None or waiter not in queue:
            return
        queue.remove(waiter)
        self._depth -= 1
        if not queue:
            del self._waiting[waiter.ticket.user]
            self._idle_check(waiter.ticket.user)
        self._notify()

    def _abandon(self, waiter: _Waiter) -> None:
        """The client went away while waiting: give back a turn granted in the meantime."""
        if waiter.turn.done() and not waiter.turn.cancelled():
            self._release(waiter.ticket, waiter.turn.result(), self.clock())
        else:
            waiter.turn.cancel()
            self._leave(waiter)

    def _cannot_start(self, ticket: Ticket) -> bool:
        """Whether a request arriving now would have to wait."""
        if self._running[ticket.user] >= self.policy.limits_of(ticket.user).max_concurrent:
            return True
        return not self._free_backends(ticket)

    def _over_bound(self, user: str, joining: bool) -> RefusalReason | None:
        """Which bound the room passes with this request in it (``joining``: not yet)."""
        extra = 1 if joining else 0
        if len(self._waiting.get(user, ())) + extra > self.policy.limits_of(user).max_queued:
            return "user_queue_full"
        if self._depth + extra > self.policy.queue.max_depth:
            return "gateway_busy"
        return None

    def _refusal(self, reason: RefusalReason, user: str) -> Refusal:
        """The refusal of a request that is not (or no longer) in the waiting room."""
        limits = self.policy.limits_of(user)
        if reason == "user_queue_full":
            waiting, places = len(self._waiting.get(user, ())), limits.max_concurrent
            message = (
                f"user {user} already has {self._running[user]} running and {waiting} "
                f"waiting (max_queued {limits.max_queued}); retry later"
            )
        else:
            waiting = self._depth + self.state.others_waiting
            places = max(1, sum(b.slots for b in self.pool.backends))
            message = (
                f"the gateway is busy: {self._depth} requests waiting (max_depth "
                f"{self.policy.queue.max_depth}); retry later"
                if reason == "gateway_busy"
                else f"no slot freed within max_wait {self.policy.queue.max_wait:g}s; retry later"
            )
        retry_after = self._hold_estimate * (waiting + 1) / places
        return Refusal(reason, message, min(retry_after, 600.0))

    # -- dispatch ----------------------------------------------------------------------

    def _dispatch(self) -> None:
        if not any(self._busy[b.name] < b.slots for b in self.pool.backends):
            return  # every slot is taken: nobody waiting can start (the common overload case)
        while self._waiting:
            choice = self._next_turn()
            if choice is None:
                return
            waiter, backend = choice
            self._running[waiter.ticket.user] += 1  # before leaving: the user stays active
            self._leave(waiter)
            self._take(waiter.ticket, backend)
            self.ordering.on_dispatch(waiter.candidate)
            waiter.turn.set_result(backend)

    def _next_turn(self) -> tuple[_Waiter, Backend] | None:
        offers: dict[int, tuple[_Waiter, Backend]] = {}
        for user, queue in self._waiting.items():
            if self._running[user] >= self.policy.limits_of(user).max_concurrent:
                continue
            for waiter in queue:
                if waiter.turn.done():  # cancelled; its task is about to remove it
                    continue
                backend = self._free_backend(waiter.ticket)
                if backend is not None:
                    offers[waiter.candidate.seq] = (waiter, backend)
                    break
        if not offers:
            return None
        chosen = self.ordering.choose([waiter.candidate for waiter, _ in offers.values()])
        return offers[chosen.seq]

    def _free_backend(self, ticket: Ticket) -> Backend | None:
        free = self._free_backends(ticket)
        return self.pool.prefer(free, ticket.model, self._busy) if free else None

    def _free_backends(self, ticket: Ticket) -> list[Backend]:
        heavy = self.policy.classes.heavy
        return [
            backend
            for backend in self.pool.serving(ticket.api, ticket.model)
            if self._busy[backend.name] < backend.slots
            and not (ticket.heavy and self._heavy[backend.name] >= heavy.slots_on(backend.slots))
        ]

    def _take(self, ticket: Ticket, backend: Backend) -> None:
        self._busy[backend.name] += 1
        if ticket.heavy:
            self._heavy[backend.name] += 1

    def _give_back(self, ticket: Ticket, backend: Backend) -> None:
        _decrement(self._busy, backend.name)
        if ticket.heavy:
            _decrement(self._heavy, backend.name)

    def _release(self, ticket: Ticket, backend: Backend, granted_at: float) -> None:
        _decrement(self._running, ticket.user)
        self._give_back(ticket, backend)
        self._idle_check(ticket.user)
        held = self.clock() - granted_at
        self._hold_estimate += 0.2 * (held - self._hold_estimate)
        self._notify()
        self._dispatch()

    def _idle_check(self, user: str) -> None:
        if user not in self._waiting and user not in self._running:
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
