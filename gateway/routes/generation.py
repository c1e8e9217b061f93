"""The request handlers: the path of a request, top to bottom."""

from __future__ import annotations

import asyncio
import contextlib
from contextlib import AbstractAsyncContextManager
from dataclasses import replace

import structlog
from aiohttp import web

from gateway.admission import REVOKED, Permit, Refusal, Ticket
from gateway.backends import Backend, BackendPool
from gateway.config import Policy
from gateway.core import GENERATION_PATHS, Api, BackendFailure, GatewayError, Reason, api_of
from gateway.edge.http import HOT_PATHS, RECORD, defer_continue, read_body
from gateway.intake import (
    Fields,
    apply_load_policy,
    checked_name,
    classify,
    lane_of,
    model_forbidden,
    model_not_found,
    no_backend,
    parsed,
    possible_lanes,
)
from gateway.relay import Relay, Target
from gateway.services import Services
from gateway.usage import InFlight
from gateway.wire import openai_refusal, server_tools, token_events

__all__ = ["Generation"]

log = structlog.get_logger("fairgate.proxy")

# Model management changes what every user of the box gets; not through a shared gateway.
MANAGEMENT_PATHS = ("/api/pull", "/api/push", "/api/create", "/api/copy", "/api/delete")


class Generation:
    """The generation and embedding routes: identify, classify, admit, relay, release."""

    def __init__(self, services: Services) -> None:
        self._services = services
        self._targets = _Targets()

    def add_routes(self, app: web.Application) -> None:
        for path in GENERATION_PATHS:
            app.router.add_post(path, self.generate, expect_handler=defer_continue)
        app[HOT_PATHS] = GENERATION_PATHS
        for path in (*MANAGEMENT_PATHS, "/api/blobs/{digest}"):
            app.router.add_route("*", path, refuse_management, expect_handler=defer_continue)
        app.router.add_get("/", root)

    async def generate(self, request: web.Request) -> web.StreamResponse:
        """A generation or embedding request, top to bottom."""
        services, record, path = self._services, request[RECORD], request.path
        view, settings = services.policy.current, services.settings
        api = api_of(path)
        caller = services.caller(request, view)
        user, lanes = caller.user, view.policy.lanes
        admission = services.admission
        # Both said before the body is read: a refused body costs nothing. The budget first:
        # "not before midnight" is the truer answer than "busy, retry in a second".
        _check_budget(services, view.policy, user)
        unseen = admission.refuses_unseen(user, possible_lanes(lanes, request.headers))
        if unseen is not None:
            raise unseen.error()
        # A body waiting for the parser counts as arriving too: a user's burst of big
        # bodies cannot hold more of them in memory than the user could queue.
        with admission.arriving(user):
            body = await read_body(request, settings.max_body_bytes, settings.body_timeout)
            fields = await parsed(body, services.parsing, _STRUCTS.get(path))
        record.model = model = _resolved(fields, view.policy)
        _check_model_allowed(view.policy, user, model)
        _check_model_served(view.pool, api, model)
        if api is not Api.OLLAMA and (refused := _REFUSED[api](fields.values)) is not None:
            raise GatewayError(400, Reason.BAD_REQUEST, refused)
        if api is Api.OLLAMA:
            _check_field_types(fields)
            if apply_load_policy(fields.values, view.policy, model):
                fields.changed()
        estimate = classify(fields.values, view.policy)
        record.request_class, record.input_estimate = estimate.request_class, estimate.input_tokens
        record.lane = lane = lane_of(lanes, request.headers, user, model, path, fields.values)
        ticket = Ticket(
            user,
            model,
            api,
            input_tokens=estimate.input_tokens,
            request_class=estimate.request_class,
            class_weight=estimate.weight,
            credential=caller.credential,
            lane=lane,
            num_ctx=estimate.num_ctx if api is Api.OLLAMA else None,
        )
        # Again, right before joining the room, and counted as in flight until the request
        # ends: with replicas, in the shared store, so that together they keep the budget.
        async with _in_flight(services, view.policy, user):
            # A reload while the body arrived revoked waiting requests it could see; this one
            # was not waiting yet: ask the policy in force now, as the reload asked the others.
            now = services.policy.current
            if now is not view and not now.directory.admits(user, caller.credential):
                raise REVOKED.error()
            outcome = admission.at_once(ticket) or await admission.acquire(ticket)
            if isinstance(outcome, Refusal):
                raise outcome.error()
            async with outcome as permit:
                record.queue_wait, record.dispatched_at = permit.queue_wait, permit.granted_at
                record.queue_position = permit.queue_position
                try:
                    response = await self._relay_with_failover(
                        request, permit, fields.body, view.policy
                    )
                except asyncio.CancelledError:
                    if record.first_byte_at is not None:
                        # The client left a reply under way: the backend took the request, and
                        # loaded its model, all the same.
                        permit.answered()
                    raise
                finally:  # a reply cut short still spent what it streamed
                    record.streamed_tokens = int(permit.output_charged)
                permit.settle(record.prompt_tokens, record.completion_tokens)
                permit.loaded(record.load_seconds)
                if response.status >= 400 and record.load_seconds is None:
                    permit.refused_by_backend()
                else:
                    permit.answered()
            services.warmth.note_load(permit.backend.name, model, record.load_seconds)
        return response

    async def _relay_with_failover(
        self, request: web.Request, permit: Permit, body: bytes, policy: Policy
    ) -> web.StreamResponse:
        """Relay on the permit's backend; if it fails before any byte, once more on another."""
        admission, record = self._services.admission, request[RECORD]
        try:
            # With nowhere else to go, the backend's own error reaches the client as it is.
            fail_fast = admission.can_reroute(permit)
            target = self._targets.of(request, permit.backend, policy, fail_fast)
            return await self._attempt(request, permit, body, target)
        except BackendFailure as failure:
            failed = permit.backend.name
            if failure.reason is Reason.BACKEND_UNREACHABLE:
                self._services.monitor.report_failure(failed, failure.message)
            if not await admission.reroute(permit):
                raise
            log.warning("failover", failed=failed, to=permit.backend.name, error=failure.message)
            record.retried = True
            target = self._targets.of(request, permit.backend, policy, fail_fast=False)
            return await self._attempt(request, permit, body, target)

    async def _attempt(
        self, request: web.Request, permit: Permit, body: bytes, target: Target
    ) -> web.StreamResponse:
        record = request[RECORD]
        record.backend = permit.backend.name
        if permit.placement.unload:  # nearly never: no coroutine made for nothing
            await self._make_room(permit, target.timeouts.connect)
        services = self._services
        relay = Relay(services.upstream.replies, target, services.reply_headers, permit.add_output)
        streams = services.streams
        streams.add(relay)  # so that a shutdown can end it with an in-band error
        try:
            return await relay.run(request, body)
        finally:
            streams.discard(relay)
            record.add(relay.progress)

    async def _make_room(self, permit: Permit, within: float) -> None:
        """A planned swap (swaps/planner.py): unload its victims before the request goes, then let
        the requests for the model swapped in follow; sent before, they would find no room
        and Ollama would unload a model of its own choosing."""
        victims = permit.placement.unload
        permit.placement = replace(permit.placement, unload=())  # once, whatever happens
        try:
            await self._services.warmth.unload(permit.backend, victims, within)
        finally:
            self._services.admission.made_room(permit.backend)


