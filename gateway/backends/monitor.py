"""The background watch over every backend: probes on an interval, never on a request's path.

A backend leaves rotation after ``unhealthy_after`` failed probes in a row and comes back
after ``healthy_after`` good ones, so one lost packet does not make it flap.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import aiohttp
import structlog

from gateway.backends.pool import BackendState
from gateway.backends.probes import Observation, ProbeFailed, probe
from gateway.policy import BackendConfig, Monitoring

__all__ = ["BackendMonitor"]

log = structlog.get_logger("fairgate.backends")


class BackendMonitor:
    """One probing task per configured backend; their states survive policy reloads."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        states: dict[str, BackendState],
        on_change: Callable[[], None],
    ) -> None:
        self.states = states
        self._session = session
        self._on_change = on_change
        self._tasks: dict[str, tuple[BackendConfig, asyncio.Task[None]]] = {}
        self._settings = Monitoring()

    def reconcile(self, backends: list[BackendConfig], settings: Monitoring) -> None:
        """Start, restart or stop probing so that it matches the configured backends."""
        self._settings = settings
        wanted = {backend.name: backend for backend in backends}
        for name, (config, task) in list(self._tasks.items()):
            if wanted.get(name) != config:
                task.cancel()
                del self._tasks[name]
                if name not in wanted:
                    self.states.pop(name, None)
        for name, config in wanted.items():
            if name not in self._tasks:
                state = self.states.setdefault(name, BackendState())
                task = asyncio.create_task(self._watch(config, state), name=f"monitor-{name}")
                self._tasks[name] = (config, task)

    async def start(self, backends: list[BackendConfig], settings: Monitoring) -> None:
        """Probe every backend once, together, so that routing starts knowing what they
        serve; then keep probing in the background."""
        self._settings = settings
        await asyncio.gather(
            *(self.check(b, self.states.setdefault(b.name, BackendState())) for b in backends)
        )
        self.reconcile(backends, settings)

    async def close(self) -> None:
        tasks = [task for _, task in self._tasks.values()]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()

    async def _watch(self, config: BackendConfig, state: BackendState) -> None:
        while True:
            await asyncio.sleep(self._settings.interval)
            await self.check(config, state)

    async def check(self, config: BackendConfig, state: BackendState) -> None:
        """Probe once and update ``state``."""
        try:
            seen = await probe(self._session, config.kind, config.url, self._settings.timeout)
        except ProbeFailed as exc:
            self._failed(config, state, str(exc))
        else:
            self._succeeded(config, state, seen)

    def report_failure(self, name: str, reason: str) -> None:
        """A request found the backend failing: count it like a failed probe."""
        state = self.states.get(name)
        config = self._tasks.get(name, (None, None))[0]
        if state is not None and config is not None:
            self._failed(config, state, reason)

    def _failed(self, config: BackendConfig, state: BackendState, reason: str) -> None:
        state.failures += 1
        state.successes = 0
        state.last_error = reason
        if state.healthy and state.failures >= self._settings.unhealthy_after:
            state.healthy = False
            log.warning("backend_down", backend=config.name, url=config.url, reason=reason)
            self._on_change()

    def _succeeded(self, config: BackendConfig, state: BackendState, seen: Observation) -> None:
        state.successes += 1
        state.failures = 0
        state.last_error = None
        changed = (state.slots, state.models) != (seen.slots, seen.models)
        state.slots, state.models, state.loaded = seen.slots, seen.models, seen.loaded
        state.sleeping, state.listings = seen.sleeping, seen.listings
        if not state.healthy and state.successes >= self._settings.healthy_after:
            state.healthy = True
            changed = True
            log.info("backend_up", backend=config.name, url=config.url)
        if changed:
            self._on_change()
