"""A user's requests in flight, for budgets (``usage/in_flight.py``), counted in Redis across
every replica: leases of the kind the holds are, in one sorted set per user, with a hash of
the tokens each reserves beside it, counted and added by one script (``COUNT_IN``).

The store (``redis.py``) maps Redis's errors and sends the removals in the background; this
keeps what this replica counted there, and what it has ended whose removal is under way (an
ended request counts in the ledger's figures at once, and must not count in flight too).
"""

from __future__ import annotations

import structlog
from redis.asyncio import Redis
from redis.exceptions import RedisError

from gateway.admission.holds import scripts
from gateway.admission.holds.redis_house import PREFIX

__all__ = ["RedisInFlight"]

log = structlog.get_logger("fairgate.state")


def _keys(user: str) -> list[str]:
    """The user's requests in flight, and the tokens each reserves."""
    return [f"{PREFIX}:in_flight:{user}", f"{PREFIX}:in_flight_tokens:{user}"]


class RedisInFlight:
    """This replica's requests counted in flight in Redis, by request: their users."""

    def __init__(self, redis: Redis, lease_ms: int) -> None:
        self._redis = redis
        self._lease_ms = lease_ms
        self._count_in = redis.register_script(scripts.COUNT_IN)
        self._renew = redis.register_script(scripts.RENEW_IN_FLIGHT)
        self._counted: dict[str, str] = {}  # requests this replica counts there: their users
        self._ended: dict[str, set[str]] = {}  # by user: requests ended, their removal under way

    async def count(
        self, user: str, request: str, room: int, tokens: int, token_room: int | None
    ) -> bool:
        """COUNT_IN (raises Redis's errors: the store maps them)."""
        ended = self._ended.get(user, ())
        limits = [room, self._lease_ms, tokens, -1 if token_room is None else token_room]
        counted = await self._count_in(keys=_keys(user), args=[request, *limits, *ended])
        if counted:
            self._counted[request] = user
        return bool(counted)

    def ended(self, user: str, request: str) -> bool:
        """``request`` ended: whether it was counted there, and its removal is now due
        (``remove``)."""
        if self._counted.pop(request, None) is None:
            return False  # never counted in Redis (it was away): nothing to undo there
        self._ended.setdefault(user, set()).add(request)
        return True

    async def remove(self, user: str, request: str) -> None:
        try:
            in_flight, tokens = _keys(user)
            await self._redis.zrem(in_flight, request)
            await self._redis.hdel(tokens, request)
        except (RedisError, OSError) as exc:
            log.warning("state_release_failed", request=request, error=repr(exc))
        finally:  # removed, or left to its lease
            ended = self._ended.get(user)
            if ended is not None:
                ended.discard(request)
                if not ended:
                    del self._ended[user]

    async def renew(self) -> None:
        """Renew the leases of the requests counted (raises Redis's errors)."""
        for request, user in list(self._counted.items()):
            await self._renew(keys=_keys(user), args=[request, self._lease_ms])
