"""The whole house in one room snapshot, for the views, when replicas share Redis.

Every view (``/status``, the house page, "where am I", ``fairgate status``) reads one
snapshot; with several replicas that is this one's room with the other replicas' requests
added from the house as last read (at most a second old): what runs everywhere, and every
waiting request in the house's order, whichever replica it entered. Positions count every
replica's requests; how soon one likely starts is known only on its own replica. Metrics
read this replica's room alone: Prometheus sums the replicas.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import replace

from gateway.admission.holds.base import House, Place
from gateway.admission.room_snapshot import RoomSnapshot, RunningRequest, WaitingRequest
from gateway.config import model_key
from gateway.core import BACKGROUND, RequestClass

__all__ = ["whole_house"]


def whole_house(
    room: RoomSnapshot, house: House, mine: Mapping[int, Place], now: float
) -> RoomSnapshot:
    """``room`` with the other replicas' part of ``house`` (``mine``: this replica's
    places, by their request; ``now``: the wall clock, as places' arrivals are)."""
    others = house.elsewhere()
    places = sorted([*others.waiting, *mine.values()], key=Place.key)
    waiting = _waiting(room, places, mine, house.replica, now)
    running = room.running + tuple(
        RunningRequest(
            run.user,
            run.model,
            run.backend,
            _class(run.heavy),
            max(0.0, now - run.since),
            run.lane,
            run.replica,
        )
        for run in others.running
    )
    elsewhere = Counter(run.backend for run in others.running)
    heavy = Counter(run.backend for run in others.running if run.heavy)
    by_model = Counter((run.backend, model_key(run.model)) for run in others.running)
    by_class = Counter((place.user, _class(place.heavy)) for place in others.waiting)
    return replace(
        room,
        backends={
            name: (busy + elsewhere[name], slots) for name, (busy, slots) in room.backends.items()
        },
        heavy_running={name: n + heavy[name] for name, n in room.heavy_running.items()},
        model_busy=dict(Counter(room.model_busy) + by_model),
        queued_by_class=dict(Counter(room.queued_by_class) + by_class),
        users=_users(room.users, running, places, interactive=True),
        background_users=_users(room.background_users, running, places, interactive=False),
        queue_depth=len(waiting),
        oldest_wait=max([room.oldest_wait, *(w.waited for w in waiting)]),
        running=running,
        waiting=waiting,
    )


def _waiting(
    room: RoomSnapshot, places: list[Place], mine: Mapping[int, Place], here: str, now: float
) -> tuple[WaitingRequest, ...]:
    starts = {w.request: w.starts_in for w in room.waiting}
    requests = {place.id: request for request, place in mine.items()}
    return tuple(
        WaitingRequest(
            place.user,
            place.model,
            _class(place.heavy),
            max(0.0, now - place.arrived),
            position,
            place.lane,
            starts.get(requests.get(place.id, 0), 0.0),
            place.replica or here,
            requests.get(place.id, 0),
        )
        for position, place in enumerate(places, start=1)
    )


def _class(heavy: bool) -> RequestClass:
    return RequestClass.HEAVY if heavy else RequestClass.LIGHT


def _users(
    local: dict[str, tuple[int, int]],
    running: tuple[RunningRequest, ...],
    places: list[Place],
    interactive: bool,
) -> dict[str, tuple[int, int]]:
    """(running, waiting) by user in one lane, every replica's."""
    runs = Counter(r.user for r in running if (r.lane is not BACKGROUND) == interactive)
    waits = Counter(p.user for p in places if (p.lane is not BACKGROUND) == interactive)
    users = {user: (runs[user], waits[user]) for user in runs.keys() | waits.keys()}
    # A request of this replica's that waits without a place (Redis was away as it came).
    for user, (_, queued) in local.items():
        ran, waiting = users.get(user, (0, 0))
        users[user] = (ran, max(waiting, queued))
    return users
