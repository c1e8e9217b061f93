"""What each kind of backend says about itself: health, slots, models, loaded models.

- Ollama: ``GET /api/version`` (health; and its engine: before 0.30 its own runner, which
  keeps one prompt a slot; since, llama-server's), ``/api/tags`` (models), ``/api/ps``
  (loaded now, with ``expires_at``). Its parallelism cannot be read: the policy states it.
- llama.cpp: ``GET /health`` (503 "Loading model" while loading), ``/props`` (``total_slots``,
  ``is_sleeping``), ``/v1/models``.
- llama.cpp's router (``--models-dir``): ``GET /health``, ``/props`` (``"role": "router"``,
  ``max_instances``: its --models-max), ``/models`` (each model, its aliases and ``status``),
  and for one loaded model ``/props?model=NAME&autoload=false`` (its child's
  ``total_slots``). ``autoload=false``: without it, asking a child's props loads the model.
- any OpenAI-compatible server: ``GET /v1/models``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import aiohttp

from gateway.backends.pool import LoadedModel
from gateway.backends.watch.failures import cause_of, http_cause
from gateway.config import BackendKind, model_key

__all__ = ["Observation", "ProbeFailed", "entries_of", "names_of", "probe"]


class ProbeFailed(Exception):
    """The backend did not answer its probe as a healthy one does."""


@dataclass(frozen=True, slots=True)
class Observation:
    models: frozenset[str]
    loaded: dict[str, LoadedModel] = field(default_factory=dict)
    sizes: dict[str, int] = field(default_factory=dict)  # model -> bytes on disk (Ollama)
    slots: int | None = None
    sleeping: bool = False
    model_limit: int | None = None  # the router's --models-max (None: no limit)
    names: dict[str, str] = field(default_factory=dict)  # model key -> the router's own name
    # Models whose last load failed (the router's), with the exit code of their child.
    failed: dict[str, int | None] = field(default_factory=dict)
    # Models whose child is starting (the router's): a failed one being tried again.
    loading: frozenset[str] = frozenset()
    child_slots: dict[str, int] = field(default_factory=dict)  # the router's, by model key
    # Keys the router's names share (``coder`` and an alias ``Coder`` of another): the
    # router's names for each, which the gateway's spelling-blind keys cannot tell apart.
    ambiguous: dict[str, tuple[str, ...]] = field(default_factory=dict)
    version: str | None = None  # as it says it (Ollama's /api/version)


Getter = Callable[[str], Awaitable[Any]]


async def probe(
    session: aiohttp.ClientSession, kind: BackendKind, url: str, within: float
) -> Observation:
    """Ask the backend at ``url`` about itself; ProbeFailed when it is not ready."""

    async def get(path: str) -> Any:
        try:
            async with session.get(
                url + path, timeout=aiohttp.ClientTimeout(total=within)
            ) as reply:
                if reply.status != 200:
                    raise ProbeFailed(http_cause(path, reply.status, await reply.text(), kind))
                return await reply.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            raise ProbeFailed(cause_of(exc, kind, within)) from exc

    probes = {
        "ollama": _ollama,
        "llamacpp": _llamacpp,
        "llamacpp-router": _llamacpp_router,
        "openai": _openai,
    }
    return await probes[kind](get)


async def _ollama(get: Getter) -> Observation:
    version = await get("/api/version")
    tags = _entries(await get("/api/tags"), "models")
    running = _entries(await get("/api/ps"), "models")
    return Observation(
        models=frozenset(model_key(str(entry.get("name"))) for entry in tags),
        loaded={model_key(str(e.get("name"))): _loaded(e) for e in running},
        sizes={model_key(str(e.get("name"))): _count(e.get("size")) or 0 for e in tags},
        version=_text(version.get("version") if isinstance(version, dict) else None),
    )


def _text(value: Any) -> str | None:
    """A version as the backend says it, if it says one: at most a line's worth."""
    return value[:64] if isinstance(value, str) else None


def _loaded(entry: dict[str, Any]) -> LoadedModel:
    """An /api/ps entry (api.ProcessModelResponse): expiry, size, context per slot."""
    expires = entry.get("expires_at")
    return LoadedModel(
        expires_at=expires if isinstance(expires, str) else None,
        size=_count(entry.get("size")) or 0,
        context_length=_count(entry.get("context_length")),
    )


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


