"""Reads that never queue: model listings (the union over healthy backends), show, version.

Listings are asked of every healthy backend at once, when a client asks: ``/api/ps`` must
say what is loaded now, not at the last probe. A backend that does not answer in time is
left out of the list rather than failing it; when none is healthy, or none answers, the
client gets a 503 that says so, not an empty list (which a chat app shows as "no models").
Each user may have a few reads under way at once (``FAIRGATE_MAX_READS_PER_USER``); past
that, 429: a read opens backend connections, and a user capped at one generation must not
open dozens through ``/api/show``.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import aiohttp
import structlog
from aiohttp import web

from gateway.backends import Backend
from gateway.backends.watch import entries_of, names_of
from gateway.config import model_key
from gateway.core import Api, GatewayError, Reason
from gateway.edge.http import NO_STORE, RECORD, body_size, defer_continue, read_body
from gateway.intake import checked_name, model_forbidden, model_not_found, no_backend, parsed
from gateway.relay import Relay
from gateway.routes.targets import target_for
from gateway.routes.token_counting import COUNT_TOKENS, Counting, counting_backends
from gateway.services import Services

__all__ = ["Reads"]

log = structlog.get_logger("fairgate.listings")

# path -> (the list's key in the reply, the field naming an entry, the API it belongs to)
_LISTINGS = {
    "/api/tags": ("models", "name", Api.OLLAMA),
    "/api/ps": ("models", "name", Api.OLLAMA),
    "/v1/models": ("data", "id", Api.OPENAI),
}
# What a user may ask for lists the aliases too; what is loaded (/api/ps) lists models only.
_WITH_ALIASES = {"/api/tags": ("name", "model"), "/v1/models": ("id",)}


class Reads:
    """The routes that read without queueing: listings, show, version."""

    def __init__(self, services: Services) -> None:
        self._services = services
        self._reading: Counter[str] = Counter()  # reads under way, by user
        self._counting = Counting()

    def add_routes(self, app: web.Application) -> None:
        for path in _LISTINGS:
            app.router.add_get(path, self.listing)
        # The openai SDK's models.retrieve; an id may hold slashes (hf.co/org/model).
        app.router.add_get("/v1/models/{model:.+}", self.model)
        app.router.add_post("/api/show", self.show, expect_handler=defer_continue)
        app.router.add_post(COUNT_TOKENS, self.show, expect_handler=defer_continue)
        # Clients probe the version to see whether a server is there: no key needed.
        app.router.add_get("/api/version", self.version)

    async def listing(self, request: web.Request) -> web.Response:
        """The union of every healthy backend's list, each model once."""
        user = self._services.caller(request, self._services.policy.current).user
        with self._read_by(user):
            return await self._listing(request, user)

    async def model(self, request: web.Request) -> web.Response:
        """One entry of the caller's /v1/models (an alias too), as OpenAI's retrieve answers."""
        user = self._services.caller(request, self._services.policy.current).user
        wanted = checked_name(request.match_info["model"])
        request[RECORD].model = wanted
        if not self._services.policy.current.policy.may_use(user, wanted):
            raise model_forbidden(user, wanted)
        with self._read_by(user):
            entries = await self._entries(user, "/v1/models")
        entry = entries.get(wanted) or _named(entries.values(), wanted)
        if entry is None:
            raise model_not_found(wanted)
        return web.json_response(entry, headers=NO_STORE)

    async def show(self, request: web.Request) -> web.StreamResponse:
        """Model details from a backend that has the model; or Anthropic's count of a
        Messages request's prompt, from a llama-server that has it (routes/token_counting.py)."""
        user = self._services.caller(request, self._services.policy.current).user
        with self._read_by(user):
            return await self._show(request, user)

    @contextmanager
    def _read_by(self, user: str) -> Iterator[None]:
        limit = self._services.settings.max_reads_per_user
        if self._reading[user] >= limit:
            raise GatewayError(
                429,
                Reason.TOO_MANY_READS,
                f"user {user} already has {limit} reads (listings, show) under way",
                retry_after=1.0,
            )
        self._reading[user] += 1
        try:
            yield
        finally:
            self._reading[user] -= 1
            if not self._reading[user]:
                del self._reading[user]

    async def _listing(self, request: web.Request, user: str) -> web.Response:
        key, _, api = _LISTINGS[request.path]
        entries = await self._entries(user, request.path)
        body: dict[str, Any] = {key: list(entries.values())}
        if api is Api.OPENAI:
            body = {"object": "list", **body}
        return web.json_response(body, headers=NO_STORE)  # the models this user may use

    async def _entries(self, user: str, path: str) -> dict[str, dict[str, Any]]:
        """The union of the healthy backends' lists at ``path`` (each model once, by name)
        that ``user`` may use, and the aliases of those models."""
        services = self._services
        policy, pool = services.policy.current.policy, services.policy.current.pool
        key, field, api = _LISTINGS[path]
        session, within = services.upstream.session, policy.monitoring.timeout
        healthy = pool.healthy(api)
        if not healthy:  # an empty list would say "no models", not "Ollama is down"
            raise no_backend(pool, api, "")
        lists = await asyncio.gather(
            *(_entries(session, b.url + path, key, within) for b in healthy)
        )
        answered = [listed for listed in lists if listed is not None]
        if not answered:
            raise GatewayError(
                503,
                Reason.NO_BACKEND,
                f"no backend answered {path} within {within:g}s; retry in a moment",
                retry_after=10.0,
            )
        entries: dict[str, dict[str, Any]] = {}
        for listed in answered:
            for entry in map(_told_users, listed):
                name = str(entry.get(field))
                # A user limited to some models sees only those.
                if policy.may_use(user, name):
                    entries.setdefault(name, entry)
                    continue
                # A router's preset names its model by its aliases too: one allowed by an
                # alias sees the model under it, as the requests it may send name it.
                for alias in names_of(entry)[1:]:
                    if policy.may_use(user, alias):
                        entries.setdefault(alias, entry | {field: alias})
        by_model = {model_key(name): entry for name, entry in entries.items()}
        for alias, model in policy.aliases.items():
            named = by_model.get(model_key(model))
            if named is not None and path in _WITH_ALIASES:
                # The model's own entry under the alias's name: what it runs, said as it is
                # (over a model of that name, which a request by the name no longer reaches).
                entries[alias] = named | dict.fromkeys(_WITH_ALIASES[path], alias)
        return entries

    async def _show(self, request: web.Request, user: str) -> web.StreamResponse:
        services = self._services
        view, record, settings = services.policy.current, request[RECORD], services.settings
        # Read as Ollama reads it (keys folded, last wins refused), so the model checked
        # against models: is the model shown: `model`, else the older `name`.
        counting = request.path == COUNT_TOKENS
        if counting:  # before its body, as a generation's: it costs the engine work
            services.spending.check(view.policy, user)
        limit = settings.max_body_bytes
        with services.admission.arriving(user, body_size(request, limit), limit):
            body = await read_body(request, limit, settings.body_timeout)
        fields = await parsed(body, services.parsing)
        named = "model" if counting or fields.values.get("model") else "name"
        model = fields.values.get(named) or ""
        if not isinstance(model, str):
            raise GatewayError(400, Reason.BAD_REQUEST, "model must be a string")
        checked_name(model)
        if model and not view.policy.may_use(user, model):
            raise model_forbidden(user, model)
        if model and view.policy.resolve(model) != model:  # the backend shows what it runs
            model = fields.values[named] = view.policy.resolve(model)
            fields.changed()
        record.model = model or None
        pool = view.pool
        if counting:
            backend = self._choose(counting_backends(pool, model), model)
            async with self._counting.turn(backend, user):
                return await self._relay(request, backend, fields.body)
        candidates = pool.serving(Api.OLLAMA, model) if model else pool.healthy(Api.OLLAMA)
        if not candidates and model and pool.known_nowhere(Api.OLLAMA, model):
            raise model_not_found(model)
        return await self._relay(request, self._choose(candidates, model), fields.body)

    async def version(self, request: web.Request) -> web.StreamResponse:
        view = self._services.policy.current
        return await self._relay(request, self._choose(view.pool.healthy(Api.OLLAMA), ""), None)

    def _choose(self, candidates: Sequence[Backend], model: str) -> Backend:
        pool, busy = self._services.policy.current.pool, self._services.admission.busy
        if not candidates:
            raise no_backend(pool, Api.OLLAMA, model)
        return pool.prefer(candidates, model, busy)

    async def _relay(
        self, request: web.Request, backend: Backend, body: bytes | None
    ) -> web.StreamResponse:
        record = request[RECORD]
        record.backend = backend.name
        target = target_for(backend, self._services.policy.current.policy, request.path_qs)
        relay = Relay(self._services.upstream.replies, target, self._services.reply_headers)
        try:
            return await relay.run(request, body)
        finally:
            record.add(relay.progress)


