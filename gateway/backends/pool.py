"""Backends as configured plus what their monitor has seen, and the choice among them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gateway.config import MANY_MODEL_KINDS, BackendConfig, BackendKind, model_key
from gateway.core import Api

__all__ = [
    "FAILED_LOAD_MOST_SECONDS",
    "FAILED_LOAD_SECONDS",
    "OLLAMA_AUTOMATIC_MAX_LOADED",
    "Backend",
    "BackendPool",
    "BackendState",
    "BackendStates",
    "FailedLoad",
    "LoadedModel",
    "RunsAtMost",
]

OLLAMA_AUTOMATIC_MAX_LOADED = 3
"""Models Ollama keeps loaded at most without OLLAMA_MAX_LOADED_MODELS: 3 per GPU
(server/sched.go defaultModelsPerGPU), taken for one GPU."""


@dataclass(frozen=True, slots=True)
class LoadedModel:
    """One model in Ollama's /api/ps: when it unloads, its size, its context per slot."""

    expires_at: str | None = None
    size: int = 0  # bytes: weights and KV cache (size_vram of them on the GPU)
    context_length: int | None = None


FAILED_LOAD_SECONDS = 60.0
"""How long requests for a model whose load failed are refused before one tries again;
twice as long after each retry that fails too, up to ``FAILED_LOAD_MOST_SECONDS``."""
FAILED_LOAD_MOST_SECONDS = 960.0


@dataclass(slots=True)
class FailedLoad:
    """A model the router could not load (its child exited: a broken file, too little
    memory), as ``/models`` says; requests for it are refused until ``retry_at`` (the
    monotonic clock), when one may try again. ``failures``: in a row, each retry included;
    ``retried_at``: when a retry was sent whose outcome is not seen yet."""

    exit_code: int | None
    retry_at: float
    failures: int = 1
    retried_at: float | None = None

    def next_retry(self, now: float) -> float:
        """When the next retry is due, from ``now``: a minute after the first failure, then
        twice as long after each, so that a file broken for good unloads the models others
        use a few times an hour at most, rather than once a minute."""
        wait = FAILED_LOAD_SECONDS * (1 << min(self.failures - 1, 10))
        return now + min(wait, FAILED_LOAD_MOST_SECONDS)

    def retrying(self, now: float) -> None:
        """A request for the model is sent ``now``: this is the retry, and the next minute's
        requests wait for what becomes of it (the monitor sees it load, or fail again)."""
        self.retry_at, self.retried_at = now + FAILED_LOAD_SECONDS, now


@dataclass(frozen=True, slots=True)
class RunsAtMost:
    """A backend found to run ``runs`` requests at once where the policy says ``slots``
    (``admission/parallelism.py``), ``at`` the clock's time."""

    slots: int
    runs: int
    at: float


@dataclass(slots=True)
class ServingChanges:
    """Bumped whenever a backend's health or model list is written, by the monitor or anyone
    else: the pools remember who serves what (``BackendPool.serving``) until then. A
    counter, not the values' identity: health is a bool written in place. One per gateway
    (``BackendStates``), shared by its backends' states."""

    count: int = 0


@dataclass(slots=True)
class BackendState:
    """What the monitor last saw of a backend; it outlives policy reloads."""

    # First: written before the fields whose writes it counts.
    changes: ServingChanges = field(default_factory=ServingChanges, repr=False, compare=False)
    healthy: bool = True  # optimistic until the first probe says otherwise
    failures: int = 0  # consecutive failed probes
    successes: int = 0  # consecutive good probes
    slots: int | None = None  # as the backend reports them (llama.cpp /props)
    child_slots: dict[str, int] = field(default_factory=dict)  # a router's, by model key
    model_limit: int | None = None  # models loaded at once, as it reports it (the router's)
    # The router's own name for each model key: it matches names exactly, where the keys
    # are Ollama's spelling-blind ones.
    names: dict[str, str] = field(default_factory=dict)
    ambiguous: dict[str, tuple[str, ...]] = field(default_factory=dict)  # keys names share
    models: frozenset[str] | None = None  # model keys it serves; None: not known yet
    loaded: dict[str, LoadedModel] = field(default_factory=dict)  # by model key
    sizes: dict[str, int] = field(default_factory=dict)  # model key -> bytes on disk (tags)
    observed_at: float = float("-inf")  # when the probe that read `loaded` started
    sleeping: bool = False
    version: str | None = None  # as it says it (Ollama's)
    one_prompt_a_slot: bool = False  # an Ollama before 0.30: its own runner's prompt cache
    failed_loads: dict[str, FailedLoad] = field(default_factory=dict)  # by model key
    last_error: str | None = None
    comebacks: int = 0  # times it came back after its probes failed: restarted, caches empty
    # Fewer requests at once than the policy's slots, as the gateway found: sent no more.
    runs_at_most: RunsAtMost | None = None

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _SERVING_FIELDS:
            self.changes.count += 1
        object.__setattr__(self, name, value)


