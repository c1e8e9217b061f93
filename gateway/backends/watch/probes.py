"""What each kind of backend says about itself: health, slots, models, loaded models.

- Ollama: ``GET /api/version`` (health), ``/api/tags`` (models), ``/api/ps`` (loaded now, with
  ``expires_at``). Its parallelism cannot be read: the policy states it.
- llama.cpp: ``GET /health`` (503 "Loading model" while loading), ``/props`` (``total_slots``,
  ``is_sleeping``), ``/v1/models``.
- any OpenAI-compatible server: ``GET /v1/models``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from gateway.backends.pool import LoadedModel
from gateway.backends.watch.failures import cause_of, http_cause
from gateway.config import model_key

__all__ = ["Observation", "ProbeFailed", "entries_of", "probe"]


class ProbeFailed(Exception):
    """The backend did not answer its probe as a healthy one does."""


@dataclass(frozen=True, slots=True)
class Observation:
    models: frozenset[str]
    loaded: dict[str, LoadedModel] = field(default_factory=dict)
    sizes: dict[str, int] = field(default_factory=dict)  # model -> bytes on disk (Ollama)
    slots: int | None = None
    sleeping: bool = False


Getter = Callable[[str], Awaitable[Any]]


async def probe(session: aiohttp.ClientSession, kind: str, url: str, within: float) -> Observation:
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

    probes = {"ollama": _ollama, "llamacpp": _llamacpp, "openai": _openai}
    return await probes[kind](get)


async def _ollama(get: Getter) -> Observation:
    await get("/api/version")
    tags = _entries(await get("/api/tags"), "models")
    running = _entries(await get("/api/ps"), "models")
    return Observation(
        models=frozenset(model_key(str(entry.get("name"))) for entry in tags),
        loaded={model_key(str(e.get("name"))): _loaded(e) for e in running},
        sizes={model_key(str(e.get("name"))): _count(e.get("size")) or 0 for e in tags},
    )


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
    slots = props.get("total_slots") if isinstance(props, dict) else None
    openai_models = _entries(await get("/v1/models"), "data")
    return Observation(
        models=frozenset(model_key(str(entry.get("id"))) for entry in openai_models),
        slots=slots if isinstance(slots, int) and slots > 0 else None,
        sleeping=bool(isinstance(props, dict) and props.get("is_sleeping")),
    )


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
