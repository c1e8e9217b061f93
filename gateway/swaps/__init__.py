"""swaps."""

from gateway.swaps.outcomes import RESIDENT, Placement, SwapsSnapshot, SwapWait
from gateway.swaps.planner import SwapPlanner
from gateway.swaps.residency import ResidentsSnapshot
from gateway.swaps.victims import load_seconds

__all__ = [
    "RESIDENT",
    "Placement",
    "ResidentsSnapshot",
    "SwapPlanner",
    "SwapWait",
    "SwapsSnapshot",
    "load_seconds",
]
