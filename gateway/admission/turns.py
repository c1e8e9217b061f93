"""Whose turn it is, and where: the backends a request may start on now, and the request of
a lane the ordering picks among those that could go.

A request may start on a backend that serves it where its slot group has a free slot; a
heavy request also needs a free heavy slot and an open prefill gate (``prefill_gate.py``), a
background request a free background slot and no person waiting for that backend; on Ollama,
memory must hold its model (``gateway.swaps``). Each user offers its first request
that could go (also when a swap that would make room for it is due: ``swap_due``), and
the ordering (FIFO or fair) chooses among the offers.

Questions put to the room's state (``RoomState``), with the room's bounds at the end: they
change no count of the room (only the prefill gate notes since when a heavy request is
held). The room acts on the answers: it plans the swap, or starts the chosen request.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gateway.admission.room_state import RoomState
from gateway.admission.tickets import Ticket, Waiter
from gateway.backends import Backend
from gateway.config import model_key
from gateway.core import BACKGROUND, Lane, Reason

__all__ = [
    "Offer",
    "cannot_start",
    "free_backends",
    "free_now",
    "free_to_start",
    "next_offer",
    "over_bound",
    "refuses_unseen",
    "waits",
]

_NOBODY: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class Offer:
    """A waiting request that could go on ``backend``; ``swap``: once a swap made room."""

    waiter: Waiter
    backend: Backend
    swap: bool = False


def next_offer(room: RoomState, lane: Lane) -> Offer | None:
    """The request of ``lane`` the ordering picks among each user's first that could go."""
    offers = _offers(room, lane)
    if not offers:
        return None
    chosen = room.ordering.choose([offer.waiter.candidate for offer in offers.values()])
    return offers[chosen.seq]


def _offers(room: RoomState, lane: Lane) -> dict[int, Offer]:
    """Each user's offer in ``lane`` (users at their cap make none), by candidate seq."""
    offers: dict[int, Offer] = {}
    for user, queue in room.lines.queues(lane).items():
        if room.lines.at_cap(user, lane):
            continue
        offer = _first_offer(room, queue)
        if offer is not None:
            offers[offer.waiter.candidate.seq] = offer
    return offers


def _first_offer(room: RoomState, queue: Iterable[Waiter]) -> Offer | None:
    # A user's first request that could go offers itself, so that one stuck request (a
    # model that does not fit, a heavy lane that is full) does not hold back the rest.
    for waiter in queue:
        if waiter.turn.done():  # cancelled; its task is about to remove it
            continue
        free = free_to_start(room, waiter.ticket)
        if free:
            return Offer(waiter, room.prefer(free, waiter.ticket))
        swap = _swap_for(room, waiter)
        if swap is not None:
            return Offer(waiter, swap, swap=True)
    return None


def free_now(
    room: RoomState, ticket: Ticket, serving: Sequence[Backend], single: bool
) -> Backend | None:
    """The backend the quick yes (``WaitingRoom.start_at_once``) starts ``ticket``'s
    request on, what memory holds aside when ``single``; None if none has room for it now."""
    if single and ticket.lane is not BACKGROUND:
        # A person's light request and one backend, the common case: of the checks of
        # ``free_backends``, only its slot applies.
        backend = serving[0]
        return (
            backend if room.slots.busy.get(backend.group(ticket.model), 0) < backend.slots else None
        )
    if single:  # not heavy: ``free_to_start`` is ``free_backends``
        free = free_backends(room, ticket, serving, memory=False)
        return free[0] if free else None
    free = free_to_start(room, ticket, serving)
    return room.prefer(free, ticket) if free else None


def free_to_start(
    room: RoomState, ticket: Ticket, serving: Sequence[Backend] | None = None, memory: bool = True
) -> list[Backend]:
    """The backends ``ticket``'s request may start on now: a free slot, and for a heavy
    request an open prefill gate (``serving``: the pool's for it, when known already;
    ``memory``: see ``free_backends``)."""
    free = free_backends(room, ticket, serving, memory)
    if ticket.heavy:
        free = [backend for backend in free if _heavy_may_start(room, backend, ticket.model)]
    return free


