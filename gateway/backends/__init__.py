"""The backends that exist: each as configured plus what its monitor has seen, and the
choice among them (the pool). Pure: routing loads without aiohttp; the watch over the
backends (HTTP) is ``backends.watch``.

May import: ``config``, ``wire``, ``core``.
"""

from gateway.backends.advice import failed_to_load, runs_fewer, unavailable
from gateway.backends.pool import (
    FAILED_LOAD_MOST_SECONDS,
    FAILED_LOAD_SECONDS,
    OLLAMA_AUTOMATIC_MAX_LOADED,
    Backend,
    BackendPool,
    BackendState,
    BackendStates,
    LoadedModel,
    RunsAtMost,
)

__all__ = [
    "FAILED_LOAD_MOST_SECONDS",
    "FAILED_LOAD_SECONDS",
    "OLLAMA_AUTOMATIC_MAX_LOADED",
    "Backend",
    "BackendPool",
    "BackendState",
    "BackendStates",
    "LoadedModel",
    "RunsAtMost",
    "failed_to_load",
    "runs_fewer",
    "unavailable",
]
