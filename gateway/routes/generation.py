"""The request handlers: the path of a request, top to bottom."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from dataclasses import replace
from functools import partial

import structlog
from aiohttp import web

from gateway.admission import NO_PREFIX, REVOKED, Permit, Refusal, Ticket
from gateway.backends import Backend, runs_fewer
from gateway.backends.watch import unload_models
from gateway.config import Policy, background_account
from gateway.core import (
    EMBEDDING_PATHS,
    GENERATION_PATHS,
    Api,
    BackendFailure,
    GatewayError,
    Lane,
    Reason,
    api_of,
)
from gateway.edge.http import HOT_PATHS, RECORD, body_size, defer_continue, read_body
from gateway.intake import apply_load_policy, classify, lane_of, parsed, possible_lanes, prefix_of
from gateway.relay import Preempted, Relay, Target
from gateway.routes.checks import (
    PEOPLE_ONLY,
    as_routers_name_it,
    check_field_types,
    check_model_allowed,
    check_model_served,
    quick_no,
    refused_body,
    resolved,
)
from gateway.routes.targets import target_for
from gateway.services import Services
from gateway.wire import SLOT_PATHS, STRUCT_OF_PATH, token_events, with_slot

__all__ = ["Generation"]

log = structlog.get_logger("fairgate.proxy")

# A front end's task is its prompt and a little history: Open WebUI's are a few KB.
TASK_BODY_BYTES = 256 * 1024

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
        # "not before midnight" is the truer answer than "busy, retry in a second". Only a
        # person's: background work is charged to its front end, known from the body.
        possible = possible_lanes(lanes, request.headers)
        if possible == PEOPLE_ONLY:
            services.spending.check(view.policy, user)
        person_refused = quick_no(admission, user, possible)
        # A person whose places are all taken may still send a task, known from its prompt:
        # a body is read only if it is small enough to be one, else refused for the person.
        limit = settings.max_body_bytes if person_refused is None else TASK_BODY_BYTES
        # A body waiting for the parser counts as arriving too: a user's bodies cannot
        # hold more memory than the user could queue, nor than one body of the largest size.
        with admission.arriving(user, body_size(request, limit), settings.max_body_bytes):
            try:
                body = await read_body(request, limit, settings.body_timeout)
            except GatewayError as error:
                if person_refused is not None and error.reason is Reason.BODY_TOO_LARGE:
                    person_refused = replace(person_refused, close=error.close)  # rest unread
                    raise person_refused.error() from None
                raise
            fields = await parsed(body, services.parsing, STRUCT_OF_PATH.get(path))
        record.model = model = resolved(fields, view.policy)
        check_model_allowed(view.policy, user, model)
        check_model_served(view.pool, api, model)
        if api is not Api.OLLAMA and (refused := refused_body(api, path, fields.values)):
            raise GatewayError(400, Reason.BAD_REQUEST, refused)
        if api is Api.OLLAMA:
            check_field_types(fields)
            if apply_load_policy(fields.values, view.policy, model):
                fields.changed()
        # Of the prompt, what the engine will evaluate: not what its cache holds already.
        prefix = (
            NO_PREFIX
            if path in EMBEDDING_PATHS
            else prefix_of(fields.values, model, view.policy.costs.image_tokens)
        )
        cached = admission.cached_share(view.pool.serving(api, model), prefix)
        estimate = classify(fields.values, view.policy, cached, native=api is Api.OLLAMA)
        record.request_class, record.input_estimate = estimate.request_class, estimate.prompt_tokens
        record.uncached_estimate = estimate.input_tokens
        record.lane = lane = lane_of(lanes, request.headers, user, model, path, fields.values)
        record.model = model = as_routers_name_it(fields, view.pool, api, model)
        account = background_account(user) if lane is Lane.BACKGROUND else user
        if possible != PEOPLE_ONLY:
            services.spending.check(view.policy, account)
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
            prefix=prefix,
        )
        # Again, right before joining the room, and counted as in flight until the request
        # ends: with replicas, in the shared store, so that together they keep the budget.
        async with services.spending.counted(view.policy, account, estimate):
            # A reload while the body arrived revoked waiting requests it could see; this one
            # was not waiting yet: ask the policy in force now, as the reload asked the others.
            now = services.policy.current
            if now is not view and not now.directory.admits(user, caller.credential):
                raise REVOKED.error()
            # Background work that gave its slot to a person runs again, from its body.
            while (response := await self._run(request, ticket, fields.body, view.policy)) is None:
                ticket = ticket.restarted()
        return response

    async def _run(
        self, request: web.Request, ticket: Ticket, body: bytes, policy: Policy
    ) -> web.StreamResponse | None:
        """One turn: wait for it, relay, release. None: background work gave its slot to a
        person before its reply began (its client has been sent nothing)."""
        services, record = self._services, request[RECORD]
        admission = services.admission
        outcome = admission.at_once(ticket) or await admission.acquire(ticket)
        if isinstance(outcome, Refusal):
            raise outcome.error()
        async with outcome as permit:
            record.queue_wait = permit.queue_wait + record.given_way_seconds
            record.dispatched_at = permit.granted_at
            record.queue_position = permit.queue_position
            try:
                response = await self._relay_or_give_way(request, permit, body, policy)
            except asyncio.CancelledError:
                if record.first_byte_at is not None:
                    # The client left a reply under way: the backend took the request, and
                    # loaded its model, all the same.
                    permit.answered()
                raise
            finally:  # a reply cut short still spent what it streamed
                record.streamed_tokens = int(permit.output_charged)
            if response is None:  # its wait and its run are part of the client's wait
                record.restarts += 1
                record.given_way_seconds += (
                    permit.queue_wait + admission.clock() - permit.granted_at
                )
                return None
            failed = response.status >= 400
            first_byte, dispatched = record.first_byte_at, record.dispatched_at
            permit.settle(
                record.prompt_tokens,
                record.cached_tokens,
                record.completion_tokens,
                answered=not failed and record.reason is None,
                prefill_seconds=None if first_byte is None else first_byte - dispatched,
            )
            if permit.replied(first_byte) is not None:
                said = runs_fewer(permit.backend)
                log.warning("backend_runs_fewer", backend=permit.backend.name, said=said)
            permit.loaded(record.load_seconds, first_byte)
            if failed and record.load_seconds is None:
                permit.refused_by_backend(response.status)
            else:
                permit.answered()
        services.warmth.note_load(permit.backend.name, ticket.model, record.load_seconds)
        return response

    async def _relay_or_give_way(
        self, request: web.Request, permit: Permit, body: bytes, policy: Policy
    ) -> web.StreamResponse | None:
        """The relay; for background work that may give way, raced with a person's claim on
        its slot (None: it gave way, and its backend connection was closed)."""
        relayed = self._relay_with_failover(request, permit, body, policy)
        if permit.preempted is None:  # people's requests: no task of their own
            return await relayed
        return await _unless_preempted(relayed, permit.preempted)

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
        if request.path in SLOT_PATHS and permit.backend.llama_server:
            # Its slot; a router's child its own choice (-1), never the client's.
            if permit.backend.router:
                body = with_slot(body, None)
            else:
                body = await self._to_slot(permit, body, target.timeouts.connect)
        if permit.placement.unload:  # nearly never: no coroutine made for nothing
            await self._make_room(permit, target.timeouts.connect)
        # A router's failed load, rarely: this one retries it. Marked as it is sent, not
        # when admitted: a request refused on its way must not use up the retry.
        if permit.backend.state.failed_loads and (
            failed := permit.backend.failed_load(permit.ticket.model)
        ):
            failed.retrying(time.monotonic())
        services = self._services
        begin = permit.begin_reply if permit.preempted is not None else None
        relay = Relay(
            services.upstream.replies, target, services.reply_headers, permit.add_output, begin
        )
        streams = services.streams
        streams.add(relay)  # so that a shutdown can end it with an in-band error
        try:
            return await relay.run(request, body)
        finally:
            streams.discard(relay)
            record.add(relay.progress)

    async def _to_slot(self, permit: Permit, body: bytes, within: float) -> bytes:
        """``body`` for the slot pinned (else -1) once a copy there is made; again if it failed."""
        copies = self._services.slot_copies
        for _ in range(2):
            slot, copy = permit.pin(), permit.take_copy()
            if copy is not None:
                done = partial(permit.copied, permit.backend, copy)  # it may move meanwhile
                copies.start(permit.backend, copy.source, copy.target, done)
            if slot is None or await copies.ready(permit.backend, slot, within):
                break
        return with_slot(body, slot)

    async def _make_room(self, permit: Permit, within: float) -> None:
        """A planned swap (swaps/planner.py): its victims unloaded before this request goes, the
        others for its model after; sent before, Ollama would evict a model of its own choice."""
        victims = permit.placement.unload
        permit.placement = replace(permit.placement, unload=())  # once, whatever happens
        try:
            await unload_models(self._services.upstream.session, permit.backend, victims, within)
        finally:
            self._services.admission.made_room(permit.backend)


async def _unless_preempted(
    relayed: Coroutine[object, object, web.StreamResponse], preempted: asyncio.Future[None]
) -> web.StreamResponse | None:
    """The relay's reply, or None if ``preempted`` resolves before it began: the relay is
    then cancelled, which closes its backend connection, and the engine stops."""
    run = asyncio.ensure_future(relayed)
    try:
        await asyncio.wait((run, preempted), return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # the client went away: the relay goes with it, reporting first
        run.cancel()
        await asyncio.wait((run,))
        raise
    if not run.done():
        run.cancel()
        await asyncio.wait((run,))
    if run.cancelled() or isinstance(run.exception(), Preempted):
        return None
    return run.result()


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
            events = token_events(path)
            return target_for(backend, policy, request.path_qs, fail_fast=fail_fast, events=events)
        if policy is not self._policy:  # a reload: the old policy's are forgotten
            self._policy, self._made = policy, {}
        # The route's path (a generation path), and the backend's all that its Target reads.
        key = (backend.url, backend.kind, path, fail_fast)
        target = self._made.get(key)
        if target is None:
            target = self._made[key] = target_for(
                backend, policy, path, fail_fast=fail_fast, events=token_events(path)
            )
        return target


_NO_MANAGEMENT = "model management (pull, push, create, copy, delete) is disabled on this gateway"


async def refuse_management(request: web.Request) -> web.StreamResponse:
    raise GatewayError(403, Reason.MANAGEMENT_FORBIDDEN, _NO_MANAGEMENT)


async def root(request: web.Request) -> web.StreamResponse:
    # Ollama clients probe GET / (and HEAD /) to see whether the server is up.
    return web.Response(text="Ollama is running")
