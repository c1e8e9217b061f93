"""Which models each backend holds, what a swap would unload, and the swaps the gateway
plans so that a model is never swapped by accident. Pure: no I/O, the clock passed in.

May import: ``backends`` (the pool, not its watch), ``config``, ``wire``, ``core`` (never
aiohttp).
"""

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
