"""Usage in Redis, one set of counters for every replica (``FAIRGATE_REDIS_URL``).

A batch is one Lua script: HINCRBY of the hourly rows and of each user's day, hour and
minute totals, then a read of those totals, so what a replica reads back includes its own
batch and every other replica's flushed ones. Hourly rows are hashes per day whose fields
are JSON arrays (``[13, "alice", "llama3.2:3b", "requests"]``), so that any user or model
name stays one field; they expire after ``KEEP_DAYS``, the window totals soon after their
window. The days that have rows are kept in one sorted set (``DAYS``), so that a report reads
its days without scanning the keyspace, which the house's leases and marks make large; rows
written before that set existed are found once by a scan (``_index_days``). Redis must
persist (``appendonly yes``) for usage to outlive a Redis restart.

A batch may be sent twice: the client re-sends a command whose reply did not come within
its socket timeout (``core/redis_client.py``), and the ledger sends a batch again after a
StoreError, though Redis may have applied it both times (a fsync stall, a reply lost on
the way). So the script first sets the batch's mark (``SET ... NX EX``) and adds only if
the mark was not there yet: a batch counts once, and a repeat only reads the totals.
Marks are kept ``APPLIED_SECONDS``, which a ledger's retries fall within unless Redis stays
unreachable for longer; a script is atomic, so no reader sees half a batch, and it reaches
the append-only file as one entry with its mark.
"""

from __future__ import annotations

import contextlib
import json
from datetime import date, timedelta
from typing import Any

import structlog
from redis.exceptions import RedisError

from gateway.core import Windows, connect
from gateway.usage.stores.base import Batch, RefusalRow, StoreError, Tally, Totals, UsageRow

__all__ = ["APPLIED_SECONDS", "KEEP_DAYS", "RedisUsage"]

log = structlog.get_logger("fairgate.usage")

PREFIX = "fairgate:usage"
DAYS = f"{PREFIX}:days"  # a sorted set, every score 0: the days with rows, read by their order
_DAYS_INDEXED = f"{DAYS}:indexed"  # set once the rows written before DAYS are in it
KEEP_DAYS = 400  # hourly rows: a year of reports, and the same days of last year
_DAY_SECONDS = 86400
APPLIED_SECONDS = _DAY_SECONDS  # a batch's mark: a day of retries after a lost reply
_COUNTS = ("requests", "prompt_tokens", "completion_tokens", "slot_seconds")

# KEYS: the batch's mark, the day, hour and minute totals to read, then the keys written.
# ARGV: the mark's lifetime, then four per write: kind (HINCRBY, HINCRBYFLOAT, EXPIRE, ZADD,
# ZREMRANGEBYLEX), the
# index of its key in KEYS, the field, the amount. Returns whether the batch was a repeat,
# then the three totals. The mark comes first: a write that fails halfway (a key of the
# wrong type) is not applied again, so a fault undercounts rather than counting twice.
_ADD = """
local repeated = 0
if #ARGV > 1 then
  if redis.call('SET', KEYS[1], '1', 'NX', 'EX', ARGV[1]) then
    for i = 2, #ARGV, 4 do
      local kind, key = ARGV[i], KEYS[tonumber(ARGV[i + 1])]
      if kind == 'i' then
        redis.call('HINCRBY', key, ARGV[i + 2], ARGV[i + 3])
      elseif kind == 'f' then
        redis.call('HINCRBYFLOAT', key, ARGV[i + 2], ARGV[i + 3])
      elseif kind == 'z' then
        redis.call('ZADD', key, 0, ARGV[i + 2])
      elseif kind == 'r' then
        redis.call('ZREMRANGEBYLEX', key, '-', ARGV[i + 2])
      else
        redis.call('EXPIRE', key, ARGV[i + 3])
      end
    end
  else
    repeated = 1
  end
end
return {repeated, redis.call('HGETALL', KEYS[2]), redis.call('HGETALL', KEYS[3]),
        redis.call('HGETALL', KEYS[4])}
"""


def _rows_key(day: str) -> str:
    return f"{PREFIX}:rows:{day}"


