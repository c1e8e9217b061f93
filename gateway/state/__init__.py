"""Holds on capacity shared by every gateway replica: one interface, two implementations.

``MemoryState`` (the default) keeps them in this process; ``RedisState`` keeps them in Redis
so that several replicas enforce one set of limits: a user's cap and a backend's slots hold
across all of them.
"""

from gateway.state.base import Hold, SharedState, StateUnavailable
from gateway.state.memory import MemoryState

__all__ = ["Hold", "MemoryState", "SharedState", "StateUnavailable"]
