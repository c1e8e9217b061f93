"""Why a request waits for memory, in words and seconds: what its 503 says when the swap
it waited for (or the room a swap could not make) kept it past ``max_wait``.

Questions put to the room's ``SwapPlanner``, as ``admission/turns.py`` puts its own to the room:
they plan nothing and change no record. Apart from the planner, which decides what is
sent and what is unloaded, because they are asked only of a request being refused, and
their words and estimates are not the planning's.

Pure: no I/O; the running counts and how long a request holds its slot are passed in.
"""

from __future__ import annotations

from collections.abc import Mapping

from gateway.admission.room_state import RoomState
from gateway.admission.tickets import Ticket
from gateway.backends import Backend
from gateway.config import model_key
from gateway.swaps import SwapPlanner, SwapWait, load_seconds

__all__ = ["swap_wait", "waits"]


def swap_wait(room: RoomState, ticket: Ticket, hold: float) -> SwapWait | None:
    """Why ``ticket``'s model keeps its request waiting, if memory does, on the first
    backend serving it where it does (``waits``); when a swap would make room but none is
    started for its user (``SwapBar``), that, and when they will be again."""
    planner, user, busy = room.swaps, ticket.user, room.slots.busy
    for backend in room.pool.serving(ticket.api, ticket.model):
        found = waits(planner, backend, ticket.model, ticket.num_ctx, busy, hold)
        if found is None:
            continue
        barred = planner.bar.seconds_left(user)
        if barred and planner.under_way(backend) is None:
            return SwapWait(
                f"{ticket.model} needs a swap on {backend.name}, and none is started for "
                f"{user} for {barred:.0f} s more: the backend refused, without loading "
                "anything, a request that models were unloaded for",
                barred,
            )
        return found
    return None


def waits(
    planner: SwapPlanner,
    backend: Backend,
    model: str,
    asked: int | None,
    busy: Mapping[str, int],
    hold: float,
) -> SwapWait | None:
    """Why a request for ``model`` cannot be sent to ``backend`` for memory, if it
    cannot: the swap it waits for (its drain and load, estimated with ``hold``, how
    long a request holds its slot lately), or the models that leave no room."""
    if planner.admits(backend, model, asked, busy):
        return None
    model, swap, plans = model_key(model), planner.under_way(backend), planner.plans_of(backend)
    load = load_seconds(plans, model)
    if plans.unloading is not None:
        return SwapWait(f"a swap on {backend.name} is making room", load)
    if swap is None:
        if planner.would_swap(backend, model, asked, busy):
            return SwapWait(f"{model} waits for room on {backend.name}", load)
        protected = ", ".join(sorted(backend.protected)) or "models in use"
        return SwapWait(f"{model} does not fit on {backend.name} beside {protected}", load)
    running = sum(busy.get(backend.group(v), 0) for v in swap.victims)
    drain = hold if running else 0.0
    said = (
        f"{model} waits for a swap on {backend.name}: draining {', '.join(swap.victims)} "
        f"({running} running), then loading {swap.model}"
    )
    later = 0.0 if swap.model == model else load  # then its own swap
    return SwapWait(said, drain + load_seconds(plans, swap.model) + later)
