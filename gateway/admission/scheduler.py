"""Which waiting request gets a freed slot: the ordering policies (pure: no I/O, no clock).

Admission offers, for each user who could run something now, that user's first eligible
waiting request; the ordering picks one. FIFO is what Ollama and llama.cpp do themselves.

Fair is the Virtual Token Counter (VTC) of Sheng et al., "Fairness in Serving Large Language
Models", OSDI 2024 (https://arxiv.org/abs/2401.00588): each user has a counter of the service
it received, in weighted tokens divided by its weight. Time is virtual: the counters move
only when tokens are charged. Among the candidates, the one whose counter would be smallest
once its prompt is charged goes next: its virtual finish time, as in weighted fair queueing
(Demers, Keshav, Shenker, SIGCOMM 1989; WF2Q, Bennett and Zhang, INFOCOM 1996), where VTC
compares the counters alone, before the charge.

Why the finish: users who come back to the waiting room are lifted to the counter of the
least-served user waiting, so a returning user with a short question and a heavy user
waiting with a long prompt often start level. Compared at the start, they tie and go in
arrival order, and the question waits for a prefill of thousands of tokens. Compared at the
finish, the question goes first; the long prompt goes as soon as the question's user's
counter has caught up with its own finish, so it waits at most its own cost's worth of
others' service (the bound in tests/test_scheduler.py).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import NamedTuple, Protocol

__all__ = ["Candidate", "Fair", "Fifo", "Ordering"]


class _CandidateFields(NamedTuple):
    seq: int  # arrival order, unique and increasing
    user: str
    weight: float  # the user's weight times the request class's weight
    input_tokens: float  # estimated prompt tokens of this request


class Candidate(_CandidateFields):
    """A waiting request as the ordering sees it.

    Immutable, as a frozen dataclass would be, but a tuple: one is made for every request,
    where a frozen dataclass sets each field through ``object.__setattr__``."""

    __slots__ = ()

    def __new__(cls, seq: int, user: str, weight: float, input_tokens: float) -> Candidate:
        # Charges are divided by the weight: zero would divide by zero, a negative weight
        # would turn service into credit.
        if not weight > 0:
            raise ValueError(f"a candidate's weight must be > 0, not {weight!r}")
        return tuple.__new__(cls, (seq, user, weight, input_tokens))


class Ordering(Protocol):
    """What admission tells the ordering, and the one question it asks it."""

    def choose(self, candidates: Sequence[Candidate]) -> Candidate:
        """The request to run next, one of ``candidates``.

        ``candidates`` is never empty and holds at most one request per user: that user's
        first eligible one, so each user's own requests keep their arrival order.
        """

    def on_arrival(self, user: str, active_users: Collection[str]) -> None:
        """A request of ``user`` starts waiting, and ``user`` had none waiting before.

        ``active_users``: the other users with requests waiting now, as in the paper. Call
        it even if ``user`` has requests running, or a user who never goes idle keeps the
        credit of its quiet stretches and a burst spends it. Leave out users who only have
        requests running, or newcomers lifted to a light user's low counter pass it on, and
        a burst at that level delays the backlogged users for as long as that has gone on.
        Either way the wait bound in tests/test_scheduler.py no longer holds.
        """

    def on_dispatch(self, candidate: Candidate) -> None:
        """``candidate`` was given a slot."""

    def cost(self, weight: float, input_tokens: float) -> float:
        """What a request's prompt adds to its user's finish tag in a house of several
        replicas (``holds/scripts.py`` keeps the tags): 0 where arrival decides."""

    def on_output(self, user: str, weight: float, tokens: float) -> None:
        """``tokens`` more output tokens streamed (negative: a correction downwards)."""

    def on_correction(self, user: str, weight: float, input_delta: float) -> None:
        """The backend counted ``input_delta`` more prompt tokens than estimated (or fewer)."""

    def on_idle(self, user: str) -> None:
        """``user`` has nothing waiting or running any more."""

    def take_charges(self) -> dict[str, float]:
        """Charges since the last call, to add to the counters shared by replicas."""
        ...

    def take_output(self) -> dict[str, float]:
        """Output charged since the last call, by user: what a house of several replicas
        adds to each user's finish tag (their prompts are added as they join)."""
        ...

    def adopt(self, totals: Mapping[str, float]) -> None:
        """Replace counters with the totals shared by every replica."""
        ...

    def counters(self) -> Mapping[str, float]:
        """A snapshot of the virtual counters by user, for metrics."""


