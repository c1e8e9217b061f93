"""The bar on users whose swaps were wasted: for a while, no swap is planned for them.

Ollama checks a body before it evicts anything, so on its own a request it refuses (a body
it cannot decode, a capability the model lacks) costs nobody a model. Behind the gateway,
which unloads the victims itself before it sends the request, each such request would
unload another user's model for nothing. So a user whose swap was wasted plans no swap for
``SWAP_BAR_SECONDS``: at most one such loss in that time, whatever they send.

But for a model llama-server's router failed to load (a broken file: its 500 says no more
than a child's refusal of a body would), which is nobody's doing: once the router lists it
as failed (``Backend.failed_load``), the user who met it first is not barred for it, and its
own refusals keep it from costing anyone a model again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from gateway.backends import Backend

__all__ = ["SWAP_BAR_SECONDS", "SwapBar"]

# How long a user whose swap was wasted (``SwapBar.wasted``) plans no other.
SWAP_BAR_SECONDS = 300.0


class _Barred(NamedTuple):
    until: float
    backend: Backend  # where the swap was wasted, and for which model
    model: str


class SwapBar:
    """The users for whom no swap is planned, each until when."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._barred: dict[str, _Barred] = {}  # user -> until when no swap is planned

    def wasted(self, user: str, backend: Backend, model: str) -> None:
        """Models were unloaded on ``backend`` for ``user``'s request for ``model``, for
        nothing: no swap is planned for them for ``SWAP_BAR_SECONDS``."""
        now = self._clock()
        # Pruned where it grows, so that it holds only the users barred in the last 300 s.
        self._barred = {other: bar for other, bar in self._barred.items() if bar.until > now}
        self._barred[user] = _Barred(now + SWAP_BAR_SECONDS, backend, model)

    def seconds_left(self, user: str) -> float:
        """Seconds until a swap may be planned for ``user`` again (0: it may now)."""
        bar = self._barred.get(user)
        if bar is None:
            return 0.0
        if bar.backend.failed_load(bar.model) is not None:  # the file's doing, not theirs
            del self._barred[user]
            return 0.0
        return max(0.0, bar.until - self._clock())
