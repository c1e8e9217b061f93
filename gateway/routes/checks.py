"""What a generation request must pass before it waits for a turn: its model named and
served and allowed, its fields of the types Ollama reads, nothing a shared box refuses to
run, and its account's budget (counted as in flight until it ends)."""

from __future__ import annotations

import contextlib
from contextlib import AbstractAsyncContextManager

from gateway.backends import BackendPool
from gateway.config import Policy
from gateway.core import Api, GatewayError, Reason
from gateway.intake import (
    Estimate,
    Fields,
    checked_name,
    model_forbidden,
    model_not_found,
    no_backend,
)
from gateway.services import Services
from gateway.usage import InFlight
from gateway.wire import openai_refusal, server_tools

__all__ = [
    "REFUSED",
    "STRUCTS",
    "check_budget",
    "check_field_types",
    "check_model_allowed",
    "check_model_served",
    "in_flight",
    "resolved",
]


def resolved(fields: Fields, policy: Policy) -> str:
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


def check_model_served(pool: BackendPool, api: Api, model: str) -> None:
    if pool.serving(api, model):
        return
    if pool.known_nowhere(api, model):
        raise model_not_found(model)
    raise no_backend(pool, api, model)


def in_flight(
    services: Services, policy: Policy, user: str, estimate: Estimate | None = None
) -> AbstractAsyncContextManager[None]:
    """A request counted (and its ``estimate`` of tokens reserved) against ``user``'s budget
    while it runs or waits; nothing to count without a budget."""
    budget = policy.budget_of(user) if policy.budgeted else None
    if not budget:
        return _UNCOUNTED
    tokens = 0
    if estimate is not None and budget.tokens_per_day is not None:
        output = estimate.output_tokens
        tokens = estimate.prompt_tokens + (output or services.usage.expected_output(user))
    return InFlight(services.usage, services.admission, budget, user, tokens)


_UNCOUNTED = contextlib.nullcontext()


def check_budget(services: Services, policy: Policy, user: str) -> None:
    if not policy.budgeted:
        return
    budget = policy.budget_of(user)
    if not budget:
        return
    spent = services.usage.refusal(user, budget, services.admission.in_flight(user))
    if spent is not None:
        raise spent.error()


def check_model_allowed(policy: Policy, user: str, model: str) -> None:
    if not policy.may_use(user, model):
        raise model_forbidden(user, model)


# What each API's requests may not ask of a shared box, and why (None: nothing).
REFUSED = {Api.OPENAI: openai_refusal, Api.ANTHROPIC: server_tools}

# Ollama's structs for its native routes (api/types.go), by path.
STRUCTS = {
    "/api/generate": "api.GenerateRequest",
    "/api/chat": "api.ChatRequest",
    "/api/embed": "api.EmbedRequest",
    "/api/embeddings": "api.EmbeddingRequest",
}


def check_field_types(fields: Fields) -> None:
    """Ollama's own 400 for a field of the wrong type (found with the parse), before a slot
    is taken: sent on, it would be refused there only after a swap had unloaded another
    user's model for it."""
    if fields.type_error is not None:
        raise GatewayError(400, Reason.BAD_REQUEST, fields.type_error)
