"""What the waiting room knows of a request: its ticket, and the waiter that stands for it.

Every part of the room (the slot ledger, the user queues, the turns, the snapshot) speaks of
requests in these two words.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import NamedTuple

from gateway.admission.prompt_caches import NO_PREFIX, Prefix
from gateway.admission.scheduler import Candidate
from gateway.backends import Backend
from gateway.config import background_account
from gateway.core import BACKGROUND, Api, Lane, RequestClass
from gateway.swaps import RESIDENT, Placement

__all__ = ["Ticket", "Waiter"]


class _TicketFields(NamedTuple):
    user: str
    model: str
    api: Api
    input_tokens: float  # estimated prompt tokens, charged at dispatch
    request_class: RequestClass
    class_weight: float
    credential: str  # how the user was identified (identity.Caller), for revocation
    lane: Lane
    num_ctx: int | None  # the options.num_ctx forwarded (Ollama loads with it)
    # Of its request class; computed once, as the room asks it at every take and release.
    heavy: bool
    restarts: int  # times it gave its slot to a person and ran again (background work)
    prefix: Prefix  # its prompt in hashed blocks, for the engines' prompt caches


class Ticket(_TicketFields):
    """What admission needs to know about a request.

    Immutable, and a tuple: one is made for every request, and a tuple is built in one
    step where a frozen dataclass sets each field through ``object.__setattr__``. Built by
    keyword beyond who, what and which API."""

    __slots__ = ()

    def __new__(
        cls,
        user: str,
        model: str,
        api: Api,
        *,
        input_tokens: float = 0.0,
        request_class: RequestClass = RequestClass.LIGHT,
        class_weight: float = 1.0,
        credential: str = "",
        lane: Lane = Lane.INTERACTIVE,
        num_ctx: int | None = None,
        restarts: int = 0,
        prefix: Prefix = NO_PREFIX,
    ) -> Ticket:
        heavy = request_class is RequestClass.HEAVY
        return tuple.__new__(
            cls,
            (
                user,
                model,
                api,
                input_tokens,
                request_class,
                class_weight,
                credential,
                lane,
                num_ctx,
                heavy,
                restarts,
                prefix,
            ),
        )

    @property
    def payer(self) -> str:
        """Who its fair share is charged to: the user, or for background work the front
        end's background account (never the person whose chat caused it)."""
        return background_account(self.user) if self.lane is BACKGROUND else self.user

    def restarted(self) -> Ticket:
        """This request again, after it gave its slot to a person (a new identity in the
        room: the slot ledger knows a running request by its ticket)."""
        return self._replace(restarts=self.restarts + 1)


@dataclass(eq=False, slots=True)
class Waiter:
    """A request in the room; ``turn`` resolves to its backend when it is dispatched."""

    ticket: Ticket
    candidate: Candidate
    arrived: float
    turn: asyncio.Future[Backend]
    position: int = 0  # where it stood in the room when it arrived (0: it started at once)
    placement: Placement = RESIDENT  # how its dispatch found the model (swaps/planner.py)
    expected: float | None = None  # seconds it was expected to wait, when it joined
