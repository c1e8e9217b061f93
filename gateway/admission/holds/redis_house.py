"""The house's one waiting room in Redis: each waiting request's place, leased like a hold.

A place joins when its request cannot start at once (``JOIN`` checks its holder's
``max_queued`` and the house's ``max_depth`` across every replica), is renewed with this
replica's leases, and leaves when its request starts (``TAKE`` removes it), gives up or is
refused (``LEAVE``). A replica killed outright stops renewing: its places expire within a
lease, as its holds do, and their clients are gone with it. The house as every replica's
views show it is read back once a second (``HOUSE``). Places and running holds are stored
as JSON arrays: names and models are client input, and JSON quotes whatever they hold.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace

from redis.asyncio import Redis

from gateway.admission.holds import house_scripts as scripts
from gateway.admission.holds.base import (
    BACKGROUND_HOLDER,
    LANE_ORDER,
    Hold,
    House,
    HouseRun,
    Place,
)
from gateway.core import Lane

__all__ = [
    "GONE",
    "PREFIX",
    "RUNNING",
    "TAGS",
    "RedisHouse",
    "holder_key",
    "running_member",
    "together_keys",
]

PREFIX = "fairgate"
WAITING = f"{PREFIX}:house:waiting"
PLACES = f"{PREFIX}:house:places"
ASKED = f"{PREFIX}:house:asked"
RUNNING = f"{PREFIX}:house:running"
CLOCK = f"{PREFIX}:house:clock"  # the finish tag of the last request started
TAGS = f"{PREFIX}:house:tags"  # each payer's last finish tag
REPLICAS = f"{PREFIX}:house:replicas"  # every replica renewing its leases, idle or not
GONE = f"{PREFIX}:house:gone"  # places and holds ended lately (TAKE derives it: keep alike)

_LANES = {number: lane for lane, number in LANE_ORDER.items()}
# What JOIN answers when a place may not wait, as ``HoldStore.join`` says it.
_REFUSED = {-1: "user", -2: "house"}


def holder_key(holder: str) -> str:
    """A holder's running holds (a front end's people's together are an account's)."""
    return f"{PREFIX}:user:{holder}"


def queued_key(holder: str) -> str:
    return f"{PREFIX}:queued:{holder}"


def together_keys(hold: Hold | Place) -> list[str]:
    """A front end's people's holds and queued places, where its total bounds them (its
    account, ``owui/(all)``, counts as a holder's would); none else."""
    if not hold.together:
        return []
    return [holder_key(hold.together), queued_key(hold.together)]


def place_json(place: Place) -> str:
    """The place as ``TAKE`` reads it: its first seven fields are the script's."""
    return json.dumps(
        [
            place.holder,
            place.cap,
            LANE_ORDER[place.lane],
            place.rank,
            place.arrived,
            place.heavy,
            list(place.groups),
            place.user,
            place.model,
            place.replica,
            place.id,
            place.payer,
            place.cost,
            place.together,  # 14 and 15, as ``TAKE`` reads them of a place ahead
            place.together_cap,
        ]
    )


def _place(text: bytes) -> Place:
    fields = json.loads(text)
    holder, cap, lane, rank, arrived, heavy, groups, user, model, replica, id_ = fields[:11]
    payer, cost = fields[11:13]
    together, together_cap = fields[13:15] or ("", -1)  # as a replica before them wrote
    return Place(
        id=id_,
        holder=holder,
        cap=cap,
        lane=_LANES[lane],
        payer=payer,
        cost=cost,
        arrived=arrived,
        heavy=heavy,
        groups=tuple(groups),
        user=user,
        model=model,
        rank=rank,
        replica=replica,
        together=together,
        together_cap=together_cap,
    )


def running_member(hold: Hold, replica: str, since: float) -> str:
    """The hold as ``RUNNING`` holds it (unique: it carries the hold's id)."""
    place = hold.place
    if place is None:  # moved to another backend (a failover): its holder says who
        user, background, _ = hold.user.partition(BACKGROUND_HOLDER)
        lane = Lane.BACKGROUND if background else Lane.INTERACTIVE
        model = hold.model
    else:
        user, model, lane = place.user, place.model, place.lane
    return json.dumps(
        [hold.id, replica, user, model, hold.backend_name, hold.heavy, lane.value, since]
    )


def _run(text: bytes) -> HouseRun:
    _, replica, user, model, backend, heavy, lane, since = json.loads(text)
    return HouseRun(user, model, backend, heavy, Lane(lane), since, replica)


class RedisHouse:
    """This replica's places in the house, and the house as last read."""

    def __init__(self, redis: Redis, lease_ms: int, replica: str) -> None:
        self._lease_ms = lease_ms
        self._replica = replica
        self._join = redis.register_script(scripts.JOIN)
        self._leave = redis.register_script(scripts.LEAVE)
        self._renew = redis.register_script(scripts.RENEW_PLACE)
        self._read = redis.register_script(scripts.HOUSE)
        self._present = redis.register_script(scripts.PRESENT)
        self.mine: dict[str, Place] = {}  # places this replica has in Redis
        self._joining: set[str] = set()  # of those, the ones whose JOIN is under way
        self.taking: set[str] = set()  # and those a TAKE may be removing from Redis now
        self.house = House(replica=replica)
        self.on_change: Callable[[], None] = lambda: None

    async def join(self, place: Place, max_queued: int, max_depth: int, asking: str) -> Place | str:
        """JOIN (raises Redis's errors: the store maps them)."""
        keys = [WAITING, PLACES, ASKED, queued_key(place.holder), CLOCK, TAGS, GONE]
        keys += together_keys(place)[1:]
        args: list[str | int | float] = [place.id, place_json(place), max_queued, max_depth]
        args += [self._lease_ms, place.payer, place.cost, asking, place.together_queued]
        # Noted before the script runs: a request cancelled meanwhile leaves (``leave``)
        # what the script may have added, rather than a place nobody takes back.
        self.mine[place.id] = place
        self._joining.add(place.id)  # not renewed before it joins: a refused one would be
        try:
            joined = await self._join(keys=keys, args=args)
        finally:
            self._joining.discard(place.id)
        if isinstance(joined, int):
            del self.mine[place.id]
            return _REFUSED[joined]
        place = replace(place, rank=float(joined))
        self.mine[place.id] = place
        return place

    def started(self, place: Place) -> None:
        """``TAKE`` removed the place from Redis: nothing left to renew or take back."""
        self.mine.pop(place.id, None)

    def forget(self) -> None:
        """Redis is away: whatever it held of this replica's places expires there."""
        self.mine.clear()

    async def leave(self, place: Place, channel: str) -> bool:
        """LEAVE, if the place is this replica's in Redis; whether it was."""
        if self.mine.pop(place.id, None) is None:
            return False
        keys = [WAITING, PLACES, ASKED, queued_key(place.holder), GONE]
        keys += together_keys(place)[1:]
        await self._leave(keys=keys, args=[place.id, channel, self._lease_ms])
        return True

    async def renew(self) -> None:
        """RENEW_PLACE for each of this replica's places that is settled in Redis: not one
        joining (a refused one would be added), nor one being taken (a started one would be
        written back, a waiting place nobody takes for a lease). And this replica is
        there, idle or not, for the views' count of replicas."""
        await self._present(keys=[REPLICAS], args=[self._replica, self._lease_ms])
        for place_id in list(self.mine):
            place = self.mine.get(place_id)  # as it is now: joined since, it has its rank
            if place is None or place_id in self._joining or place_id in self.taking:
                continue
            keys = [WAITING, queued_key(place.holder), PLACES, GONE, *together_keys(place)[1:]]
            await self._renew(keys=keys, args=[place.id, self._lease_ms, place_json(place)])

    async def read(self) -> House:
        """Every replica's places and running holds, now."""
        keys = [WAITING, PLACES, ASKED, RUNNING, CLOCK, TAGS, REPLICAS]
        _, places, running, present = await self._read(keys=keys)
        replicas = {self._replica, *(replica.decode() for replica in present)}
        waiting = tuple(sorted((_place(text) for text in places), key=Place.key))
        runs = tuple(_run(text) for text in running)
        replicas.update(p.replica for p in waiting)
        replicas.update(r.replica for r in runs)
        self.seen(House(waiting, runs, self._replica, frozenset(replicas)))
        return self.house

    def seen(self, house: House) -> None:
        """``house`` is the house now: the views redraw if it changed."""
        if house != self.house:
            self.house = house
            self.on_change()

    @staticmethod
    def take_args(hold: Hold, member: str) -> tuple[list[str], list[str | int | float]]:
        """``TAKE``'s keys and its place arguments (after the hold's own)."""
        place = hold.place
        queued = queued_key(place.holder) if place is not None else f"{PREFIX}:queued:"
        keys = [WAITING, PLACES, ASKED, RUNNING, queued, CLOCK, TAGS]
        if place is None:
            return keys, ["", 0, 0, 0, hold.backend, member, PREFIX, ""]
        lane, arrived, group = LANE_ORDER[place.lane], place.arrived, hold.backend
        return keys, [place.id, lane, place.cost, arrived, group, member, PREFIX, place.payer]
