"""Holds in this process: the contract's reference implementation.

A single gateway needs no hold store (its waiting room is the only ledger); this one serves
several gateways in one process (tests, benchmarks) and pins down what Redis must do.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import replace

from gateway.admission.holds.base import Hold, House, Place
from gateway.admission.holds.scripts import ASKING_MS

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
        self._light: Counter[str] = Counter()  # people's light requests, by slot group
        self._release = asyncio.Event()
        self._in_flight: dict[str, dict[str, int]] = {}  # by user: requests counted, tokens
        self._places: dict[str, Place] = {}  # the house's waiting room
        # When each place last asked for a slot, and for which slot group.
        self._asked: dict[str, tuple[float, str]] = {}
        self._on_change: Callable[[], None] = lambda: None
        self._clock = 0.0  # the finish tag of the last request started
        self._tags: dict[str, float] = {}  # each payer's last finish tag

    @property
    def house(self) -> House:
        return House(tuple(sorted(self._places.values(), key=Place.key)))

    def start(self) -> None:
        return None

    def watch(self, on_change: Callable[[], None]) -> None:
        self._on_change = on_change

    async def take(self, hold: Hold) -> bool:
        if hold.id in self._holds:
            return True
        mine = hold.place
        if mine is not None:  # waiting: the tag it joined with; else the one it would have
            mine = self._places.get(mine.id) or replace(mine, rank=self._tag(mine))
        if not self._has_room(hold) or self._ahead(hold, mine):
            if mine is not None and mine.id in self._places:
                self._asked[mine.id] = (time.monotonic(), hold.backend)
                # Its caps as now (a reload may have lowered them since it joined).
                self._places[mine.id] = replace(
                    self._places[mine.id], cap=hold.user_cap, together_cap=hold.together_cap
                )
            return False
        if mine is not None:
            self._forget(mine)
            self._clock = max(self._clock, mine.rank)
            self._tags[mine.payer] = max(self._tags.get(mine.payer, 0.0), mine.rank)
        self._holds[hold.id] = hold
        self._users[hold.user] += 1
        if hold.together:  # a front end's people together: an account of its own
            self._users[hold.together] += 1
        self._backends[hold.backend] += 1
        if hold.heavy:
            self._heavy[hold.backend] += 1
        if hold.light:
            self._light[hold.backend] += 1
        return True

    def _has_room(self, hold: Hold) -> bool:
        if self._users[hold.user] >= hold.user_cap or self._backends[hold.backend] >= hold.slots:
            return False
        if self._full(hold.together, hold.together_cap):
            return False
        if hold.heavy and not hold.prefill_may_start and self._light[hold.backend]:
            return False  # the prefill gate, across replicas
        return not (hold.heavy and self._heavy[hold.backend] >= hold.heavy_slots)

    def _full(self, together: str, cap: int) -> bool:
        """Whether a front end's people hold all its total lets them together."""
        return bool(together) and cap >= 0 and self._users[together] >= cap

    def _tag(self, place: Place) -> float:
        return max(self._clock, self._tags.get(place.payer, 0.0)) + place.cost

    def _ahead(self, hold: Hold, mine: Place | None) -> bool:
        """Whether a place ahead of ``mine`` asks for ``hold``'s slot and could take it."""
        if mine is None:
            return False
        return any(
            place.key() < mine.key()
            and self._asks_for(place, hold.backend)
            and self._users[place.holder] < place.cap
            and not self._full(place.together, place.together_cap)
            and not (place.heavy and self._heavy[hold.backend] >= hold.heavy_slots)
            and not (place.heavy and self._light[hold.backend])  # held by the prefill gate
            for place in self._places.values()
            if place.id != mine.id
        )

    def _asks_for(self, place: Place, group: str) -> bool:
        """Whether ``place`` asked for ``group`` lately (just joined: any serving it)."""
        when, asked = self._asked.get(place.id, (0.0, ""))
        if when <= time.monotonic() - ASKING_MS / 1000:
            return False
        return asked == group or (asked == "*" and group in place.groups)

    async def join(
        self, place: Place, max_queued: int, max_depth: int, asking: str = ""
    ) -> Place | str:
        joined = self._places.get(place.id)
        if joined is not None:
            return joined
        if sum(p.holder == place.holder for p in self._places.values()) >= max_queued:
            return "user"
        if place.together and place.together_queued >= 0:
            waiting = sum(p.together == place.together for p in self._places.values())
            if waiting >= place.together_queued:
                return "user"
        if len(self._places) >= max_depth:
            return "house"
        place = replace(place, rank=self._tag(place))
        self._tags[place.payer] = place.rank
        self._places[place.id] = place
        self._asked[place.id] = (time.monotonic(), asking or "*")
        self._on_change()
        return place

    def leave(self, place: Place) -> None:
        if self._forget(place):
            self._wake()

    def _forget(self, place: Place) -> bool:
        self._asked.pop(place.id, None)
        if self._places.pop(place.id, None) is None:
            return False
        self._on_change()
        return True

    def _wake(self) -> None:
        self._release.set()
        self._release = asyncio.Event()

    def give_back(self, hold: Hold) -> None:
        if self._holds.pop(hold.id, None) is None:
            return
        counts = [(self._users, hold.user), (self._backends, hold.backend)]
        if hold.together:
            counts.append((self._users, hold.together))
        for counter, key in counts:
            counter[key] -= 1
            if counter[key] <= 0:
                del counter[key]
        for counted, counter in ((hold.heavy, self._heavy), (hold.light, self._light)):
            if counted:
                counter[hold.backend] -= 1
                if counter[hold.backend] <= 0:
                    del counter[hold.backend]
        self._wake()

    async def give_back_now(self, hold: Hold) -> None:
        self.give_back(hold)

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

    async def exchange(
        self, charges: dict[str, float], output: dict[str, float]
    ) -> dict[str, float] | None:
        for payer, amount in output.items():
            self._tags[payer] = self._tags.get(payer, 0.0) + amount
        return {}  # taken: no counters to share in one process

    async def close(self) -> None:
        return None
