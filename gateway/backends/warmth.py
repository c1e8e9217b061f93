"""Keeping the household's models loaded, and the admin's say over keep_alive.

Ollama unloads a model ``keep_alive`` after its last request (5 minutes by default) and the
next person waits for a reload; any client sending ``"keep_alive": 0`` unloads it for
everybody (https://github.com/ollama/ollama/blob/main/docs/faq.md). So the gateway:

- pings each ``keep_warm`` model with an empty ``POST /api/generate`` (no prompt, no
  options: different options would force a reload) when ``/api/ps``, as the backend
  monitor last read it, shows it unloaded or about to expire. Ollama runs such a request
  without a parallel slot, and the gateway sends it outside admission, so it takes no
  user's slot either;
- clamps or overrides the keep_alive of proxied requests;
- counts a reply whose ``load_duration`` shows it paid for a load: a cold start.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import aiohttp
import structlog

from gateway.backends import Backend, BackendState, BackendStates, model_key
from gateway.config.policy import BackendConfig, KeepAlivePolicy, Warmth
from gateway.core.errors import GatewayError
from gateway.core.tasks import KeyedTasks
from gateway.core.units import fits_go_duration, parse_go_duration
from gateway.core.vocabulary import Reason
from gateway.relay.clients import Upstream

__all__ = ["KeepWarm", "WarmthSnapshot", "apply_keep_alive_policy", "kept_alive"]

log = structlog.get_logger("fairgate.warmth")
# Go's longest duration, spelt out, is 25 characters ("-2562047h47m16.854775807s").
_LONGEST_KEEP_ALIVE = 64
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

    def note_load(self, backend: str, model: str, load_seconds: float | None) -> bool:
        """Count a cold start when a reply's load_duration passes the threshold."""
        if load_seconds is None or load_seconds <= self._settings.cold_start_after:
            return False
        self.cold_starts[backend, model] += 1
        log.warning("cold_start", backend=backend, model=model, load_seconds=round(load_seconds, 3))
        return True

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

    async def unload(self, backend: Backend, models: tuple[str, ...], within: float) -> None:
        """Unload ``models`` (a planned swap's victims, drained) from ``backend`` with an
        empty ``keep_alive: 0`` request each, before the request that needs the room goes:
        Ollama then has room, and unloads nothing of its own choosing. A failure is logged;
        Ollama then makes room its own way."""
        for model in models:
            body = {"model": model, "keep_alive": 0}
            try:
                async with self._upstream.session.post(
                    backend.url + "/api/generate", json=body, timeout=aiohttp.ClientTimeout(within)
                ) as reply:
                    await reply.read()
                    log.info(
                        "model_unloaded", backend=backend.name, model=model, status=reply.status
                    )
            except (aiohttp.ClientError, TimeoutError) as exc:
                log.warning(
                    "model_unload_failed", backend=backend.name, model=model, error=repr(exc)
                )

    async def _ping(self, config: BackendConfig, model: str) -> bool:
        body = {"model": model, "keep_alive": _seconds(config.keep_alive)}
        # Loading a large model from disk can take minutes.
        timeout = aiohttp.ClientTimeout(total=600)
        async with self._upstream.session.post(
            config.url + "/api/generate", json=body, timeout=timeout
        ) as reply:
            await reply.read()
            log.info("keep_warm_ping", backend=config.name, model=model, status=reply.status)
            return reply.status == 200


def apply_keep_alive_policy(
    fields: dict[str, Any], rules: KeepAlivePolicy, kept: float | None = None
) -> bool:
    """Clamp or override ``fields["keep_alive"]`` in place; True when the body changed.

    ``kept`` (``kept_alive``): a model the policy keeps loaded is protected from a
    client's shorter keep_alive, a ``0`` above all, which would unload it for everybody."""
    given = fields.get("keep_alive")
    if given is None and rules.override is None and kept is None:
        return False  # nothing asked, nothing imposed: most requests, on their first byte's path
    wanted = _wanted_keep_alive(given, rules)
    if kept is not None:
        wanted = _protected(given if wanted is None else wanted, kept) or wanted
    if wanted is None:
        return False
    fields["keep_alive"] = _seconds(wanted)
    return True


