"""The policy's ``backends:``: each inference server the gateway sends work to, as the admin
describes it.

Apart from ``config/policy.py`` so that what only needs a backend's configuration (the pool, its
monitor, the keep-warm pings) does not import the whole policy. A check that needs another
section (``keep_warm`` naming no alias) stays on ``Policy``, which sees them all.
"""

from __future__ import annotations

from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator

from gateway.config.base import Strict
from gateway.config.problems import problem_at
from gateway.core import Duration, Size

__all__ = [
    "MANY_MODEL_KINDS",
    "SWAP_PATIENCE",
    "BackendConfig",
    "check_backends",
    "check_swap_waits",
]

BackendKind = Literal["ollama", "llamacpp", "llamacpp-router", "openai"]
# The kinds that load models on demand, several at once, each with slots of its own: Ollama,
# and llama-server's router (``--models-dir``), which runs a child server per loaded model.
MANY_MODEL_KINDS = frozenset({"ollama", "llamacpp-router"})
# Read for those kinds only: their swaps and what stays loaded.
_MANY_MODELS_ONLY = ("max_loaded_models", "resident", "swap_after")
# Read for Ollama only: its pings, keep_alive, memory as /api/ps counts it, num_ctx.
_OLLAMA_ONLY = ("keep_warm", "keep_alive", "memory", "default_num_ctx")


class BackendConfig(Strict):
    """One inference server the gateway sends work to."""

    name: str = Field(min_length=1, description="Name used in logs, metrics and /status.")
    url: str = Field(description="Base URL, e.g. http://127.0.0.1:11434.")
    kind: BackendKind = Field(
        default="ollama",
        description="ollama, llamacpp (one llama-server), llamacpp-router (llama-server "
        "with --models-dir: a child server per loaded model) or openai.",
    )
    slots: int | None = Field(
        default=None,
        ge=1,
        description="Requests it runs at once: llama-server's -np (read from it if not "
        "given); for ollama and llamacpp-router, per loaded model, as OLLAMA_NUM_PARALLEL "
        "(which must equal it) and the router's -np apply to each.",
    )
    keep_warm: list[str] = Field(
        default_factory=list,
        description="Ollama models to keep loaded, with empty requests that take no slot.",
    )
    keep_alive: Duration = Field(
        default=1800.0, description="How long each ping holds a keep_warm model; -1: pinned."
    )
    max_loaded_models: int | None = Field(
        default=None,
        ge=1,
        description="ollama, llamacpp-router: models loaded at once, at most "
        "(OLLAMA_MAX_LOADED_MODELS if set, else its automatic 3 per GPU; the router's "
        "--models-max, read from it if not given); the gateway plans swaps to stay within it.",
    )
    memory: Size | None = Field(
        default=None,
        description="ollama: what its loaded models may take together (24GiB), as /api/ps "
        "counts them (weights and KV cache); the gateway plans swaps to stay within it.",
    )

    @field_validator("memory")
    @classmethod
    def _memory_with_a_unit(cls, memory: int | None) -> int | None:
        # A bare number is bytes: "memory: 24" meant 24GiB, and would evict at every swap.
        if memory is not None and memory < 1024 * 1024:
            raise ValueError("a number alone is bytes, too few for a GPU: give a unit (24GiB)")
        return memory

    resident: list[str] = Field(
        default_factory=list,
        description="ollama, llamacpp-router: models the gateway never unloads to make room "
        "for another (keep_warm models neither).",
    )
    swap_after: Literal["auto"] | Duration = Field(
        default="auto",
        description="ollama, llamacpp-router: while the models held are in use, how long a "
        "person's request for another waits before the gateway swaps for it (requests for "
        "that model gathered meanwhile go in the same load). auto: the swap's cost, the "
        "seconds it spends loading (that model, and the ones it unloads when they come "
        "back), times the people it would interrupt over the people waiting, at most a third "
        "of max_wait; at once when fewer use the models going out than want the other. A "
        "duration: that wait, whoever the switch interrupts (at most a third of max_wait: "
        "the drain and the load must fit before a 503); 0s: at once, as Ollama and the "
        "router do.",
    )
    default_num_ctx: int = Field(
        default=4096,
        ge=4,
        description="ollama: the context a request without num_ctx gets: OLLAMA_CONTEXT_LENGTH, "
        "else 4096 (32768 from 24 GiB of VRAM, 262144 from 48 GiB).",
    )

    @field_validator("url")
    @classmethod
    def _http_url(cls, url: str) -> str:
        if not url.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        return _checked_url(url).rstrip("/")

    @model_validator(mode="after")
    def _ollama_needs_slots(self) -> BackendConfig:
        # Ollama does not expose OLLAMA_NUM_PARALLEL, so the admin has to state it.
        if self.kind == "ollama" and self.slots is None:
            raise ValueError("an ollama backend needs slots (its OLLAMA_NUM_PARALLEL)")
        # Each read for some kinds only: given for another kind, it would do nothing
        # without a word. Every such field is named at once.
        problems = []
        if self.kind != "ollama" and (given := self._given(_OLLAMA_ONLY)):
            router = self.kind == "llamacpp-router" and "memory" in given
            why = " (the router counts models, not bytes: its --models-max)" if router else ""
            problems.append(f"{given}: only for an ollama backend{why}")
        if self.kind not in MANY_MODEL_KINDS and (given := self._given(_MANY_MODELS_ONLY)):
            problems.append(f"{given}: only for an ollama or llamacpp-router backend")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def _given(self, names: tuple[str, ...]) -> str:
        """Which of ``names`` the admin set, to something, as one phrase."""
        set_ = self.model_fields_set
        return ", ".join(n for n in names if n in set_ and getattr(self, n) not in (None, []))


