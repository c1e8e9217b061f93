"""The permit: a held turn, charged as its reply streams, corrected, released once.

The request handler holds it with ``async with`` while the request runs; leaving the block
releases the turn, which wakes the waiters. It knows the admission that granted it only as
``Issuer``: the few things a permit needs of whoever issues it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from types import TracebackType
from typing import Protocol

from gateway.admission.holds.base import Hold
from gateway.admission.parallelism import Parallelism
from gateway.admission.prompt_caches import SlotCopy
from gateway.admission.room import WaitingRoom
from gateway.admission.tickets import Ticket, Waiter
from gateway.backends import Backend, RunsAtMost
from gateway.core import BACKGROUND
from gateway.swaps import Placement

__all__ = ["Issuer", "Permit"]


class Issuer(Protocol):
    """What a permit needs of the admission that granted it."""

    @property
    def room(self) -> WaitingRoom: ...

    @property
    def clock(self) -> Callable[[], float]: ...

    @property
    def parallelism(self) -> Parallelism: ...

    def release(self, permit: Permit) -> None: ...


class Permit:
    """A held turn: one of the user's running places and one backend slot.

    Use it with ``async with``; leaving the block releases both, on every path, and lets
    the next waiting request in.
    """

    __slots__ = (
        "_admission",
        "_giving_way",
        "_released",
        "_waits_in_engine",
        "backend",
        "engine_slot",
        "evaluated",
        "first_byte_after",
        "granted_at",
        "hold",
        "output_charged",
        "placement",
        "preempted",
        "queue_position",
        "queue_wait",
        "slot_copy",
        "ticket",
        "weight",
        "withdrawn",
    )

    def __init__(
        self,
        admission: Issuer,
        ticket: Ticket,
        backend: Backend,
        placement: Placement,
        weight: float,
        granted_at: float,
        queue_wait: float = 0.0,
        queue_position: int = 0,
    ) -> None:
        """``weight``: its candidate's; ``queue_wait`` and ``queue_position``: 0 when it
        started at once (``queued`` makes the permit of a request that waited)."""
        self._admission = admission
        self._released = False
        self._giving_way = False  # counted in ``Preemptions.giving_way`` until it leaves
        self.ticket = ticket
        self.weight = weight
        self.backend = backend
        self.granted_at = granted_at
        self.queue_wait = queue_wait
        self.queue_position = queue_position
        self.output_charged = 0.0
        self.withdrawn = False  # given back unused: another replica's request goes first
        self.hold: Hold | None = None  # the claim in the hold store, once confirmed
        self.placement = placement  # how it finds its model: held, loaded, swapped
        self.engine_slot: int | None = None  # llama-server's slot, when the gateway chose it
        self.slot_copy: SlotCopy | None = None  # of its slot's prompt, to make before it goes
        self._waits_in_engine = False  # for that slot: its first byte is no prefill's time
        self.evaluated: int | None = None  # prompt tokens its engine evaluated, once it says
        self.first_byte_after: float | None = None  # seconds from its grant to its reply
        # Resolved when background work gives its slot to a person (preemption.py); None
        # for people's requests, and for work whose reply has begun or may not give way.
        self.preempted: asyncio.Future[None] | None = None
        admission.parallelism.started(admission.room.slots, ticket, backend, granted_at)
        if ticket.lane is BACKGROUND:
            room = admission.room
            if ticket.restarts < room.policy.lanes.background.max_restarts:
                self.preempted = asyncio.get_running_loop().create_future()
                room.preemptions.add(self)
                # Granted from the queue, a person may have started beside it meanwhile.
                room.give_way()

    @classmethod
    def queued(cls, admission: Issuer, waiter: Waiter, backend: Backend) -> Permit:
        """The permit of ``waiter``, whose turn came in the room (on ``backend``)."""
        now = admission.clock()
        ticket, placement, weight = waiter.ticket, waiter.placement, waiter.candidate.weight
        return cls(
            admission,
            ticket,
            backend,
            placement,
            weight,
            now,
            now - waiter.arrived,
            waiter.position,
        )

    def add_output(self, tokens: float) -> None:
        """Charge tokens as they stream, so a long reply counts before it ends."""
        self.output_charged += tokens
        self._admission.room.ordering.on_output(self.ticket.payer, self.weight, tokens)

    def pin(self) -> int | None:
        """The llama-server slot this request goes to (``id_slot``), or None: where its
        wait and its prefill together take least (``PromptCaches.pin``)."""
        room, backend = self._admission.room, self.backend
        self.unpin()  # a request moved to another backend leaves its first slot
        waits, now = room.waits, self._admission.clock()
        decode, rate = waits.decode(backend.name, self.ticket), waits.prefill_rate(backend.name)
        pinned = room.prompts.pin(backend, self.ticket.prefix, now, decode, rate)
        if pinned is not None:
            self.engine_slot, self._waits_in_engine, self.slot_copy, starts = pinned
            if self._waits_in_engine:
                room.slots.in_engine[id(self.ticket)] = starts
        return self.engine_slot

    def take_copy(self) -> SlotCopy | None:
        """The copy ``pin`` planned, to be made once (``backends/watch/slot_copies.py``)."""
        copy, self.slot_copy = self.slot_copy, None
        return copy

    def copied(
        self, backend: Backend, copy: SlotCopy, seconds: float | None, unsupported: bool
    ) -> None:
        """The copy ``pin`` planned on ``backend`` took ``seconds`` (None: failed)."""
        now = self._admission.clock()
        self._admission.room.prompts.copied(backend, copy, seconds, unsupported, now)

    def unpin(self) -> None:
        if self.engine_slot is not None:
            room = self._admission.room
            room.prompts.unpin(self.backend, self.engine_slot)
            room.slots.in_engine.pop(id(self.ticket), None)
            self.engine_slot = None

    def settle(
        self,
        prompt_tokens: int | None,
        cached_tokens: int | None,
        output_tokens: int | None,
        *,
        answered: bool = True,
        prefill_seconds: float | None = None,
    ) -> None:
        """Correct the charges with the backend's own counts, when it reported them: the
        prompt by what its engine evaluated (its cache read the rest). ``answered``: the
        engine took the prompt (not an error), and holds it in its cache now;
        ``prefill_seconds``: from its dispatch to its first byte."""
        room, ticket = self._admission.room, self.ticket
        self.first_byte_after = prefill_seconds
        if prompt_tokens is not None:
            predicted, held = room.prompts.matched(self.backend, ticket.prefix)
            if cached_tokens is None:  # the engine does not say: as estimated
                cached_tokens = int(prompt_tokens * ticket.prefix.share(held))
            evaluated = prompt_tokens - min(cached_tokens, prompt_tokens)
            self.evaluated = evaluated
            room.ordering.on_correction(ticket.payer, self.weight, evaluated - ticket.input_tokens)
            if answered:
                engine_share = cached_tokens / prompt_tokens if prompt_tokens else None
                self._learn(predicted, engine_share, prefill_seconds)
        if output_tokens is not None:
            self.add_output(output_tokens - self.output_charged)

    def replied(self, first_byte: float | None) -> RunsAtMost | None:
        """The reply's first byte came at ``first_byte`` (None: none came): a finding that
        the backend runs fewer requests at once than its slots, if this reply completes
        one (``parallelism.py``)."""
        if first_byte is None:
            return None
        return self._admission.parallelism.first_byte(self.ticket, self.backend, first_byte)

    def _learn(self, predicted: int, engine_share: float | None, prefill: float | None) -> None:
        """What the engine holds now (this prompt), and how fast it evaluated it
        (``prefill`` seconds to the first byte)."""
        room, backend, prefix = self._admission.room, self.backend, self.ticket.prefix
        if self.placement.loads:  # its engine started with an empty cache
            room.prompts.emptied(backend)
            predicted = 0
        room.prompts.evaluated(backend, prefix, predicted, engine_share, self.engine_slot)
        if prefill is not None and not self._waits_in_engine and not self.placement.loads:
            room.waits.observe_prefill(backend.name, self.evaluated or 0, prefill)

    def refused_by_backend(self, status: int) -> None:
        """The backend answered with the error ``status``, saying no load
        (``SwapPlanner.refused``)."""
        room, ticket, backend = self._admission.room, self.ticket, self.backend
        alone = room.slots.busy.get(backend.group(ticket.model), 0) <= 1  # this one
        room.swaps.refused(ticket.user, backend, ticket.model, self.placement, alone, status)

    def answered(self) -> None:
        """The backend took the request (``SwapPlanner.answered``)."""
        self._admission.room.swaps.answered(self.backend, self.ticket.model, self.placement)

    def loaded(self, seconds: float | None, first_byte: float | None = None) -> None:
        """The reply says its model took ``seconds`` to load. If this request caused the
        load (a load, swap or reload), its user pays for the time (``costs.load``
        generated tokens a second) and the time is remembered for the next estimates.
        The router says nothing of its loads: there, the wait for the ``first_byte`` of a
        request that loaded its model (its unloads, its load, its prompt: the swap's price)."""
        if seconds is None and first_byte is not None and self.backend.router:
            seconds = first_byte - self.granted_at
        if seconds is None or not self.placement.loads:
            return
        room = self._admission.room
        room.swaps.loaded(self.backend, self.ticket.model, seconds)
        tokens = room.policy.costs.load * seconds
        room.ordering.on_output(self.ticket.payer, self.weight, tokens)

    @property
    def released(self) -> bool:
        return self._released

    @property
    def gave_way(self) -> bool:
        """Whether it gave its slot to a person (its hold is no measure of a reply's)."""
        return self.preempted is not None and self.preempted.done()

    def begin_reply(self) -> bool:
        """The reply is about to go out to the client: from now on it keeps its slot. False
        if it gave the slot up already (the reply must not go out)."""
        preempted = self.preempted
        if preempted is None:
            return True
        if preempted.done():
            return False
        self._admission.room.preemptions.discard(self)
        self.preempted = None
        return True

    def preempt(self) -> None:
        """Give the slot up now, for a person (the room's call, ``Preemptions.preempt``):
        released here, once; the request's handler sees ``preempted`` resolve."""
        preempted = self.preempted
        if preempted is None or preempted.done() or self._released:
            return
        preempted.set_result(None)
        self._giving_way = True
        self._admission.room.preemptions.giving_way[self.ticket.user] += 1
        self.release()

    async def __aenter__(self) -> Permit:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._giving_way:  # it gave way, and now leaves: it waits again, or ends
            self._left()
        if not self._released:  # as ``release`` does, without a call more on every request
            self._released = True
            if self.preempted is not None:
                self._admission.room.preemptions.discard(self)
            self._admission.release(self)

    def withdraw(self) -> None:
        """Give back a turn the house did not confirm (``admission/replicas.py``): its
        prompt's charge is taken back, and its moment in the slot is no run to learn from."""
        if self._giving_way:  # given way before it was confirmed: never used, it leaves
            self._left()
        if self._released:
            return
        self.withdrawn = True
        room, ticket = self._admission.room, self.ticket
        room.ordering.on_correction(ticket.payer, self.weight, -ticket.input_tokens)
        self.release()

    def _left(self) -> None:
        self._giving_way = False
        giving_way = self._admission.room.preemptions.giving_way
        giving_way[self.ticket.user] -= 1
        if giving_way[self.ticket.user] <= 0:
            del giving_way[self.ticket.user]

    def release(self) -> None:
        """Give the turn back, once: a second call (the block's exit after an explicit
        release) does nothing."""
        if not self._released:
            self._released = True
            if self.preempted is not None:
                self._admission.room.preemptions.discard(self)
            self._admission.release(self)