class Fifo:
    """First come, first served among those that can run."""

    def choose(self, candidates: Sequence[Candidate]) -> Candidate:
        return min(candidates, key=lambda candidate: candidate.seq)

    def on_arrival(self, user: str, active_users: Collection[str]) -> None:
        return None

    def on_dispatch(self, candidate: Candidate) -> None:
        return None

    def cost(self, weight: float, input_tokens: float) -> float:
        return 0.0  # arrival decides

    def on_output(self, user: str, weight: float, tokens: float) -> None:
        return None

    def on_correction(self, user: str, weight: float, input_delta: float) -> None:
        return None

    def on_idle(self, user: str) -> None:
        return None

    def take_charges(self) -> dict[str, float]:
        return {}

    def take_output(self) -> dict[str, float]:
        return {}

    def adopt(self, totals: Mapping[str, float]) -> None:
        return None

    def counters(self) -> Mapping[str, float]:
        return {}


class Fair:
    """Weighted fair sharing of service: the Virtual Token Counter, ordered by finish.

    A user's counter grows by ``w_in`` per prompt token and ``w_out`` per output token,
    divided by the request's weight. The candidate with the smallest finish (its user's
    counter plus its own prompt's charge) goes next, the earlier request on a tie. Output
    is left out of the finish: it is not known before the reply, and is charged as it
    streams. State is one float per user ever seen.
    """

    def __init__(self, w_in: float = 1.0, w_out: float = 2.0) -> None:
        if w_in < 0 or w_out < 0:
            raise ValueError(f"token costs must be >= 0, not w_in={w_in!r}, w_out={w_out!r}")
        self._w_in = w_in
        self._w_out = w_out
        self._counters: dict[str, float] = {}
        self._unshared: dict[str, float] = {}  # charges not yet sent to other replicas
        self._output: dict[str, float] = {}  # output charged since ``take_output``
        self._last_dispatched: str | None = None

    def choose(self, candidates: Sequence[Candidate]) -> Candidate:
        return min(candidates, key=lambda candidate: (self.finish(candidate), candidate.seq))

    def finish(self, candidate: Candidate) -> float:
        """The user's counter once ``candidate``'s prompt is charged (``on_dispatch``)."""
        return self._counter(candidate.user) + self._prompt_charge(candidate)

    def on_arrival(self, user: str, active_users: Collection[str]) -> None:
        # The lift: a user who starts waiting joins at the level of the least-served user
        # waiting, so time spent idle cannot be banked and spent later as a burst.
        if active_users:
            level = min(self._counter(other) for other in active_users)
        elif self._last_dispatched is not None:
            # Nobody waits: join where the last dispatched user is, which is where the
            # waiting room left off (the paper's Algorithm 2 uses the last user to leave the
            # queue). Keeping the counter as it was would let a user who was light long ago,
            # arriving first after a quiet spell, starve the others until it caught up.
            level = self._counter(self._last_dispatched)
        else:
            level = 0.0
        self._charge(user, max(0.0, level - self._counter(user)))

    def cost(self, weight: float, input_tokens: float) -> float:
        return self._w_in * input_tokens / weight

    def on_dispatch(self, candidate: Candidate) -> None:
        self._charge(candidate.user, self._prompt_charge(candidate))
        self._last_dispatched = candidate.user

    def _prompt_charge(self, candidate: Candidate) -> float:
        return self._w_in * candidate.input_tokens / candidate.weight

    def on_output(self, user: str, weight: float, tokens: float) -> None:
        charge = self._w_out * tokens / weight
        self._charge(user, charge)
        self._output[user] = self._output.get(user, 0.0) + charge

    def on_correction(self, user: str, weight: float, input_delta: float) -> None:
        self._charge(user, self._w_in * input_delta / weight)

    def on_idle(self, user: str) -> None:
        # Counters persist: lifting compares against them when the user comes back.
        return None

    def counters(self) -> Mapping[str, float]:
        return dict(self._counters)

    def _counter(self, user: str) -> float:
        return self._counters.get(user, 0.0)

    def take_charges(self) -> dict[str, float]:
        """Charges (lifts included) since the last call, for replicas sharing counters."""
        charges, self._unshared = self._unshared, {}
        return charges

    def take_output(self) -> dict[str, float]:
        output, self._output = self._output, {}
        return output

    def adopt(self, totals: Mapping[str, float]) -> None:
        """Counters summed over every replica; charges made since take_charges stay on top."""
        for user, total in totals.items():
            self._counters[user] = total + self._unshared.get(user, 0.0)

    def _charge(self, user: str, amount: float) -> None:
        self._counters[user] = self._counters.get(user, 0.0) + amount
        self._unshared[user] = self._unshared.get(user, 0.0) + amount
