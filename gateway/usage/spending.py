"""What a request may spend: its account's budget asked before it runs (the 429), and the
request counted against it, with the tokens it reserves, while it waits and runs.

A request spends its own account's budget and, for a front end's people, their total's
(``Policy.together_of``). Nothing is counted where the policy has no budget.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager

from gateway.admission import Admission
from gateway.config import Policy
from gateway.intake import Estimate
from gateway.usage.in_flight import InFlight
from gateway.usage.ledger import Ledger

__all__ = ["Spending"]

_UNCOUNTED = contextlib.nullcontext()


class Spending:
    """Budgets as the request path asks them: ``check`` before it waits, ``counted`` while
    it waits and runs."""

    def __init__(self, ledger: Ledger, admission: Admission) -> None:
        self._ledger = ledger
        self._admission = admission

    def check(self, policy: Policy, user: str) -> None:
        """The 429 when ``user``'s budget, or its front end's people's together, is used up."""
        if not policy.budgeted:
            return
        for account in _accounts(policy, user):
            budget = policy.budget_of(account)
            if not budget:
                continue
            in_flight = self._admission.in_flight(account)
            spent = self._ledger.refusal(account, budget, in_flight)
            if spent is not None:
                raise spent.error()

    def counted(
        self, policy: Policy, user: str, estimate: Estimate | None = None
    ) -> AbstractAsyncContextManager[None]:
        """A request counted (and its ``estimate`` of tokens reserved) against ``user``'s
        budget, and its front end's people's together, while it runs or waits."""
        if not policy.budgeted:
            return _UNCOUNTED
        counts = []
        for account in _accounts(policy, user):
            budget = policy.budget_of(account)
            if not budget:
                continue
            tokens = 0
            if estimate is not None and budget.tokens_per_day is not None:
                output = estimate.output_tokens or self._ledger.expected_output(user)
                tokens = estimate.prompt_tokens + output
            counts.append(InFlight(self._ledger, self._admission, budget, account, tokens))
        if not counts:
            return _UNCOUNTED
        return counts[0] if len(counts) == 1 else _all_of(counts)


@contextlib.asynccontextmanager
async def _all_of(counts: list[InFlight]) -> AsyncIterator[None]:
    """A person's count and their front end's people's together: the second entered only
    once the first is (its 429 gives the first back)."""
    async with contextlib.AsyncExitStack() as stack:
        for count in counts:
            await stack.enter_async_context(count)
        yield


def _accounts(policy: Policy, user: str) -> tuple[str, ...]:
    """Whose budgets a request of ``user`` spends: its own, and its front end's people's."""
    together = policy.together_of(user)
    return (user,) if together is None else (user, together[0])
