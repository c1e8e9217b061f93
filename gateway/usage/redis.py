"""Usage in Redis, one set of counters for every replica (``FAIRGATE_REDIS_URL``).

A batch is one MULTI/EXEC: HINCRBY of the hourly rows and of each user's day, hour and
minute totals, then a read of those totals, so what a replica reads back includes its own
batch and every other replica's flushed ones. Hourly rows are hashes per day whose fields
are JSON arrays (``[13, "alice", "llama3.2:3b", "requests"]``), so that any user or model
name stays one field; they expire after ``KEEP_DAYS``, the window totals soon after their
window. Redis must persist (``appendonly yes``) for usage to outlive a Redis restart.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

from redis.exceptions import RedisError

from gateway.shared_redis import connect
from gateway.usage.base import Batch, RefusalRow, StoreError, Tally, Totals, UsageRow
from gateway.windows import Windows

__all__ = ["KEEP_DAYS", "RedisUsage"]

PREFIX = "fairgate:usage"
KEEP_DAYS = 400  # hourly rows: a year of reports, and the same days of last year
_DAY_SECONDS = 86400
_COUNTS = ("requests", "prompt_tokens", "completion_tokens", "slot_seconds")


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

    async def open(self, windows: Windows) -> dict[str, Tally]:
        return await self.add(Batch(), windows)

    async def add(self, batch: Batch, windows: Windows) -> dict[str, Tally]:
        try:
            async with self._redis.pipeline(transaction=True) as pipe:
                _increments(pipe, batch)
                for key in _window_keys(windows):
                    pipe.hgetall(key)
                results = await pipe.execute()
        except (RedisError, OSError) as exc:
            raise StoreError(f"Redis: {exc!r}") from exc
        day, hour, minute = results[-3:]
        return _totals(windows, day, hour, minute)

    async def rows(self, since: tuple[str, int]) -> tuple[list[UsageRow], list[RefusalRow]]:
        day = since[0]
        usage: list[UsageRow] = []
        refusals: list[RefusalRow] = []
        try:
            days = set()
            for kind in ("rows", "refusals"):  # a day may have refusals only
                async for key in self._redis.scan_iter(match=f"{PREFIX}:{kind}:*", count=1000):
                    days.add(key.decode().rsplit(":", 1)[1])
            for stored in sorted(d for d in days if d >= day):
                usage += _usage_rows(stored, await self._redis.hgetall(_rows_key(stored)))
                found = await self._redis.hgetall(_refusals_key(stored))
                refusals += _refusal_rows(stored, found)
        except (RedisError, OSError) as exc:
            raise StoreError(f"Redis: {exc!r}") from exc
        usage = [r for r in usage if (r.day, r.hour) >= since]
        refusals = [r for r in refusals if (r.day, r.hour) >= since]
        usage.sort(key=lambda r: (r.day, r.hour, r.user, r.model))
        refusals.sort(key=lambda r: (r.day, r.hour, r.user, r.reason))
        return usage, refusals

    async def close(self) -> None:
        with contextlib.suppress(RedisError, OSError):
            await self._redis.aclose()


def _increments(pipe: Any, batch: Batch) -> None:
    days: set[str] = set()
    windows: dict[str, int] = {}  # key -> seconds to keep it
    for (day, hour, user, model), counts in batch.served.items():
        days.add(day)
        day_key, hour_key = f"{PREFIX}:day:{day}", f"{PREFIX}:hour:{day}T{hour:02d}"
        for name in _COUNTS:
            amount = getattr(counts, name)
            field = json.dumps([hour, user, model, name])
            if name == "slot_seconds":
                pipe.hincrbyfloat(_rows_key(day), field, amount)
                pipe.hincrbyfloat(day_key, json.dumps([user, name]), amount)
            else:
                pipe.hincrby(_rows_key(day), field, amount)
                pipe.hincrby(day_key, json.dumps([user, name]), amount)
        pipe.hincrby(hour_key, user, counts.requests)
        windows[day_key], windows[hour_key] = 2 * _DAY_SECONDS, 2 * 3600
    for (day, hour, user, reason), count in batch.refused.items():
        days.add(day)
        pipe.hincrby(_refusals_key(day), json.dumps([hour, user, reason]), count)
        day_key = f"{PREFIX}:day:{day}"
        pipe.hincrby(day_key, json.dumps([user, "refused"]), count)
        windows[day_key] = 2 * _DAY_SECONDS
    for (minute, user), count in batch.minutes.items():
        key = f"{PREFIX}:minute:{minute}"
        pipe.hincrby(key, user, count)
        windows[key] = 120
    for day in days:
        pipe.expire(_rows_key(day), KEEP_DAYS * _DAY_SECONDS)
        pipe.expire(_refusals_key(day), KEEP_DAYS * _DAY_SECONDS)
    for key, seconds in windows.items():
        pipe.expire(key, seconds)


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
