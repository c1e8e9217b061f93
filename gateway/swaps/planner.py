"""Swaps planned by the gateway, never by accident: which model an Ollama backend loads,
and which it unloads to make room, decided before a request is sent.

Left to itself, Ollama unloads a model to make room by its own rule, waits for the
victim's requests to finish while more keep arriving for it, and meanwhile holds every
request that needs a load (server/sched.go, ``processPending``). A request whose
``num_ctx`` differs reloads the model the same way. Here instead:

- a request for a model held with its context runs within that model's slots;
- one for a model that fits beside those held is sent at once (a load);
- one that needs room waits in the gateway's own room while the gateway drains the victims
  (no new requests for them), then goes, after the gateway has unloaded the victims itself
  (``keep_alive: 0``; a router's ``/models/unload``), so that Ollama unloads nothing of its
  own choosing. Requests for the models that stay keep flowing all the while;
- the victims are chosen, and what fits is counted, in ``victims``; one swap per backend at
  a time; a swap nobody waits for any more is called off;
- a user whose swap was wasted (the backend refused the request, loading nothing) plans no
  other for a while (``SwapBar``); why a request waits, in its 503's words: swap_waits.py.

Swaps are rationed (``swap_due``): while the models held are in use, a request for another
waits the swap's cost before it is planned, and background work swaps only models nobody
uses, or after a third of its max_wait. Only a model the backend lists is held or swapped
for: while its list is unknown, requests go and Ollama decides, and a made-up name never
waits for room nor unloads a model.

Pure: no I/O; the clock and the running counts are passed in.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass

from gateway.backends import Backend
from gateway.config import model_key
from gateway.swaps.bar import SwapBar
from gateway.swaps.outcomes import RESIDENT, DoneSwap, Placement, SwapsSnapshot
from gateway.swaps.residency import Residency
from gateway.swaps.victims import BackendPlans, fits_beside, load_seconds, swap_due, victims

__all__ = ["PlannedSwap", "SwapPlanner"]

_RECENT = 32  # swaps remembered for /status
_USERS_REMEMBERED = 32  # each model's latest users, for who a swap would interrupt

# Running requests by slot group; waiting ones by backend key and model key.
Busy = Mapping[str, int]
Demand = Mapping[tuple[str, str], int]

_LOAD = Placement("load")
_RELOAD = Placement("reload")


@dataclass(slots=True)
class PlannedSwap:
    """A swap planned on a backend: ``model`` waits while its ``victims`` drain."""

    model: str
    num_ctx: int
    victims: tuple[str, ...]
    planned_at: float


class SwapPlanner:
    """Loads and swaps for every backend of many models (Ollama, a router), by server (URL)."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self.residency = Residency(clock)
        self._plans: dict[str, BackendPlans] = {}
        # The swaps planned, by backend key: apart from the plans, so that the common case,
        # none, is one look (``planned``) for the room's every dispatch.
        self._swaps: dict[str, PlannedSwap] = {}
        self.bar = SwapBar(clock)
        self.counts: defaultdict[tuple[str, str, str], float] = defaultdict(float)
        self.recent: deque[DoneSwap] = deque(maxlen=_RECENT)
        # Seconds until the soonest swap that would make room is due (``room_for``): the
        # waiting room wakes then. Cleared by whoever reads it.
        self.due_in: float | None = None

    def refused(
        self,
        user: str,
        backend: Backend,
        model: str,
        placement: Placement,
        alone: bool,
        status: int,
    ) -> None:
        """The backend answered ``user``'s request for ``model`` with the error ``status``,
        saying no load. Ollama reads a body before it evicts anything, so its refusal (a
        body it cannot decode, a capability the model lacks) loaded nothing, and neither
        did a load that failed; the router loads the model before its child reads the body,
        so only its 5xx (a child that did not start) did not. Unless other requests for the
        model run there (``alone``), the record of having sent what is not held goes: the
        next swap would unload a real model for it (the next probe sets it right where the
        router's 5xx came from a child after all). If models were unloaded for it, ``user``
        is barred from swaps for a while (``SwapBar``: not for a load the router failed)."""
        if alone and not (backend.router and status < 500):
            self.residency.unsent(backend, model)
        if placement.kind in ("swap", "reload"):
            self.bar.wasted(user, backend, model)

    @property
    def planned(self) -> bool:
        """Whether a swap is planned on any backend (``keep_only`` has one to call off)."""
        return bool(self._swaps)

    def under_way(self, backend: Backend) -> PlannedSwap | None:
        """The swap planned on ``backend``, if one is."""
        return self._swaps.get(backend.key)

    def may_plan_for(self, user: str) -> bool:
        """Whether a swap may be planned for ``user``'s request (``SwapBar``)."""
        return self.bar.seconds_left(user) == 0.0

    def admits(
        self, backend: Backend, model: str, asked: int | None, busy: Mapping[str, int]
    ) -> bool:
        """Whether a request for ``model`` (``asked``: its num_ctx) may be sent now, as far
        as memory goes; its model's slots are the waiting room's to count."""
        if not backend.per_model or not backend.lists(model):
            # Only a model its list confirms is held or swapped for. Any other name Ollama
            # refuses at once (404), and while the list is unknown (no probe has read it)
            # nothing is confirmed: the request goes and Ollama decides, as it would without
            # the gateway. A made-up name never waits for room nor unloads a model.
            return True
        model = model_key(model)
        num_ctx = self.residency.num_ctx(backend, model, asked)
        if self.plans_of(backend).unloading == model:
            return False  # it would reach Ollama before the room is made
        swap = self._swaps.get(backend.key)
        if swap is not None:
            if (swap.model, swap.num_ctx) == (model, num_ctx):
                return all(busy.get(backend.group(v), 0) == 0 for v in swap.victims)
            if model in swap.victims:
                return False  # draining
        held = self.residency.context(backend, model, busy)
        if held is not None:
            return held == num_ctx
        if swap is not None:
            return False
        return fits_beside(self.residency, backend, busy, model, num_ctx)

    def plan(
        self, backend: Backend, model: str, asked: int | None, busy: Busy, demand: Demand
    ) -> bool:
        """Plan the swap that makes room for ``model``: True if there is one, and it now
        drains its victims. ``demand``: waiting requests by backend key and model key."""
        chosen = self._victims(backend, model, asked, busy, demand)
        if chosen is None:
            return False
        num_ctx = self.residency.num_ctx(backend, model_key(model), asked)
        self._swaps[backend.key] = PlannedSwap(model_key(model), num_ctx, chosen, self._clock())
        return True

    def would_swap(
        self, backend: Backend, model: str, asked: int | None, busy: Mapping[str, int]
    ) -> bool:
        """Whether a swap could make room for ``model`` on ``backend`` now, due or not."""
        return self._victims(backend, model, asked, busy, {}) is not None

    def _victims(
        self, backend: Backend, model: str, asked: int | None, busy: Busy, demand: Demand
    ) -> tuple[str, ...] | None:
        """The models a swap for ``model`` would unload, if one may be planned now."""
        if not backend.per_model:
            return None
        if backend.key in self._swaps or self.plans_of(backend).unloading is not None:
            return None  # one swap at a time, until its room is made
        if self.admits(backend, model, asked, busy):
            return None  # memory is not what keeps it waiting: its slots are
        model = model_key(model)
        num_ctx = self.residency.num_ctx(backend, model, asked)
        plans = self.plans_of(backend)
        return victims(self.residency, backend, plans, model, num_ctx, busy, demand)

    def placed(
        self, backend: Backend, model: str, asked: int | None, busy: Mapping[str, int]
    ) -> Placement:
        """A request for ``model`` is being sent to ``backend``: how it finds its model."""
        if not backend.per_model:
            return RESIDENT
        model = model_key(model)
        num_ctx = self.residency.num_ctx(backend, model, asked)
        plans, now = self.plans_of(backend), self._clock()
        held = self.residency.context(backend, model, busy)
        swap = self._swaps.get(backend.key)
        if swap is not None and (swap.model, swap.num_ctx) == (model, num_ctx):
            del self._swaps[backend.key]
            unload = tuple(v for v in swap.victims if v != model)
            for victim in unload:
                self.residency.gone(backend, victim)
                self.counts[backend.key, victim, "evictions"] += 1
            self.counts[backend.key, model, "swaps"] += 1
            self.counts[backend.key, model, "swap_wait_seconds"] += now - swap.planned_at
            self.recent.append(DoneSwap(backend.key, model, swap.victims, swap.planned_at, now))
            placement = Placement("reload" if model in swap.victims else "swap", unload)
            plans.unloading = model if unload else None
        elif held is not None:
            placement = RESIDENT if held == num_ctx else _RELOAD
        else:
            placement = _LOAD
        self._send(backend, plans, model, num_ctx, now, placement)
        return placement

    def admitted(
        self, backend: Backend, model: str, asked: int | None, busy: Mapping[str, int]
    ) -> Placement | None:
        """``placed`` if ``admits``, else None. What the quick yes asks of its one backend:
        with no swap under way (nearly always), the model's context and residency worked
        out once for both questions, and in the order ``admits`` asks them."""
        if not backend.per_model:
            return RESIDENT
        plans = self.plans_of(backend)
        if self._swaps or plans.unloading is not None:
            if not self.admits(backend, model, asked, busy):
                return None
            return self.placed(backend, model, asked, busy)
        model, residency = model_key(model), self.residency
        num_ctx, held = residency.placing(backend, model, asked, busy)
        # ``backend.lists``, of a key: else ``admits`` says yes, whatever memory holds.
        listed = backend.state.models is not None and model in backend.state.models
        if held is None:
            if listed and not fits_beside(residency, backend, busy, model, num_ctx):
                return None
            placement = _LOAD
        elif held == num_ctx:
            placement = RESIDENT
        elif listed:
            return None  # held with another context: a reload, planned as a swap is
        else:
            placement = _RELOAD
        # ``_send``, written out: one call less on every request's path.
        now = self._clock()
        loading = _loading(plans, model) if placement.loads else 0.0
        residency.sent(backend, model, num_ctx, now, loading)
        plans.last_used[model] = now
        return placement

    def _send(
        self,
        backend: Backend,
        plans: BackendPlans,
        model: str,
        num_ctx: int,
        now: float,
        placement: Placement,
    ) -> None:
        loading = _loading(plans, model) if placement.loads else 0.0
        self.residency.sent(backend, model, num_ctx, now, loading)
        plans.last_used[model] = now

    def ran(self, backend: Backend, model: str, user: str | None) -> None:
        """``user``'s request for ``model`` ended on ``backend`` (None: a task's, nobody's)."""
        self.residency.ran(backend, model)
        if not backend.per_model:
            return
        plans, key, now = self.plans_of(backend), model_key(model), self._clock()
        plans.last_used[key] = now
        if user is None:
            return
        users = plans.users.setdefault(key, {})
        users.pop(user, None)  # re-entered last, so that the oldest is first to go
        users[user] = now
        if len(users) > _USERS_REMEMBERED:
            del users[next(iter(users))]

    def answered(self, backend: Backend, model: str, placement: Placement) -> None:
        """The backend took the request sent with ``placement``: the load or reload it
        planned has happened. Counted now, not when sent: a request the backend refuses
        (``refused``) loads nothing, and a counter cannot take a count back."""
        if not placement.loads:
            return  # held already (nearly always): nothing to count
        model = model_key(model)
        if placement.kind == "reload":
            self.counts[backend.key, model, "reloads"] += 1
        self.counts[backend.key, model, "loads"] += 1

    def made_room(self, backend: Backend) -> None:
        """The victims of the swap last sent to ``backend`` are unloaded."""
        self.plans_of(backend).unloading = None

    def loaded(self, backend: Backend, model: str, seconds: float) -> None:
        """A load of ``model`` took ``seconds`` (the reply's load_duration)."""
        self.plans_of(backend).load_seconds[model_key(model)] = seconds

    def room_for(
        self,
        backends: Iterable[Backend],
        model: str,
        asked: int | None,
        busy: Mapping[str, int],
        demand: Mapping[tuple[str, str], int],
        waited: float,
        patience: float,
        wanting: frozenset[str],
        service: Callable[[Backend], float],
    ) -> Backend | None:
        """The first of ``backends`` where a swap would make room for ``model`` and is due
        for a request that has ``waited`` (``swap_due``; ``wanting``: the people waiting for
        ``model``, none for background work; with those who used it lately, who are
        between two questions; ``service``: how long the request would hold a slot on
        each); when one would make room but is not due yet, ``due_in`` says how soon it
        will be."""
        for backend in backends:
            chosen = self._victims(backend, model, asked, busy, demand)
            if chosen is None:
                continue
            plans = self.plans_of(backend)
            key = model_key(model)
            now = self._clock()
            lately = plans.users.get(key, {}).items()
            people = len(wanting | {u for u, at in lately if at > now - patience}) if wanting else 0
            away = service(backend)
            left = swap_due(backend, plans, key, chosen, busy, demand, patience, now, people, away)
            if waited >= left:
                return backend
            if self.due_in is None or left - waited < self.due_in:
                self.due_in = left - waited
        return None

    def keep_only(self, wanted: Collection[tuple[str, str]]) -> None:
        """Call off the swaps for which no request waits any more (``wanted``: backend key
        and model key of every waiting request)."""
        for key, swap in list(self._swaps.items()):
            if (key, swap.model) not in wanted:
                del self._swaps[key]

    def snapshot(self) -> SwapsSnapshot:
        now = self._clock()
        pending = {
            key: (swap.model, swap.victims, now - swap.planned_at)
            for key, swap in self._swaps.items()
        }
        return SwapsSnapshot(dict(self.counts), pending, tuple(self.recent))

    def plans_of(self, backend: Backend) -> BackendPlans:
        """What the planner keeps of ``backend`` beside the residency."""
        found = self._plans.get(backend.key)
        if found is None:  # not setdefault: that would build a BackendPlans on every call
            found = self._plans[backend.key] = BackendPlans()
        return found


def _loading(plans: BackendPlans, model: str) -> float:
    """How long a load of ``model`` may be under way, generously: twice its last load (a
    busy disk is slower), and a few seconds more."""
    return 2 * load_seconds(plans, model) + 5.0
