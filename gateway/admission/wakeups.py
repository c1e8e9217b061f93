"""Wake-ups on the event loop: the "something changed" future and the one dispatch timer.

The waiting room is synchronous and owns no loop; it reports each change of its counts and
asks to be dispatched again later (a held heavy request may start anyway after a while).
These two turn that into loop objects: a future that ``/status`` watchers and the tests
await, and a timer that calls back once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

__all__ = ["Changes", "WakeTimer"]


class Changes:
    """A future resolved at the next change of counts; a fresh one once it has resolved."""

    __slots__ = ("_future",)

    def __init__(self) -> None:
        self._future: asyncio.Future[None] | None = None

    def next(self) -> asyncio.Future[None]:
        """The future of the next change, shared by everyone waiting for it."""
        if self._future is None or self._future.done():
            self._future = asyncio.get_running_loop().create_future()
        return self._future

    def notify(self) -> None:
        """The counts changed: wake whoever waits (nobody, most of the time)."""
        if self._future is not None and not self._future.done():
            self._future.set_result(None)


class WakeTimer:
    """Calls ``wake`` after a delay: one timer, the earliest asked for."""

    __slots__ = ("_timer", "_wake")

    def __init__(self, wake: Callable[[], None]) -> None:
        self._wake = wake
        self._timer: asyncio.TimerHandle | None = None

    def wake_in(self, delay: float) -> None:
        """Wake in ``delay`` seconds, unless a timer already wakes sooner; one that would
        wake later is replaced, so that a single timer is ever pending."""
        loop = asyncio.get_running_loop()
        timer = self._timer
        if timer is not None and timer.when() <= loop.time() + delay:
            return
        if timer is not None:
            timer.cancel()
        self._timer = loop.call_later(delay, self._woken)

    def _woken(self) -> None:
        self._timer = None
        self._wake()
