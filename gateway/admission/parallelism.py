"""How many requests a backend really runs at once, seen from outside: the check on a
``slots:`` that nobody else can check.

Ollama does not say its ``OLLAMA_NUM_PARALLEL`` (1 unless set), so the policy states it; an
admin who writes ``slots: 2`` in front of an Ollama that runs 1 has every second request
wait inside Ollama's own first-come queue, unseen by the fair scheduler. Ollama's reply
is no help on every release: before 0.30 its ``prompt_eval_duration`` ran from the
sequence's creation, before the runner's slot semaphore (runner/ollamarunner,
``NewSequence`` then ``seqsSem.Acquire``), so a wait for a slot read as a slow prompt (since,
it is llama-server's own prompt time). What the gateway sees for itself can tell, on any:

- a request sent while others ran on its slot group whose first byte came while every one
  of them still ran: the backend ran them side by side (``level``: it and those others);
- one whose first byte came only after one of them ended, more of its wait before that
  end than after: it waited for that one's slot, a sign the backend runs fewer.

``SERIAL_TO_CONCLUDE`` such signs at one level, and not one of the first kind, and the
backend is taken to run one fewer: it is sent no more until the policy's ``slots`` change,
its probes fail and recover (a restart), or ``RETEST_SECONDS`` pass and it is tried again.
Only for slots the policy states: a llama-server says its own (``/props``).

Pure: no I/O; the clock's times are passed in.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass

from gateway.admission.slot_ledger import SlotLedger
from gateway.admission.tickets import Ticket
from gateway.backends import Backend, RunsAtMost

__all__ = ["RETEST_SECONDS", "SERIAL_TO_CONCLUDE", "Parallelism"]

SERIAL_TO_CONCLUDE = 3
RETEST_SECONDS = 1800.0  # a finding stands this long; then the backend is tried again
_MIN_WAIT = 0.2  # seconds: a first byte sooner than this waited for nobody
_REMEMBERED = 256  # ended requests kept, for the requests that started beside them


@dataclass(slots=True)
class _Run:
    ticket: Ticket  # kept, so that its id stays unique while it is remembered
    backend: str  # key
    started: float
    beside: tuple[Ticket, ...]  # the requests running on its slot group when it started
    ended: float | None = None


class Parallelism:
    """What each backend has shown of how many requests it runs at once."""

    def __init__(self) -> None:
        self._runs: dict[int, _Run] = {}  # running, and the last ended, by ticket id
        self._ended: deque[int] = deque()
        self._serial: Counter[tuple[str, int]] = Counter()  # (backend, level) -> signs
        # backend -> the most requests seen running side by side, and when
        self._seen: dict[str, tuple[int, float]] = {}

    def started(self, ledger: SlotLedger, ticket: Ticket, backend: Backend, now: float) -> None:
        """``ticket``'s request was sent to ``backend`` at ``now`` (its slot already taken)."""
        if backend.configured_slots is None:
            return  # the backend says its slots itself
        found = backend.state.runs_at_most
        if found is not None and now - found.at >= RETEST_SECONDS:
            backend.state.runs_at_most = None  # tried again with every slot
        group = backend.group(ticket.model)
        beside: tuple[Ticket, ...] = ()
        if ledger.busy.get(group, 0) > 1:
            beside = tuple(
                held
                for held, name, _ in ledger.holders.values()
                if name == backend.name
                and held is not ticket
                and backend.group(held.model) == group
            )
        self._runs[id(ticket)] = _Run(ticket, backend.key, now, beside)

    def ended(self, ticket: Ticket, now: float) -> None:
        run = self._runs.get(id(ticket))
        if run is None or run.ended is not None:
            return
        run.ended = now
        self._ended.append(id(ticket))
        while len(self._ended) > _REMEMBERED:
            self._runs.pop(self._ended.popleft(), None)

    def first_byte(self, ticket: Ticket, backend: Backend, at: float) -> RunsAtMost | None:
        """The first byte of ``ticket``'s reply came at ``at``: what it shows. A new finding
        is returned (and kept in the backend's state), else None."""
        run = self._runs.get(id(ticket))
        if run is None or not run.beside or backend.configured_slots is None:
            return None
        others = [self._runs.get(id(t)) for t in run.beside]
        if any(o is None or o.ticket is not t for o, t in zip(others, run.beside, strict=True)):
            return None  # one is forgotten already: nothing to compare with
        level, key = len(run.beside) + 1, run.backend
        ends = [o.ended for o in others if o is not None and o.ended is not None and o.ended <= at]
        if not ends:  # every one still ran: side by side
            if level >= self._most_seen(key, at):
                self._seen[key] = (level, at)
            self._serial[key, level] = 0
            return None
        first_end = min(ends)
        if at - run.started < _MIN_WAIT or at - first_end > first_end - run.started:
            return None  # no wait to speak of, or most of it after that one ended
        self._serial[key, level] += 1
        if self._serial[key, level] < SERIAL_TO_CONCLUDE or self._most_seen(key, at) >= level:
            return None
        self._serial[key, level] = 0
        found = backend.state.runs_at_most
        if found is not None and found.runs <= level - 1:
            return None
        finding = RunsAtMost(backend.configured_slots, level - 1, at)
        backend.state.runs_at_most = finding
        return finding

    def _most_seen(self, key: str, now: float) -> int:
        """The most requests ``key`` was seen to run side by side lately (a restart with
        another setting makes older sightings moot)."""
        level, at = self._seen.get(key, (1, now))
        return level if now - at < RETEST_SECONDS else 1
