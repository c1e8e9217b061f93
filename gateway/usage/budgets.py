"""Budgets: what a user may use over a day, an hour or a minute, and the 429 once it is used.

A budget is quota, not capacity: the answer is 429 (503 means "busy, retry soon"), with
``Retry-After`` at the end of the window that must roll over, in the admin's time zone.
The check comes before a request waits, never during one: a stream already running is
never cut, so a long reply may take a user past a budget, and the next request is refused.

Requests count when they end; those running or waiting count already (``in_flight``), so
a user cannot pass a requests budget by sending many at once (with replicas, counted across
them: ``usage/in_flight.py``). Tokens are known only when a reply ends, and count then; until
then each request running or waiting reserves its estimate (its prompt, and the most it
may generate, or what its user's replies have taken so far), so that a burst passes a
tokens budget by one request's estimate at most (across replicas: ``usage/in_flight.py``).
Slot time counts when a reply ends.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.admission import Refusal
from gateway.config import PERSON_SEPARATOR, Budget, is_background_account, is_together_account
from gateway.core import Calendar, Reason, Windows
from gateway.usage.stores.base import Tally

__all__ = ["BudgetState", "budget_states", "over_budget", "requests_room"]

_WORDS = {
    "tokens_per_day": "tokens per day",
    "requests_per_minute": "requests per minute",
    "requests_per_hour": "requests per hour",
    "slot_seconds_per_day": "slot-seconds per day",
}


@dataclass(frozen=True, slots=True)
class BudgetState:
    """One limit of a user's budget against what the user has used in its window."""

    name: str  # the policy's field: tokens_per_day, requests_per_hour, ...
    limit: float
    used: float
    renews_at: float  # epoch seconds: the end of the current window

    @property
    def remaining(self) -> float:
        return max(0.0, self.limit - self.used)

    @property
    def spent(self) -> bool:
        return self.used >= self.limit


def budget_states(
    budget: Budget, used: Tally, in_flight: int, windows: Windows, reserved: int = 0
) -> list[BudgetState]:
    """Each limit ``budget`` sets, with its use in ``windows`` (``in_flight``: requests
    running or waiting, which reserved ``reserved`` tokens)."""
    states = []
    if budget.tokens_per_day is not None:
        tokens = used.tokens + reserved
        states.append(
            BudgetState("tokens_per_day", budget.tokens_per_day, tokens, windows.day_ends)
        )
    if budget.requests_per_minute is not None:
        minute = used.minute_requests + in_flight
        states.append(
            BudgetState(
                "requests_per_minute", budget.requests_per_minute, minute, windows.minute_ends
            )
        )
    if budget.requests_per_hour is not None:
        hour = used.hour_requests + in_flight
        states.append(
            BudgetState("requests_per_hour", budget.requests_per_hour, hour, windows.hour_ends)
        )
    if budget.slot_seconds_per_day is not None:
        states.append(
            BudgetState(
                "slot_seconds_per_day",
                budget.slot_seconds_per_day,
                used.slot_seconds,
                windows.day_ends,
            )
        )
    return states


def requests_room(budget: Budget, used: Tally) -> int | None:
    """How many of the user's requests may be in flight (running or waiting) now under
    ``budget``'s requests limits; None when it sets none."""
    rooms = []
    if budget.requests_per_minute is not None:
        rooms.append(budget.requests_per_minute - used.minute_requests)
    if budget.requests_per_hour is not None:
        rooms.append(budget.requests_per_hour - used.hour_requests)
    return min(rooms) if rooms else None


def over_budget(user: str, states: list[BudgetState], calendar: Calendar) -> Refusal | None:
    """The 429 when a limit is used up: the one that renews last, since nothing is admitted
    before it does; None while every limit has room."""
    spent = [state for state in states if state.spent]
    if not spent:
        return None
    state = max(spent, key=lambda s: s.renews_at)
    words = _WORDS[state.name]
    # A person a front end names (a header's value) is not repeated back: error bodies echo
    # nothing the client sent. The policy's own user names are the admin's words.
    front_end, separator, _ = user.partition(PERSON_SEPARATOR)
    if is_background_account(user):
        who = f"background work on {front_end} (counted apart from its people's)"
    elif is_together_account(user):
        who = f"the people of {front_end} together (on_behalf.total)"
    else:
        who = f"this person on {front_end}" if separator else user
    message = (
        f"{who} has used the budget of {_amount(state.limit)} {words} "
        f"({_amount(state.used)} so far); it renews at {calendar.clock_time(state.renews_at)}"
    )
    retry_after = max(0.0, state.renews_at - calendar.clock())
    return Refusal(Reason.BUDGET_EXHAUSTED, message, retry_after, status=429)


def _amount(value: float) -> str:
    return f"{value:,.0f}" if value >= 10 or value == int(value) else f"{value:.1f}"
