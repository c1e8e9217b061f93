"""The hold-store contract that admission relies on when replicas share limits."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

__all__ = ["Hold", "HoldStore", "StoreUnavailable"]


@dataclass(frozen=True, slots=True)
class Hold:
    """One running request's claim: a place under its user's cap and a backend slot."""

    id: str
    user: str
    user_cap: int
    backend: str
    slots: int
    heavy: bool = False
    heavy_slots: int = 0


class StoreUnavailable(Exception):
    """The shared store cannot be reached; the caller applies ``on_failure``."""


class HoldStore(Protocol):
    shared: bool  # False while running on per-replica limits only
    failures: int  # times the shared store could not be reached

    def start(self) -> None:
        """Start any background work (lease renewal); called once a loop runs."""

    async def take(self, hold: Hold) -> bool:
        """Atomically take the hold if the user and the backend have room; False if not."""

    def give_back(self, hold: Hold) -> None:
        """Release the hold (never blocks; a remote store releases in the background)."""

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

    async def exchange(self, charges: dict[str, float], waiting: int) -> dict[str, float] | None:
        """Add this replica's fair-share charges and publish its queue depth; the counters
        summed over every replica, or None when nothing is shared."""

    others_waiting: int  # requests waiting on the other replicas, as of the last exchange

    async def close(self) -> None: ...