def free_backends(
    room: RoomState, ticket: Ticket, serving: Sequence[Backend] | None = None, memory: bool = True
) -> list[Backend]:
    """The backends serving ``ticket`` with a slot it may take now (the gate aside).
    ``memory=False``: what their memory holds is not asked (``SwapPlanner.admitted`` asks
    it of the one backend chosen)."""
    background = ticket.lane is BACKGROUND
    shared = ticket.heavy or background  # held to a share of the slots, as well
    # People first: background work does not start on a backend a person waits for, even
    # one who cannot take this slot (the heavy lane is full): the slot is theirs when the
    # lane frees, and background work would slow their stream meanwhile.
    model, slots = ticket.model, room.slots
    serving = _loadable(room.pool.serving(ticket.api, model) if serving is None else serving, model)
    wanted = _kept_for_people(room) if background else _NOBODY
    return [
        backend
        for backend in serving
        if slots.busy.get(group := backend.group(model), 0) < backend.slots
        and backend.key not in wanted
        and not (shared and _share_full(room, ticket, backend, group))
        # Last, as the dearest: what memory holds (Ollama backends only).
        and (not memory or room.swaps.admits(backend, model, ticket.num_ctx, slots.busy))
    ]


def _loadable(serving: Sequence[Backend], model: str) -> Sequence[Backend]:
    """``serving`` without the backends that failed to load ``model`` lately (a router
    whose child exited), while another serves it: sent there, a request would unload the
    models others use there for a load that fails again."""
    for backend in serving:  # a loop, not any(): on every dispatch's path
        if backend.state.failed_loads:  # a router's, rarely
            now = time.monotonic()  # the monitor's clock for failed loads
            able = [b for b in serving if not b.load_failed(model, now)]
            return able or serving
    return serving


def _share_full(room: RoomState, ticket: Ticket, backend: Backend, group: str) -> bool:
    """Whether the heavy, or background, share of ``backend``'s slots that ``ticket``'s
    request would take a place in is full."""
    policy, slots = room.policy, room.slots
    if ticket.heavy and slots.heavy[group] >= policy.classes.heavy.slots_on(backend.slots):
        return True
    if ticket.lane is not BACKGROUND:
        return False
    return slots.background[group] >= policy.lanes.background.slots_on(backend.slots)


def waits(room: RoomState) -> Counter[tuple[str, str]]:
    """Waiting requests by (backend key, model key), for each backend serving them."""
    if not room.lines.depth:
        return Counter()  # after every release with nobody waiting: cheaper than the walk
    return Counter(
        (backend.key, model_key(w.ticket.model))
        for w in room.lines.waiters()
        if not w.turn.done()
        for backend in room.pool.serving(w.ticket.api, w.ticket.model)
    )


def _swap_for(room: RoomState, waiter: Waiter) -> Backend | None:
    """A backend where a swap would make room for ``waiter``'s model and is due, if one
    would (``swap_due``)."""
    ticket = waiter.ticket
    backends = _loadable(room.pool.serving(ticket.api, ticket.model), ticket.model)
    # Only a backend that loads models has swaps: asked first, as the common case is none
    # (a llama-server under load, its waiters each asked at every dispatch).
    if not any(b.per_model for b in backends) or not room.swaps.may_plan_for(ticket.user):
        return None
    waited = room.clock() - waiter.arrived
    patience = room.policy.swap_patience(ticket.lane)
    wanting = frozenset() if ticket.lane is BACKGROUND else _people_wanting(room, ticket.model)
    busy, demand = room.slots.busy, waits(room)
    return room.swaps.room_for(
        backends,
        ticket.model,
        ticket.num_ctx,
        busy,
        demand,
        waited,
        patience,
        wanting,
        lambda backend: room.service(backend, ticket),
    )


