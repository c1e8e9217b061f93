"""Backends as configured plus what their monitor has seen, and the choice among them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gateway.policy import BackendConfig
from gateway.vocabulary import Api

__all__ = ["Backend", "BackendPool", "BackendState", "BackendStates", "model_key"]


def model_key(name: str) -> str:
    """Ollama treats ``llama3.2`` and ``llama3.2:latest`` as one model."""
    return name if ":" in name else f"{name}:latest"


@dataclass(slots=True)
class BackendState:
    """What the monitor last saw of a backend; it outlives policy reloads."""

    healthy: bool = True  # optimistic until the first probe says otherwise
    failures: int = 0  # consecutive failed probes
    successes: int = 0  # consecutive good probes
    slots: int | None = None  # as the backend reports them (llama.cpp /props)
    models: frozenset[str] | None = None  # model keys it serves; None: not known yet
    loaded: dict[str, str | None] = field(default_factory=dict)  # model key -> expires_at
    sleeping: bool = False
    last_error: str | None = None


class BackendStates:
    """What the monitor has seen of each configured backend, by name.

    One per gateway: the monitor writes it; every version of the pool and keep-warm read it.
    It outlives policy reloads, so a reload does not forget which backends are down.
    """

    def __init__(self) -> None:
        self._by_name: dict[str, BackendState] = {}

    def of(self, name: str) -> BackendState:
        """The state of ``name``, created (optimistically healthy) on first sight."""
        return self._by_name.setdefault(name, BackendState())

    def get(self, name: str) -> BackendState | None:
        return self._by_name.get(name)

    def forget(self, name: str) -> None:
        self._by_name.pop(name, None)


@dataclass(frozen=True, slots=True)
class Backend:
    """One inference server: its configuration and its live state."""

    name: str
    url: str
    kind: str
    configured_slots: int | None
    state: BackendState

    @property
    def key(self) -> str:
        """What its running requests are counted under: the server (its URL), not the name,
        so that a reload renaming a backend cannot forget what runs on it."""
        return self.url.rstrip("/")

    @property
    def slots(self) -> int:
        """How many requests it runs at once: configured, else reported, else one."""
        return self.configured_slots or self.state.slots or 1

    def speaks(self, api: Api) -> bool:
        """Ollama's native API is served only by Ollama; every kind speaks /v1."""
        return api is Api.OPENAI or self.kind == "ollama"

    def serves(self, model: str) -> bool:
        models = self.state.models
        return models is None or model_key(model) in models

    def has_loaded(self, model: str) -> bool:
        """Whether a request would find the model in memory (no load to wait for)."""
        if self.kind == "ollama":
            return model_key(model) in self.state.loaded
        # llama-server keeps its one model resident, unless it went to sleep (/props).
        return not self.state.sleeping


class BackendPool:
    """The configured backends; routing picks among those that can run a request."""

    def __init__(self, configs: list[BackendConfig], states: BackendStates) -> None:
        # The states are shared with the monitor and with pools of later policy versions.
        self.backends = [
            Backend(c.name, c.url, c.kind, c.slots, states.of(c.name)) for c in configs
        ]

    def serving(self, api: Api, model: str) -> list[Backend]:
        """Healthy backends that speak ``api`` and serve ``model``."""
        return [b for b in self.backends if b.state.healthy and b.speaks(api) and b.serves(model)]

    def prefer(self, free: list[Backend], model: str, busy: Mapping[str, int]) -> Backend:
        """Where ``model`` is loaded now (a cold load costs seconds), then the most free slots.

        The one rule for choosing among backends, for requests and for reads alike."""
        return max(
            free,
            key=lambda b: (b.has_loaded(model), b.slots - busy.get(b.key, 0)),
        )

    def known_nowhere(self, api: Api, model: str) -> bool:
        """True when every backend for ``api`` has listed its models and none lists ``model``."""
        speaking = [b for b in self.backends if b.speaks(api)]
        return all(b.state.models is not None and not b.serves(model) for b in speaking)

    def healthy(self, api: Api) -> list[Backend]:
        return [b for b in self.backends if b.state.healthy and b.speaks(api)]
