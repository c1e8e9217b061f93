"""One reading of the gateway at one instant: what `/status` and the Prometheus gauges render.

Each component offers its own snapshot (the waiting room, the backends, keep-warm, the
hold store, the policy reloads, the last hour's history); this module puts them side by
side, with each user's limits. Several renderers, one reading: the JSON page, the house page,
`fairgate status` and the metrics cannot disagree about what they saw.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from gateway.admission import HoldStore, RoomSnapshot
from gateway.backends import Backend, BackendPool, failed_to_load, runs_fewer
from gateway.backends.watch import WarmthSnapshot
from gateway.config import BackendKind, Policy
from gateway.observe.history import HistorySnapshot
from gateway.reload import ReloadSnapshot
from gateway.swaps import ResidentsSnapshot
from gateway.usage import BudgetState, Tally

__all__ = [
    "BackendSnapshot",
    "GatewaySnapshot",
    "HoldsSnapshot",
    "ModelSnapshot",
    "PendingSwap",
    "UserLimits",
    "UserUsage",
    "take",
]


@dataclass(frozen=True, slots=True)
class BackendSnapshot:
    name: str
    kind: BackendKind
    url: str
    healthy: bool
    busy: int
    slots: int
    heavy_running: int
    loaded: dict[str, str | None]  # model -> when Ollama unloads it
    sleeping: bool
    last_error: str | None
    heavy_slots: int = 0  # how many of its slots heavy requests may hold
    # Ollama: slots are per loaded model; ``slots`` above counts those of the models held.
    slots_per_model: int | None = None
    models: tuple[ModelSnapshot, ...] = ()  # Ollama: the models it holds
    memory_used: int = 0
    memory: int | None = None
    max_loaded_models: int | None = None
    # Ollama: loads, evictions, reloads, swaps, swap_wait_seconds, by (model, counter).
    model_counts: dict[tuple[str, str], float] = field(default_factory=dict)
    swap: PendingSwap | None = None  # the swap under way
    runs_fewer: str | None = None  # found to run fewer at once than its slots: what to do
    failed_to_load: str | None = None  # ``failed_loads`` in words, where to look
    failed_loads: dict[str, int | None] = field(default_factory=dict)  # model -> exit code
    version: str | None = None  # as it says it (Ollama's /api/version)


@dataclass(frozen=True, slots=True)
class PendingSwap:
    """A planned swap: the model it makes room for, the victims draining, since when."""

    model: str
    victims: tuple[str, ...]
    waited: float


@dataclass(frozen=True, slots=True)
class ModelSnapshot:
    """A model an Ollama backend holds: its requests, context per slot and size."""

    model: str
    busy: int
    num_ctx: int
    size: int
    expires_at: str | None


@dataclass(frozen=True, slots=True)
class HoldsSnapshot:
    """Where holds are kept: ``local`` (this process's waiting room only) or ``redis``."""

    kind: str
    shared: bool  # False while Redis is away and limits are per replica
    failures: int
    others_waiting: int
    replica: str = ""  # this replica's name in the house
    replicas: int = 1  # replicas renewing their leases in Redis, idle or not; else this one


@dataclass(frozen=True, slots=True)
class UserLimits:
    max_concurrent: int
    max_queued: int
    weight: float


@dataclass(frozen=True, slots=True)
class UserUsage:
    """A user's figures in the current day (and hour, minute), and each budget limit."""

    today: Tally
    budgets: tuple[BudgetState, ...] = ()


@dataclass(frozen=True, slots=True)
class GatewaySnapshot:
    backends: tuple[BackendSnapshot, ...]
    room: RoomSnapshot
    warmth: WarmthSnapshot
    holds: HoldsSnapshot
    reloads: ReloadSnapshot
    # Every configured user's limits, and those of anyone else active now (the defaults).
    limits: dict[str, UserLimits] = field(default_factory=dict)
    hold_seconds: float = 0.0  # how long a request has recently held its slot
    history: HistorySnapshot = field(default_factory=HistorySnapshot)
    # Every configured user, and anyone else with use today (usage/ledger.py).
    usage: dict[str, UserUsage] = field(default_factory=dict)

    @property
    def busy(self) -> int:
        """Slots busy in the whole house: what every view's "N of M slots busy" says."""
        return sum(backend.busy for backend in self.backends)

    @property
    def slots(self) -> int:
        return sum(backend.slots for backend in self.backends)


def take(
    pool: BackendPool,
    *,
    room: RoomSnapshot,
    warmth: WarmthSnapshot,
    holds: HoldStore | None,
    reloads: ReloadSnapshot,
    policy: Policy | None = None,
    hold_seconds: float = 0.0,
    history: HistorySnapshot | None = None,
    usage: dict[str, UserUsage] | None = None,
) -> GatewaySnapshot:
    heavy_slots = policy.classes.heavy.slots_on if policy is not None else lambda _: 0
    return GatewaySnapshot(
        backends=tuple(_backend(b, room, heavy_slots(b.slots)) for b in pool.backends),
        room=room,
        warmth=warmth,
        holds=holds_snapshot(holds),
        reloads=reloads,
        limits={} if policy is None else _limits(policy, room),
        hold_seconds=hold_seconds,
        history=history or HistorySnapshot(),
        usage=usage or {},
    )


def _limits(policy: Policy, room: RoomSnapshot) -> dict[str, UserLimits]:
    limits = {}
    for user in [*policy.users, *room.users]:
        given = policy.limits_of(user)
        limits[user] = UserLimits(given.max_concurrent, given.max_queued, given.weight)
    return limits


def _backend(backend: Backend, room: RoomSnapshot, heavy_slots: int) -> BackendSnapshot:
    name = backend.name
    busy, slots = room.backends.get(name, (0, backend.slots))
    state = backend.state
    held = room.residents.get(name)
    pending = room.swaps.pending.get(backend.key)
    said = state.names.get  # a router's models as it names them, not by the gateway's keys
    models = () if held is None else _models(name, held, room, said)
    failed = {said(model, model): load.exit_code for model, load in state.failed_loads.items()}
    return BackendSnapshot(
        name=name,
        kind=backend.kind,
        url=backend.url,
        healthy=state.healthy,
        busy=busy,
        slots=slots * max(1, len(models)) if held is not None else slots,
        heavy_running=room.heavy_running.get(name, 0),
        loaded={said(model, model): seen.expires_at for model, seen in state.loaded.items()},
        sleeping=state.sleeping,
        last_error=state.last_error,
        heavy_slots=heavy_slots,
        slots_per_model=slots if held is not None else None,
        models=models,
        memory_used=0 if held is None else held.memory_used,
        memory=None if held is None else held.memory,
        max_loaded_models=None if held is None else held.max_loaded_models,
        model_counts={
            (said(model, model), counter): value
            for (key, model, counter), value in room.swaps.counts.items()
            if key == backend.key
        },
        swap=None if pending is None else PendingSwap(*pending),
        runs_fewer=runs_fewer(backend),
        failed_loads=failed,
        failed_to_load=failed_to_load(failed),
        version=state.version,
    )


def _models(
    name: str, held: ResidentsSnapshot, room: RoomSnapshot, said: Callable[[str, str], str]
) -> tuple[ModelSnapshot, ...]:
    return tuple(
        ModelSnapshot(
            said(r.model, r.model),
            room.model_busy.get((name, r.model), 0),
            r.num_ctx,
            r.size,
            r.expires_at,
        )
        for r in held.residents
    )


def holds_snapshot(holds: HoldStore | None) -> HoldsSnapshot:
    if holds is None:
        return HoldsSnapshot("local", True, 0, 0)
    kind, house = type(holds).__name__.removesuffix("Holds").lower(), holds.house
    replicas = max(1, len(house.replicas))
    return HoldsSnapshot(
        kind, holds.shared, holds.failures, holds.others_waiting, house.replica, replicas
    )
