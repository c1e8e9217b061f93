"""One reading of the gateway at one instant (the snapshot), and what renders it: the
Prometheus metrics and the last hour kept for the house page.

May import: ``reload`` and every package below it.
"""

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
