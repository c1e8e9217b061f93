"""Holds in this process: the contract's reference implementation.

A single gateway needs no hold store (its waiting room is the only ledger); this one serves
several gateways in one process (tests, benchmarks) and pins down what Redis must do.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter

from gateway.admission.holds.base import Hold

__all__ = ["MemoryHolds"]


class MemoryHolds:
    """Counts in dictionaries; ``take`` is atomic because nothing in it awaits."""

    shared = True
    failures = 0
    others_waiting = 0  # one process: there are no other replicas

    def __init__(self) -> None:
        self._holds: dict[str, Hold] = {}
        self._users: Counter[str] = Counter()
        self._backends: Counter[str] = Counter()
        self._heavy: Counter[str] = Counter()
        self._release = asyncio.Event()
        self._in_flight: dict[str, dict[str, int]] = {}  # by user: requests counted, tokens

    def start(self) -> None:
        return None

    async def take(self, hold: Hold) -> bool:
        if hold.id in self._holds:
            return True
        if self._users[hold.user] >= hold.user_cap or self._backends[hold.backend] >= hold.slots:
            return False
        if hold.heavy and self._heavy[hold.backend] >= hold.heavy_slots:
            return False
        self._holds[hold.id] = hold
        self._users[hold.user] += 1
        self._backends[hold.backend] += 1
        if hold.heavy:
            self._heavy[hold.backend] += 1
        return True

    def give_back(self, hold: Hold) -> None:
        if self._holds.pop(hold.id, None) is None:
            return
        for counter, key in ((self._users, hold.user), (self._backends, hold.backend)):
            counter[key] -= 1
            if counter[key] <= 0:
                del counter[key]
        if hold.heavy:
            self._heavy[hold.backend] -= 1
            if self._heavy[hold.backend] <= 0:
                del self._heavy[hold.backend]
        self._release.set()
        self._release = asyncio.Event()

    async def count_in_flight(
        self, user: str, request: str, room: int, tokens: int = 0, token_room: int | None = None
    ) -> bool:
        counted = self._in_flight.setdefault(user, {})
        if request in counted:
            return True
        if len(counted) >= room:
            return False
        if token_room is not None and sum(counted.values()) >= token_room:
            return False
        counted[request] = tokens
        return True

    def uncount_in_flight(self, user: str, request: str) -> None:
        counted = self._in_flight.get(user)
        if counted is not None:
            counted.pop(request, None)
            if not counted:
                del self._in_flight[user]

    async def usage(self) -> tuple[dict[str, int], dict[str, int]]:
        return dict(self._users), dict(self._backends)

    async def released(self, within: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._release.wait(), within)

    async def exchange(self, charges: dict[str, float], waiting: int) -> dict[str, float] | None:
        return None

    async def close(self) -> None:
        return None
