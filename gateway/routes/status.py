"""``GET /status``: the gateway's snapshot as JSON, for admins (an admin key, or loopback);
``/healthz`` and ``/readyz`` for health checks, without a key.

Liveness and readiness differ on purpose: a gateway whose every backend is down is alive
(restarting it would not bring Ollama back) but not ready (it can only answer 503s)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from aiohttp import web

from gateway.admission import EstimatesSnapshot, RunningRequest, WaitingRequest
from gateway.backends import Backend
from gateway.core import GatewayError, Reason
from gateway.edge.http import NO_STORE
from gateway.observe import (
    BackendSnapshot,
    GatewaySnapshot,
    MinuteFigures,
    RecentRefusal,
    UserUsage,
)
from gateway.services import Services

__all__ = ["Status", "answering", "render", "render_budget", "render_today"]


class Status:
    def __init__(self, services: Services) -> None:
        self._services = services

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get("/status", self.status)
        app.router.add_get("/healthz", self.alive)
        app.router.add_get("/readyz", self.ready)

    async def alive(self, request: web.Request) -> web.Response:
        """Liveness: the process answers HTTP; nothing else is checked."""
        return web.json_response({"status": "alive"})

    async def ready(self, request: web.Request) -> web.Response:
        """Readiness: 200 while at least one backend is in rotation and has answered its
        probes, 503 otherwise. Counts only: the backends' names and errors are in /status."""
        backends = self._services.policy.current.pool.backends
        ready = sum(1 for _ in answering(backends))
        body = {
            "status": "ready" if ready else "not_ready",
            "backends_ready": ready,
            "backends": len(backends),
        }
        return web.json_response(body, status=200 if ready else 503)

    async def status(self, request: web.Request) -> web.Response:
        services = self._services
        if not services.is_admin(request, services.policy.current):
            raise GatewayError(
                403, Reason.ADMIN_ONLY, "/status needs an admin key or a loopback client"
            )
        return web.json_response(render(services.snapshot()), headers=NO_STORE)


def answering(backends: Iterable[Backend]) -> Iterable[Backend]:
    """Backends in rotation that have answered a probe. A backend is healthy until its
    probes say otherwise, so health alone would call a gateway ready whose only backend has
    never answered (a first run without Ollama)."""
    return (b for b in backends if b.state.healthy and b.state.models is not None)


def render(snapshot: GatewaySnapshot) -> dict[str, Any]:
    room, holds, reloads = snapshot.room, snapshot.holds, snapshot.reloads
    return {
        "backends": {b.name: _backend(b, snapshot) for b in snapshot.backends},
        "slots": {"busy": snapshot.busy, "total": snapshot.slots},  # the house's, all backends
        "users": _users(snapshot),
        "queue": {
            "depth": room.queue_depth,
            "oldest_wait_seconds": round(room.oldest_wait, 3),
            "waiting": [_waiting(w) for w in room.waiting],
            "hold_seconds": round(snapshot.hold_seconds, 3),
            "estimates": _estimates(room.estimates),
            # Background work that gave its slot to a person, since the gateway started.
            "given_way": {
                "restarts": room.given_way.restarts,
                "slot_seconds": round(room.given_way.slot_seconds, 3),
                "prompt_tokens": round(room.given_way.prompt_tokens),
                "running_now": room.preemptible,
            },
        },
        "running": [_running(r) for r in room.running],
        "refusals": [_refusal(r) for r in snapshot.history.refusals],
        "strangers": [_refusal(r) for r in snapshot.history.strangers],
        "last_hour": [_minute(m) for m in snapshot.history.minutes],
        "state": {
            "kind": holds.kind,
            "shared": holds.shared,
            "waiting_on_other_replicas": holds.others_waiting,
            # With several replicas: this one, and every replica the house has seen lately.
            "replica": holds.replica or None,
            "replicas": holds.replicas,
        },
        "policy": {
            "path": reloads.path,
            "reloads_ok": reloads.reloads_ok,
            "reloads_failed": reloads.reloads_failed,
            "last_error": reloads.last_error,
        },
    }


def _backend(backend: BackendSnapshot, snapshot: GatewaySnapshot) -> dict[str, Any]:
    warmth = snapshot.warmth
    return {
        "kind": backend.kind,
        "url": backend.url,
        "version": backend.version,  # Ollama's: before 0.30 its own runner, since llama-server
        "healthy": backend.healthy,
        "busy": backend.busy,
        "slots": backend.slots,
        "heavy_running": backend.heavy_running,
        "heavy_slots": backend.heavy_slots,
        "loaded": backend.loaded,  # model -> when Ollama unloads it
        "sleeping": backend.sleeping,
        "last_error": backend.last_error,
        "runs_fewer": backend.runs_fewer,
        "failed_loads": backend.failed_loads,  # the router's: model -> its child's exit code
        "failed_to_load": backend.failed_to_load,  # the same in words
        "keep_warm_pings": {
            f"{model}:{outcome}": count
            for (name, model, outcome), count in warmth.pings.items()
            if name == backend.name
        },
        "cold_starts": {
            model: count
            for (name, model), count in warmth.cold_starts.items()
            if name == backend.name
        },
        **({} if backend.slots_per_model is None else _models(backend)),
    }