_SERVING_FIELDS = frozenset({"healthy", "models"})

# Which backends serve which (api, model), remembered by each pool: at most this many, as
# the model is the client's to name.
_SERVING_REMEMBERED = 256
# Slot group names remembered by each backend, for the same reason.
_GROUPS_REMEMBERED = 256


class BackendStates:
    """What the monitor has seen of each configured backend, by name.

    One per gateway: the monitor writes it; every version of the pool and keep-warm read it.
    It outlives policy reloads, so a reload does not forget which backends are down.
    """

    def __init__(self) -> None:
        self._by_name: dict[str, BackendState] = {}
        self.changes = ServingChanges()  # to any backend's health or model list

    def of(self, name: str) -> BackendState:
        """The state of ``name``, created (optimistically healthy) on first sight."""
        state = self._by_name.get(name)
        if state is None:
            state = self._by_name[name] = BackendState(self.changes)
        return state

    def get(self, name: str) -> BackendState | None:
        return self._by_name.get(name)

    def forget(self, name: str) -> None:
        self._by_name.pop(name, None)


@dataclass(frozen=True, slots=True)
class Backend:
    """One inference server: its configuration and its live state."""

    name: str
    url: str
    kind: BackendKind
    configured_slots: int | None
    state: BackendState
    max_loaded_models: int | None = None
    memory: int | None = None
    protected: frozenset[str] = frozenset()  # model keys never unloaded for another
    default_num_ctx: int = 4096
    swap_after: float | None = None  # seconds; None: the swap's own cost (``swap_due``)
    # The server (its URL), not the name: a reload renaming a backend cannot forget what
    # runs on it. Computed once, as ``per_model``: every dispatch reads them several times.
    key: str = field(init=False, compare=False, repr=False)
    # Ollama's parallel slots belong to each loaded model (OLLAMA_NUM_PARALLEL), as the
    # router's do to each of its child servers.
    per_model: bool = field(init=False, compare=False, repr=False)
    # llama-server's own API (a router passes it on): timings, id_slot, /apply-template.
    llama_server: bool = field(init=False, compare=False, repr=False)
    router: bool = field(init=False, compare=False, repr=False)  # llama-server's router
    # ``group`` of each model name, as asked: every request asks it twice or more.
    _groups: dict[str, str] = field(default_factory=dict, init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "key", self.url.rstrip("/"))
        object.__setattr__(self, "per_model", self.kind in MANY_MODEL_KINDS)
        object.__setattr__(self, "llama_server", self.kind in ("llamacpp", "llamacpp-router"))
        object.__setattr__(self, "router", self.kind == "llamacpp-router")

    def failed_load(self, model: str) -> FailedLoad | None:
        """Its failure to load ``model`` lately (the router's child exited), by whichever
        name of it is asked (an alias, another case); None if none."""
        failed, names = self.state.failed_loads, self.state.names
        return failed.get(model_key(names.get(model_key(model), model))) if failed else None

    def load_failed(self, model: str, now: float) -> bool:
        """Whether it failed to load ``model`` lately, its retry not due by ``now``."""
        failed = self.failed_load(model)
        return failed is not None and failed.retry_at > now

    def protects(self, model: str) -> bool:
        """Whether ``model`` (a key) is never unloaded for another (``resident``,
        ``keep_warm``): on a router, by whichever of its names the policy wrote."""
        if model in self.protected:
            return True
        names = self.state.names
        return bool(names) and any(model_key(names.get(k, k)) == model for k in self.protected)

    def group(self, model: str) -> str:
        """What a request's slot is counted under: the server and, on Ollama, the model."""
        found = self._groups.get(model)
        if found is None:
            found = f"{self.key} {model_key(model)}" if self.per_model else self.key
            if len(self._groups) < _GROUPS_REMEMBERED:
                self._groups[model] = found
        return found

    @property
    def slots(self) -> int:
        """How many requests it runs at once (per model on Ollama): configured, else
        reported, else one; fewer if it was found to run fewer than configured."""
        found, reported = self.state.runs_at_most, self.state.slots
        if found is not None and found.slots == self.configured_slots:
            return found.runs
        if self.kind == "llamacpp" and self.configured_slots and reported:
            return min(self.configured_slots, reported)  # it says its own: never more
        return self.configured_slots or reported or 1

    @property
    def model_limit(self) -> int | None:
        """Models it holds at once, at most (None: no limit): configured, else reported (the
        router's --models-max), else Ollama's automatic limit."""
        if self.max_loaded_models is not None:
            return self.max_loaded_models
        if self.kind == "ollama":
            return OLLAMA_AUTOMATIC_MAX_LOADED
        return self.state.model_limit

    @property
    def capacity(self) -> int:
        """Requests it can run at once, every model together."""
        if not self.per_model:
            return self.slots
        limit = self.model_limit or len(self.state.models or ()) or 1
        return self.slots * limit

    def speaks(self, api: Api) -> bool:
        """Ollama's native API is served only by Ollama; every kind speaks OpenAI's /v1;
        Anthropic's /v1/messages, Ollama and llama-server (not any OpenAI-compatible one)."""
        if api is Api.OPENAI:
            return True
        if api is Api.ANTHROPIC:
            return self.kind != "openai"
        return self.kind == "ollama"

    def serves(self, model: str) -> bool:
        """Whether a request for ``model`` may go here: listed, or the list not known yet."""
        models = self.state.models
        return models is None or model_key(model) in models

    def lists(self, model: str) -> bool:
        """Whether its last list (Ollama's /api/tags) names ``model``: on its disk, so that
        a request can load it. Not while the list is unknown."""
        models = self.state.models
        return models is not None and model_key(model) in models

    def has_loaded(self, model: str) -> bool:
        """Whether a request would find the model in memory (no load to wait for)."""
        if self.per_model:
            return model_key(model) in self.state.loaded
        # llama-server keeps its one model resident, unless it went to sleep (/props).
        return not self.state.sleeping


