"""When a heavy request may start: not while light requests run on its backend, for a while.

llama.cpp, and Ollama which runs it, put the work of every slot into one batch per step. A
long prompt's prefill fills that batch, and every stream on the backend waits for it to
end. Measured on the real llama-server of the tests (SmolLM2-135M, 2 CPU threads), a light
reply that takes 0.3-0.6 s alone took 4.2-4.4 s when a 1,200-token prefill started beside it
(12 s on a loaded machine), holding its slot all the while (docs/fairness.md, "On a real engine").
Keeping heavy requests to some of the slots does not help: the light slot is stalled too.

So a heavy request that could start waits while light requests run on its backend, but
only ``wait`` seconds from the moment it was first held there: heavy work still progresses
within a bound, and the backend is not idle while it waits (a light request runs on it).
Pure, like the scheduler: no I/O, the time is passed in.
"""

from __future__ import annotations

__all__ = ["PrefillGate"]


class PrefillGate:
    """Since when a heavy request has been held on each backend."""

    def __init__(self) -> None:
        self._held_since: dict[str, float] = {}

    def may_start(self, backend: str, light_running: int, wait: float, now: float) -> bool:
        """Whether a heavy request may start on ``backend`` now; if not, it is held."""
        if light_running == 0 or wait <= 0:
            return True
        since = self._held_since.setdefault(backend, now)
        return now - since >= wait

    def started(self, backend: str) -> None:
        """A heavy request started on ``backend``: the next one is held afresh."""
        self._held_since.pop(backend, None)

    def clear(self) -> None:
        """No heavy request waits any more."""
        self._held_since.clear()

    @property
    def holding(self) -> bool:
        """Whether a heavy request is held anywhere (``opens_at`` has a time to say)."""
        return bool(self._held_since)

    def opens_at(self, wait: float) -> float | None:
        """The earliest time a held heavy request may start anyway, or None if none is held."""
        if not self._held_since:
            return None
        return min(self._held_since.values()) + wait