async def _entries(
    session: aiohttp.ClientSession, url: str, key: str, within: float
) -> list[dict[str, Any]] | None:
    """The entries of one backend's list; None if it did not answer with one."""
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=within)) as reply:
            document = await reply.json(content_type=None) if reply.status == 200 else None
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        log.warning("listing_failed", url=url, error=repr(exc))
        return None
    if document is None:
        log.warning("listing_failed", url=url, status=reply.status)
        return None
    return entries_of(document, key) or []


# What a user is told of a router's model's status: the router adds the child's command line
# and its preset (the model file's path on the server, the child's port), for its admin.
_STATUS_TOLD = ("value", "failed", "exit_code")


def _told_users(entry: dict[str, Any]) -> dict[str, Any]:
    """``entry`` as a user may see it: a router's status without its child's command line."""
    status = entry.get("status")
    if not isinstance(status, dict):
        return entry
    return entry | {"status": {k: v for k, v in status.items() if k in _STATUS_TOLD}}


def _named(entries: Iterable[dict[str, Any]], wanted: str) -> dict[str, Any] | None:
    """The entry a request for ``wanted`` reaches, spelled otherwise (``Family``,
    ``family:latest``) or by an alias of a router's, under the name asked; None if none."""
    key = model_key(wanted)
    for entry in entries:
        if key in (model_key(name) for name in names_of(entry)):
            return entry | {"id": wanted}
    return None