class BackendPool:
    """The configured backends; routing picks among those that can run a request."""

    def __init__(self, configs: list[BackendConfig], states: BackendStates) -> None:
        # The states are shared with the monitor and with pools of later policy versions.
        self.backends = [
            Backend(
                name=c.name,
                url=c.url,
                kind=c.kind,
                configured_slots=c.slots,
                state=states.of(c.name),
                max_loaded_models=c.max_loaded_models,
                memory=c.memory,
                protected=frozenset(map(model_key, [*c.resident, *c.keep_warm])),
                default_num_ctx=c.default_num_ctx,
                swap_after=None if c.swap_after == "auto" else c.swap_after,
            )
            for c in configs
        ]
        self.routers = any(b.router for b in self.backends)  # on every request
        self._serving: dict[tuple[str, str], tuple[Backend, ...]] = {}
        self._changes = states.changes
        self._serving_at = -1  # ``_changes.count`` when ``_serving`` was right

    def serving(self, api: Api, model: str) -> tuple[Backend, ...]:
        """Healthy backends that speak ``api`` and serve ``model``: worked out once until a
        backend's health or model list changes, as every request asks it."""
        if self._serving_at != self._changes.count:
            self._serving.clear()
            self._serving_at = self._changes.count
        # Keyed by the member's value: hashing the member itself is a call into enum.py.
        key = (api._value_, model)
        found = self._serving.get(key)
        if found is None:
            found = tuple(
                b for b in self.backends if b.state.healthy and b.speaks(api) and b.serves(model)
            )
            if len(self._serving) >= _SERVING_REMEMBERED:
                self._serving.clear()
            self._serving[key] = found
        return found

    def prefer(self, free: Sequence[Backend], model: str, busy: Mapping[str, int]) -> Backend:
        """Where ``model`` is loaded now (a cold load costs seconds), then the most free slots
        (``busy``: by slot group).

        The one rule for choosing among backends, for requests and for reads alike."""
        if len(free) == 1:  # the common case: nothing to weigh
            return free[0]
        return max(
            free,
            key=lambda b: (b.has_loaded(model), b.slots - busy.get(b.group(model), 0)),
        )

    def known_nowhere(self, api: Api, model: str) -> bool:
        """True when every backend for ``api`` has listed its models and none lists ``model``;
        False when none speaks ``api``: then that, not the model, is what to say."""
        speaking = [b for b in self.backends if b.speaks(api)]
        return bool(speaking) and all(
            b.state.models is not None and not b.serves(model) for b in speaking
        )

    def healthy(self, api: Api) -> list[Backend]:
        return [b for b in self.backends if b.state.healthy and b.speaks(api)]
