"""Days, hours and minutes as the admin counts them: in the admin's time zone.

Budgets renew when their window does ("2 M tokens a day" renews at the admin's midnight,
not UTC's), and usage is reported by the admin's days. The zone is ``FAIRGATE_TIME_ZONE``
(an IANA name), or the machine's own when unset. Labels sort in time order as strings, so
stores can compare and range over them without parsing: ``2025-03-14``, hour 13,
``2025-03-14T13``, ``2025-03-14T13:05``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date, datetime, timedelta, tzinfo
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

__all__ = ["Calendar", "Windows", "zone_named"]


def zone_named(name: str) -> tzinfo | None:
    """The zone called ``name`` (``Europe/Berlin``), or None (the machine's) for ``""``;
    ValueError saying what is wrong otherwise."""
    if not name:
        return None
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        message = f"{name!r} is not a time zone; an IANA name such as Europe/Berlin"
        raise ValueError(message) from None


@dataclass(frozen=True, slots=True)
class Windows:
    """The day, hour and minute that hold one instant, and when each ends (epoch seconds)."""

    day: str  # 2025-03-14
    hour: int  # 0-23
    minute: str  # 2025-03-14T13:05
    day_ends: float
    hour_ends: float
    minute_ends: float
    minute_starts: float
    hour_label: str  # 2025-03-14T13: made once here, compared for each request


class Calendar:
    """Windows in one time zone; ``None`` is the machine's local time."""

    def __init__(self, zone: tzinfo | None = None, clock: Callable[[], float] = time.time) -> None:
        self.zone = zone
        self.clock = clock
        self._last: Windows | None = None

    def now(self) -> Windows:
        return self.at(self.clock())

    def at(self, now: float) -> Windows:
        """The windows holding ``now``; the same object again within one minute (a request
        asks several times, and building one reads the local time and formats its labels)."""
        last = self._last
        if last is not None and last.minute_starts <= now < last.minute_ends:
            return last
        local = datetime.fromtimestamp(now, self.zone)
        into_minute = local.second + local.microsecond / 1e6
        # Hours and minutes end by counting forward from now, which stays right across a
        # change to or from summer time; the day ends at the next local midnight.
        following = local.date() + timedelta(days=1)
        day = local.strftime("%Y-%m-%d")
        windows = Windows(
            day=day,
            hour=local.hour,
            minute=local.strftime("%Y-%m-%dT%H:%M"),
            day_ends=self.midnight(following),
            hour_ends=now - local.minute * 60 - into_minute + 3600,
            minute_ends=now - into_minute + 60,
            minute_starts=now - into_minute,
            hour_label=f"{day}T{local.hour:02d}",
        )
        self._last = windows
        return windows

    def midnight(self, day: date) -> float:
        """When ``day`` starts in this zone, in epoch seconds."""
        return datetime(day.year, day.month, day.day, tzinfo=self.zone).timestamp()

    def clock_time(self, instant: float) -> str:
        """``15:00 CET``, or ``Sat 00:00 CET`` when ``instant`` is not today: for messages,
        read by people who may not be in the gateway's time zone."""
        local = datetime.fromtimestamp(instant, self.zone)
        today = datetime.fromtimestamp(self.clock(), self.zone).date()
        return f"{local:%H:%M %Z}" if local.date() == today else f"{local:%a %H:%M %Z}"
