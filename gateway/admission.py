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
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Literal

from gateway.backends import Backend, BackendPool
from gateway.errors import Api
from gateway.live import PolicyView
from gateway.policy import Policy
from gateway.scheduler import Candidate, Ordering

__all__ = ["Admission", "AdmissionSnapshot", "Permit", "Refusal", "Ticket"]

RefusalReason = Literal["user_queue_full", "gateway_busy", "wait_timeout"]


@dataclass(frozen=True, slots=True)
class Ticket:
    """What admission needs to know about a request."""

    user: str
    model: str
    api: Api
    cost: float = 0.0  # estimated tokens, for the fair ordering


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


class Permit:
    """A held turn: one of the user's running places and one backend slot.

    Use it with ``async with``; leaving the block releases both, on every path, and lets
    the next waiting request in.
    """

    __slots__ = ("_admission", "_released", "backend", "granted_at", "queue_wait", "ticket")

    def __init__(self, admission: Admission, ticket: Ticket, backend: Backend, waited: float):
        self._admission = admission
        self._released = False
        self.ticket = ticket
        self.backend = backend
        self.queue_wait = waited
        self.granted_at = admission.clock()

    async def __aenter__(self) -> Permit:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._admission._release(self.ticket.user, self.backend, self.granted_at)


# Until real requests have been timed, assume a reply holds its slot this long.
_DEFAULT_HOLD_SECONDS = 5.0


@dataclass
class Admission:
    """Caps, the bounded waiting room, and dispatch of freed slots."""

    policy: Policy
    pool: BackendPool
    ordering: Ordering
    clock: Callable[[], float] = time.monotonic
    _waiting: dict[str, deque[_Waiter]] = field(default_factory=dict)
    _running: Counter[str] = field(default_factory=Counter)  # by user
    _busy: Counter[str] = field(default_factory=Counter)  # by backend name
    _seq: itertools.count[int] = field(default_factory=itertools.count)
    _depth: int = 0
    _hold_estimate: float = _DEFAULT_HOLD_SECONDS
    _change: asyncio.Future[None] | None = None

    def reconfigure(self, view: PolicyView) -> None:
        """Apply a new policy: new admissions follow it at once; held permits stay valid."""
        self.policy, self.pool = view.policy, view.pool
        self._dispatch()

    async def acquire(self, ticket: Ticket) -> Permit | Refusal:
        """Wait for a turn; a Permit to hold while the request runs, or a Refusal."""
        waiter = self._enqueue(ticket)
        self._dispatch()
        if not waiter.turn.done():
            refusal = self._over_bound(ticket.user)
            if refusal is not None:
                self._leave(waiter)
                return refusal
        try:
            async with asyncio.timeout(self.policy.queue.max_wait):
                backend = await asyncio.shield(waiter.turn)
        except TimeoutError:
            if waiter.turn.done():  # granted as the timer fired: take the turn after all
                return Permit(self, ticket, waiter.turn.result(), self.clock() - waiter.arrived)
            self._leave(waiter)
            return self._refusal("wait_timeout", ticket.user)
        except BaseException:
            self._abandon(waiter)
            raise
        return Permit(self, ticket, backend, self.clock() - waiter.arrived)

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
        oldest = now
        for user, queue in self._waiting.items():
            users[user] = (self._running[user], len(queue))
            oldest = min(oldest, queue[0].arrived)
        return AdmissionSnapshot(
            backends={b.name: (self._busy[b.name], b.slots) for b in self.pool.backends},
            users=users,
            queue_depth=self._depth,
            oldest_wait=now - oldest,
        )

    # -- the waiting room --------------------------------------------------------------

    def _enqueue(self, ticket: Ticket) -> _Waiter:
        self.ordering.on_arrival(ticket.user, frozenset(self._waiting))
        candidate = Candidate(next(self._seq), ticket.user, ticket.cost)
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
        self._notify()

    def _abandon(self, waiter: _Waiter) -> None:
        """The client went away while waiting: give back a turn granted in the meantime."""
        if waiter.turn.done() and not waiter.turn.cancelled():
            self._release(waiter.ticket.user, waiter.turn.result(), self.clock())
        else:
            waiter.turn.cancel()
            self._leave(waiter)

    def _over_bound(self, user: str) -> Refusal | None:
        # The request is already counted in the room, hence ">".
        if len(self._waiting[user]) > self.policy.limits_of(user).max_queued:
            return self._refusal("user_queue_full", user)
        if self._depth > self.policy.queue.max_depth:
            return self._refusal("gateway_busy", user)
        return None

    def _refusal(self, reason: RefusalReason, user: str) -> Refusal:
        limits = self.policy.limits_of(user)
        if reason == "user_queue_full":
            ahead, places = len(self._waiting.get(user, ())), limits.max_concurrent
            message = (
                f"user {user} already has {self._running[user]} running and {ahead - 1} "
                f"waiting (max_queued {limits.max_queued}); retry later"
            )
        else:
            ahead, places = self._depth, max(1, sum(b.slots for b in self.pool.backends))
            message = (
                f"the gateway is busy: {self._depth - 1} requests waiting (max_depth "
                f"{self.policy.queue.max_depth}); retry later"
                if reason == "gateway_busy"
                else f"no slot freed within max_wait {self.policy.queue.max_wait:g}s; retry later"
            )
        retry_after = self._hold_estimate * max(1, ahead) / places
        return Refusal(reason, message, min(retry_after, 600.0))

    # -- dispatch ----------------------------------------------------------------------

    def _dispatch(self) -> None:
        while self._waiting:
            choice = self._next_turn()
            if choice is None:
                return
            waiter, backend = choice
            self._leave(waiter)
            self._running[waiter.ticket.user] += 1
            self._busy[backend.name] += 1
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
        free = [
            backend
            for backend in self.pool.serving(ticket.api, ticket.model)
            if self._busy[backend.name] < backend.slots
        ]
        return self.pool.prefer(free, ticket.model, self._busy) if free else None

    def _release(self, user: str, backend: Backend, granted_at: float) -> None:
        _decrement(self._running, user)
        _decrement(self._busy, backend.name)
        held = self.clock() - granted_at
        self._hold_estimate += 0.2 * (held - self._hold_estimate)
        self._notify()
        self._dispatch()


def _decrement(counter: Counter[str], key: str) -> None:
    # Keys at zero are dropped so that state stays proportional to what is active.
    if counter[key] <= 1:
        counter.pop(key, None)
    else:
        counter[key] -= 1
