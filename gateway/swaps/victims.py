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
        (m for m in held if m != model and m not in backend.protected),
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
    """About how long a load of ``model`` takes: its last one, else a guess."""
    return plans.load_seconds.get(model, _DEFAULT_LOAD_SECONDS)


def swap_due(
    backend: Backend,
    plans: BackendPlans,
    model: str,
    chosen: tuple[str, ...],
    busy: Mapping[str, int],
    demand: Mapping[tuple[str, str], int],
    patience: float,
    person: bool = True,
) -> float:
    """How long a request for ``model`` waits before the swap that unloads ``chosen`` is
    planned for it. A person's: at once when nobody runs or waits for any of them (the
    swap costs nobody anything); else the backend's ``swap_after``, by default the swap's
    cost: the seconds of loading it brings (``model`` now, each victim again when its
    users come back); at most ``patience``. Background work's: the cost, and only while
    nobody runs or waits for them; ``patience`` whatever they do, so that it is never
    refused for want of a swap, nor swaps a person's model out between two questions.

    So swaps are rationed: while the models held are in use, a request for another waits
    as long as the switch would make the backend's users wait, and in that time more
    requests for its model gather and go with it, in one load. A backend that switched at
    every change of model, as Ollama and the router do on their own, would load about
    once per change."""
    idle = all(
        not busy.get(backend.group(v), 0) and not demand.get((backend.key, v), 0) for v in chosen
    )
    if idle and person:
        return 0.0
    if not idle and not person:
        return patience
    if backend.swap_after is not None:
        return min(backend.swap_after, patience)
    cost = load_seconds(plans, model) + sum(load_seconds(plans, v) for v in chosen if v != model)
    return min(cost, patience)
