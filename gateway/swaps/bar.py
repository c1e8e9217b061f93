"""The bar on users whose swaps were wasted: for a while, no swap is planned for them.

Ollama checks a body before it evicts anything, so on its own a request it refuses (a body
it cannot decode, a capability the model lacks) costs nobody a model. Behind the gateway,
which unloads the victims itself before it sends the request, each such request would
unload another user's model for nothing. So a user whose swap was wasted plans no swap for
``SWAP_BAR_SECONDS``: at most one such loss in that time, whatever they send.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["SWAP_BAR_SECONDS", "SwapBar"]

# How long a user whose swap was wasted (``SwapBar.wasted``) plans no other.
SWAP_BAR_SECONDS = 300.0


class SwapBar:
    """The users for whom no swap is planned, each until when."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._barred: dict[str, float] = {}  # user -> until when no swap is planned for them

    def wasted(self, user: str) -> None:
        """Models were unloaded for ``user``'s request, for nothing: no swap is planned for
        them for ``SWAP_BAR_SECONDS``."""
        now = self._clock()
        # Pruned where it grows, so that it holds only the users barred in the last 300 s.
        self._barred = {other: until for other, until in self._barred.items() if until > now}
        self._barred[user] = now + SWAP_BAR_SECONDS

    def seconds_left(self, user: str) -> float:
        """Seconds until a swap may be planned for ``user`` again (0: it may now)."""
        return max(0.0, self._barred.get(user, 0.0) - self._clock())
