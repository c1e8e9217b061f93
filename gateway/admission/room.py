"""The local waiting room: who runs, who waits, and who goes next when a slot frees.

Synchronous and without I/O: every method runs to completion on the event loop, so the
counts it keeps are never seen half-updated. Its slot ledger (``slot_ledger.py``) is the one
ledger of this replica's running requests and busy slots; the cross-replica hold store only
confirms them.

A request runs when its user has fewer than ``max_concurrent`` running and a backend that
serves it a free slot (heavy requests: a free heavy slot, and no light request running there
for at most ``classes.heavy.wait_for_light``: ``prefill_gate.py``); the ordering (FIFO or
fair) picks among the users waiting (``admission/turns.py``). Two lanes
(``admission/queues.py``), each user an interactive and a background queue: a slot goes to
background work only when no interactive request can take it, up to
``lanes.background.max_slots``. Which bound a request would pass: the end of ``turns.py``.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping
from dataclasses import replace

from gateway.admission.preemption import Preemptions
from gateway.admission.prefill_gate import PrefillGate
from gateway.admission.prompt_caches import PromptCaches
from gateway.admission.queues import UserQueues
from gateway.admission.room_snapshot import RoomSnapshot, room_snapshot
from gateway.admission.scheduler import Candidate, Fair, Fifo, Ordering
from gateway.admission.slot_ledger import SlotLedger
from gateway.admission.tickets import Ticket, Waiter
from gateway.admission.turns import Offer, free_backends, free_now, next_offer, waits
from gateway.admission.wait_estimates import WaitEstimates
from gateway.backends import Backend, BackendPool
from gateway.config import Limits, Policy, background_account, model_key
from gateway.core import BACKGROUND, Lane
from gateway.swaps import Placement, SwapPlanner

__all__ = ["QuickYes", "Ticket", "Waiter", "WaitingRoom", "ordering_for"]


# A request started at once: its backend, how it finds its model there, its weight.
QuickYes = tuple[Backend, Placement, float]


class WaitingRoom:
    """The user queues and the slot ledger kept in step: joins, the quick yes, the
    dispatch of freed slots, releases. Its counts (``waiting``, ``busy``...) read through."""

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
        self.lines = UserQueues(policy)  # who waits and who runs, by user and lane
        self.slots = SlotLedger(clock)  # what runs, by slot group, and who holds it
        self.swaps = SwapPlanner(clock)  # what each Ollama backend holds, loads and unloads
        self.gate = PrefillGate()  # since when a heavy request is held, by slot group
        self.preemptions = Preemptions()  # background work that gives way to a person
        self.prompts = PromptCaches()  # what each engine likely holds of recent prompts
        self.waits = WaitEstimates()  # service times learned, waits played out from them
        self.clock = clock
        self._seq = itertools.count()
        self._on_change = on_change
        self._wake_in = wake_in

    # The room's counts, as its callers (admission, refusals, the snapshot) read them.
    @property
    def depth(self) -> int:
        return self.lines.depth

    @property
    def waiting(self) -> dict[str, deque[Waiter]]:
        return self.lines.waiting

    @property
    def background(self) -> dict[str, deque[Waiter]]:
        return self.lines.background

    @property
    def running(self) -> Counter[str]:
        return self.lines.running

    @property
    def background_running(self) -> Counter[str]:
        return self.lines.background_running

    @property
    def giving_way(self) -> int:
        return len(self.preemptions.runs)

    @property
    def busy(self) -> Counter[str]:
        return self.slots.busy

    def reconfigure(self, policy: Policy, pool: BackendPool) -> None:
        """New admissions follow the new policy at once; running requests stay counted."""
        if _ordered_by(policy) != _ordered_by(self.policy):
            self.ordering = ordering_for(policy, self.ordering.counters())
        self.policy = self.lines.policy = policy
        self.pool = pool

    def join(self, ticket: Ticket, now: float, turn: asyncio.Future[Backend]) -> Waiter:
        """``ticket``'s request waits in its lane; ``dispatch`` gives it its turn."""
        waiter = self._arrival(ticket, now, turn)
        self.lines.add(waiter)
        self.waits.expect(self, waiter, now)
        self._on_change()
        return waiter

    def start_at_once(self, ticket: Ticket) -> QuickYes | None:
        """The quick yes: with nobody waiting, a request that can start takes its slot now;
        None if it would have to wait. What ``join`` and ``dispatch`` would do, the request
        being the only one to choose from, without a waiter, a turn to resolve, nor a queue
        to enter and leave: this is the path of every request on a gateway with room."""
        lines = self.lines
        if lines.depth or not self.slots.has_free_slot(self.pool.backends):
            return None  # somebody waits (the ordering picks who goes next) or all is taken
        limits = self.policy.limits_of(ticket.user)
        if lines.at_cap(ticket.user, ticket.lane, limits):
            return None
        serving = self.pool.serving(ticket.api, ticket.model)
        if self.swaps.planned:  # as dispatch does first, the waiting being this one alone
            self.swaps.keep_only({(b.key, model_key(ticket.model)) for b in serving})
        # With one backend, what its memory holds is asked once, with how the request would
        # find its model there: not once to know whether it may go, then again as it goes.
        # Not for heavy requests: asking the prefill gate whether one may start holds it.
        single = len(serving) == 1 and not ticket.heavy
        backend = free_now(self, ticket, serving, single)
        if backend is None:
            return None
        swaps, busy = self.swaps, self.slots.busy
        if single:
            placement = swaps.admitted(backend, ticket.model, ticket.num_ctx, busy)
            if placement is None:
                return None
        else:
            placement = swaps.placed(backend, ticket.model, ticket.num_ctx, busy)
        # As ``_arrival`` does, nobody waiting: the user is lifted to where the room left off.
        self.ordering.on_arrival(ticket.payer, ())
        candidate = self._candidate(ticket, limits)
        lines.started(ticket)
        self._occupy(ticket, backend)
        self.ordering.on_dispatch(candidate)
        self._on_change()
        if self.gate.holding:  # nearly never: asked here, without a call on every request
            self._wake_for_held()
        if ticket.lane is not BACKGROUND:  # a person, perhaps beside a task
            self.give_way()
        return backend, placement, candidate.weight

    def _arrival(self, ticket: Ticket, now: float, turn: asyncio.Future[Backend]) -> Waiter:
        user, lines = ticket.user, self.lines
        if user not in lines.queues(ticket.lane):
            # VTC's rule: a user whose queue was empty is lifted to the least-served user
            # still waiting, so idle (or merely running) time cannot be banked into a burst.
            # Background work is charged to its own account: lifted, and ordered, as one.
            self.ordering.on_arrival(ticket.payer, self._payers_waiting() if lines.depth else ())
        return Waiter(ticket, self._candidate(ticket, self.policy.limits_of(user)), now, turn)

    def _payers_waiting(self) -> set[str]:
        """Whom the requests waiting now are charged to (``Ticket.payer``)."""
        lines = self.lines
        return lines.waiting.keys() | {background_account(user) for user in lines.background}

    def _candidate(self, ticket: Ticket, limits: Limits) -> Candidate:
        weight = limits.weight * ticket.class_weight
        # Built without ``Candidate``'s check that the weight is > 0: the policy holds both
        # factors to 0.001 and more (``Weight``), and every request makes one.
        fields = (next(self._seq), ticket.payer, weight, ticket.input_tokens)
        return tuple.__new__(Candidate, fields)

    def leave(self, waiter: Waiter) -> None:
        """``waiter`` is out of the room (dispatched, gone, refused); again: nothing."""
        if not self.lines.remove(waiter):
            return
        self._idle_check(waiter.ticket.user)
        self._on_change()

    def queues(self, lane: Lane) -> dict[str, deque[Waiter]]:
        """The waiting requests of ``lane``, by user."""
        return self.lines.queues(lane)

    def runs(self, lane: Lane) -> Counter[str]:
        """The running requests of ``lane``, by user."""
        return self.lines.runs(lane)

    def caps(self, user: str, lane: Lane) -> tuple[int, int]:
        """(max_concurrent, max_queued) of ``user`` in ``lane``."""
        return self.lines.caps(user, lane)

    def dispatch(self) -> None:
        """Give every free slot that a waiting request can use to the one the ordering picks."""
        if self.swaps.planned:  # none, nearly always: then nobody's demand needs counting
            self.swaps.keep_only(waits(self))
        if self.lines.depth or self.gate.holding:  # somebody to give a slot to, or to wake
            self._dispatch_waiting()
        # Asked whether slots are free or not: a task holding the last slot gives it up.
        self.give_way()

    def _dispatch_waiting(self) -> None:
        if not self.slots.has_free_slot(self.pool.backends):
            return  # every slot is taken: nobody waiting can start (the common overload case)
        while self.lines.depth:
            offer = self._next_turn()
            if offer is None:
                break
            self.lines.started(offer.waiter.ticket)  # before it leaves: the user stays active
            self.leave(offer.waiter)
            self._start(offer.waiter, offer.backend)
        self._wake_for_held()

    def give_way(self) -> None:
        """Background work that should give its slot to a person does so now."""
        if self.preemptions.runs:  # nearly never: background work runs that may give way
            self._give_way()

    def _give_way(self) -> None:
        """Background work gives its slot up where a person's request runs beside it (unless
        ``lanes.background.beside_people``), or where a person still waits who could use
        it: its release dispatches again, which starts the person, and gives way again for
        the next."""
        preemptions, now = self.preemptions, self.clock()
        if not self.policy.lanes.background.beside_people:
            for beside in preemptions.beside_people(self):
                preemptions.preempt(beside, now)
        for queue in list(self.lines.waiting.values()):
            victim = preemptions.victim_for(self, queue[0].ticket)
            if victim is not None:
                preemptions.preempt(victim, now)
                return

    def could_give_way(self, ticket: Ticket) -> bool:
        """Whether background work holds a slot ``ticket``'s request could start on now."""
        preemptions = self.preemptions
        return bool(preemptions.runs) and preemptions.victim_for(self, ticket) is not None

    def _next_turn(self) -> Offer | None:
        # People first: background work gets a slot only when no interactive request can.
        return self._turn_in(Lane.INTERACTIVE) or self._turn_in(Lane.BACKGROUND)

    def _turn_in(self, lane: Lane) -> Offer | None:
        offer = next_offer(self, lane)
        while offer is not None and offer.swap:
            # Its turn: drain the victims now, so that it goes as soon as they are idle
            # (at once if they are); meanwhile the others' requests keep their turns.
            ticket = offer.waiter.ticket
            busy = self.slots.busy
            self.swaps.plan(offer.backend, ticket.model, ticket.num_ctx, busy, waits(self))
            self._on_change()
            offer = next_offer(self, lane)
        return offer

    def _start(self, waiter: Waiter, backend: Backend) -> None:
        """``waiter``'s turn: its slot on ``backend`` taken and charged, its turn resolved."""
        waiter.placement = self.take(waiter.ticket, backend)
        self.waits.started(waiter, self.clock())
        self.ordering.on_dispatch(waiter.candidate)
        waiter.turn.set_result(backend)

    def _wake_for_held(self) -> None:
        # A swap that would make room, due later (``swap_due``), or a held heavy request.
        due_in, self.swaps.due_in = self.swaps.due_in, None
        if due_in is not None:
            self._wake_in(due_in)
        if not self.gate.holding:
            return  # nearly always: no heavy request is held
        opens = self.gate.opens_at(self.policy.classes.heavy.wait_for_light)
        if opens is None:
            return
        if not any(waiter.ticket.heavy for waiter in self.lines.waiters()):
            self.gate.clear()  # the held request went away: the next is held afresh
            return
        now = self.clock()
        if opens > now:  # else open already: the next release or arrival dispatches
            self._wake_in(opens - now)

    def free_backends(self, ticket: Ticket) -> list[Backend]:
        return free_backends(self, ticket)  # serving it, with a slot it may take (gate aside)

    def prefer(self, free: list[Backend], ticket: Ticket) -> Backend:
        """Where its engine likely holds the most of its prompt, then the pool's rule."""
        free = self.prompts.holding_most(free, ticket.prefix) if len(free) > 1 else free
        return self.pool.prefer(free, ticket.model, self.slots.busy)

    def service(self, backend: Backend, ticket: Ticket) -> float:
        """How long ``ticket``'s request would likely hold a slot on ``backend``."""
        return self.waits.service(backend.name, ticket)

    def take(self, ticket: Ticket, backend: Backend) -> Placement:
        """Count ``ticket``'s request as running on ``backend``; how it finds its model."""
        # Asked before the slot is counted: what memory holds is judged by the requests
        # already running, and this one would make its own model look held.
        placement = self.swaps.placed(backend, ticket.model, ticket.num_ctx, self.slots.busy)
        self._occupy(ticket, backend)
        return placement

    def _occupy(self, ticket: Ticket, backend: Backend) -> None:
        """``take``, its placement worked out already."""
        self.slots.take(ticket, backend)
        if ticket.heavy:
            self.gate.started(backend.group(ticket.model))  # the next one is held afresh

    def give_back(self, ticket: Ticket, backend: Backend) -> None:
        """``ticket``'s slot on ``backend`` is free (it ended, or failed over elsewhere)."""
        self.swaps.ran(backend, ticket.model, None if ticket.lane is BACKGROUND else ticket.user)
        self.slots.give_back(ticket, backend)

    def release(self, ticket: Ticket, backend: Backend) -> None:
        """A running request ended: its user's place and its slot are free again."""
        self.lines.ended(ticket)
        self.give_back(ticket, backend)
        self._idle_check(ticket.user)
        self._on_change()
        self.dispatch()

    def snapshot(self, now: float) -> RoomSnapshot:
        """The room at ``now``, for /status, metrics and the house page."""
        waits, starts = self.waits, self.waits.starts(self, now) if self.lines.depth else {}
        snapshot = room_snapshot(self, now, self.preemptions.waste, self.giving_way, starts)
        return replace(snapshot, estimates=waits.snapshot())

    def _idle_check(self, user: str) -> None:
        if self.lines.idle(user):
            self.ordering.on_idle(user)


def _ordered_by(policy: Policy) -> tuple[str, float, float]:
    """What the ordering reads of a policy (not the costs of loads or images)."""
    return policy.scheduling, policy.costs.input, policy.costs.output


def ordering_for(policy: Policy, counters: Mapping[str, float] | None = None) -> Ordering:
    """The ordering policy the YAML asks for; a fair one with ``counters`` (a reload's: who
    has had how much, since a changed price is no fresh start for everyone)."""
    if policy.scheduling == "fifo":
        return Fifo()
    fair = Fair(w_in=policy.costs.input, w_out=policy.costs.output)
    fair.adopt(counters or {})
    return fair
