"""Which waiting request gets a freed slot: the ordering policies (pure: no I/O, no clock).

Admission offers, for each user who could run something now, that user's first eligible
waiting request; the ordering picks one. FIFO is what Ollama and llama.cpp do themselves.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

__all__ = ["Candidate", "Fifo", "Ordering"]


@dataclass(frozen=True, slots=True)
class Candidate:
    """A waiting request as the ordering sees it."""

    seq: int  # arrival order, unique and increasing
    user: str
    cost: float  # estimated service in tokens


class Ordering(Protocol):
    def choose(self, candidates: Sequence[Candidate]) -> Candidate:
        """The candidate to run next; ``candidates`` is never empty."""

    def on_arrival(self, user: str, waiting_users: frozenset[str]) -> None:
        """A request of ``user`` starts waiting; ``waiting_users`` had requests waiting before."""

    def on_dispatch(self, candidate: Candidate) -> None:
        """``candidate`` was given a slot."""


class Fifo:
    """First come, first served among those that can run."""

    def choose(self, candidates: Sequence[Candidate]) -> Candidate:
        return min(candidates, key=lambda candidate: candidate.seq)

    def on_arrival(self, user: str, waiting_users: frozenset[str]) -> None:
        return None

    def on_dispatch(self, candidate: Candidate) -> None:
        return None
