"""The inference servers behind the gateway: their state, their health, and routing."""

from gateway.backends.monitor import BackendMonitor
from gateway.backends.pool import Backend, BackendPool, BackendState, model_key

__all__ = ["Backend", "BackendMonitor", "BackendPool", "BackendState", "model_key"]
