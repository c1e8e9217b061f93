"""The slot ledger: the requests running on each slot group, and who holds each slot.

A slot group (``Backend.group``) is what one set of slots belongs to: the server's URL, and on
Ollama the model too, as each model's runner has its own slots. Counting by group rather
than by backend name means a reload that renames a backend keeps what runs there.

This is the one ledger of this replica's busy slots (the cross-replica hold store only
confirms them). Synchronous and without I/O, like the room that holds it: a take or a give
back runs to completion on the event loop, so the counts are never seen half-updated.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable

from gateway.admission.tickets import Ticket
from gateway.backends import Backend
from gateway.core import BACKGROUND

__all__ = ["SlotLedger", "decrement", "increment"]


class SlotLedger:
    """Running requests by slot group (every one, heavy ones, background ones) and holders."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.busy: Counter[str] = Counter()
        self.heavy: Counter[str] = Counter()
        self.background: Counter[str] = Counter()
        # People's light requests: the streams a long prefill beside them would stall, for
        # which a heavy request waits (prefill_gate.py). Background work's are not counted.
        self.people_light: Counter[str] = Counter()
        # Running requests by backend (its key), every model together: what the quick yes
        # and every dispatch ask first, without summing an Ollama backend's groups.
        self.on_backend: Counter[str] = Counter()
        # People's requests running by backend (its key): where background work gives way.
        self.people_on: Counter[str] = Counter()
        # Who holds each busy slot, and since when, for the house page: by the ticket's
        # identity, since two requests can be alike field for field. The ticket is kept so
        # that its id stays unique while it is here.
        self.holders: dict[int, tuple[Ticket, str, float]] = {}
        # Of those, the ones llama-server keeps waiting for the slot the gateway chose, and
        # when that slot likely frees: the waits played out from them start then, not now.
        self.in_engine: dict[int, float] = {}
        self._clock = clock

    def busy_on(self, backend: Backend, counter: Counter[str] | None = None) -> int:
        """Requests running on ``backend`` (of ``counter``: busy, heavy), every model."""
        if counter is None:
            return self.on_backend[backend.key]
        if not backend.per_model:
            return counter[backend.key]
        return sum(self.by_model(backend, counter).values())

    def by_model(self, backend: Backend, counter: Counter[str] | None = None) -> dict[str, int]:
        """Requests running on an Ollama ``backend`` by model key (of ``counter``)."""
        counter = self.busy if counter is None else counter
        prefix = backend.key + " "
        return {g[len(prefix) :]: n for g, n in counter.items() if g.startswith(prefix)}

    def has_free_slot(self, backends: Iterable[Backend]) -> bool:
        """Whether any of ``backends`` runs fewer requests than it has room for."""
        on_backend = self.on_backend
        # A loop, not any() over a generator: this runs at every arrival and release.
        for backend in backends:  # noqa: SIM110
            if on_backend.get(backend.key, 0) < backend.capacity:
                return True
        return False

    def take(self, ticket: Ticket, backend: Backend) -> None:
        """Count ``ticket``'s request as running on ``backend``."""
        group, key = backend.group(ticket.model), backend.key
        # ``increment``, written out: every request counts three or four of them here.
        busy, on_backend = self.busy, self.on_backend
        busy[group] = busy.get(group, 0) + 1
        on_backend[key] = on_backend.get(key, 0) + 1
        if ticket.heavy:
            increment(self.heavy, group)
        if ticket.lane is BACKGROUND:
            increment(self.background, group)
        else:
            increment(self.people_on, key)
            if not ticket.heavy:
                light = self.people_light
                light[group] = light.get(group, 0) + 1
        # Who holds the slot, for the house page. A request moved to another backend
        # (failover) keeps the time it started.
        held = self.holders.get(id(ticket))
        started = self._clock() if held is None else held[2]
        self.holders[id(ticket)] = (ticket, backend.name, started)

    def give_back(self, ticket: Ticket, backend: Backend) -> None:
        """``ticket``'s request no longer runs on ``backend`` (it ended, or moved)."""
        group = backend.group(ticket.model)
        decrement(self.busy, group)
        decrement(self.on_backend, backend.key)
        if ticket.heavy:
            decrement(self.heavy, group)
        if ticket.lane is BACKGROUND:
            decrement(self.background, group)
        else:
            decrement(self.people_on, backend.key)
            if not ticket.heavy:
                decrement(self.people_light, group)
        held = self.holders.get(id(ticket))
        # After a failover the ticket holds the new backend already: that hold stays.
        if held is not None and held[1] == backend.name:
            del self.holders[id(ticket)]
            self.in_engine.pop(id(ticket), None)


def increment(counter: dict[str, int], key: str, by: int = 1) -> None:
    """Count ``by`` more of ``key``."""
    # Not ``counter[key] += 1``: the key is new at every first request (``decrement``
    # drops it at zero), and a Counter answers a missing key with a call in Python.
    counter[key] = counter.get(key, 0) + by


def decrement(counter: dict[str, int], key: str, by: int = 1) -> None:
    """Count ``by`` fewer of ``key``, dropping it at zero."""
    # Keys at zero are dropped so that state stays proportional to what is active.
    left = counter.get(key, 0) - by
    if left > 0:
        counter[key] = left
    else:
        counter.pop(key, None)
