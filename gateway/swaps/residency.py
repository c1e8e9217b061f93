"""Which models each Ollama backend holds in memory, with which context, and at what size.

Ollama says it in ``/api/ps`` (each model's ``size`` with its KV cache, its
``context_length`` per slot, ``expires_at``), which the monitor reads every few seconds.
Between two probes the gateway knows better than the last probe what it has itself sent:
a model it dispatched a request to is loaded (or loading) with the context that request
asked for. So the view is the last probe, overlaid with the gateway's own dispatches made
since that probe started, and with every model that has requests running. A dispatch counts
only for a model the backend's list (``/api/tags``) names: Ollama answers any other name
with 404 at once and loads nothing, so a name a client made up never takes room.

Pure: no I/O; the clock and the running counts are passed in.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from gateway.backends import Backend, LoadedModel
from gateway.config import model_key

__all__ = ["Residency", "Resident", "ResidentsSnapshot"]

# A model never seen loaded is guessed at its file size plus this much for the KV cache
# and compute buffers (a 3B model at 4096 tokens and 1 slot: about 23%).
_UNSEEN_OVERHEAD = 1.25


@dataclass(frozen=True, slots=True)
class Resident:
    """A model the backend holds, or is loading, as the gateway sees it."""

    model: str  # model key
    num_ctx: int  # context per slot
    size: int  # bytes: /api/ps, else an estimate
    expires_at: str | None = None  # from /api/ps; None when only the gateway's dispatch says so


@dataclass(frozen=True, slots=True)
class ResidentsSnapshot:
    """One Ollama backend's models at one instant, for /status and metrics."""

    residents: tuple[Resident, ...]
    memory_used: int
    memory: int | None
    max_loaded_models: int | None  # None: no limit


@dataclass(slots=True)
class _Sent:
    """A dispatch the last probe may not show yet."""

    num_ctx: int
    at: float
    # Until when a load it asked for may still be under way: till then, only a probe that
    # shows the model ends the record. Ollama goes on loading a model whose request has
    # gone, so a probe during the load, which shows nothing, must not make room look free.
    loading_until: float = float("-inf")


@dataclass(slots=True)
class _Backend:
    sent: dict[str, _Sent] = field(default_factory=dict)  # by model key
    gone: dict[str, float] = field(default_factory=dict)  # unloaded by the gateway, when
    sizes: dict[str, tuple[int, int]] = field(default_factory=dict)  # model -> (num_ctx, size)
    trained: dict[str, int] = field(default_factory=dict)  # model -> the most num_ctx it gets


