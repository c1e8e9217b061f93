"""Which models a swap unloads, and what fits beside what: pure functions of a backend's
residency (what it holds, what a model would take) and of the planner's record of it.

Left to itself, Ollama unloads a model to make room by its own rule (the first idle one,
by keep-alive then file path: a family's main model as likely as any; server/sched.go,
``findRunnerToUnload``). Here the victims are the fewest models whose going makes room,
those serving the fewest requests first, and ``resident`` and ``keep_warm`` models are
never victims. What fits is Ollama's own count: as many models as ``max_loaded_models``
(else Ollama's automatic limit) and, when the backend's memory is known, their sizes.

Pure: no I/O; the running counts and waiting demand are passed in.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from gateway.backends import Backend
from gateway.swaps.residency import Residency, Resident

__all__ = ["BackendPlans", "fits", "fits_beside", "load_seconds", "swap_due", "victims"]

_DEFAULT_LOAD_SECONDS = 10.0  # until a load of the model has been timed


@dataclass(slots=True)
class BackendPlans:
    """What the planner keeps of one backend beside the residency."""

    unloading: str | None = None  # swapped in, its victims still being unloaded
    last_used: dict[str, float] = field(default_factory=dict)
    load_seconds: dict[str, float] = field(default_factory=dict)
    # model -> user -> when their last request for it ended: who a swap would interrupt
    users: dict[str, dict[str, float]] = field(default_factory=dict)


def victims(
    residency: Residency,
    backend: Backend,
    plans: BackendPlans,
    model: str,
    num_ctx: int,
    busy: Mapping[str, int],
    demand: Mapping[tuple[str, str], int],
) -> tuple[str, ...] | None:
    """The fewest models to unload so that ``model`` fits: itself first when held with
    another context, then the unprotected ones with the fewest requests running, then
    waiting, then the longest unused. None when nothing would make room."""
    held = residency.residents(backend, busy)
    last_used = plans.last_used
    chosen = [model] if model in held else []
    candidates = sorted(
        (m for m in held if m != model and not backend.protects(m)),
        key=lambda m: (
            busy.get(backend.group(m), 0),
            demand.get((backend.key, m), 0),
            last_used.get(m, 0.0),
        ),
    )
    while not fits(residency, backend, held, chosen, model, num_ctx):
        if not candidates:
            return None
        chosen.append(candidates.pop(0))
    return tuple(chosen)


def fits_beside(
    residency: Residency, backend: Backend, busy: Mapping[str, int], model: str, num_ctx: int
) -> bool:
    """Whether ``model`` fits beside every model ``backend`` holds, none unloaded."""
    return fits(residency, backend, residency.residents(backend, busy), (), model, num_ctx)


def fits(
    residency: Residency,
    backend: Backend,
    held: Mapping[str, Resident],
    leaving: Collection[str],
    model: str,
    num_ctx: int,
) -> bool:
    """Whether ``model`` fits beside the ``held`` models that are not ``leaving``."""
    staying = [r for m, r in held.items() if m not in leaving and m != model]
    if not staying:
        return True  # alone it loads, as Ollama loads a first model whatever its size
    limit = backend.model_limit
    if limit is not None and len(staying) + 1 > limit:
        return False
    if backend.memory is None:
        return True
    size = residency.estimate(backend, model, num_ctx)
    return sum(r.size for r in staying) + size <= backend.memory


def load_seconds(plans: BackendPlans, model: str) -> float:
    """About how long a load of ``model`` takes: its last one; a model never loaded here,
    as the slowest load seen here; else a guess."""
    found = plans.load_seconds.get(model)
    if found is not None:
        return found
    return max(plans.load_seconds.values(), default=_DEFAULT_LOAD_SECONDS)


def swap_due(
    backend: Backend,
    plans: BackendPlans,
    model: str,
    chosen: tuple[str, ...],
    busy: Mapping[str, int],
    demand: Mapping[tuple[str, str], int],
    patience: float,
    now: float,
    wanting: int = 1,
    away: float = 0.0,
) -> float:
    """How long a request for ``model`` waits before the swap that unloads ``chosen`` is
    planned for it; ``wanting``: the people waiting for ``model`` (0: background work);
    ``away``: how long the request would hold its slot.

    The swap's cost is how long it keeps the victims away from their users: the loads it
    brings (``model`` now, each victim again when its users come back) and the request's
    own time between them; or the backend's ``swap_after``; at most ``patience``. The
    victims' users are those running or waiting for them, or whose last request for them
    ended within that cost (between two questions; for background work, within its
    patience: a person reading a reply). A person's request goes at once when
    the victims have no users, or fewer than the people waiting for ``model``; else once
    the people waiting have waited, together, what the switch costs the victims' users
    together (the cost, times their users, over the people waiting). With the backend's
    ``swap_after``, a person's request waits that, as it is, while the victims have users
    (the policy keeps it within ``patience``). Background work's:
    after the cost when the victims have no users, else after ``patience``, so that it is
    never refused for want of a swap, nor swaps a person's model out from under them.

    So swaps are rationed: while the models held are in use, the few who want another
    wait their fair turn, as long as the switch would make the many wait, and in that
    time more requests for their model gather and go with it, in one load. A backend that
    switched at every change of model, as Ollama and the router do on their own, loads
    about once per change."""
    if backend.swap_after is not None:
        cost = backend.swap_after
    else:
        loads = [load_seconds(plans, v) for v in chosen if v != model]
        cost = load_seconds(plans, model) + away + sum(loads)
    cost = min(cost, patience)
    # For background work, a person who used a victim within its patience is reading the
    # reply or typing the next question: still its user, whose model it does not unload.
    since = now - (cost if wanting else patience)
    users = max((_users_of(backend, plans, v, busy, demand, since) for v in chosen), default=0)
    if not wanting:
        return cost if not users else patience
    if backend.swap_after is not None:  # the wait the admin chose, whoever it interrupts
        return cost if users else 0.0
    return 0.0 if users < wanting else min(cost * users / wanting, patience)


def _users_of(
    backend: Backend,
    plans: BackendPlans,
    model: str,
    busy: Mapping[str, int],
    demand: Mapping[tuple[str, str], int],
    since: float,
) -> int:
    """How many people use ``model`` now: those whose last request ended after ``since``,
    and at least one while a request for it runs or waits."""
    recent = sum(1 for at in plans.users.get(model, {}).values() if at > since)
    active = busy.get(backend.group(model), 0) or demand.get((backend.key, model), 0)
    return max(recent, 1) if active else recent