def _people_wanting(room: RoomState, model: str) -> frozenset[str]:
    """The people waiting for ``model`` (asked only of a swap that would make room)."""
    key = model_key(model)
    return frozenset(
        user
        for user, queue in room.lines.waiting.items()
        if any(model_key(w.ticket.model) == key for w in queue)
    )


def _kept_for_people(room: RoomState) -> frozenset[str]:
    """The backends background work may not start on: those a person waits for, and,
    unless ``lanes.background.beside_people``, those a person's request runs on."""
    wanted = _wanted_by_people(room)
    if room.policy.lanes.background.beside_people:
        return wanted
    return wanted | room.slots.people_on.keys()


def _wanted_by_people(room: RoomState) -> frozenset[str]:
    """The backends an interactive request waits for (its user has a free place): on
    Ollama too, whatever the model, as they share one GPU."""
    return frozenset(
        backend.key
        for user, queue in room.lines.waiting.items()
        if not room.lines.at_cap(user, Lane.INTERACTIVE)
        for waiter in queue
        if not waiter.turn.done()
        for backend in room.pool.serving(waiter.ticket.api, waiter.ticket.model)
    )


def _heavy_may_start(room: RoomState, backend: Backend, model: str) -> bool:
    # One batch per slot group: on Ollama each model's runner batches its own slots.
    group = backend.group(model)
    # People first: a title or tag task running here does not hold a person's long prompt.
    light_running = room.slots.people_light[group]
    wait = room.policy.classes.heavy.wait_for_light
    return room.gate.may_start(group, light_running, wait, room.clock())


# The waiting room's bounds: which one a request would pass, asked before it joins the
# room, as it joins, and before its body is even read (the quick no). What a full room
# refuses, and when a person's request is let in all the same (background work gives way),
# reads here in one place; the refusal's words and its Retry-After are ``refusals.py``'s.


def over_bound(room: RoomState, user: str, lane: Lane, joining: bool) -> Reason | None:
    """Which bound the room passes with this request in it (``joining``: not yet)."""
    return room.lines.over_bound(user, lane, extra=1 if joining else 0)


def cannot_start(room: RoomState, ticket: Ticket) -> bool:
    """Whether a request arriving now would have to wait."""
    return room.lines.at_cap(ticket.user, ticket.lane) or not free_backends(room, ticket)


def refuses_unseen(room: RoomState, user: str, lanes: tuple[Lane, ...]) -> Reason | None:
    """The bound a request of ``user`` would pass, when it would pass it whatever its
    body says: the user's own places are all taken, or no backend has a free slot.
    Checked before the body is read, so a user at cap cannot make the gateway read,
    and hold, body after body only to refuse each. Requests of the user still reading
    their bodies count as waiting. ``lanes``: those the request may turn out to be in
    (its lane may depend on its prompt); only what every one of them would refuse."""
    first = _refuses_unseen_in(room, user, lanes[0])
    if first is None or not all(_refuses_unseen_in(room, user, lane) for lane in lanes[1:]):
        return None
    return first


def _refuses_unseen_in(room: RoomState, user: str, lane: Lane) -> Reason | None:
    lines = room.lines
    arriving = lines.arriving.count.get(user, 0)
    if arriving and lines.holds_all_it_may(user, lane, arriving):
        # Bodies still on their way count as the user's: a burst of slow bodies cannot
        # be read side by side beyond what the user could run and queue.
        return Reason.USER_QUEUE_FULL
    if lane is Lane.INTERACTIVE and lines.together_holds_all(user):
        return Reason.USER_QUEUE_FULL  # and as its front end's people's, whatever the name
    if not lines.at_cap(user, lane) and room.slots.has_free_slot(room.pool.backends):
        return None  # it may start at once, whatever its waiting would pass: asked first
    reason = lines.over_bound(user, lane, extra=1 + arriving)
    busy_for_a_person = reason is Reason.GATEWAY_BUSY and lane is Lane.INTERACTIVE
    if busy_for_a_person and (lines.background or room.giving_way):
        return None  # a person's request would displace background work
    return reason
