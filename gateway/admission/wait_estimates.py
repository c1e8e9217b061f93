"""How long a waiting request will wait, learned from how long requests hold their slots.

A request holds its slot for its prefill and its decode. The prefill is its prompt's
uncached part (``prompt_caches.py``) at the rate its engine has shown (tokens evaluated
over the time to the first byte); the decode a moving average for its backend, model and
class (a summary decodes for a minute, a quick question for two seconds: one average for
both is wrong for both). A wait is played out from these service times: the
running requests free their slots when their service time says (one already past it, a
fifth of it from now), and the requests ahead, in the order the room would dispatch them,
each take the earliest slot that serves their model, no sooner than their user's
``max_concurrent`` lets them. Heavy slots and swaps are left out.

Every estimate made when a request starts waiting is set against the wait it had; the
median of those errors is in /status, so that "starts in about" is a measured promise:
people's apart from background work's, whose wait hangs on when people come (it takes a
slot only where none runs), which no estimate can know.
"""

from __future__ import annotations

import heapq
import statistics
from collections import defaultdict, deque
from collections.abc import Iterable
from typing import TypeVar

from gateway.admission.cache_contents import BLOCK_BYTES, CHARS_PER_TOKEN, common_blocks
from gateway.admission.room_snapshot import EstimatesSnapshot, in_order
from gateway.admission.room_state import RoomState
from gateway.admission.tickets import Ticket, Waiter
from gateway.backends import Backend
from gateway.core import BACKGROUND, Lane, RequestClass

__all__ = ["WaitEstimates"]

_DEFAULT_SECONDS = 5.0  # until real requests have been timed
_PREFILL_RATE = 1000.0  # prompt tokens a second, until an engine has shown its own
_RATE_MIN_TOKENS = 64  # a prefill shorter than this is mostly overhead: no measure of rate
_ALPHA = 0.2  # weight of the newest observation in each moving average
_PAST_DUE = 0.2  # of its service time: how long a request past it is still expected to run
_SAMPLES = 256  # errors kept for the median
# A waiting prompt is compared with this many run before it, at most: the play runs for
# every status read, and a full room of long shared prompts must not make it slow.
_PROMPTS_COMPARED = 16
# A wait shorter than this is judged against it: 0.1 s promised and 0.3 s waited is no
# 200 % error to a person.
_ERROR_FLOOR = 1.0

_Key = tuple[str, str, RequestClass]
_K = TypeVar("_K")


