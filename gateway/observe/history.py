"""The last hour, in memory, for the house page: what Prometheus keeps for longer. (Each
user's day is kept by ``usage/ledger.py``, across restarts.)

Fed once per finished request by the access log (``Services.on_finished``), at a fixed cost:
a request lands in the current minute's counts, and a refusal in a short ring of recent
ones. Times to first token go into a fixed set of log-spaced buckets, so a minute's p50
and p95 need no list of samples however busy it was (each figure is the upper bound of its
bucket: within a quarter of the true value).
Memory is bounded: 60 minutes of buckets, 20 refusals.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from gateway.core import API_PREFIXES, REFUSALS, Lane, Reason
from gateway.edge import RequestRecord

__all__ = ["History", "HistorySnapshot", "MinuteFigures", "RecentRefusal"]

MINUTES = 60
RECENT_REFUSALS = 20
# Refusals of callers the gateway did not recognise (a wrong key, no key) on its APIs: kept
# apart and fewer, so that a stranger's stream of 401s cannot push the household's out.
RECENT_STRANGERS = 5
# Of a refused request's path: enough to tell the route, not a stranger's 8 KiB of it.
_PATH_CHARS = 200
# 5 ms to about 9 minutes, each bound a quarter above the one before.
TTFT_BOUNDS = tuple(0.005 * 1.25**k for k in range(53))


@dataclass(frozen=True, slots=True)
class MinuteFigures:
    """One minute of the last hour; ``start`` is seconds since the epoch."""

    start: float
    requests: int
    refusals: int
    ttft_p50: float | None  # seconds; None when no reply started in that minute
    ttft_p95: float | None


@dataclass(frozen=True, slots=True)
class RecentRefusal:
    at: float  # seconds since the epoch
    user: str | None
    reason: Reason
    path: str
    model: str | None


@dataclass(frozen=True, slots=True)
class HistorySnapshot:
    minutes: tuple[MinuteFigures, ...] = ()  # the last hour, oldest first, one per minute
    refusals: tuple[RecentRefusal, ...] = ()  # the household's, newest first
    strangers: tuple[RecentRefusal, ...] = ()  # callers not recognised, kept apart


@dataclass(slots=True)
class _Minute:
    index: int  # minutes since the epoch
    requests: int = 0
    refusals: int = 0
    ttft: list[int] = field(default_factory=lambda: [0] * (len(TTFT_BOUNDS) + 1))


class History:
    """Per-minute figures for the last hour, and recent refusals."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._minutes: deque[_Minute] = deque(maxlen=MINUTES)
        self._refusals: deque[RecentRefusal] = deque(maxlen=RECENT_REFUSALS)
        self._strangers: deque[RecentRefusal] = deque(maxlen=RECENT_STRANGERS)

    def observe(self, record: RequestRecord) -> None:
        """Take in one finished request (a listener of the access log)."""
        refused = record.reason in REFUSALS
        # Listings, counts of tokens, metrics scrapes and the house page's own polls are not
        # the household's requests; refusals are, on its APIs' paths only (not a scanner's
        # /wp-login.php).
        if not refused and not record.generation:
            return
        if not record.path.startswith(API_PREFIXES):
            return
        now = self._clock()
        minute = self._minute(now)
        if refused:
            assert record.reason is not None
            minute.refusals += 1
            path = record.path[:_PATH_CHARS]
            refusal = RecentRefusal(now, record.user, record.reason, path, record.model)
            (self._refusals if record.user is not None else self._strangers).appendleft(refusal)
            return
        minute.requests += 1
        # The TTFT line is people's: a task's wait, given way to them, is not theirs.
        if record.first_byte_at is not None and record.lane is not Lane.BACKGROUND:
            minute.ttft[bisect_left(TTFT_BOUNDS, record.first_byte_at - record.arrived)] += 1

    def snapshot(self) -> HistorySnapshot:
        now = self._clock()
        last = int(now // 60)
        by_index = {minute.index: minute for minute in self._minutes}
        figures = tuple(
            _figures(index, by_index.get(index)) for index in range(last - MINUTES + 1, last + 1)
        )
        return HistorySnapshot(
            minutes=figures, refusals=tuple(self._refusals), strangers=tuple(self._strangers)
        )

    def _minute(self, now: float) -> _Minute:
        index = int(now // 60)
        if not self._minutes or self._minutes[-1].index != index:
            self._minutes.append(_Minute(index))
        return self._minutes[-1]


def _figures(index: int, minute: _Minute | None) -> MinuteFigures:
    if minute is None:
        return MinuteFigures(index * 60.0, 0, 0, None, None)
    return MinuteFigures(
        index * 60.0,
        minute.requests,
        minute.refusals,
        _quantile(minute.ttft, 0.5),
        _quantile(minute.ttft, 0.95),
    )


def _quantile(counts: list[int], q: float) -> float | None:
    """The upper bound of the bucket holding the q-quantile (the last bucket: its lower)."""
    total = sum(counts)
    if not total:
        return None
    seen = 0
    for index, count in enumerate(counts):
        seen += count
        if seen >= q * total:
            return TTFT_BOUNDS[min(index, len(TTFT_BOUNDS) - 1)]
    return TTFT_BOUNDS[-1]


def _at(refusal: RecentRefusal) -> float:
    return refusal.at
