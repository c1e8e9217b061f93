"""Each user's lines in the waiting room: who waits and who runs, in both lanes, and the caps
and bounds that keep them short.

Two lanes (``intake/lanes.py``): each user has an interactive and a background queue, with their
own bounds: ``max_concurrent`` and ``max_queued`` of the user for a person's requests,
``lanes.background`` for the work a front end does meanwhile. ``queue.max_depth`` bounds
both lanes together. Synchronous and without I/O, like the room that holds these lines.
"""

from __future__ import annotations

import itertools
from collections import Counter, deque
from collections.abc import Iterator

from gateway.admission.arriving import ArrivingBodies
from gateway.admission.slot_ledger import decrement, increment
from gateway.admission.tickets import Ticket, Waiter
from gateway.config import Limits, Policy, key_of
from gateway.core import BACKGROUND, Lane, Reason

__all__ = ["UserQueues"]


class UserQueues:
    """The waiting and running requests of each user, by lane; their caps and bounds."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy  # the room's: ``WaitingRoom.reconfigure`` sets both
        self.depth = 0  # waiting requests of both lanes: 0 exactly when both are empty
        self.waiting: dict[str, deque[Waiter]] = {}  # interactive, by user
        self.background: dict[str, deque[Waiter]] = {}  # background, by user
        self.running: Counter[str] = Counter()  # interactive, by user
        self.background_running: Counter[str] = Counter()
        # Requests past the quick refusal that are still reading their bodies, by user.
        self.arriving = ArrivingBodies()
        # The running and waiting requests of the people a front end names, again, by front
        # end (``owui`` for ``owui/alice``); with its own, what ``on_behalf.total`` bounds.
        self.people_running: Counter[str] = Counter()
        self.people_waiting: Counter[str] = Counter()

    def queues(self, lane: Lane) -> dict[str, deque[Waiter]]:
        """The waiting requests of ``lane``, by user."""
        return self.background if lane is BACKGROUND else self.waiting

    def runs(self, lane: Lane) -> Counter[str]:
        """The running requests of ``lane``, by user."""
        return self.background_running if lane is BACKGROUND else self.running

    def caps(self, user: str, lane: Lane) -> tuple[int, int]:
        """(max_concurrent, max_queued) of ``user`` in ``lane``."""
        if lane is BACKGROUND:
            background = self.policy.lanes.background
            return background.max_concurrent, background.max_queued
        limits = self.policy.limits_of(user)
        return limits.max_concurrent, limits.max_queued

    def at_cap(self, user: str, lane: Lane, limits: Limits | None = None) -> bool:
        """Whether ``user`` already runs as many requests of ``lane`` as it may (``limits``:
        the user's, when looked up already)."""
        # ``caps``' first, read without the pair: asked twice of every request.
        if lane is BACKGROUND:
            return (
                self.background_running.get(user, 0) >= self.policy.lanes.background.max_concurrent
            )
        if limits is None:
            limits = self.policy.limits_of(user)
        if self.running.get(user, 0) >= limits.max_concurrent:
            return True
        if not self.policy.bounds_people_together:  # nearly every house
            return False
        together = self.policy.together_of(user)
        if together is None or together[1].max_concurrent is None:
            return False
        return self.together_running(key_of(user)) >= together[1].max_concurrent

    def over_bound(self, user: str, lane: Lane, extra: int) -> Reason | None:
        """Which bound the lines pass with ``extra`` more requests of ``user`` waiting."""
        if len(self.queues(lane).get(user, ())) + extra > self.caps(user, lane)[1]:
            return Reason.USER_QUEUE_FULL
        if lane is not BACKGROUND and self.together_full(user, extra):
            return Reason.USER_QUEUE_FULL
        if self.depth + extra > self.policy.queue.max_depth:
            return Reason.GATEWAY_BUSY
        return None

    def holds_all_it_may(self, user: str, lane: Lane, arriving: int) -> bool:
        """Whether ``user``'s requests of ``lane`` running and waiting, with ``arriving``
        more still reading their bodies, already take every place the user has
        (``max_concurrent`` + ``max_queued``)."""
        running, queued = self.caps(user, lane)
        held = self.runs(lane).get(user, 0) + len(self.queues(lane).get(user, ()))
        return held + arriving >= running + queued

    def together_holds_all(self, user: str) -> bool:
        """Whether the people of ``user``'s front end, running, waiting and with bodies on
        their way, already take every place its total gives them together."""
        if not self.policy.bounds_people_together:
            return False
        together = self.policy.together_of(user)
        if together is None or together[1].max_concurrent is None:
            return False
        places = together[1].max_concurrent + (together[1].max_queued or 0)
        key = key_of(user)
        held = self.together_running(key) + self.together_waiting(key)
        return held + self.arriving.together(key) >= places

    def together_full(self, user: str, extra: int) -> bool:
        """Whether ``extra`` more requests of ``user`` waiting would pass its front end's
        bound on its people's waiting requests together (``on_behalf.total.max_queued``)."""
        together = self.policy.together_of(user)
        if together is None or together[1].max_queued is None:
            return False
        return self.together_waiting(key_of(user)) + extra > together[1].max_queued

    def together_running(self, front_end: str) -> int:
        """The interactive requests running with ``front_end``'s key: its people's, its own."""
        return self.people_running.get(front_end, 0) + self.running.get(front_end, 0)

    def together_waiting(self, front_end: str) -> int:
        """The interactive requests waiting with ``front_end``'s key: its people's, its own."""
        return self.people_waiting.get(front_end, 0) + len(self.waiting.get(front_end, ()))

    def waiters(self) -> Iterator[Waiter]:
        """Every waiting request, interactive first; with the ones whose turn is done (a
        cancelled request stays until its task removes it)."""
        queues = (*self.waiting.values(), *self.background.values())
        return itertools.chain.from_iterable(queues)  # no Python frame per request

    def add(self, waiter: Waiter) -> None:
        """``waiter`` joins the end of its user's queue in its lane."""
        user, lane = waiter.ticket.user, waiter.ticket.lane
        self.queues(lane).setdefault(user, deque()).append(waiter)
        self.depth += 1
        if lane is not BACKGROUND and (key := key_of(user)) is not user:
            increment(self.people_waiting, key)

    def remove(self, waiter: Waiter) -> bool:
        """Take ``waiter`` out of its queue; False if it was not in it (already gone)."""
        user, queues = waiter.ticket.user, self.queues(waiter.ticket.lane)
        queue = queues.get(user)
        if queue is None or waiter not in queue:
            return False
        queue.remove(waiter)
        self.depth -= 1
        if waiter.ticket.lane is not BACKGROUND and (key := key_of(user)) is not user:
            decrement(self.people_waiting, key)
        if not queue:
            del queues[user]  # users without waiting requests are not looked at by dispatch
        return True

    def started(self, ticket: Ticket) -> None:
        """``ticket``'s request runs: it takes one of its user's places in its lane."""
        # ``increment`` of ``runs``, written out: every request starts here.
        if ticket.lane is BACKGROUND:
            runs = self.background_running
        else:
            runs = self.running
            if (key := key_of(ticket.user)) is not ticket.user:
                increment(self.people_running, key)
        runs[ticket.user] = runs.get(ticket.user, 0) + 1

    def ended(self, ticket: Ticket) -> None:
        """``ticket``'s request ended: its user's place in its lane is free again."""
        decrement(self.runs(ticket.lane), ticket.user)
        if ticket.lane is not BACKGROUND and (key := key_of(ticket.user)) is not ticket.user:
            decrement(self.people_running, key)

    def idle(self, user: str) -> bool:
        """Whether ``user`` has nothing waiting and nothing running, in either lane."""
        return (
            user not in self.waiting
            and user not in self.background
            and user not in self.running
            and user not in self.background_running
        )

    def newest_background(self) -> Waiter | None:
        """The background request that came last: the first to go when a person needs room."""
        waiting = [w for queue in self.background.values() for w in queue if not w.turn.done()]
        return max(waiting, key=lambda waiter: waiter.candidate.seq, default=None)
