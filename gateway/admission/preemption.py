"""Background work gives its slot up the moment a person would wait for it.

A background request (a front end's title or tags task, an agent's batch) may run on any
slot nobody is using. When a person's request would wait for a slot that such a request
holds, or (unless ``lanes.background.beside_people``) starts on its backend, whose compute
the two would share, the room takes the slot back at once: the background request's
connection to the backend is closed (so the engine stops working on it) and it waits again,
to run later from its saved body; its client sees only a delay.

Only before its reply has begun: once a byte has gone to its client it keeps its slot to
the end, since a reply cannot be sent twice. A non-streaming request (Open WebUI's tasks)
sends nothing until it is done, so it can give way for as long as it runs; a streaming one
only until its first token. One that has given way ``lanes.background.max_restarts`` times
keeps its next slot to the end, so that no task starves.

What preemption wastes is counted: the slot time and the prompt the engine had read.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Protocol

from gateway.admission.room_state import RoomState
from gateway.admission.tickets import Ticket
from gateway.admission.turns import free_backends
from gateway.backends import Backend

__all__ = ["Preemptible", "Preemptions", "Waste"]


class Preemptible(Protocol):
    """A running background request that may still give its slot up (its permit)."""

    ticket: Ticket
    backend: Backend
    granted_at: float

    def preempt(self) -> None:
        """Give the slot back now; the request runs again later."""
        ...


@dataclass(slots=True)
class Waste:
    """What giving way has cost since the start: restarts, slot time, prompts read again."""

    restarts: int = 0
    slot_seconds: float = 0.0
    prompt_tokens: float = 0.0  # estimated: what the engine had read and will read again


class Preemptions:
    """The background requests running now that may give their slot to a person."""

    __slots__ = ("giving_way", "runs", "waste")

    def __init__(self) -> None:
        # By the permit's identity. Asked ``if preemptions.runs`` on every request's path:
        # a dict's truth, without a method call.
        self.runs: dict[int, Preemptible] = {}
        self.waste = Waste()
        # By user: requests that gave their slot up and have not yet left it (their relay
        # being called off), to wait again. Out of the room meanwhile, they still count as
        # in flight for their budget (``Admission.in_flight``).
        self.giving_way: Counter[str] = Counter()

    def add(self, run: Preemptible) -> None:
        self.runs[id(run)] = run

    def discard(self, run: Preemptible) -> None:
        self.runs.pop(id(run), None)

    def victim_for(self, room: RoomState, ticket: Ticket) -> Preemptible | None:
        """The background request whose slot ``ticket``'s request could start on now; the
        newest first, as it has done the least work that would be lost."""
        if room.lines.at_cap(ticket.user, ticket.lane):
            return None  # the person waits for their own requests, not for background work
        if free_backends(room, ticket):
            return None  # a slot is free: what the person waits for is no task's to give
        serving = {b.name for b in room.pool.serving(ticket.api, ticket.model)}
        for run in sorted(self.runs.values(), key=lambda r: r.granted_at, reverse=True):
            if run.backend.name in serving and _frees_a_slot_for(room, run, ticket):
                return run
        return None

    def beside_people(self, room: RoomState) -> list[Preemptible]:
        """The background requests running on a backend a person's request now runs on."""
        people_on = room.slots.people_on
        return [run for run in self.runs.values() if run.backend.key in people_on]

    def preempt(self, run: Preemptible, now: float) -> None:
        """``run`` gives its slot up now (its permit releases it, which lets the person in);
        nothing if it has already (a release between lets others give way in turn)."""
        if self.runs.pop(id(run), None) is None:
            return
        waste = self.waste
        waste.restarts += 1
        waste.slot_seconds += max(now - run.granted_at, 0.0)
        waste.prompt_tokens += run.ticket.input_tokens
        run.preempt()


def _frees_a_slot_for(room: RoomState, run: Preemptible, ticket: Ticket) -> bool:
    """Whether ``ticket``'s request could start on ``run``'s backend were ``run`` gone: asked
    of the room with the slot given back for the question, and taken again after it."""
    slots, backend = room.slots, run.backend
    held = slots.holders.get(id(run.ticket))
    slots.give_back(run.ticket, backend)
    try:
        room_on_backend = slots.on_backend.get(backend.key, 0) < backend.capacity
        return room_on_backend and any(b.name == backend.name for b in free_backends(room, ticket))
    finally:
        slots.take(run.ticket, backend)
        if held is not None:  # the house page's "running since" stays the run's own
            slots.holders[id(run.ticket)] = held