def _models(backend: BackendSnapshot) -> dict[str, Any]:
    """An Ollama backend's models in memory: each with its own slots, context and size."""
    return {
        "slots_per_model": backend.slots_per_model,
        "max_loaded_models": backend.max_loaded_models,
        "memory": {"used": backend.memory_used, "budget": backend.memory},
        "swap": None
        if backend.swap is None
        else {
            "model": backend.swap.model,
            "draining": list(backend.swap.victims),
            "waited_seconds": round(backend.swap.waited, 3),
        },
        "counts": {
            model: {c: round(v, 3) for (m, c), v in backend.model_counts.items() if m == model}
            for model in sorted({m for m, _ in backend.model_counts})
        },
        "models": {
            m.model: {
                "busy": m.busy,
                "slots": backend.slots_per_model,
                "num_ctx": m.num_ctx,
                "size": m.size,
                "expires_at": m.expires_at,
            }
            for m in backend.models
        },
    }


def _users(snapshot: GatewaySnapshot) -> dict[str, Any]:
    """Every configured user, and anyone else active: places in use against limits, today's
    use against the budget."""
    active, usage = snapshot.room.users, snapshot.usage
    background = snapshot.room.background_users
    users = {}
    for name in sorted({*snapshot.limits, *active, *background, *usage}):
        running, queued = active.get(name, (0, 0))
        background_running, background_queued = background.get(name, (0, 0))
        limits, used = snapshot.limits.get(name), usage.get(name)
        users[name] = {
            "running": running,
            "queued": queued,
            "max_concurrent": limits and limits.max_concurrent,
            "max_queued": limits and limits.max_queued,
            "weight": limits and limits.weight,
            "background": {"running": background_running, "queued": background_queued},
            "today": render_today(used),
            "budget": render_budget(used),
        }
    return users


def render_today(usage: UserUsage | None) -> dict[str, Any]:
    """A user's day so far (in the admin's time zone), across restarts."""
    if usage is None:
        return {"requests": 0, "refused": 0, "prompt_tokens": 0, "completion_tokens": 0,
                "slot_seconds": 0.0}  # fmt: skip
    today = usage.today
    return {
        "requests": today.requests,
        "refused": today.refused,
        "prompt_tokens": today.prompt_tokens,
        "completion_tokens": today.completion_tokens,
        "slot_seconds": round(today.slot_seconds, 3),
    }


def render_budget(usage: UserUsage | None) -> dict[str, Any]:
    """Each limit of the user's budget: used, remaining, and when it renews (epoch seconds)."""
    return {
        state.name: {
            "limit": state.limit,
            "used": round(state.used, 3),
            "remaining": round(state.remaining, 3),
            "renews_at": round(state.renews_at, 3),
        }
        for state in (usage.budgets if usage is not None else ())
    }


def _running(run: RunningRequest) -> dict[str, Any]:
    return {
        "user": run.user,
        "model": run.model,
        "backend": run.backend,
        "class": run.request_class,
        "lane": run.lane,
        "seconds": round(run.seconds, 3),
        "replica": run.replica or None,
    }


def _waiting(waiter: WaitingRequest) -> dict[str, Any]:
    return {
        "position": waiter.position,
        "user": waiter.user,
        "model": waiter.model,
        "class": waiter.request_class,
        "lane": waiter.lane,
        "waited_seconds": round(waiter.waited, 3),
        "estimated_start_seconds": round(waiter.starts_in, 3),
        "replica": waiter.replica or None,
    }


def _estimates(estimates: EstimatesSnapshot) -> dict[str, Any]:
    """How far off "starts in about" has been (|estimated - waited| / waited, over the last
    waits; a wait under a second counts as one), and the service times it is made of."""
    error = estimates.median_error
    by_backend: dict[str, dict[str, dict[str, float]]] = {}
    for (backend, model, request_class), seconds in sorted(estimates.decode_seconds.items()):
        models = by_backend.setdefault(backend, {})
        models.setdefault(model, {})[request_class] = round(seconds, 3)
    rates, background = estimates.prefill_rates, estimates.background_median_error
    return {
        "median_error": None if error is None else round(error, 3),  # people's waits
        "samples": estimates.samples,
        "background_median_error": None if background is None else round(background, 3),
        "background_samples": estimates.background_samples,
        "decode_seconds": by_backend,
        "prefill_tokens_per_second": {name: round(rate, 1) for name, rate in rates.items()},
    }


def _refusal(refusal: RecentRefusal) -> dict[str, Any]:
    return {
        "at": round(refusal.at, 3),
        "user": refusal.user,
        "reason": refusal.reason,
        "path": refusal.path,
        "model": refusal.model,
    }


def _minute(minute: MinuteFigures) -> dict[str, Any]:
    return {
        "start": minute.start,
        "requests": minute.requests,
        "refusals": minute.refusals,
        "ttft_p50": minute.ttft_p50,
        "ttft_p95": minute.ttft_p95,
    }
