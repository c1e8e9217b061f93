"""Many deadlines on one loop timer, on a real event loop."""

from __future__ import annotations

import asyncio

from gateway.relay.deadlines import Deadlines


class TestDeadlines:
    async def test_a_deadline_armed_later_but_due_sooner_expires_first(self) -> None:
        """The one timer moves to an earlier deadline: it does not wait for the first armed."""
        loop, deadlines = asyncio.get_running_loop(), Deadlines()
        order: list[str] = []
        late, soon = loop.create_future(), loop.create_future()
        deadlines.arm(loop, loop.time() + 30.0, lambda: late.set_result(order.append("late")))
        deadlines.arm(loop, loop.time() + 0.05, lambda: soon.set_result(order.append("soon")))
        await asyncio.wait_for(soon, timeout=5)
        assert order == ["soon"]

    async def test_each_deadline_expires_once_its_time_has_come(self) -> None:
        """After the earliest fires, the timer is set again for the next one left."""
        loop, deadlines = asyncio.get_running_loop(), Deadlines()
        expired: list[tuple[float, float]] = []  # (due, expired at)

        def arm(seconds: float) -> None:
            at = loop.time() + seconds
            deadlines.arm(loop, at, lambda: expired.append((at, loop.time())))

        for seconds in (0.06, 0.02, 0.04):
            arm(seconds)
        done = loop.create_future()
        deadlines.arm(loop, loop.time() + 0.08, lambda: done.set_result(None))
        await asyncio.wait_for(done, timeout=5)
        assert [due for due, _ in expired] == sorted(due for due, _ in expired)
        assert len(expired) == 3
        # Not before its time (a loop timer rounds to the millisecond).
        assert all(when >= due - 0.001 for due, when in expired)

    async def test_a_cancelled_deadline_never_expires(self) -> None:
        """Disarmed before its time (the first byte came), it is not called, while a later
        deadline on the same timer still is."""
        loop, deadlines = asyncio.get_running_loop(), Deadlines()
        called: list[str] = []
        done = loop.create_future()
        cancelled = deadlines.arm(loop, loop.time() + 0.02, lambda: called.append("cancelled"))
        deadlines.arm(loop, loop.time() + 0.04, lambda: done.set_result(None))
        cancelled.cancel()
        cancelled.cancel()  # again: nothing
        await asyncio.wait_for(done, timeout=5)
        assert called == []