async def _llamacpp(get: Getter) -> Observation:
    await get("/health")
    props = await get("/props")
    if _is_router(props):
        # Served as one model, a router's swaps would be its own and none of its models
        # would show as loaded: say what to write instead.
        raise ProbeFailed("this llama-server is a router (--models-dir): kind: llamacpp-router")
    slots = props.get("total_slots") if isinstance(props, dict) else None
    openai_models = _entries(await get("/v1/models"), "data")
    return Observation(
        models=frozenset(model_key(str(entry.get("id"))) for entry in openai_models),
        slots=slots if isinstance(slots, int) and slots > 0 else None,
        sleeping=bool(isinstance(props, dict) and props.get("is_sleeping")),
    )


# The router's words for a child that holds (or is taking) memory: ``loading`` counts, as
# its room is taken from the moment the child starts.
_HELD = frozenset({"loaded", "loading", "sleeping"})


def names_of(entry: dict[str, Any]) -> list[str]:
    """What an OpenAI listing's model answers to: its ``id``, then its aliases (llama-server's
    router: a preset's ``alias``)."""
    aliases = entry.get("aliases")
    return [
        str(name) for name in (entry.get("id"), *(aliases if isinstance(aliases, list) else ()))
    ]


async def _llamacpp_router(get: Getter) -> Observation:
    await get("/health")
    props = await get("/props")
    if not _is_router(props):
        raise ProbeFailed("this llama-server serves one model, not a router: kind: llamacpp")
    limit = props.get("max_instances")
    names: dict[str, str] = {}
    loaded: dict[str, LoadedModel] = {}
    failed: dict[str, int | None] = {}
    loading: set[str] = set()
    ambiguous: dict[str, tuple[str, ...]] = {}
    for entry in _entries(await get("/models"), "data"):
        name = str(entry.get("id"))
        for called in names_of(entry):
            key = model_key(called)
            if names.setdefault(key, name) != name and name not in ambiguous.get(key, ()):
                ambiguous[key] = (*ambiguous.get(key, (names[key],)), name)
        status = entry.get("status")
        if not isinstance(status, dict):
            continue
        # Under its own name only: requests name it so where routers alone serve it
        # (``routes/checks.py``: as_routers_name_it).
        if status.get("value") in _HELD:
            loaded[model_key(name)] = LoadedModel()
            if status.get("value") == "loading":
                loading.add(model_key(name))
        elif status.get("failed") is True:
            code = status.get("exit_code")
            failed[model_key(name)] = code if isinstance(code, int) else None
    children = await _children(get, [names[m] for m in loaded])
    for key, (_, context) in children.items():  # its context per slot, as Ollama's /api/ps
        loaded[key] = LoadedModel(context_length=context)
    return Observation(
        models=frozenset(names),
        loaded=loaded,
        failed=failed,
        loading=frozenset(loading),
        child_slots={key: slots for key, (slots, _) in children.items()},
        model_limit=_count(limit),
        names=names,
        ambiguous=ambiguous,
    )


async def _children(get: Getter, loaded: list[str]) -> dict[str, tuple[int, int | None]]:
    """Slots of each loaded child and its context per slot, by model key, from its own
    /props (a preset may give each model its own ``parallel`` and ``ctx-size``); none of one
    that went in the meantime."""
    found: dict[str, tuple[int, int | None]] = {}
    for name in loaded:
        try:
            child = await get(f"/props?model={quote(name, safe='')}&autoload=false")
        except ProbeFailed:
            continue  # unloaded since /models said it was: another may answer
        if not isinstance(child, dict):
            continue
        slots, settings = child.get("total_slots"), child.get("default_generation_settings")
        context = _count(settings.get("n_ctx")) if isinstance(settings, dict) else None
        if isinstance(slots, int) and slots > 0:
            found[model_key(name)] = (slots, context)
    return found


def _is_router(props: Any) -> bool:
    return isinstance(props, dict) and props.get("role") == "router"


async def _openai(get: Getter) -> Observation:
    openai_models = _entries(await get("/v1/models"), "data")
    return Observation(models=frozenset(model_key(str(entry.get("id"))) for entry in openai_models))


def entries_of(document: Any, key: str) -> list[dict[str, Any]] | None:
    """The objects in ``document[key]`` (Ollama's ``models``, OpenAI's ``data``); None when
    the reply has no such list."""
    entries = document.get(key) if isinstance(document, dict) else None
    if not isinstance(entries, list):
        return None
    return [entry for entry in entries if isinstance(entry, dict)]


def _entries(document: Any, key: str) -> list[dict[str, Any]]:
    entries = entries_of(document, key)
    if entries is None:
        raise ProbeFailed(f"no {key!r} list in the reply")
    return entries
