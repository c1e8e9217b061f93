"""The one interface through which the room's state is read: by the turns, the bounds, the
refusals, the swap waits and the snapshot.

``WaitingRoom`` satisfies it. Its readers name this protocol rather than the room, so the
room can import them (it dispatches through the turns and renders its snapshot) without a
cycle between the files.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable
from typing import Protocol

from gateway.admission.prefill_gate import PrefillGate
from gateway.admission.queues import UserQueues
from gateway.admission.scheduler import Ordering
from gateway.admission.slot_ledger import SlotLedger
from gateway.admission.tickets import Ticket, Waiter
from gateway.backends import Backend, BackendPool
from gateway.config import Policy
from gateway.core import Lane
from gateway.swaps import SwapPlanner

__all__ = ["RoomState"]


class RoomState(Protocol):
    """What the room holds (its parts) and the counts it reads through from them."""

    policy: Policy
    pool: BackendPool
    ordering: Ordering
    lines: UserQueues  # who waits and who runs, by user and lane
    slots: SlotLedger  # what runs, by slot group, and who holds it
    swaps: SwapPlanner  # what each Ollama backend holds, loads and unloads
    gate: PrefillGate  # since when a heavy request is held, by slot group
    clock: Callable[[], float]

    @property
    def depth(self) -> int: ...

    @property
    def waiting(self) -> dict[str, deque[Waiter]]: ...

    @property
    def background(self) -> dict[str, deque[Waiter]]: ...

    @property
    def running(self) -> Counter[str]: ...

    @property
    def background_running(self) -> Counter[str]: ...

    @property
    def giving_way(self) -> int:
        """Background requests running now that would give their slot to a person."""
        ...

    def queues(self, lane: Lane) -> dict[str, deque[Waiter]]:
        """The waiting requests of ``lane``, by user."""
        ...

    def runs(self, lane: Lane) -> Counter[str]:
        """The running requests of ``lane``, by user."""
        ...

    def caps(self, user: str, lane: Lane) -> tuple[int, int]:
        """(max_concurrent, max_queued) of ``user`` in ``lane``."""
        ...

    def prefer(self, free: list[Backend], ticket: Ticket) -> Backend:
        """Which of the ``free`` backends ``ticket`` goes to."""
        ...

    def service(self, backend: Backend, ticket: Ticket) -> float:
        """How long ``ticket``'s request would likely hold a slot on ``backend``."""
        ...