def _refusals_key(day: str) -> str:
    return f"{PREFIX}:refusals:{day}"


def _window_keys(windows: Windows) -> tuple[str, str, str]:
    return (
        f"{PREFIX}:day:{windows.day}",
        f"{PREFIX}:hour:{windows.hour_label}",
        f"{PREFIX}:minute:{windows.minute}",
    )


class RedisUsage:
    """Usage counters shared by every replica."""

    shared = True

    def __init__(self, url: str) -> None:
        self._redis = connect(url)
        self._add = self._redis.register_script(_ADD)  # EVALSHA, loaded again after NOSCRIPT

    async def open(self, windows: Windows) -> dict[str, Tally]:
        return await self.add(Batch(), windows)

    async def add(self, batch: Batch, windows: Windows) -> dict[str, Tally]:
        writes = _Writes([f"{PREFIX}:applied:{batch.id}", *_window_keys(windows)])
        _increments(writes, batch)
        if batch.served or batch.refused:  # the days whose rows have expired leave the index
            oldest = date.fromisoformat(windows.day) - timedelta(days=KEEP_DAYS)
            writes.zremrangebylex(DAYS, oldest.isoformat())
        try:
            repeated, day, hour, minute = await self._add(writes.keys, writes.argv)
        except (RedisError, OSError) as exc:
            raise StoreError(f"Redis: {exc!r}") from exc
        if repeated:
            log.info("usage_batch_already_counted", batch=batch.id)
        return _totals(windows, _pairs(day), _pairs(hour), _pairs(minute))

    async def rows(self, since: tuple[str, int]) -> tuple[list[UsageRow], list[RefusalRow]]:
        usage: list[UsageRow] = []
        refusals: list[RefusalRow] = []
        try:
            await self._index_days()
            for stored in await self._redis.zrange(DAYS, f"[{since[0]}", "+", bylex=True):
                day = stored.decode() if isinstance(stored, bytes) else str(stored)
                usage += _usage_rows(day, await self._redis.hgetall(_rows_key(day)))
                refusals += _refusal_rows(day, await self._redis.hgetall(_refusals_key(day)))
        except (RedisError, OSError) as exc:
            raise StoreError(f"Redis: {exc!r}") from exc
        usage = [r for r in usage if (r.day, r.hour) >= since]
        refusals = [r for r in refusals if (r.day, r.hour) >= since]
        usage.sort(key=lambda r: (r.day, r.hour, r.user, r.model))
        refusals.sort(key=lambda r: (r.day, r.hour, r.user, r.reason))
        return usage, refusals

    async def _index_days(self) -> None:
        """The days of rows written before ``DAYS`` existed (by an older gateway), put in it
        once: a scan of the keyspace, then never again on this Redis."""
        if await self._redis.exists(_DAYS_INDEXED):
            return
        days = set()
        for kind in ("rows", "refusals"):  # a day may have refusals only
            async for key in self._redis.scan_iter(match=f"{PREFIX}:{kind}:*", count=1000):
                days.add(key.decode().rsplit(":", 1)[1])
        if days:
            await self._redis.zadd(DAYS, dict.fromkeys(days, 0))
        await self._redis.set(_DAYS_INDEXED, "1")

    async def close(self) -> None:
        with contextlib.suppress(RedisError, OSError):
            await self._redis.aclose()


class _Writes:
    """A batch as the script's arguments: each key once in KEYS, four ARGV per write."""

    def __init__(self, keys: list[str]) -> None:
        self.keys = keys
        self.argv: list[str | int | float] = [APPLIED_SECONDS]
        self._index = {key: i for i, key in enumerate(keys, 1)}  # Lua counts from 1

    def hincrby(self, key: str, field: str, amount: int) -> None:
        self._write("i", key, field, amount)

    def hincrbyfloat(self, key: str, field: str, amount: float) -> None:
        self._write("f", key, field, amount)

    def expire(self, key: str, seconds: int) -> None:
        self._write("x", key, "", seconds)

    def zadd(self, key: str, member: str) -> None:
        self._write("z", key, member, 0)

    def zremrangebylex(self, key: str, below: str) -> None:
        """Members before ``below`` (exclusive) removed."""
        self._write("r", key, f"({below}", 0)

    def _write(self, kind: str, key: str, field: str, amount: int | float) -> None:
        index = self._index.get(key)
        if index is None:
            self.keys.append(key)
            index = self._index[key] = len(self.keys)
        self.argv += (kind, index, field, amount)


