"""The waiting room's bounds: which one a request would pass, asked before it joins the
room, as it joins, and before its body is even read (the quick no).

Questions put to a ``WaitingRoom``, as ``admission/turns.py`` and ``admission/room_snapshot.py``
put theirs:
they change no count of the room. Apart from the room, which joins, dispatches and
releases, so that what a full room refuses, and when a person's request is let in all the
same (background work gives way), reads in one place; the refusal's words and its
Retry-After are ``admission/refusals.py``'s.
"""

from __future__ import annotations

from gateway.admission.room_state import RoomState
from gateway.admission.tickets import Ticket
from gateway.admission.turns import free_backends
from gateway.core.vocabulary import Lane, Reason

__all__ = ["cannot_start", "over_bound", "refuses_unseen"]


def over_bound(room: RoomState, user: str, lane: Lane, joining: bool) -> Reason | None:
    """Which bound the room passes with this request in it (``joining``: not yet)."""
    return room.lines.over_bound(user, lane, extra=1 if joining else 0)


def cannot_start(room: RoomState, ticket: Ticket) -> bool:
    """Whether a request arriving now would have to wait."""
    return room.lines.at_cap(ticket.user, ticket.lane) or not free_backends(room, ticket)


def refuses_unseen(room: RoomState, user: str, lanes: tuple[Lane, ...]) -> Reason | None:
    """The bound a request of ``user`` would pass, when it would pass it whatever its
    body says: the user's own places are all taken, or no backend has a free slot.
    Checked before the body is read, so a user at cap cannot make the gateway read,
    and hold, body after body only to refuse each. Requests of the user still reading
    their bodies count as waiting. ``lanes``: those the request may turn out to be in
    (its lane may depend on its prompt); only what every one of them would refuse."""
    first = _refuses_unseen_in(room, user, lanes[0])
    if first is None or not all(_refuses_unseen_in(room, user, lane) for lane in lanes[1:]):
        return None
    return first


def _refuses_unseen_in(room: RoomState, user: str, lane: Lane) -> Reason | None:
    lines = room.lines
    if not lines.at_cap(user, lane) and room.slots.has_free_slot(room.pool.backends):
        return None  # it may start at once, whatever its waiting would pass: asked first
    reason = lines.over_bound(user, lane, extra=1 + lines.arriving.get(user, 0))
    if reason is Reason.GATEWAY_BUSY and lane is Lane.INTERACTIVE and lines.background:
        return None  # a person's request would displace background work
    return reason