class WaitEstimates:
    """Service times by backend, model and class; the waits played out from them."""

    def __init__(self) -> None:
        self.seconds = _DEFAULT_SECONDS  # any request's hold: what swap waits reckon with
        self._decode = _DEFAULT_SECONDS  # any request's decode
        self._timed = False  # the defaults above are guesses until the first is timed
        self._by_key: dict[_Key, float] = {}  # decode seconds
        self._by_model: dict[tuple[str, RequestClass], float] = {}
        self._rates: dict[str, float] = {}  # prefill tokens a second, by backend
        self._errors: dict[Lane, deque[float]] = {lane: deque(maxlen=_SAMPLES) for lane in Lane}

    def observe(
        self, backend: str, ticket: Ticket, held: float, evaluated: int | None, first: float | None
    ) -> None:
        """``ticket``'s request held its slot on ``backend`` for ``held`` seconds, its first
        byte ``first`` seconds in (its prefill, and a load if it caused one), and its
        engine evaluated ``evaluated`` prompt tokens (None: not said; as estimated)."""
        if first is None:
            tokens = ticket.input_tokens if evaluated is None else evaluated
            first = tokens / self.prefill_rate(backend)
        decode = max(0.0, held - first)
        if not self._timed:  # a guess is replaced, not averaged with: 5 s would linger
            self.seconds, self._decode, self._timed = held, decode, True
        self.seconds += _ALPHA * (held - self.seconds)
        self._decode += _ALPHA * (decode - self._decode)
        cls = ticket.request_class
        _average(self._by_key, (backend, ticket.model, cls), decode)
        _average(self._by_model, (ticket.model, cls), decode)

    def observe_prefill(self, backend: str, tokens: int, seconds: float) -> None:
        """``backend``'s engine evaluated ``tokens`` prompt tokens in ``seconds``."""
        if tokens >= _RATE_MIN_TOKENS and seconds > 0:
            _average(self._rates, backend, tokens / seconds)

    def prefill_rate(self, backend: str) -> float:
        return self._rates.get(backend, _PREFILL_RATE)

    def decode(self, backend: str, ticket: Ticket) -> float:
        """How long ``ticket``'s request will likely decode on ``backend``."""
        cls = ticket.request_class
        found = self._by_key.get((backend, ticket.model, cls))
        if found is None:
            found = self._by_model.get((ticket.model, cls), self._decode)
        return found

    def service(self, backend: str, ticket: Ticket, tokens: float | None = None) -> float:
        """How long ``ticket``'s request will likely hold a slot on ``backend``, evaluating
        ``tokens`` of its prompt (None: as estimated when it came)."""
        tokens = ticket.input_tokens if tokens is None else tokens
        return tokens / self.prefill_rate(backend) + self.decode(backend, ticket)

    def starts(self, room: RoomState, now: float) -> dict[int, float]:
        """Seconds until each waiting request likely starts, by ``id`` of its waiter."""
        play = _Play(self, room, now)
        return {id(waiter): play.start(waiter.ticket) for waiter in in_order(room)}

    def start_of(self, room: RoomState, now: float, ticket: Ticket, others: int = 0) -> float:
        """Seconds until ``ticket``'s request would start, were it to join now behind the
        requests waiting (people's behind people only) and ``others`` more (on the other
        replicas)."""
        play = _Play(self, room, now)
        for waiter in in_order(room):
            if ticket.lane is not BACKGROUND and waiter.ticket.lane is BACKGROUND:
                break
            play.start(waiter.ticket)
        for _ in range(others):
            play.start(ticket._replace(user=""))
        return play.start(ticket)

    def expect(self, room: RoomState, waiter: Waiter, now: float) -> None:
        """Note when ``waiter``, which has just joined, will likely start: played up to it,
        not beyond."""
        play = _Play(self, room, now)
        for other in in_order(room):
            start = play.start(other.ticket)
            if other is waiter:
                waiter.expected = start
                return

    def started(self, waiter: Waiter, now: float) -> None:
        """``waiter`` starts now: how far off its estimate was."""
        if waiter.expected is None:
            return
        waited = now - waiter.arrived
        error = abs(waiter.expected - waited) / max(waited, _ERROR_FLOOR)
        self._errors[waiter.ticket.lane].append(error)

    def snapshot(self) -> EstimatesSnapshot:
        people, background = self._errors[Lane.INTERACTIVE], self._errors[Lane.BACKGROUND]
        return EstimatesSnapshot(
            _median(people),
            len(people),
            dict(self._by_key),
            dict(self._rates),
            _median(background),
            len(background),
        )


def _median(errors: deque[float]) -> float | None:
    return statistics.median(errors) if errors else None


def _average(averages: dict[_K, float], key: _K, value: float) -> None:
    old = averages.get(key)
    averages[key] = value if old is None else old + _ALPHA * (value - old)


