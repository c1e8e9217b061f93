"""The background watch over every backend: probes on an interval, never on a request's path.

A backend leaves rotation after ``unhealthy_after`` failed probes in a row and comes back
after ``healthy_after`` good ones, so one lost packet does not make it flap.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import structlog

from gateway.backends.pool import (
    BackendState,
    BackendStates,
    FailedLoad,
    LoadedModel,
)
from gateway.backends.watch.failures import sentence
from gateway.backends.watch.probes import Observation, ProbeFailed, probe
from gateway.config import BackendConfig, Monitoring
from gateway.core import KeyedTasks, repeat
from gateway.relay import Upstream
from gateway.wire import runs_own_runner

__all__ = ["BackendMonitor"]

log = structlog.get_logger("fairgate.backends")


class BackendMonitor:
    """One probing task per configured backend; their states survive policy reloads."""

    def __init__(
        self,
        upstream: Upstream,
        states: BackendStates,
        on_change: Callable[[], None],
    ) -> None:
        self.states = states
        self._upstream = upstream
        self._on_change = on_change
        self._tasks = KeyedTasks(self._watch, "monitor")
        self._settings = Monitoring()

    def reconcile(self, backends: list[BackendConfig], settings: Monitoring) -> None:
        """Start, restart or stop probing so that it matches the configured backends."""
        self._settings = settings
        gone = self._tasks.reconcile({backend.name: backend for backend in backends})
        for name in gone:
            self.states.forget(name)

    async def start(self, backends: list[BackendConfig], settings: Monitoring) -> None:
        """Probe every backend once, together, so that routing starts knowing what they
        serve; then keep probing in the background."""
        self._settings = settings
        await asyncio.gather(*(self.check(b, self.states.of(b.name)) for b in backends))
        for backend in backends:
            error = self.states.of(backend.name).last_error
            if error is not None:
                # Said now, not after unhealthy_after probes: on a first run without Ollama
                # this line is the first thing the admin needs to read.
                reason = sentence(backend.name, backend.url, error)
                log.warning(
                    "backend_unreachable", backend=backend.name, url=backend.url, reason=reason
                )
        self.reconcile(backends, settings)

    async def close(self) -> None:
        await self._tasks.close()

    async def _watch(self, config: BackendConfig) -> None:
        state = self.states.of(config.name)
        await repeat(lambda: self._settings.interval, lambda: self.check(config, state))

    async def check(self, config: BackendConfig, state: BackendState) -> None:
        """Probe once and update ``state``."""
        started = time.monotonic()
        try:
            seen = await probe(
                self._upstream.session, config.kind, config.url, self._settings.timeout
            )
        except ProbeFailed as exc:
            self._failed(config, state, str(exc))
        else:
            self._succeeded(config, state, seen, started)

    def report_failure(self, name: str, reason: str) -> None:
        """A request found the backend failing: count it like a failed probe. When probes
        already failed, their words stay: they say what to check, the relay's do not."""
        state, config = self.states.get(name), self._tasks.config(name)
        if state is not None and config is not None:
            kept = state.last_error if state.failures else None
            self._failed(config, state, kept or reason)

    def _failed(self, config: BackendConfig, state: BackendState, reason: str) -> None:
        state.failures += 1
        state.successes = 0
        state.last_error = reason
        if state.healthy and state.failures >= self._settings.unhealthy_after:
            state.healthy = False
            state.child_slots.clear()  # restarted, its presets may say otherwise
            log.warning(
                "backend_down",
                backend=config.name,
                url=config.url,
                reason=sentence(config.name, config.url, reason),
            )
            self._on_change()

    def _succeeded(
        self, config: BackendConfig, state: BackendState, seen: Observation, started: float
    ) -> None:
        state.successes += 1
        state.failures = 0
        state.last_error = None
        slots, children_changed = seen.slots, False
        if config.kind == "llamacpp-router":
            slots, children_changed = _child_slots(state, seen)
        # What Ollama holds decides what can be dispatched without a swap: a change wakes
        # the waiting room as a change of slots or models does.
        changed = (state.slots, state.models, _held(state.loaded)) != (
            slots,
            seen.models,
            _held(seen.loaded),
        )
        changed |= children_changed
        state.slots, state.models, state.loaded = slots, seen.models, seen.loaded
        state.model_limit, state.names = seen.model_limit, seen.names
        if seen.ambiguous != state.ambiguous and seen.ambiguous:
            log.warning("router_names_alike", backend=config.name, names=seen.ambiguous)
        state.ambiguous = seen.ambiguous
        # What the gateway sent after the probe started is newer than what it read.
        state.sizes, state.observed_at = seen.sizes, started
        state.sleeping = seen.sleeping
        if seen.version != state.version:  # read once a release, not at every probe
            state.version, state.one_prompt_a_slot = seen.version, runs_own_runner(seen.version)
        changed |= _note_failed_loads(config, state, seen, started)
        if not state.healthy and state.successes >= self._settings.healthy_after:
            state.healthy = True
            state.comebacks += 1  # what its engine cached is gone with its process
            state.runs_at_most = None  # back from a restart, maybe with another setting
            changed = True
            log.info("backend_up", backend=config.name, url=config.url)
        if changed:
            self._on_change()


def _child_slots(state: BackendState, seen: Observation) -> tuple[int | None, bool]:
    """A router's slots: one figure for every child, the fewest any has run here (a preset
    may give each its own ``parallel``), remembered while it is unloaded, so that the first
    requests after a swap to it are not more than it runs; and whether a child's changed."""
    children = state.child_slots
    before = dict(children)
    children.update(seen.child_slots)
    for gone in children.keys() - seen.models:  # no longer among its models
        del children[gone]
    return min(children.values(), default=None), children != before


def _note_failed_loads(
    config: BackendConfig, state: BackendState, seen: Observation, now: float
) -> bool:
    """Models whose load failed, as the router says, are refused for a while
    (``FailedLoad.next_retry``): each request for one would otherwise unload what the
    others use, for a load that fails again. A retry that failed too doubles the while; one
    that loaded is forgotten (one being tried is not: its child is starting). Whether a
    failure was noted (requests waiting for the model are told at once)."""
    failures = state.failed_loads
    for model in failures.keys() - seen.failed.keys() - seen.loading:
        del failures[model]
    noted = False
    for model, code in seen.failed.items():
        known = failures.get(model)
        if known is None:
            known = failures[model] = FailedLoad(code, 0.0)
        elif known.retried_at is not None and known.retried_at < now:
            known.failures += 1  # what this probe read came after the retry was sent
        else:
            continue
        known.exit_code, known.retried_at = code, None
        known.retry_at = known.next_retry(now)
        noted = True
        log.warning(
            "model_failed_to_load",
            backend=config.name,
            model=model,
            exit_code=code,
            failures=known.failures,
            retry_in_s=round(known.retry_at - now),
        )
    return noted


def _held(loaded: dict[str, LoadedModel]) -> dict[str, tuple[int, int | None]]:
    """Models in memory with their sizes and contexts; not when they expire, which moves."""
    return {model: (seen.size, seen.context_length) for model, seen in loaded.items()}
