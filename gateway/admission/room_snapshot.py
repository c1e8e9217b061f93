"""The waiting room at one instant (for /status, metrics and the house page), and the order
in which its waiting requests would go.

Read-only views of ``room.WaitingRoom``: they never change its counts. The order is
played on a copy of the ordering, slot by slot: interactive requests first, as dispatch
does. Caps, heavy and background slots are left out, so positions are an estimate.
"""

from __future__ import annotations

import copy
from collections import Counter, deque
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

from gateway.admission.preemption import Waste
from gateway.admission.room_state import RoomState
from gateway.admission.scheduler import Ordering
from gateway.admission.tickets import Ticket, Waiter
from gateway.core import Lane, RequestClass
from gateway.swaps import ResidentsSnapshot, SwapsSnapshot

__all__ = [
    "EstimatesSnapshot",
    "RoomSnapshot",
    "RunningRequest",
    "WaitingRequest",
    "in_order",
    "position_of",
    "room_snapshot",
]


@dataclass(frozen=True, slots=True)
class RunningRequest:
    """A request holding a slot: who runs what where, for how long so far (seconds)."""

    user: str
    model: str
    backend: str
    request_class: RequestClass
    seconds: float
    lane: Lane = Lane.INTERACTIVE
    replica: str = ""  # with several replicas: the one it runs on


@dataclass(frozen=True, slots=True)
class WaitingRequest:
    """A request in the room; ``position`` 1 is the next the ordering would pick."""

    user: str
    model: str
    request_class: RequestClass
    waited: float
    position: int
    lane: Lane = Lane.INTERACTIVE
    starts_in: float = 0.0  # seconds until it likely starts (admission/wait_estimates.py)
    replica: str = ""  # with several replicas: the one it waits on
    request: int = 0  # which request it is (its ticket's id), to match it with its place


@dataclass(frozen=True, slots=True)
class EstimatesSnapshot:
    """How good the waiting estimates have been, and what they are made of."""

    median_error: float | None  # |estimated - waited| / waited, people's last waits
    samples: int
    decode_seconds: dict[tuple[str, str, RequestClass], float] = field(default_factory=dict)
    prefill_rates: dict[str, float] = field(default_factory=dict)  # tokens a second
    background_median_error: float | None = None  # the same, of background work's waits
    background_samples: int = 0


@dataclass(frozen=True, slots=True)
class RoomSnapshot:
    """The room at one instant, for /status, metrics and the house page."""

    backends: dict[str, tuple[int, int]]  # name -> (busy, slots); Ollama: every model's
    users: dict[str, tuple[int, int]]  # name -> (running, queued), interactive
    queue_depth: int  # both lanes
    oldest_wait: float
    heavy_running: dict[str, int] = field(default_factory=dict)  # backend -> heavy requests
    queued_by_class: dict[tuple[str, RequestClass], int] = field(default_factory=dict)
    fair_counters: dict[str, float] = field(default_factory=dict)  # user -> virtual tokens
    background_users: dict[str, tuple[int, int]] = field(default_factory=dict)
    running: tuple[RunningRequest, ...] = ()  # oldest first
    waiting: tuple[WaitingRequest, ...] = ()  # in the order the ordering would pick them
    model_busy: dict[tuple[str, str], int] = field(default_factory=dict)  # (backend, model)
    residents: dict[str, ResidentsSnapshot] = field(default_factory=dict)  # Ollama, by name
    swaps: SwapsSnapshot = field(default_factory=lambda: SwapsSnapshot({}, {}))  # by key
    given_way: Waste = field(default_factory=Waste)  # background work's restarts, since start
    preemptible: int = 0  # background requests running now that would give way to a person
    estimates: EstimatesSnapshot = field(default_factory=lambda: EstimatesSnapshot(None, 0))


def room_snapshot(
    room: RoomState,
    now: float,
    given_way: Waste | None = None,
    preemptible: int = 0,
    starts: dict[int, float] | None = None,
) -> RoomSnapshot:
    """``starts``: seconds until each waiter likely starts, by its ``id``."""
    starts = starts or {}
    by_class: Counter[tuple[str, RequestClass]] = Counter()
    oldest = now
    for queue in (*room.waiting.values(), *room.background.values()):
        oldest = min(oldest, queue[0].arrived)
        for waiter in queue:
            by_class[waiter.ticket.user, waiter.ticket.request_class] += 1
    slots = room.slots
    return RoomSnapshot(
        backends={b.name: (slots.busy_on(b), b.slots) for b in room.pool.backends},
        model_busy={
            (b.name, model): count
            for b in room.pool.backends
            if b.per_model
            for model, count in slots.by_model(b).items()
        },
        users=_counts(room.running, room.waiting),
        background_users=_counts(room.background_running, room.background),
        queue_depth=room.depth,
        oldest_wait=now - oldest,
        heavy_running={b.name: slots.busy_on(b, slots.heavy) for b in room.pool.backends},
        residents={
            b.name: room.swaps.residency.snapshot(b, slots.busy)
            for b in room.pool.backends
            if b.per_model
        },
        swaps=room.swaps.snapshot(),
        queued_by_class=dict(by_class),
        fair_counters=dict(room.ordering.counters()),
        given_way=Waste() if given_way is None else replace(given_way),
        preemptible=preemptible,
        running=_running(room, now),
        waiting=tuple(
            WaitingRequest(
                waiter.ticket.user,
                waiter.ticket.model,
                waiter.ticket.request_class,
                now - waiter.arrived,
                position,
                waiter.ticket.lane,
                starts.get(id(waiter), 0.0),
                request=id(waiter.ticket),
            )
            for position, waiter in enumerate(in_order(room), start=1)
        ),
    )


def in_order(room: RoomState) -> Iterator[Waiter]:
    """The waiting requests in the order they would be dispatched if slots freed one by
    one now."""
    ordering = copy.deepcopy(room.ordering)
    for lane in (Lane.INTERACTIVE, Lane.BACKGROUND):
        yield from _played(ordering, room.queues(lane))


def position_of(room: RoomState, waiter: Waiter) -> int:
    """Where ``waiter`` stands in the order the room would dispatch (1: next), or 0."""
    for position, other in enumerate(in_order(room), start=1):
        if other is waiter:
            return position
    return 0


def _running(room: RoomState, now: float) -> tuple[RunningRequest, ...]:
    return tuple(
        RunningRequest(
            ticket.user, ticket.model, name, ticket.request_class, now - started, ticket.lane
        )
        for ticket, name, started in sorted(room.slots.holders.values(), key=_started)
    )


def _counts(running: Counter[str], waiting: dict[str, deque[Waiter]]) -> dict[str, tuple[int, int]]:
    """(running, waiting) by user, for every user with either."""
    return {
        user: (running[user], len(waiting.get(user, ())))
        for user in running.keys() | waiting.keys()
    }


def _played(ordering: Ordering, by_user: dict[str, deque[Waiter]]) -> Iterator[Waiter]:
    queues = [deque(w for w in queue if not w.turn.done()) for queue in by_user.values()]
    queues = [queue for queue in queues if queue]
    while queues:
        chosen = ordering.choose([queue[0].candidate for queue in queues])
        ordering.on_dispatch(chosen)
        index = next(i for i, queue in enumerate(queues) if queue[0].candidate is chosen)
        yield queues[index].popleft()
        if not queues[index]:
            del queues[index]


def _started(held: tuple[Ticket, str, float]) -> float:
    return held[2]
