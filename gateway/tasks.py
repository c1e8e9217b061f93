"""Background tasks keyed by name, reconciled against the configuration after every reload."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine
from typing import Any, Generic, TypeVar

__all__ = ["KeyedTasks"]

Config = TypeVar("Config")


class KeyedTasks(Generic[Config]):
    """One task per name; a task restarts when its configuration changes."""

    def __init__(self, run: Callable[[Config], Coroutine[Any, Any, None]], label: str) -> None:
        self._run = run
        self._label = label
        self._tasks: dict[str, tuple[Config, asyncio.Task[None]]] = {}

    def reconcile(self, wanted: dict[str, Config]) -> list[str]:
        """Start, restart or stop tasks to match ``wanted``; returns the names stopped for good."""
        gone = []
        for name, (config, task) in list(self._tasks.items()):
            if wanted.get(name) != config:
                task.cancel()
                del self._tasks[name]
                if name not in wanted:
                    gone.append(name)
        for name, config in wanted.items():
            if name not in self._tasks:
                task = asyncio.create_task(self._run(config), name=f"{self._label}-{name}")
                self._tasks[name] = (config, task)
        return gone

    def config(self, name: str) -> Config | None:
        entry = self._tasks.get(name)
        return entry[0] if entry else None

    async def close(self) -> None:
        tasks = [task for _, task in self._tasks.values()]
        self._tasks.clear()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
