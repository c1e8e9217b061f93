"""One reading of the gateway at one instant: what `/status` and the Prometheus gauges render.

Each component offers its own snapshot (the waiting room, the backends, keep-warm, the
hold store, the policy reloads); this module puts them side by side. Two renderers, one
reading: the JSON page and the metrics cannot disagree about what they saw.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.backends.pool import Backend, BackendPool
from gateway.holds import HoldStore
from gateway.reload import ReloadSnapshot
from gateway.waiting_room import RoomSnapshot
from gateway.warmth import WarmthSnapshot

__all__ = ["BackendSnapshot", "GatewaySnapshot", "HoldsSnapshot", "take"]


@dataclass(frozen=True, slots=True)
class BackendSnapshot:
    name: str
    kind: str
    url: str
    healthy: bool
    busy: int
    slots: int
    heavy_running: int
    loaded: dict[str, str | None]  # model -> when Ollama unloads it
    sleeping: bool
    last_error: str | None


@dataclass(frozen=True, slots=True)
class HoldsSnapshot:
    """Where holds are kept: ``local`` (this process's waiting room only) or ``redis``."""

    kind: str
    shared: bool  # False while Redis is away and limits are per replica
    failures: int
    others_waiting: int


@dataclass(frozen=True, slots=True)
class GatewaySnapshot:
    backends: tuple[BackendSnapshot, ...]
    room: RoomSnapshot
    warmth: WarmthSnapshot
    holds: HoldsSnapshot
    reloads: ReloadSnapshot


def take(
    pool: BackendPool,
    room: RoomSnapshot,
    warmth: WarmthSnapshot,
    holds: HoldStore | None,
    reloads: ReloadSnapshot,
) -> GatewaySnapshot:
    return GatewaySnapshot(
        backends=tuple(_backend(b, room) for b in pool.backends),
        room=room,
        warmth=warmth,
        holds=holds_snapshot(holds),
        reloads=reloads,
    )


def _backend(backend: Backend, room: RoomSnapshot) -> BackendSnapshot:
    name = backend.name
    busy, slots = room.backends.get(name, (0, backend.slots))
    state = backend.state
    return BackendSnapshot(
        name=name,
        kind=backend.kind,
        url=backend.url,
        healthy=state.healthy,
        busy=busy,
        slots=slots,
        heavy_running=room.heavy_running.get(name, 0),
        loaded=dict(state.loaded),
        sleeping=state.sleeping,
        last_error=state.last_error,
    )


def holds_snapshot(holds: HoldStore | None) -> HoldsSnapshot:
    if holds is None:
        return HoldsSnapshot("local", True, 0, 0)
    kind = type(holds).__name__.removesuffix("Holds").lower()
    return HoldsSnapshot(kind, holds.shared, holds.failures, holds.others_waiting)
