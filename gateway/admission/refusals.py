"""Saying no: the refusal's words and when to try again.

Retry-After is an estimate of when the request would start, were it to wait: the
requests ahead (here and on the other replicas) played out on the slots that serve them,
each holding its slot for the service time learned for its backend, model and class
(``wait_estimates.py``). The same figure is said in words, for chat front ends that show
the text and not the header.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from gateway.admission.room import WaitingRoom
from gateway.admission.room_state import RoomState
from gateway.admission.tickets import Ticket
from gateway.admission.wait_estimates import WaitEstimates
from gateway.config import key_of
from gateway.core import GatewayError, Lane, Reason, retry_after_header
from gateway.swaps import SwapWait

__all__ = ["REVOKED", "Refusal", "Refuse", "TurnedAway", "refusal", "turn_away"]

_MAX_RETRY_AFTER = 600.0
# Sooner than this, a retry finds the room as it left it: the slot it would take is not
# free yet, or just taken by the next in line.
_MIN_RETRY_AFTER = 1.0


@dataclass(frozen=True, slots=True)
class Refusal:
    """The request will not run; ``retry_after`` is when a slot is likely, in seconds."""

    reason: Reason
    message: str
    retry_after: float
    status: int = 503
    close: bool = False  # the connection is closed after the answer (a stop's)

    def error(self) -> GatewayError:
        """The answer to the client: Retry-After with a 429 or a 503 (when to come back
        means something then), not with a 401."""
        retry_after = self.retry_after if self.status in (429, 503) else None
        return GatewayError(self.status, self.reason, self.message, retry_after, self.close)


class Refuse(Protocol):
    """How admission's parts refuse a ticket: the admission fills in what only it knows
    (how long slots are held, how many wait on the other replicas)."""

    def __call__(self, reason: Reason, ticket: Ticket, swap: SwapWait | None = None) -> Refusal: ...


def refusal(
    reason: Reason,
    ticket: Ticket,
    room: RoomState,
    waits: WaitEstimates,
    others_waiting: int,
    swap: SwapWait | None = None,
) -> Refusal:
    """The refusal of a request that is not (or no longer) in the waiting room; ``swap``:
    it waited for its model to be swapped in (its drain and load are the wait to come)."""
    policy, user, lane = room.policy, ticket.user, ticket.lane
    # People go before background work, which gives way to them: only people are ahead.
    waiting_ahead = room.depth if lane is Lane.BACKGROUND else _people_waiting(room)
    ahead = waiting_ahead + others_waiting
    if reason is Reason.USER_QUEUE_FULL:
        said = _queue_full(room, user, lane)
    else:
        said = (
            f"the gateway is busy: {ahead} requests waiting ahead of you (max_depth "
            f"{policy.queue.max_depth})"
            if reason is Reason.GATEWAY_BUSY
            else f"no slot freed within max_wait {policy.max_wait_of(lane):g}s; {ahead} still "
            "waiting ahead of you"
        )
    starts_in = waits.start_of(room, room.clock(), ticket, others_waiting)
    retry_after = min(max(starts_in, _MIN_RETRY_AFTER), _MAX_RETRY_AFTER)
    if swap is not None:
        said = f"{said}: {swap.said}"
        retry_after = min(max(retry_after, swap.seconds), _MAX_RETRY_AFTER)
    # In words as well as in Retry-After: chat front ends show the text, not the header.
    message = f"{said}; try again in about {retry_after_header(retry_after)} s"
    return Refusal(reason, message, retry_after)


def _queue_full(room: RoomState, user: str, lane: Lane) -> str:
    """Whose places are all taken: the user's own, or its front end's people's together."""
    lines = room.lines
    queued = room.caps(user, lane)[1]
    waiting = len(room.queues(lane).get(user, ()))
    arriving = lines.arriving.count.get(user, 0)
    together = room.policy.together_of(user) if lane is Lane.INTERACTIVE else None
    own_full = waiting >= queued or lines.holds_all_it_may(user, lane, arriving)
    if not own_full and together is not None:
        front_end = key_of(user)
        return (
            f"the people of {front_end} already have "
            f"{lines.together_running(front_end)} running, "
            f"{lines.together_waiting(front_end)} waiting and "
            f"{lines.arriving.together(front_end)} on their way together "
            f"(on_behalf.total: max_concurrent {together[1].max_concurrent}, "
            f"max_queued {together[1].max_queued})"
        )
    work = "background work" if lane is Lane.BACKGROUND else "user"
    on_the_way = f" and {arriving} more on their way" if arriving else ""
    return (
        f"{work} {user} already has {room.runs(lane)[user]} running and {waiting} "
        f"waiting{on_the_way} (max_queued {queued})"
    )


# Turning away requests that already wait: a revoked key, a shutdown, displaced background work.
#
# The refusal is set as the exception of the waiter's turn, the future its ``acquire`` awaits
# (``local.py``), which returns it as the outcome: the request leaves with its 401 or
# 503 at once rather than at the end of its ``max_wait``. Running requests are not touched:
# a reload promises that they finish.


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


def _people_waiting(room: RoomState) -> int:
    return sum(len(queue) for queue in room.waiting.values())
