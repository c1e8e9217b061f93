"""Turning away requests that already wait: a revoked key, a shutdown, displaced background work.

The refusal is set as the exception of the waiter's turn, the future its ``acquire`` awaits
(``admission/local.py``), which returns it as the outcome: the request leaves with its 401 or
503 at once rather than at the end of its ``max_wait``. Running requests are not touched:
a reload promises that they finish.
"""

from __future__ import annotations

from collections.abc import Callable

from gateway.admission.refusals import Refusal
from gateway.admission.room import WaitingRoom
from gateway.admission.tickets import Ticket
from gateway.core.vocabulary import Reason

__all__ = ["REVOKED", "TurnedAway", "turn_away"]


class TurnedAway(Exception):
    """The request was refused while it waited (its key was revoked, or a shutdown)."""

    def __init__(self, refusal: Refusal) -> None:
        super().__init__(refusal.message)
        self.refusal = refusal


REVOKED = Refusal(
    Reason.KEY_REVOKED,
    "this key or user was removed from the policy while the request waited",
    retry_after=0.0,
    status=401,
)


def turn_away(room: WaitingRoom, refused: Callable[[Ticket], bool], refusal: Refusal) -> None:
    """Refuse with ``refusal`` every waiting request, of either lane, whose ticket is
    ``refused``; their places go to whoever waits behind them. (Background work too: a
    revoked key's title generation must not run later, nor make a shutdown wait.)"""
    for queue in [*room.waiting.values(), *room.background.values()]:
        for waiter in list(queue):
            if not waiter.turn.done() and refused(waiter.ticket):
                room.leave(waiter)
                waiter.turn.set_exception(TurnedAway(refusal))
    room.dispatch()
