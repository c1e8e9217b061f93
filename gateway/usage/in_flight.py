"""A user's requests in flight, counted across replicas for a requests budget, and the
tokens they reserve against a tokens budget (``usage/budgets.py``).

Requests running or waiting count against ``requests_per_minute`` and ``requests_per_hour``
already (``usage/budgets.py``), so that a burst cannot pass them. A replica's room sees only its
own, and not even those waiting for a hold another replica has (``admission/replicas.py``): with
two replicas, a user could start twice the budget. So with a shared hold store, a request
of a user whose budget limits requests or tokens is counted there, with the tokens it
reserves, from its budget check until it ends, by one atomic check-and-add against what the
budget leaves (a lease: a killed replica's count expires), and refused when that is used
up. Without a store, or while it
is unreachable, the room's count is the count, as for a single gateway. What other
replicas finished since the last usage write is still unseen here (``usage/ledger.py``).
"""

from __future__ import annotations

import uuid

from gateway.admission import Admission, HoldStore, StoreUnavailable
from gateway.config import Budget
from gateway.usage.ledger import Ledger

__all__ = ["InFlight"]

_NO_LIMIT = 2**31  # requests in flight, where only tokens are limited


class InFlight:
    """``async with``: a request checked against its user's budget, and counted across
    replicas while it waits and runs; entering raises the 429 when the budget is used up."""

    __slots__ = (
        "_admission",
        "_budget",
        "_counted",
        "_request",
        "_reserved",
        "_tokens",
        "_usage",
        "_user",
    )

    def __init__(
        self, usage: Ledger, admission: Admission, budget: Budget, user: str, tokens: int = 0
    ) -> None:
        """``tokens``: what the request may use (its prompt, and the most it may generate),
        reserved against a tokens budget while it runs or waits."""
        self._usage, self._admission = usage, admission
        self._budget, self._user = budget, user
        self._tokens = tokens if budget.tokens_per_day is not None else 0
        self._reserved = False
        self._request = uuid.uuid4().hex  # ours, never the client's: a repeat counts once
        self._counted: HoldStore | None = None

    async def __aenter__(self) -> None:
        usage, user, budget = self._usage, self._user, self._budget
        refusal = usage.refusal(user, budget, self._admission.in_flight(user))
        if refusal is not None:
            raise refusal.error()
        usage.reserve(user, self._tokens)  # before any await: the next one sees it
        self._reserved = True
        try:
            await self._count_across_replicas()
        except BaseException:
            self._unreserve()
            raise

    async def _count_across_replicas(self) -> None:
        usage, user, budget = self._usage, self._user, self._budget
        store = self._admission.holds
        room = usage.requests_room(user, budget)
        token_room = usage.tokens_room(user, budget)
        if store is None or (room is None and token_room is None):
            return  # one replica: its room and its ledger count them all
        try:
            counted = await store.count_in_flight(
                user, self._request, _NO_LIMIT if room is None else room, self._tokens, token_room
            )
        except StoreUnavailable:
            return  # Redis is away: this replica's count, until it is back
        if counted:
            self._counted = store
            return
        # In flight elsewhere, the requests or the tokens they reserve leave no more: the
        # limit that leaves none is the one spent.
        refusal = usage.refusal(user, budget, room or 0, reserved=token_room)
        if refusal is not None:
            raise refusal.error()

    async def __aexit__(self, *exc_info: object) -> None:
        self._unreserve()
        if self._counted is not None:
            self._counted.uncount_in_flight(self._user, self._request)

    def _unreserve(self) -> None:
        if self._reserved:
            self._reserved = False
            self._usage.unreserve(self._user, self._tokens)