def check_backends(backends: list[BackendConfig]) -> list[BackendConfig]:
    """``backends`` as given, if no two share a name (logs, metrics and /status tell them
    apart by it); else the second, with the line of the first (``Policy`` validates
    ``backends:`` with this)."""
    first: dict[str, int] = {}
    for index, backend in enumerate(backends):
        earlier = first.setdefault(backend.name, index)
        if earlier != index:
            message = f"another backend is named {backend.name!r}"
            raise problem_at((index, "name"), message, first=(earlier, "name"))
    return backends


SWAP_PATIENCE = 3
"""The longest a request waits for its swap to be due is its max_wait over this: the swap
itself (the drain, the load) must still fit in what is left before its 503."""


_ROUNDING = 1e-9  # seconds: 1.1s is a third of 3.3s, whatever the floats say


def check_swap_waits(backends: list[BackendConfig], patience: float, where: str) -> None:
    """Refuse a ``swap_after`` longer than a person waits for a swap (``patience``, of the
    max_wait under ``where``): it would be cut short without a word."""
    for index, backend in enumerate(backends):
        wait = backend.swap_after
        if wait != "auto" and wait > patience + _ROUNDING:
            message = (
                f"{wait:g}s is longer than a person's request waits for a swap: a third of "
                f"max_wait ({patience:g}s), so that the drain and the load still fit before "
                f"its 503; raise {where}.max_wait to {wait * SWAP_PATIENCE:g}s, or shorten this"
            )
            raise problem_at(("backends", index, "swap_after"), message)


def _checked_url(url: str) -> str:
    """``url`` if a request can be sent to it: a host, a port from 1 to 65535, no space; not
    an API's own path (the gateway adds /api/... and /v1/... itself). ValueError saying why."""
    parts = urlsplit(url)
    if any(c.isspace() for c in url):
        raise ValueError(f"{url!r} has a space in it")
    if not parts.hostname:
        raise ValueError(f"{url!r} has no host name or address, e.g. http://127.0.0.1:11434")
    try:
        port = parts.port  # it raises for a port that is no number, or out of range
    except ValueError:
        port = 0
    if port == 0:
        raise ValueError(f"{url!r}: the port must be a number from 1 to 65535")
    if parts.path.rstrip("/").endswith(("/api", "/v1")) or parts.query or parts.fragment:
        raise ValueError(
            f"{url!r}: give the server's address alone (the gateway adds /api/... and /v1/...)"
        )
    return url