class Residency:
    """The gateway's view of what every backend of many models (Ollama, a router) holds;
    state kept by server (URL)."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._backends: dict[str, _Backend] = {}

    def num_ctx(self, backend: Backend, model: str, asked: int | None) -> int:
        """The context a request for ``model`` (a model key) asking for ``asked`` (None:
        nothing) gets on ``backend``: at least 4, at most the model's trained context once
        seen (Ollama cuts a larger num_ctx to it, so asking more reloads nothing)."""
        return _fitted(backend, self._of(backend), model, asked)

    def placing(
        self, backend: Backend, model: str, asked: int | None, busy: Mapping[str, int]
    ) -> tuple[int, int | None]:
        """(``num_ctx``, ``context``) of one request: what the quick yes asks, with one look
        at the backend's record rather than one for each."""
        mine = self._of(backend)
        return _fitted(backend, mine, model, asked), self._context(backend, mine, model, busy)

    def residents(self, backend: Backend, busy: Mapping[str, int]) -> dict[str, Resident]:
        """The models ``backend`` holds now (``busy``: running requests by slot group)."""
        mine = self._of(backend)
        view: dict[str, Resident] = {}
        for model in dict.fromkeys([*backend.state.loaded, *mine.sent]):
            resident = self.resident(backend, model, busy)
            if resident is not None:
                view[model] = resident
        return view

    def resident(self, backend: Backend, model: str, busy: Mapping[str, int]) -> Resident | None:
        """``model`` (a model key) as ``backend`` holds it now, or None: one entry of
        ``residents``."""
        seen, sent = self._held(backend, self._of(backend), model, busy)
        if sent is not None:
            size = self.estimate(backend, model, sent.num_ctx)
            return Resident(model, sent.num_ctx, size, None if seen is None else seen.expires_at)
        if seen is None:
            return None
        num_ctx = seen.context_length or backend.default_num_ctx
        size = seen.size or self.estimate(backend, model, num_ctx)
        return Resident(model, num_ctx, size, seen.expires_at)

    def context(self, backend: Backend, model: str, busy: Mapping[str, int]) -> int | None:
        """The context per slot ``model`` (a model key) is held with on ``backend`` now, or
        None when it is not held: ``resident``'s num_ctx, all that a dispatch asks, without
        the size it would estimate and the record it would build."""
        return self._context(backend, self._of(backend), model, busy)

    def _context(
        self, backend: Backend, mine: _Backend, model: str, busy: Mapping[str, int]
    ) -> int | None:
        seen, sent = self._held(backend, mine, model, busy)
        if sent is not None:
            return sent.num_ctx
        return None if seen is None else seen.context_length or backend.default_num_ctx

    def _held(
        self, backend: Backend, mine: _Backend, model: str, busy: Mapping[str, int]
    ) -> tuple[LoadedModel | None, _Sent | None]:
        """What says ``model`` is held on ``backend`` (``mine``: the gateway's record of it):
        the last probe, unless the gateway has unloaded it since, and the gateway's own
        dispatch the probe may not show yet, which wins. What either says that no longer
        holds is dropped on the way."""
        state = backend.state
        gone_at = mine.gone.get(model)
        if gone_at is not None and gone_at <= state.observed_at:
            del mine.gone[model]  # a probe since knows it is gone (or back)
            gone_at = None
        seen = state.loaded.get(model)
        found = seen if gone_at is None else None
        if found is not None and found.size:
            mine.sizes[model] = (found.context_length or backend.default_num_ctx, found.size)
        sent = mine.sent.get(model)
        if sent is None:
            return found, None
        if state.models is None or model not in state.models:  # ``backend.lists``, of a key
            # A dispatch loads only a model on the backend's disk: Ollama answers any other
            # name with 404 at once. So one its list does not confirm takes no room; kept
            # while the list is unknown (the list may yet confirm it), dropped once known.
            if state.models is not None:
                del mine.sent[model]
            return found, None
        if seen is None and sent.loading_until > state.observed_at:
            return found, sent  # loading still, as far as anyone can tell
        if sent.at <= state.observed_at and not busy.get(backend.group(model), 0):
            del mine.sent[model]  # the probe since knows better
            seen_ctx = seen.context_length if seen is not None else None
            if seen_ctx is not None and seen_ctx < sent.num_ctx:
                mine.trained[model] = seen_ctx  # asked for more, got this much
            return found, None
        return found, sent

    def estimate(self, backend: Backend, model: str, num_ctx: int) -> int:
        """Bytes ``model`` takes loaded with ``num_ctx``: as /api/ps last said, scaled for
        another context; else its file size plus an allowance."""
        seen = self._of(backend).sizes.get(model)
        on_disk = backend.state.sizes.get(model, 0)
        if seen is not None:
            seen_ctx, seen_size = seen
            if seen_ctx == num_ctx or not on_disk or seen_size <= on_disk:
                return seen_size
            return on_disk + (seen_size - on_disk) * num_ctx // seen_ctx
        return int(on_disk * _UNSEEN_OVERHEAD)

    def sent(
        self, backend: Backend, model: str, num_ctx: int, at: float, loading: float = 0.0
    ) -> None:
        """A request for ``model`` (a model key) with ``num_ctx`` was dispatched to
        ``backend`` at ``at`` (the clock's time); ``loading``: seconds its load may take,
        when it loads the model."""
        if not backend.per_model:
            return
        sent = self._of(backend).sent
        found = sent.get(model)
        if found is None:
            found = sent[model] = _Sent(num_ctx, at)
        else:  # its previous dispatch, as nearly always: updated rather than made anew
            found.num_ctx, found.at = num_ctx, at
        if loading:
            found.loading_until = at + loading

    def unsent(self, backend: Backend, model: str) -> None:
        """The request for ``model`` sent to ``backend`` was refused without a load: it
        holds nothing the gateway sent."""
        if backend.per_model:
            self._of(backend).sent.pop(model_key(model), None)

    def ran(self, backend: Backend, model: str) -> None:
        """A request for ``model`` ended: only a probe started after this knows better
        (one started during its load does not show the model yet)."""
        sent = self._of(backend).sent.get(model_key(model))
        if sent is not None:
            sent.at = max(sent.at, self._clock())

    def gone(self, backend: Backend, model: str) -> None:
        """The gateway is unloading ``model`` from ``backend``."""
        mine = self._of(backend)
        mine.sent.pop(model, None)
        mine.gone[model] = self._clock()

    def snapshot(self, backend: Backend, busy: Mapping[str, int]) -> ResidentsSnapshot:
        residents = self.residents(backend, busy)
        return ResidentsSnapshot(
            residents=tuple(sorted(residents.values(), key=lambda r: r.model)),
            memory_used=sum(r.size for r in residents.values()),
            memory=backend.memory,
            max_loaded_models=backend.model_limit,
        )

    def _of(self, backend: Backend) -> _Backend:
        found = self._backends.get(backend.key)
        if found is None:  # not setdefault: that would build a _Backend on every call
            found = self._backends[backend.key] = _Backend()
        return found


def _fitted(backend: Backend, mine: _Backend, model: str, asked: int | None) -> int:
    """``num_ctx``'s answer, from the backend's record already looked up."""
    wanted = max(4, backend.default_num_ctx if asked is None else asked)
    trained = mine.trained.get(model)
    return wanted if trained is None else min(wanted, trained)