class _Play:
    """The room's slots and users played forward: when each slot frees (and each slot heavy
    requests may hold), when each user may start another request, until when people run on
    each slot group (background work starts only where none does, unless the policy lets
    it run beside them)."""

    def __init__(self, estimates: WaitEstimates, room: RoomState, now: float) -> None:
        self._estimates, self._room, self._now = estimates, room, now
        policy = room.policy
        self._heavy, self._beside = policy.classes.heavy, policy.lanes.background.beside_people
        self._backends = {b.name: b for b in room.pool.backends}
        self._frees: dict[str, list[float]] = {}  # slot group -> when each slot frees
        self._heavy_frees: dict[str, list[float]] = {}  # the same, of the heavy share
        self._ends: defaultdict[tuple[str, Lane], list[float]] = defaultdict(list)  # runs
        self._people: defaultdict[str, list[float]] = defaultdict(list)  # group -> ends
        self._light: defaultdict[str, list[float]] = defaultdict(list)  # people's light
        # Group -> the prompts run before, which its engine will hold: a request that
        # shares their start evaluates only the rest of its own.
        self._prompts: defaultdict[str, list[tuple[int, ...]]] = defaultdict(list)
        running: defaultdict[str, list[float]] = defaultdict(list)
        heavy: defaultdict[str, list[float]] = defaultdict(list)
        giving_way = room.giving_way  # background work that gives its slot up at once
        in_engine = room.slots.in_engine
        for ticket, name, started in room.slots.holders.values():
            started = in_engine.get(id(ticket), started)  # held by llama-server until then
            service = estimates.service(name, ticket)
            end = now + max(service - (now - started), _PAST_DUE * service)
            if giving_way and ticket.lane is BACKGROUND:
                end, giving_way = now, giving_way - 1
            backend = self._backends.get(name)
            if backend is not None:
                group = backend.group(ticket.model)
                running[group].append(end)
                if ticket.heavy:
                    heavy[group].append(end)
                self._ran(ticket, group, end)
                self._prompts[group].append(ticket.prefix.blocks)
            self._ends[ticket.user, ticket.lane].append(end)
        self._running, self._running_heavy = running, heavy

    def start(self, ticket: Ticket) -> float:
        """When ``ticket``'s request would start, after those played before it."""
        best: tuple[float, str, Backend] | None = None
        for backend in self._serving(ticket):
            at, group = self._earliest(ticket, backend)
            if best is None or at < best[0]:
                best = (at, group, backend)
        if best is None:
            return 0.0
        at, group, backend = best
        start = max(at, self._user_ready(ticket))
        end = start + self._estimates.service(backend.name, ticket, self._uncached(ticket, group))
        heapq.heapreplace(self._frees[group], end)
        if ticket.heavy:
            heapq.heapreplace(self._heavy_frees[group], end)
        self._ran(ticket, group, end)
        self._ends[ticket.user, ticket.lane].append(end)
        return start - self._now

    def _earliest(self, ticket: Ticket, backend: Backend) -> tuple[float, str]:
        """When a slot of ``backend`` could take ``ticket``'s request, and its slot group."""
        group, slots = backend.group(ticket.model), backend.slots
        at = max(self._now, self._heap(self._frees, self._running, group, slots)[0])
        if ticket.heavy:  # within the heavy share, after the light ones (or the gate's wait)
            share = self._heavy.slots_on(slots)
            at = max(at, self._heap(self._heavy_frees, self._running_heavy, group, share)[0])
            light = max(self._light.get(group, ()), default=self._now)
            at = max(at, min(light, self._now + self._heavy.wait_for_light))
        elif ticket.lane is BACKGROUND and not self._beside:
            at = max(at, max(self._people.get(group, ()), default=self._now))
        return at, group

    def _uncached(self, ticket: Ticket, group: str) -> float:
        """Tokens of ``ticket``'s prompt left to evaluate once those run before it on
        ``group`` are held: the first turns of a family sharing one front end's tools come
        together, and all but the first find the tools held when their turn comes."""
        prefix, before = ticket.prefix, self._prompts[group]
        if not prefix.blocks:
            return ticket.input_tokens
        recent = before[-_PROMPTS_COMPARED:]
        shared = max((common_blocks(blocks, prefix.blocks) for blocks in recent), default=0)
        before.append(prefix.blocks)
        rest = prefix.size * (1 - prefix.share(shared * BLOCK_BYTES)) / CHARS_PER_TOKEN
        return min(ticket.input_tokens, rest)

    def _heap(
        self, heaps: dict[str, list[float]], running: dict[str, list[float]], group: str, n: int
    ) -> list[float]:
        heap = heaps.get(group)
        if heap is None:
            ends = sorted(running.get(group, ()))
            heap = heaps[group] = ends + [self._now] * max(0, n - len(ends))
            heapq.heapify(heap)
        return heap

    def _ran(self, ticket: Ticket, group: str, end: float) -> None:
        if ticket.lane is not BACKGROUND:
            self._people[group].append(end)
            if not ticket.heavy:
                self._light[group].append(end)

    def _serving(self, ticket: Ticket) -> Iterable[Backend]:
        return self._room.pool.serving(ticket.api, ticket.model) or self._backends.values()

    def _user_ready(self, ticket: Ticket) -> float:
        """When the user is under their cap in the lane: with ``cap`` running, the
        earliest end."""
        if not ticket.user:
            return self._now
        ends = self._ends[ticket.user, ticket.lane]
        cap = self._room.caps(ticket.user, ticket.lane)[0]
        if len(ends) < cap:
            return self._now
        ends.sort()
        return ends[len(ends) - cap]
