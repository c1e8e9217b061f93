"""Backends as configured, and the choice of one for a request."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gateway.errors import Api, GatewayError
from gateway.policy import BackendConfig

__all__ = ["Backend", "BackendPool"]


@dataclass(frozen=True, slots=True)
class Backend:
    """One inference server; ``slots`` is how many requests it runs at once."""

    name: str
    url: str
    kind: str
    slots: int

    @classmethod
    def from_config(cls, config: BackendConfig) -> Backend:
        # llama.cpp reports its slots itself (GET /props); until it has, assume one.
        return cls(config.name, config.url, config.kind, config.slots or 1)

    def speaks(self, api: Api) -> bool:
        """Ollama's native API is served only by Ollama; every kind speaks /v1."""
        return api is Api.OPENAI or self.kind == "ollama"


class BackendPool:
    """The configured backends; routing picks among those that speak the request's API."""

    def __init__(self, configs: list[BackendConfig]) -> None:
        self.backends = [Backend.from_config(config) for config in configs]

    def serving(self, api: Api, model: str) -> list[Backend]:
        """Backends that can run a request for ``model`` on ``api``."""
        return [backend for backend in self.backends if backend.speaks(api)]

    def prefer(self, free: list[Backend], model: str, busy: Mapping[str, int]) -> Backend:
        """Among backends with a free slot, the one with the most free slots."""
        return max(free, key=lambda backend: backend.slots - busy.get(backend.name, 0))

    def for_reads(self, api: Api) -> Backend:
        """The backend that answers listings and metadata."""
        for backend in self.backends:
            if backend.speaks(api):
                return backend
        raise GatewayError(503, "no_backend", f"no configured backend serves the {api.value} API")
