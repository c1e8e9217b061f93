"""observe."""

from gateway.observe.history import History, MinuteFigures, RecentRefusal
from gateway.observe.metrics import Metrics
from gateway.observe.snapshot import BackendSnapshot, GatewaySnapshot, UserUsage, take

__all__ = [
    "BackendSnapshot",
    "GatewaySnapshot",
    "History",
    "Metrics",
    "MinuteFigures",
    "RecentRefusal",
    "UserUsage",
    "take",
]
