"""Background work, started one way: named tasks owned by the object that starts them and
stopped by its ``close``. Nothing starts a task from a constructor, so building an object
never needs a running loop and never leaks a task that nobody awaits.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Generic, TypeVar

import structlog

__all__ = ["Background", "KeyedTasks", "repeat"]

log = structlog.get_logger("fairgate.tasks")

Config = TypeVar("Config")


async def repeat(
    every: float | Callable[[], float], step: Callable[[], Awaitable[None] | None]
) -> None:
    """Run ``step`` every ``every`` seconds (a callable: read anew each time, so a reload
    can change it), for ever (until cancelled). A step that fails is logged and the next
    one runs: a loop that died with it would stop its work (writing usage, probing
    backends) without a word."""
    while True:
        await asyncio.sleep(every() if callable(every) else every)
        try:
            outcome = step()
            if outcome is not None:
                await outcome
        except Exception:
            log.exception("background_step_failed", step=getattr(step, "__qualname__", step))


class Background:
    """A set of named tasks, cancelled and awaited together."""

    def __init__(self, label: str) -> None:
        self._label = label
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def start(self, name: str, work: Coroutine[Any, Any, None]) -> None:
        self.stop(name)
        self._tasks[name] = asyncio.create_task(work, name=f"{self._label}-{name}")

    def stop(self, name: str) -> None:
        task = self._tasks.pop(name, None)
        if task is not None:
            task.cancel()

    async def close(self, within: float | None = None) -> None:
        """Cancel every task and wait for them (at most ``within`` seconds, when given:
        redis-py's pub/sub reader can swallow a cancellation on a dead socket)."""
        tasks = list(self._tasks.values())
        self._tasks.clear()
        for task in tasks:
            task.cancel()
        if not tasks:
            return
        if within is not None:
            await asyncio.wait(tasks, timeout=within)
            return
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task


class KeyedTasks(Generic[Config]):
    """One task per name, run with its configuration; restarted when that changes."""

    def __init__(self, run: Callable[[Config], Coroutine[Any, Any, None]], label: str) -> None:
        self._run = run
        self._background = Background(label)
        self._configs: dict[str, Config] = {}

    def reconcile(self, wanted: dict[str, Config]) -> list[str]:
        """Start, restart or stop tasks to match ``wanted``; returns the names stopped for good."""
        gone = []
        for name, config in list(self._configs.items()):
            if wanted.get(name) != config:
                self._background.stop(name)
                del self._configs[name]
                if name not in wanted:
                    gone.append(name)
        for name, config in wanted.items():
            if name not in self._configs:
                self._configs[name] = config
                self._background.start(name, self._run(config))
        return gone

    def config(self, name: str) -> Config | None:
        return self._configs.get(name)

    async def close(self) -> None:
        self._configs.clear()
        await self._background.close()