class _Targets:
    """Each backend's Target for each generation path, made once for each policy: the
    request's path made into text (yarl) and a Target built would be on every request's way
    to its upstream write, and only a policy (with its backends) changes them."""

    def __init__(self) -> None:
        self._policy: Policy | None = None
        self._made: dict[tuple[str, str, str, bool], Target] = {}

    def of(self, request: web.Request, backend: Backend, policy: Policy, fail_fast: bool) -> Target:
        path = request.path
        if request.raw_path != path:  # a query or an escape: the client's to vary, not kept
            return _target(request, backend, policy, fail_fast)
        if policy is not self._policy:  # a reload: the old policy's are forgotten
            self._policy, self._made = policy, {}
        # The route's path (a generation path), and the backend's all that its Target reads.
        key = (backend.url, backend.kind, path, fail_fast)
        target = self._made.get(key)
        if target is None:
            target = self._made[key] = _target(request, backend, policy, fail_fast)
        return target


def _target(request: web.Request, backend: Backend, policy: Policy, fail_fast: bool) -> Target:
    return Target(
        backend.url + request.path_qs,
        policy.timeouts,
        fail_fast=fail_fast,
        close_connection=backend.kind == "llamacpp",
        keep_origin=not policy.cors.origins,
        events=token_events(request.path),
    )


async def refuse_management(request: web.Request) -> web.StreamResponse:
    raise GatewayError(
        403,
        Reason.MANAGEMENT_FORBIDDEN,
        "model management (pull, push, create, copy, delete) is disabled on this gateway",
    )


async def root(request: web.Request) -> web.StreamResponse:
    # Ollama clients probe GET / (and HEAD /) to see whether the server is up.
    return web.Response(text="Ollama is running")


def _resolved(fields: Fields, policy: Policy) -> str:
    """The model the request names, an alias resolved, and written back into the body: from
    here on, the policy, the routing and the backend all see the same model."""
    model = fields.values.get("model")
    if not isinstance(model, str) or not model:
        raise GatewayError(400, Reason.BAD_REQUEST, "model is required")
    resolved = policy.resolve(checked_name(model))
    if resolved != model:
        fields.values["model"] = resolved
        fields.changed()
    return resolved


def _check_model_served(pool: BackendPool, api: Api, model: str) -> None:
    if pool.serving(api, model):
        return
    if pool.known_nowhere(api, model):
        raise model_not_found(model)
    raise no_backend(pool, api, model)


def _in_flight(services: Services, policy: Policy, user: str) -> AbstractAsyncContextManager[None]:
    budget = policy.budget_of(user) if policy.budgeted else None
    if not budget:
        return _UNCOUNTED
    return InFlight(services.usage, services.admission, budget, user)


_UNCOUNTED = contextlib.nullcontext()


def _check_budget(services: Services, policy: Policy, user: str) -> None:
    if not policy.budgeted:
        return
    budget = policy.budget_of(user)
    if not budget:
        return
    spent = services.usage.refusal(user, budget, services.admission.in_flight(user))
    if spent is not None:
        raise spent.error()


def _check_model_allowed(policy: Policy, user: str, model: str) -> None:
    if not policy.may_use(user, model):
        raise model_forbidden(user, model)


# What each API's requests may not ask of a shared box, and why (None: nothing).
_REFUSED = {Api.OPENAI: openai_refusal, Api.ANTHROPIC: server_tools}

# Ollama's structs for its native routes (api/types.go), by path.
_STRUCTS = {
    "/api/generate": "api.GenerateRequest",
    "/api/chat": "api.ChatRequest",
    "/api/embed": "api.EmbedRequest",
    "/api/embeddings": "api.EmbeddingRequest",
}


def _check_field_types(fields: Fields) -> None:
    """Ollama's own 400 for a field of the wrong type (found with the parse), before a slot
    is taken: sent on, it would be refused there only after a swap had unloaded another
    user's model for it."""
    if fields.type_error is not None:
        raise GatewayError(400, Reason.BAD_REQUEST, fields.type_error)
