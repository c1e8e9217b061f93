"""The usage-store contract, and the figures that cross it.

What is stored is counts by hour: per user and model (requests, tokens, slot-seconds) and
per user and refusal reason, labelled with the admin's day and hour (``core/calendar.py``).
Budgets need each user's figures in the current day, hour and minute: a store hands those
back (``Tally``) after every write, summed over every replica when it is shared.
"""

from __future__ import annotations

import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Protocol

from gateway.core import Windows

__all__ = [
    "Batch",
    "Counts",
    "RefusalRow",
    "StoreError",
    "Tally",
    "Totals",
    "UsageRow",
    "UsageStore",
]

RowKey = tuple[str, int, str, str]  # day, hour, user, model
RefusalKey = tuple[str, int, str, str]  # day, hour, user, reason
MinuteKey = tuple[str, str]  # minute label, user


class StoreError(Exception):
    """The store cannot be read or written now; the caller keeps its batch and retries."""


@dataclass(slots=True)
class Counts:
    """What one user's requests to one model used in one hour."""

    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    slot_seconds: float = 0.0

    def count(self, prompt_tokens: int, completion_tokens: int, slot_seconds: float) -> None:
        """One more request (without a Counts made for it: this runs for each request)."""
        self.requests += 1
        self.prompt_tokens += prompt_tokens
        self.completion_tokens += completion_tokens
        self.slot_seconds += slot_seconds


@dataclass(slots=True)
class Batch:
    """Increments not yet written, keyed by the window each happened in.

    ``id`` is the batch's for good: every send of it carries the same one, so a store that
    may have applied a send whose answer was lost (Redis) applies each id once.
    """

    served: dict[RowKey, Counts] = field(default_factory=dict)
    refused: Counter[RefusalKey] = field(default_factory=Counter)
    minutes: Counter[MinuteKey] = field(default_factory=Counter)  # requests, for budgets
    id: str = field(default_factory=lambda: uuid.uuid4().hex)

    def __bool__(self) -> bool:
        return bool(self.served or self.refused or self.minutes)


@dataclass(slots=True)
class Tally:
    """One user's figures in one day, hour and minute, each labelled with its window."""

    day: str = ""
    hour: str = ""  # hour label, 2025-03-14T13
    minute: str = ""
    requests: int = 0  # the day's
    refused: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    slot_seconds: float = 0.0
    hour_requests: int = 0
    minute_requests: int = 0

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def roll(self, windows: Windows) -> None:
        """Move to ``windows``: a window that has ended starts again at zero."""
        if self.minute == windows.minute and self.hour == windows.hour_label:
            return  # the same minute of the same hour, and so of the same day: most calls
        if self.day != windows.day:
            self.roll_day(windows.day)
        if self.hour != windows.hour_label:
            self.hour, self.hour_requests = windows.hour_label, 0
        if self.minute != windows.minute:
            self.minute, self.minute_requests = windows.minute, 0

    def absorb(self, other: Tally) -> None:
        """Add ``other``'s figures of these same windows; an older window of ``other`` is
        over and adds nothing, a newer one replaces this one's (labels sort in time order)."""
        if other.day > self.day:
            self.roll_day(other.day)
        if other.day == self.day:
            self.requests += other.requests
            self.refused += other.refused
            self.prompt_tokens += other.prompt_tokens
            self.completion_tokens += other.completion_tokens
            self.slot_seconds += other.slot_seconds
        if other.hour > self.hour:
            self.hour, self.hour_requests = other.hour, 0
        if other.hour == self.hour:
            self.hour_requests += other.hour_requests
        if other.minute > self.minute:
            self.minute, self.minute_requests = other.minute, 0
        if other.minute == self.minute:
            self.minute_requests += other.minute_requests

    def roll_day(self, day: str) -> None:
        self.day, self.requests, self.refused = day, 0, 0
        self.prompt_tokens, self.completion_tokens, self.slot_seconds = 0, 0, 0.0


class Totals(dict[str, Tally]):
    """Each user's figures in one set of windows, as a store reads them back."""

    def __init__(self, windows: Windows) -> None:
        super().__init__()
        self._windows = windows

    def of(self, user: str) -> Tally:
        """``user``'s figures, zero in these windows until set."""
        found = self.get(user)
        if found is None:
            windows = self._windows
            found = self[user] = Tally(windows.day, windows.hour_label, windows.minute)
        return found


@dataclass(frozen=True, slots=True)
class UsageRow:
    """One stored hour of one user's use of one model."""

    day: str
    hour: int
    user: str
    model: str
    requests: int
    prompt_tokens: int
    completion_tokens: int
    slot_seconds: float


@dataclass(frozen=True, slots=True)
class RefusalRow:
    """How often one user was refused for one reason in one stored hour."""

    day: str
    hour: int
    user: str
    reason: str
    count: int


class UsageStore(Protocol):
    """Where counts are kept. Every method may raise StoreError."""

    shared: bool  # totals include other replicas' usage, so they are read at every flush

    async def open(self, windows: Windows) -> dict[str, Tally]:
        """Open (or create) the store; each user's totals in ``windows`` so far."""

    async def add(self, batch: Batch, windows: Windows) -> dict[str, Tally]:
        """Add ``batch`` in one write; then each user's totals in ``windows``. After a
        StoreError the caller sends the same batch again: it must count once in all."""

    async def rows(self, since: tuple[str, int]) -> tuple[list[UsageRow], list[RefusalRow]]:
        """Every stored hour from (day, hour) ``since`` on, for reports."""

    async def close(self) -> None: ...
