"""Keeping the household's models loaded.

Ollama unloads a model ``keep_alive`` after its last request (5 minutes by default) and the
next person waits for a reload; any client sending ``"keep_alive": 0`` unloads it for
everybody (https://github.com/ollama/ollama/blob/main/docs/faq.md). So the gateway:

- pings each ``keep_warm`` model with an empty ``POST /api/generate`` (no prompt, no
  options: different options would force a reload) when ``/api/ps``, as the backend
  monitor last read it, shows it unloaded or about to expire. Ollama runs such a request
  without a parallel slot, and the gateway sends it outside admission, so it takes no
  user's slot either;
- counts a reply whose ``load_duration`` shows it paid for a load: a cold start.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime

import aiohttp
import structlog

from gateway.backends.pool import BackendState, BackendStates
from gateway.config import BackendConfig, Warmth, model_key
from gateway.core import KeyedTasks, whole_seconds
from gateway.relay import Upstream

__all__ = ["KeepWarm", "WarmthSnapshot"]

log = structlog.get_logger("fairgate.warmth")
_MAX_BACKOFF = 5  # doublings of the interval after repeated errors


@dataclass(frozen=True, slots=True)
class WarmthSnapshot:
    pings: dict[tuple[str, str, str], int]  # (backend, model, ok|failed) -> pings
    cold_starts: dict[tuple[str, str], int]  # (backend, model) -> replies that paid a load


class KeepWarm:
    """A pinging task for every Ollama backend that names models to keep warm."""

    def __init__(self, upstream: Upstream, states: BackendStates) -> None:
        self._upstream = upstream
        self._states = states
        self._settings = Warmth()
        self._tasks = KeyedTasks(self._keep_warm, "warmth")
        self.pings: Counter[tuple[str, str, str]] = Counter()  # (backend, model, ok|failed)
        self.cold_starts: Counter[tuple[str, str]] = Counter()  # (backend, model)

    def reconcile(self, backends: list[BackendConfig], settings: Warmth) -> None:
        self._settings = settings
        self._tasks.reconcile({b.name: b for b in backends if b.kind == "ollama" and b.keep_warm})

    async def close(self) -> None:
        await self._tasks.close()

    def snapshot(self) -> WarmthSnapshot:
        return WarmthSnapshot(dict(self.pings), dict(self.cold_starts))

    def note_load(self, backend: str, model: str, load_seconds: float | None) -> None:
        """Count a cold start when a reply's load_duration passes the threshold."""
        if load_seconds is None or load_seconds <= self._settings.cold_start_after:
            return
        self.cold_starts[backend, model] += 1
        log.warning("cold_start", backend=backend, model=model, load_seconds=round(load_seconds, 3))

    async def _keep_warm(self, config: BackendConfig) -> None:
        failures = 0
        while True:
            state = self._states.get(config.name)
            if state is not None and state.healthy:  # paused while the backend is down
                try:
                    await self._check(config, state)
                    failures = 0
                except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                    failures = min(failures + 1, _MAX_BACKOFF)
                    log.warning("keep_warm_failed", backend=config.name, error=repr(exc))
            await asyncio.sleep(self._settings.interval * 2**failures)

    async def _check(self, config: BackendConfig, state: BackendState) -> None:
        horizon = 2 * self._settings.interval
        loaded = {model: _expiry(seen.expires_at) for model, seen in state.loaded.items()}
        now = datetime.now(UTC)
        for model in config.keep_warm:
            expires = loaded.get(model_key(model), now)
            if model_key(model) in loaded and (expires - now).total_seconds() > horizon:
                continue
            ok = await self._ping(config, model)
            self.pings[config.name, model, "ok" if ok else "failed"] += 1
            if not ok:
                raise ValueError(f"the keep-warm ping for {model} failed")

    async def _ping(self, config: BackendConfig, model: str) -> bool:
        body = {"model": model, "keep_alive": whole_seconds(config.keep_alive)}
        # Loading a large model from disk can take minutes.
        timeout = aiohttp.ClientTimeout(total=600)
        async with self._upstream.session.post(
            config.url + "/api/generate", json=body, timeout=timeout
        ) as reply:
            await reply.read()
            log.info("keep_warm_ping", backend=config.name, model=model, status=reply.status)
            return reply.status == 200


def _expiry(text: object) -> datetime:
    try:
        return datetime.fromisoformat(str(text))
    except ValueError:
        return datetime.now(UTC)  # unreadable: treat as expiring now, so it gets pinged
