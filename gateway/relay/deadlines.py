"""Many deadlines on one loop timer: the first-byte deadlines of the relay's requests.

A timer of its own for every request (``loop.call_at``, then its cancel at the first byte)
would put a timer handle on the path to the upstream write, although nearly every deadline
is disarmed long before it is due. Here arming and disarming one is a dict entry; the one
timer is set for the earliest deadline armed, and moved only when an earlier one is armed.
When it fires, what is due by then expires, as each would have with its own timer, and it
is set again for the earliest left.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable

__all__ = ["Deadline", "Deadlines"]


class Deadline:
    """One armed deadline; ``cancel`` disarms it (again: nothing)."""

    __slots__ = ("_deadlines", "expire")

    def __init__(self, deadlines: Deadlines, expire: Callable[[], None]) -> None:
        self._deadlines = deadlines
        self.expire = expire

    def cancel(self) -> None:
        self._deadlines.disarm(self)


class Deadlines:
    """Deadlines (loop time) that call their ``expire`` when due, unless disarmed first."""

    __slots__ = ("_due", "_loop", "_timer", "_timer_at")

    def __init__(self) -> None:
        self._due: dict[Deadline, float] = {}  # armed, with when each is due
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf  # when the timer fires (inf: no timer)
        self._loop: asyncio.AbstractEventLoop | None = None  # the timer's

    def arm(
        self, loop: asyncio.AbstractEventLoop, at: float, expire: Callable[[], None]
    ) -> Deadline:
        """Call ``expire`` at ``at`` (``loop.time()``), unless the deadline is cancelled."""
        deadline = Deadline(self, expire)
        self._due[deadline] = at
        if at < self._timer_at or loop is not self._loop:
            self._set_timer(loop, at)
        return deadline

    def disarm(self, deadline: Deadline) -> None:
        """``deadline`` will not expire (the timer stays: it finds nothing due, or less)."""
        self._due.pop(deadline, None)

    def _set_timer(self, loop: asyncio.AbstractEventLoop, at: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._timer_at, self._loop = loop.call_at(at, self._fire), at, loop

    def _fire(self) -> None:
        loop, fired_at = self._loop, self._timer_at
        assert loop is not None
        self._timer, self._timer_at = None, math.inf
        # Due by the time the timer was set for, or by now: a loop timer may fire a little
        # before its time (uvloop counts milliseconds), and a timer of each one's own would
        # have fired as early.
        by = max(fired_at, loop.time())
        expired = [deadline for deadline, at in self._due.items() if at <= by]
        for deadline in expired:
            del self._due[deadline]
        if self._due:
            self._set_timer(loop, min(self._due.values()))
        for deadline in expired:
            deadline.expire()
