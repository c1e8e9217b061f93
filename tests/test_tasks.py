"""Background loops outlive a step that fails."""

from __future__ import annotations

import asyncio

import structlog

from gateway.core.tasks import repeat


async def test_a_step_that_fails_is_logged_and_the_loop_runs_on() -> None:
    """A step that raises (a usage write that met an error nobody planned for) is logged,
    and the loop runs its next step instead of ending without a word."""
    calls: list[int] = []
    again = asyncio.Event()

    def step() -> None:
        calls.append(len(calls))
        if len(calls) == 1:
            raise OverflowError("a count past 64 bits")
        again.set()

    with structlog.testing.capture_logs() as logs:
        loop = asyncio.create_task(repeat(0, step))
        try:
            async with asyncio.timeout(5):
                await again.wait()
        finally:
            loop.cancel()
    assert calls[:2] == [0, 1]
    assert [entry["event"] for entry in logs] == ["background_step_failed"]
