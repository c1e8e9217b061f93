"""The policy's ``budget:`` (in ``defaults`` and per user): limits on use over time.

Counts as admins write them (``2M`` tokens, ``500k``), slot time as a duration (``2h``), and
``unlimited`` to lift a default for one user. ``usage/budgets.py`` holds them against what was used.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from gateway.core import parse_duration

__all__ = ["UNLIMITED", "Budget", "BudgetConfig", "merged_budget"]


UNLIMITED = "unlimited"
_SUFFIXES = {"": 1, "k": 1_000, "m": 1_000_000, "g": 1_000_000_000}
_AMOUNT = re.compile(r"(\d+(?:\.\d+)?)\s*([kmg]?)", re.IGNORECASE)


def _amount(value: object) -> object:
    """A count as admins write it: 50, 500k, 2M (or unlimited, to lift a default)."""
    if value == UNLIMITED:
        return value
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    match = _AMOUNT.fullmatch(value.strip()) if isinstance(value, str) else None
    if match is None:
        raise ValueError("must be a count such as 50, 500k or 2M, or unlimited")
    return round(float(match[1]) * _SUFFIXES[match[2].lower()])


def _seconds(value: object) -> object:
    if value == UNLIMITED:
        return value
    seconds = parse_duration(value)
    if seconds < 0:
        raise ValueError("must be a duration such as 30m or 2h, or unlimited")
    return seconds


BudgetCount = Annotated[int | Literal["unlimited"], BeforeValidator(_amount)]
BudgetSeconds = Annotated[float | Literal["unlimited"], BeforeValidator(_seconds)]


class BudgetConfig(BaseModel):
    """What a user may use over time, in windows of the admin's time zone
    (FAIRGATE_TIME_ZONE). A request past any of them gets 429 until its window renews; a
    stream already running is never cut. A user's fields replace the defaults' one by one;
    ``unlimited`` lifts one."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tokens_per_day: BudgetCount | None = Field(
        default=None, description="Prompt and generated tokens per day, e.g. 2M or 500k."
    )
    requests_per_minute: BudgetCount | None = Field(
        default=None, description="Requests per minute (of the clock)."
    )
    requests_per_hour: BudgetCount | None = Field(
        default=None, description="Requests per hour (of the clock)."
    )
    slot_seconds_per_day: BudgetSeconds | None = Field(
        default=None,
        description="Time holding a backend slot per day, e.g. 2h: the fairest measure of GPU "
        "time (a long prompt costs its prefill, a cold model its load).",
    )


@dataclass(frozen=True, slots=True)
class Budget:
    """One user's budget in force: defaults and the user's own merged; None is no limit."""

    tokens_per_day: int | None = None
    requests_per_minute: int | None = None
    requests_per_hour: int | None = None
    slot_seconds_per_day: float | None = None

    def __bool__(self) -> bool:
        return (
            self.tokens_per_day is not None
            or self.requests_per_minute is not None
            or self.requests_per_hour is not None
            or self.slot_seconds_per_day is not None
        )


def merged_budget(defaults: BudgetConfig, own: BudgetConfig | None) -> Budget:
    given = {} if own is None else own.model_dump(exclude_none=True)
    merged = {**defaults.model_dump(exclude_none=True), **given}
    return Budget(**{name: value for name, value in merged.items() if value != UNLIMITED})