def kept_alive(backends: list[BackendConfig], model: str) -> float | None:
    """How long ``model`` must stay loaded after a request: forever (-1) when a backend
    holds it ``resident``, the longest keep-warm ``keep_alive`` when one keeps it warm."""
    key, floors = "", []
    for backend in backends:
        if not backend.resident and not backend.keep_warm:  # most: nothing kept
            continue
        key = key or model_key(model)  # only then: on every request's path
        if key in map(model_key, backend.resident):
            return -1.0
        if key in map(model_key, backend.keep_warm):
            floors.append(backend.keep_alive)
    if not floors:
        return None
    return -1.0 if min(floors) < 0 else max(floors)


def _protected(given: object, kept: float) -> float | None:
    """The keep_alive that keeps the model loaded for ``kept``, or None if ``given`` does.

    Pinned (``kept`` negative): always -1, as a request without keep_alive leaves the
    runner's, which a load without one sets to Ollama's 5 minutes. Kept warm: only a
    shorter one is raised; without one the runner keeps the keep-warm pings' value."""
    asked = _asked(given)
    if kept < 0:
        return None if asked is not None and asked < 0 else kept
    return kept if asked is not None and 0 <= asked < kept else None


def _wanted_keep_alive(given: object, rules: KeepAlivePolicy) -> float | None:
    """The keep_alive to send instead of ``given``, or None to leave the request alone."""
    if rules.override is not None:
        return rules.override
    asked = _asked(given)
    if asked is None:
        return None
    forever = asked < 0
    if rules.max is not None and (forever or asked > rules.max):
        return rules.max
    if rules.min is not None and not forever and asked < rules.min:
        return rules.min
    return None


def _asked(given: object) -> float | None:
    """The client's keep_alive in seconds; None when absent or malformed: Ollama answers
    those itself (a string longer than Go's durations too: ``time.ParseDuration`` refuses it).

    A number that long is refused here (400): Ollama does not refuse it but overflows it
    (``Duration.UnmarshalJSON``), to "unload when idle" on amd64 and to its "forever" on
    arm64. Read as "very long" it would pass ``min``, and a ``keep_warm`` model would not be
    raised, while Ollama unloaded it for everybody; read as either of Ollama's meanings it
    would depend on the backend's CPU. Refused, nothing is forwarded, so no rule and no kept
    model depends on it; and the client learns that -1 says "forever"."""
    if given is None or isinstance(given, bool) or not isinstance(given, int | float | str):
        return None
    if isinstance(given, str):
        if len(given) > _LONGEST_KEEP_ALIVE:
            # Parsed on the event loop in time that grows with its square: a client's
            # 32 MiB of "1s" (valid Go) would hold every stream for hours.
            raise GatewayError(
                400,
                Reason.BAD_REQUEST,
                f"keep_alive is {len(given):,} characters long; a duration such as 5m or "
                f"24h is at most {_LONGEST_KEEP_ALIVE}",
            )
        try:
            return parse_go_duration(given)
        except ValueError:
            return None
    if given < 0:
        return -1.0  # forever, however large
    if not fits_go_duration(given):
        raise GatewayError(
            400,
            Reason.BAD_REQUEST,
            "keep_alive is longer than Ollama's durations can hold (about 292 years): "
            "use -1 to keep the model loaded",
        )
    return float(given)


def _seconds(value: float) -> int | float:
    # Ollama reads a number as seconds; whole numbers keep the JSON tidy.
    return int(value) if float(value).is_integer() else value


def _expiry(text: object) -> datetime:
    try:
        return datetime.fromisoformat(str(text))
    except ValueError:
        return datetime.now(UTC)  # unreadable: treat as expiring now, so it gets pinged
