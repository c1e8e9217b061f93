"""What the swap planner (``swaps``) answers the rest of the gateway: how a dispatched
request finds its model (``Placement``), why one waits for memory (``SwapWait``), and the
swaps at one instant (``SwapsSnapshot``) for ``/status`` and the metrics.

Values only, apart from the planner, so that what carries them (a ticket, a permit, a
503's words, the room's snapshot) depends on these and not on the planning.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["RESIDENT", "DoneSwap", "Kind", "Placement", "SwapWait", "SwapsSnapshot"]

Kind = Literal["resident", "load", "swap", "reload"]


@dataclass(frozen=True, slots=True)
class Placement:
    """How a dispatched request finds its model: held, loaded beside the others, swapped
    in (``unload``: the victims to unload first), or reloaded with another context."""

    kind: Kind
    unload: tuple[str, ...] = ()

    @property
    def loads(self) -> bool:
        return self.kind != "resident"


RESIDENT = Placement("resident")


@dataclass(frozen=True, slots=True)
class SwapWait:
    """Why a request waits for its model, and about how long until it is in."""

    said: str
    seconds: float


@dataclass(frozen=True, slots=True)
class DoneSwap:
    """A swap sent: planned at, sent when its victims were drained (clock seconds)."""

    backend: str  # key
    model: str
    victims: tuple[str, ...]
    planned_at: float
    sent_at: float


@dataclass(frozen=True, slots=True)
class SwapsSnapshot:
    """Counters by (backend key, model), and the swaps under way by backend key."""

    counts: dict[tuple[str, str, str], float]  # (key, model, loads|evictions|...) -> n
    pending: dict[str, tuple[str, tuple[str, ...], float]]  # key -> (model, victims, waited)
    recent: tuple[DoneSwap, ...] = ()  # the last ones sent, oldest first
