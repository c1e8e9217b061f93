"""The hold-store contract that admission relies on when replicas share limits, and the
house's one waiting room they keep with it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from gateway.core import Lane

__all__ = [
    "BACKGROUND_HOLDER",
    "LANE_ORDER",
    "Hold",
    "HoldStore",
    "House",
    "HouseRun",
    "Place",
    "StoreUnavailable",
]

# Who goes first in the house: people before background work, then the smaller finish tag,
# then the earlier arrival (Redis's script compares the lane's number).
LANE_ORDER = {Lane.INTERACTIVE: 0, Lane.BACKGROUND: 1}

# A user's background work has a cap of its own, so its own holder name: ``alice/background``.
BACKGROUND_HOLDER = "/background"


@dataclass(frozen=True, slots=True)
class Place:
    """A request's place in the house's one waiting room, whichever replica it entered.

    Ranked by a finish tag that the store gives it as it joins, as in self-clocked fair
    queueing (Golestani, INFOCOM 1994): ``max(the house's clock, its payer's last tag) +
    cost``, the clock being the tag of the last request started, and a payer's tag growing
    by its requests' costs and its output. One store keeps every tag, so every replica
    compares the same numbers. ``cost``: its prompt's charge (``Ordering.cost``), 0 under
    FIFO, where arrival decides; ``arrived``: wall-clock seconds, the tie-break;
    ``groups``: the slot groups that could serve it; ``holder`` and ``cap``: whose running
    places it needs (``Hold.user``); ``together``, ``together_cap`` and
    ``together_queued``: a front end's people's account and its total's ``max_concurrent``
    and ``max_queued`` (-1: none), which bound it too."""

    id: str
    holder: str
    cap: int
    lane: Lane
    payer: str
    cost: float
    arrived: float
    heavy: bool
    groups: tuple[str, ...]
    user: str
    model: str
    rank: float = 0.0  # its finish tag, once joined
    replica: str = ""  # the replica it waits on: set by the store
    together: str = ""
    together_cap: int = -1
    together_queued: int = -1

    def key(self) -> tuple[int, float, float, str]:
        """The house's order: the smaller goes first."""
        return LANE_ORDER[self.lane], self.rank, self.arrived, self.id


@dataclass(frozen=True, slots=True)
class Hold:
    """One running request's claim: a place under its user's cap and a backend slot.
    ``place``: the request's place in the house (None: a hold outside its order);
    ``backend_name``: for the house's view of what runs where; ``together``: the account a
    front end's people hold together (``owui/(all)``), at most ``together_cap`` (-1: no
    bound) across the house, as the user's own at most ``user_cap``."""

    id: str
    user: str
    user_cap: int
    backend: str
    slots: int
    heavy: bool = False
    heavy_slots: int = 0
    place: Place | None = None
    backend_name: str = ""
    model: str = ""
    light: bool = False  # a person's light request: a heavy prefill waits for it to end
    prefill_may_start: bool = True  # heavy: it waited ``wait_for_light``, or need not
    together: str = ""
    together_cap: int = -1


@dataclass(frozen=True, slots=True)
class HouseRun:
    """A request running on some replica: who runs what where, since when (wall clock)."""

    user: str
    model: str
    backend: str
    heavy: bool
    lane: Lane
    since: float
    replica: str


@dataclass(frozen=True, slots=True)
class House:
    """The whole house as the store last read it: every replica's waiting and running
    requests (this replica's among them), and which replica is this one."""

    waiting: tuple[Place, ...] = ()
    running: tuple[HouseRun, ...] = ()
    replica: str = ""
    replicas: frozenset[str] = field(default_factory=frozenset)

    def elsewhere(self) -> House:
        """Only what waits and runs on the other replicas."""
        return House(
            tuple(p for p in self.waiting if p.replica != self.replica),
            tuple(r for r in self.running if r.replica != self.replica),
            self.replica,
            self.replicas,
        )


class StoreUnavailable(Exception):
    """The shared store cannot be reached; the caller applies ``on_failure``."""


class HoldStore(Protocol):
    shared: bool  # False while running on per-replica limits only
    failures: int  # times the shared store could not be reached

    @property
    def house(self) -> House:
        """Every replica's waiting and running requests, as last read."""

    def start(self) -> None:
        """Start any background work (lease renewal); called once a loop runs."""

    def watch(self, on_change: Callable[[], None]) -> None:
        """Call ``on_change`` whenever the house as read changes (the views redraw)."""

    async def take(self, hold: Hold) -> bool:
        """Atomically take the hold if the user (and its ``together``) and the backend
        have room, no request
        ahead of ``hold.place`` in the house is asking for that backend now, and (heavy,
        unless ``prefill_may_start``) no person's light request runs there: the prefill
        gate, across replicas; False if not. Taken, the hold's place leaves the room."""

    def give_back(self, hold: Hold) -> None:
        """Release the hold (never blocks; a remote store releases in the background)."""

    async def give_back_now(self, hold: Hold) -> None:
        """Release the hold, returning once the store has: a request moving to another
        backend takes its new hold next, which must not find the old one counted."""

    async def join(
        self, place: Place, max_queued: int, max_depth: int, asking: str = ""
    ) -> Place | str:
        """``place`` waits in the house: the place, ranked; or why not: ``"user"`` (its
        holder has ``max_queued`` waiting already, or its front end's people
        ``together_queued``) or ``"house"`` (``max_depth`` wait).
        ``asking``: the slot group its request was just refused, which it asks for from
        now on ("": none yet, so every group serving it, until it tries one)."""

    def leave(self, place: Place) -> None:
        """``place`` waits no more (never blocks; idempotent)."""

    async def count_in_flight(
        self, user: str, request: str, room: int, tokens: int = 0, token_room: int | None = None
    ) -> bool:
        """Count ``request`` of ``user`` as in flight (running or waiting, on any replica),
        reserving ``tokens``, if fewer than ``room`` of the user's are and (with
        ``token_room``) theirs reserve fewer than ``token_room`` tokens; False if not.
        Idempotent for ``request``."""

    def uncount_in_flight(self, user: str, request: str) -> None:
        """``request`` ended (never blocks; a remote store forgets it in the background)."""

    async def usage(self) -> tuple[dict[str, int], dict[str, int]]:
        """Holds now, across every replica: (by user, by backend)."""

    async def released(self, within: float) -> None:
        """Return when some hold is released anywhere, or after ``within`` seconds."""

    async def exchange(
        self, charges: dict[str, float], output: dict[str, float]
    ) -> dict[str, float] | None:
        """Add this replica's fair-share charges, and its payers' ``output`` to their
        finish tags; the counters summed over every replica, or None when nothing is
        shared."""

    @property
    def others_waiting(self) -> int:
        """Requests waiting on the other replicas, as of the last reading of the house."""

    async def close(self) -> None: ...
