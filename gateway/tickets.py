"""What the waiting room knows of a request: its ticket, and the waiter that stands for it.

Apart from the room so that its parts (the slot ledger, the user queues, the turns) and its
snapshot can name them without importing the room, which imports them all.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from gateway.backends.pool import Backend
from gateway.scheduler import Candidate
from gateway.swaps import RESIDENT, Placement
from gateway.vocabulary import Api, Lane, RequestClass

__all__ = ["Ticket", "Waiter"]


@dataclass(frozen=True, slots=True)
class Ticket:
    """What admission needs to know about a request."""

    user: str
    model: str
    api: Api
    input_tokens: float = 0.0  # estimated prompt tokens, charged at dispatch
    request_class: RequestClass = RequestClass.LIGHT
    class_weight: float = 1.0
    credential: str = ""  # how the user was identified (identity.Caller), for revocation
    lane: Lane = Lane.INTERACTIVE
    num_ctx: int | None = None  # the options.num_ctx forwarded (Ollama loads with it)
    # Of its request class; computed once, as the room asks it at every take and release.
    heavy: bool = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "heavy", self.request_class is RequestClass.HEAVY)


@dataclass(eq=False, slots=True)
class Waiter:
    """A request in the room; ``turn`` resolves to its backend when it is dispatched."""

    ticket: Ticket
    candidate: Candidate
    arrived: float
    turn: asyncio.Future[Backend]
    position: int = 0  # where it stood in the room when it arrived (0: it started at once)
    placement: Placement = RESIDENT  # how its dispatch found the model (swaps.py)
