"""The inference servers behind the gateway: their state, their health, and routing."""

from gateway.backends.pool import (
    Backend,
    BackendPool,
    BackendState,
    BackendStates,
    LoadedModel,
    model_key,
)

# The monitor and the probes (HTTP) are imported from their own modules, so that routing
# (the pool) can be used without loading the HTTP client.
__all__ = ["Backend", "BackendPool", "BackendState", "BackendStates", "LoadedModel", "model_key"]
