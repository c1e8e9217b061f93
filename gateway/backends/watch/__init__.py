"""watch."""

from gateway.backends.watch.failures import unavailable
from gateway.backends.watch.monitor import BackendMonitor
from gateway.backends.watch.probes import entries_of
from gateway.backends.watch.warmth import KeepWarm, WarmthSnapshot

__all__ = ["BackendMonitor", "KeepWarm", "WarmthSnapshot", "entries_of", "unavailable"]
