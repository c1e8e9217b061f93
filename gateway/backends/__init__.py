"""The inference servers behind the gateway: their state, their health, and routing."""

from gateway.backends.pool import (
    OLLAMA_AUTOMATIC_MAX_LOADED,
    Backend,
    BackendPool,
    BackendState,
    BackendStates,
    LoadedModel,
    model_key,
)

__all__ = [
    "OLLAMA_AUTOMATIC_MAX_LOADED",
    "Backend",
    "BackendPool",
    "BackendState",
    "BackendStates",
    "LoadedModel",
    "model_key",
]