def _pairs(flat: list[bytes]) -> dict[bytes, bytes]:
    """HGETALL's reply inside a script: field, value, field, value."""
    return dict(zip(flat[::2], flat[1::2], strict=True))


def _increments(writes: _Writes, batch: Batch) -> None:
    days: set[str] = set()
    windows: dict[str, int] = {}  # key -> seconds to keep it
    for (day, hour, user, model), counts in batch.served.items():
        days.add(day)
        day_key, hour_key = f"{PREFIX}:day:{day}", f"{PREFIX}:hour:{day}T{hour:02d}"
        for name in _COUNTS:
            amount = getattr(counts, name)
            field = json.dumps([hour, user, model, name])
            if name == "slot_seconds":
                writes.hincrbyfloat(_rows_key(day), field, amount)
                writes.hincrbyfloat(day_key, json.dumps([user, name]), amount)
            else:
                writes.hincrby(_rows_key(day), field, amount)
                writes.hincrby(day_key, json.dumps([user, name]), amount)
        writes.hincrby(hour_key, user, counts.requests)
        windows[day_key], windows[hour_key] = 2 * _DAY_SECONDS, 2 * 3600
    for (day, hour, user, reason), count in batch.refused.items():
        days.add(day)
        writes.hincrby(_refusals_key(day), json.dumps([hour, user, reason]), count)
        day_key = f"{PREFIX}:day:{day}"
        writes.hincrby(day_key, json.dumps([user, "refused"]), count)
        windows[day_key] = 2 * _DAY_SECONDS
    for (minute, user), count in batch.minutes.items():
        key = f"{PREFIX}:minute:{minute}"
        writes.hincrby(key, user, count)
        windows[key] = 120
    for day in days:
        writes.expire(_rows_key(day), KEEP_DAYS * _DAY_SECONDS)
        writes.expire(_refusals_key(day), KEEP_DAYS * _DAY_SECONDS)
        writes.zadd(DAYS, day)
    for key, seconds in windows.items():
        writes.expire(key, seconds)


def _totals(
    windows: Windows, day: dict[bytes, bytes], hour: dict[bytes, bytes], minute: dict[bytes, bytes]
) -> dict[str, Tally]:
    totals = Totals(windows)

    for field, value in day.items():
        user, name = json.loads(field)
        figures = totals.of(user)
        if name == "slot_seconds":
            figures.slot_seconds = float(value)
        elif name in ("requests", "refused", "prompt_tokens", "completion_tokens"):
            setattr(figures, name, int(value))
    for user, value in hour.items():
        totals.of(user.decode()).hour_requests = int(value)
    for user, value in minute.items():
        totals.of(user.decode()).minute_requests = int(value)
    return totals


def _usage_rows(day: str, fields: dict[Any, Any]) -> list[UsageRow]:
    found: dict[tuple[int, str, str], dict[str, float]] = {}
    for field, value in fields.items():
        hour, user, model, name = json.loads(field)
        found.setdefault((hour, user, model), {})[name] = float(value)
    return [
        UsageRow(
            day,
            hour,
            user,
            model,
            int(counts.get("requests", 0)),
            int(counts.get("prompt_tokens", 0)),
            int(counts.get("completion_tokens", 0)),
            counts.get("slot_seconds", 0.0),
        )
        for (hour, user, model), counts in found.items()
    ]


def _refusal_rows(day: str, fields: dict[Any, Any]) -> list[RefusalRow]:
    rows = []
    for field, value in fields.items():
        hour, user, reason = json.loads(field)
        rows.append(RefusalRow(day, hour, user, reason, int(value)))
    return rows
