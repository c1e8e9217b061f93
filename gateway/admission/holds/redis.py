"""Holds in Redis, shared by every replica, as leases that expire unless renewed.

Each hold is a member of three sorted sets (the user's, the backend's, and the backend's
heavy set), scored by its expiry on Redis's own clock. Taking a hold is one Lua script
(check every limit and the house's order, then add: ``scripts.py``), so two replicas cannot
both take the last slot. The house's waiting room is kept beside the holds
(``redis_house.py``). A replica renews its leases every third of their lifetime; one killed
with SIGKILL stops renewing and its holds and places expire within ``lease_seconds``.
A user's requests in flight, for budgets, are leases of the same kind
(``redis_in_flight.py``).

When Redis cannot be reached the state says so (``StoreUnavailable``) and admission applies
the policy's ``redis.on_failure``; a background check restores sharing when Redis returns.
Holds taken meanwhile were never written to Redis, so they cannot leak there.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import replace
from typing import Any

import structlog
from redis.exceptions import RedisError

from gateway.admission.holds import scripts
from gateway.admission.holds.base import Hold, House, Place, StoreUnavailable
from gateway.admission.holds.redis_house import (
    GONE,
    PREFIX,
    RUNNING,
    TAGS,
    RedisHouse,
    holder_key,
    running_member,
    together_keys,
)
from gateway.admission.holds.redis_in_flight import RedisInFlight
from gateway.core import Background, connect, repeat

__all__ = ["RedisHolds"]

log = structlog.get_logger("fairgate.state")

CHANNEL = f"{PREFIX}:released"
SERVICE = f"{PREFIX}:service"  # the fair scheduler's counters, summed over replicas


def _keys(hold: Hold) -> list[str]:
    return [
        holder_key(hold.user),
        f"{PREFIX}:backend:{hold.backend}",
        f"{PREFIX}:heavy:{hold.backend}",
    ]


def _light_key(hold: Hold) -> str:
    """The people's light requests running on the hold's slot group."""
    return f"{PREFIX}:light:{hold.backend}"


def _held_keys(hold: Hold) -> list[str]:
    """RENEW's and RELEASE's keys; with a front end's total, its people's holds last."""
    return [*_keys(hold), RUNNING, _light_key(hold), GONE, *together_keys(hold)[:1]]


# How often the house is read back for the views (``/status``, the house page).
_HOUSE_SECONDS = 1.0


class RedisHolds:
    """Shared holds in Redis, with leases, renewal and a fallback when Redis is away."""

    def __init__(self, url: str, lease_seconds: float = 12.0) -> None:
        # Every script is idempotent for a hold id, so the client's one retry does no harm.
        self._redis = connect(url)
        self._lease_ms = int(lease_seconds * 1000)
        self._take = self._redis.register_script(scripts.TAKE)
        self._renew = self._redis.register_script(scripts.RENEW)
        self._release = self._redis.register_script(scripts.RELEASE)
        # Holds this replica has in Redis, each with its member of the running set.
        self._mine: dict[str, tuple[Hold, str]] = {}
        self._taking: set[str] = set()  # of those, the ones whose TAKE is under way
        self._in_flight = RedisInFlight(self._redis, self._lease_ms)
        self._released = asyncio.Event()
        self._releases: set[asyncio.Task[Any]] = set()
        self._closed = False
        self._loops = Background("holds")
        self.shared = True
        self.failures = 0
        self._replica = uuid.uuid4().hex[:12]
        self._house = RedisHouse(self._redis, self._lease_ms, self._replica)

    @property
    def house(self) -> House:
        return self._house.house

    def watch(self, on_change: Callable[[], None]) -> None:
        self._house.on_change = on_change

    def start(self) -> None:
        """Renew this replica's leases, listen for releases elsewhere, read the house."""
        self._loops.start("renew", self._keep_leases(self._lease_ms / 3000))
        self._loops.start("listen", self._listen())
        self._loops.start("house", repeat(_HOUSE_SECONDS, self._read_house))

    async def take(self, hold: Hold) -> bool:
        if not self.shared:
            raise StoreUnavailable("Redis is unreachable")
        if hold.place is not None and not hold.place.replica:
            hold = replace(hold, place=replace(hold.place, replica=self._replica))
        member = running_member(hold, self._replica, time.time())
        args: list[str | int | float] = [hold.id, hold.user_cap, hold.slots, int(hold.heavy)]
        args += [hold.heavy_slots, self._lease_ms]
        house_keys, house_args = self._house.take_args(hold, member)
        # Noted before the script runs: a request cancelled meanwhile gives back what the
        # script may have taken, rather than leaving a hold renewed for ever. Not renewed
        # until it is taken: a renewal would add it, past every limit, or after a refusal.
        self._mine[hold.id] = (hold, member)
        self._taking.add(hold.id)
        place = hold.place.id if hold.place is not None else ""
        self._house.taking.add(place)
        try:
            keys = [*_keys(hold), *house_keys, _light_key(hold), *together_keys(hold)]
            gate: list[str | int | float] = [int(hold.light), int(hold.prefill_may_start)]
            gate.append(hold.together_cap)
            taken = await self._take(keys=keys, args=args + house_args + gate)
        except (RedisError, OSError) as exc:
            self._mine.pop(hold.id, None)
            self._lost(exc)
            raise StoreUnavailable(str(exc)) from exc
        except BaseException:
            self.give_back(hold)
            raise
        finally:
            self._taking.discard(hold.id)
            self._house.taking.discard(place)
        if not taken:
            self._mine.pop(hold.id, None)
        elif hold.place is not None:
            self._house.started(hold.place)
        return bool(taken)

    def give_back(self, hold: Hold) -> None:
        mine = self._mine.pop(hold.id, None)
        if mine is None:
            return  # never in Redis (taken while it was away): nothing to undo there
        self._background(self._give_back(*mine))

    async def join(
        self, place: Place, max_queued: int, max_depth: int, asking: str = ""
    ) -> Place | str:
        if not self.shared:
            raise StoreUnavailable("Redis is unreachable")
        try:
            mine = replace(place, replica=self._replica)
            return await self._house.join(mine, max_queued, max_depth, asking)
        except (RedisError, OSError) as exc:
            self._lost(exc)
            raise StoreUnavailable(str(exc)) from exc

    def leave(self, place: Place) -> None:
        if place.id in self._house.mine:
            self._background(self._leave(place))

    async def _leave(self, place: Place) -> None:
        try:
            await self._house.leave(place, CHANNEL)
        except (RedisError, OSError) as exc:
            # The place expires by itself within lease_seconds.
            log.warning("state_leave_failed", place=place.id, error=repr(exc))

    async def _read_house(self) -> None:
        if self._closed or not self.shared:  # closed: no command may open a connection now
            return
        try:
            await self._house.read()
        except (RedisError, OSError) as exc:
            self._lost(exc)

    def _background(self, release: Coroutine[Any, Any, None]) -> None:
        """A release sent without the caller waiting (``close`` waits for the last ones).
        Once closed, none: its lease expires by itself, and a command now would open a
        connection nobody closes (requests turned away at a stop leave after it)."""
        if self._closed:
            release.close()
            return
        task = asyncio.create_task(release)
        self._releases.add(task)
        task.add_done_callback(self._releases.discard)

    async def give_back_now(self, hold: Hold) -> None:
        mine = self._mine.pop(hold.id, None)
        if mine is not None:
            await self._give_back(*mine)

    async def _give_back(self, hold: Hold, member: str) -> None:
        try:
            keys = _held_keys(hold)
            await self._release(keys=keys, args=[hold.id, CHANNEL, member, self._lease_ms])
        except (RedisError, OSError) as exc:
            # The lease expires by itself within lease_seconds.
            log.warning("state_release_failed", hold=hold.id, error=repr(exc))

    async def count_in_flight(
        self, user: str, request: str, room: int, tokens: int = 0, token_room: int | None = None
    ) -> bool:
        if not self.shared:
            raise StoreUnavailable("Redis is unreachable")
        try:
            return await self._in_flight.count(user, request, room, tokens, token_room)
        except (RedisError, OSError) as exc:
            self._lost(exc)
            raise StoreUnavailable(str(exc)) from exc

    def uncount_in_flight(self, user: str, request: str) -> None:
        if self._in_flight.ended(user, request):
            self._background(self._in_flight.remove(user, request))

    async def usage(self) -> tuple[dict[str, int], dict[str, int]]:
        try:
            now_s, now_us = await self._redis.time()
            now = now_s * 1000 + now_us // 1000
            found: list[dict[str, int]] = [{}, {}]
            for index, kind in enumerate(("user", "backend")):
                async for key in self._redis.scan_iter(match=f"{PREFIX}:{kind}:*"):
                    count = await self._redis.zcount(key, f"({now}", "+inf")
                    if count:
                        found[index][key.decode().split(":", 2)[2]] = count
        except (RedisError, OSError) as exc:
            self._lost(exc)
            raise StoreUnavailable(str(exc)) from exc
        return found[0], found[1]

    @property
    def others_waiting(self) -> int:
        """Requests waiting on the other replicas, as the house was last read (each waits
        in a place of the house's waiting room)."""
        return sum(1 for place in self._house.house.waiting if place.replica != self._replica)

    async def exchange(
        self, charges: dict[str, float], output: dict[str, float]
    ) -> dict[str, float] | None:
        """HINCRBYFLOAT the charges and the finish tags into their hashes, in one trip."""
        if not self.shared:
            return None
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                for user, amount in charges.items():
                    pipe.hincrbyfloat(SERVICE, user, amount)
                for payer, amount in output.items():
                    pipe.hincrbyfloat(TAGS, payer, amount)
                pipe.hgetall(SERVICE)
                results = await pipe.execute()
        except (RedisError, OSError) as exc:
            self._lost(exc)
            return None
        totals: dict[bytes, bytes] = results[-1]
        return {user.decode(): float(value) for user, value in totals.items()}

    async def released(self, within: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._released.wait(), within)

    async def close(self) -> None:
        self._closed = True
        # Bounded: redis-py's pub/sub reader can swallow a cancellation on a dead socket.
        await self._loops.close(within=2.0)
        if self._releases:
            await asyncio.wait(self._releases, timeout=2.0)
        with contextlib.suppress(RedisError, OSError):
            await self._redis.aclose()

    def _lost(self, exc: BaseException) -> None:
        if self.shared:
            log.error("state_unavailable", error=repr(exc))
            # Each replica on its own now: what the house held is no longer known.
            self._house.seen(House(replica=self._replica))
        self.shared = False
        self.failures += 1

    def _wake(self) -> None:
        self._released.set()
        self._released = asyncio.Event()

    async def _keep_leases(self, every: float) -> None:
        await repeat(every, self._renew_all)

    async def _renew_all(self) -> None:
        """Renew this replica's leases; while Redis is away, check whether it is back."""
        if self._closed:  # a loop that outlived its cancellation: no new connection now
            return
        try:
            if not self.shared:
                await self._redis.ping()
                log.info("state_restored")
                self.shared = True
                self._wake()
            for hold, member in list(self._mine.values()):
                if hold.id in self._taking or hold.id not in self._mine:  # not, or no more
                    continue
                args: list[str | int] = [hold.id, self._lease_ms, int(hold.heavy), member]
                keys = _held_keys(hold)
                await self._renew(keys=keys, args=[*args, int(hold.light)])
            await self._house.renew()
            await self._in_flight.renew()
        except (RedisError, OSError) as exc:
            self._lost(exc)

    async def _listen(self) -> None:
        """Wake waiting requests when any replica releases a hold."""
        while True:
            try:
                async with self._redis.pubsub() as pubsub:
                    await pubsub.subscribe(CHANNEL)
                    async for message in pubsub.listen():
                        if message.get("type") == "message":
                            self._wake()
            except (RedisError, OSError):
                await asyncio.sleep(1.0)  # Redis is away; the lease loop notices and logs
