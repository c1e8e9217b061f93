"""What a generation request must pass before it waits for a turn: its model named and
served and allowed, its fields of the types Ollama reads, nothing a shared box refuses to
run, and the quick no said before its body is read. (Its account's budget:
``usage/spending.py``.)"""

from __future__ import annotations

import time
from collections.abc import Sequence

from gateway.admission import Admission, Refusal
from gateway.backends import Backend, BackendPool, failed_to_load
from gateway.config import Policy, model_key
from gateway.core import Api, GatewayError, Lane, Reason, retry_after_header
from gateway.intake import (
    Fields,
    checked_name,
    model_forbidden,
    model_not_found,
    no_backend,
)
from gateway.wire import message_list_error, openai_refusal, server_tools

PERSON = Lane.INTERACTIVE  # looked up once: an enum member is a descriptor call each time
PEOPLE_ONLY = (PERSON,)  # what most requests are known to be from their headers

__all__ = [
    "PEOPLE_ONLY",
    "PERSON",
    "as_routers_name_it",
    "check_field_types",
    "check_model_allowed",
    "check_model_served",
    "quick_no",
    "refused_body",
    "resolved",
]


def resolved(fields: Fields, policy: Policy) -> str:
    """The model the request names, an alias resolved, and written back into the body: from
    here on, the policy, the routing and the backend all see the same model."""
    model = fields.values.get("model")
    if not isinstance(model, str) or not model:
        raise GatewayError(400, Reason.BAD_REQUEST, "model is required")
    return _written(fields, model, policy.resolve(checked_name(model)))


def as_routers_name_it(fields: Fields, pool: BackendPool, api: Api, model: str) -> str:
    """``model`` as the routers serving it list it (``coder`` for ``Coder``, ``coder:latest``
    or an alias of its preset), written back into the body, where only routers serve it
    and they name it alike. The gateway's rules tell models apart as Ollama does, blind to
    case and tag, and judge the name asked (the allowlist, the lanes); llama-server's router
    matches its own names exactly, so a request it would refuse, or send to the same child
    under another name, would be planned as a swap of its own: the family's model unloaded
    for a 400. Where an Ollama serves it too, or two routers spell it otherwise, it goes as
    asked: each would need its own spelling."""
    if not pool.routers:  # nearly every house: nothing asked on its requests' path
        return model
    named = None
    for backend in pool.serving(api, model):  # a loop: a few backends, every request
        if not backend.router:
            return model
        own = backend.state.names.get(model_key(model))
        if own is None or named not in (None, own):
            return model
        named = own
    return model if named is None else _written(fields, model, named)


def _written(fields: Fields, model: str, named: str) -> str:
    """``named``, written into the body in place of ``model`` if they differ."""
    if named != model:
        fields.values["model"] = named
        fields.changed()
    return named


def check_model_served(pool: BackendPool, api: Api, model: str) -> None:
    serving = pool.serving(api, model)
    if serving:
        for backend in serving:  # a loop, not any(): on every request's path
            if backend.state.failed_loads or backend.state.ambiguous:  # a router's, rarely
                _check_names(serving, model)
                _check_loads(serving, model)
                break
        return
    if pool.known_nowhere(api, model):
        raise model_not_found(model)
    raise no_backend(pool, api, model)


def _check_names(serving: Sequence[Backend], model: str) -> None:
    """A 503 when a router serving ``model`` has two models the name could mean (``coder``,
    and ``Coder`` an alias of another): the policy, blind to case and tag as Ollama is,
    would judge one and the router run the other. The admin renames one."""
    for backend in serving:
        names = backend.state.ambiguous.get(model_key(model))
        if names:
            raise GatewayError(
                503,
                Reason.NO_BACKEND,
                f"{model!r} could mean any of {', '.join(names)} on backend {backend.name}, "
                "whose names differ only in case or tag, which the gateway does not tell "
                "apart; the admin must rename one in the router's models or presets",
            )


def _check_loads(serving: Sequence[Backend], model: str) -> None:
    """A 503 when every backend serving ``model`` failed to load it lately (a router whose
    child exited): sent, the request would unload the models others use for a load that
    fails again. Once a while has passed, one request tries again."""
    now = time.monotonic()
    # Another backend can load it, or a retry is due (requests go until one is sent:
    # ``FailedLoad.retrying``).
    if not all(backend.load_failed(model, now) for backend in serving):
        return
    failed = (b.failed_load(model) for b in serving)
    due = min((load for load in failed if load is not None), key=lambda load: load.retry_at)
    raise GatewayError(
        503,
        Reason.NO_BACKEND,
        f"{failed_to_load({repr(model): due.exit_code})}; it is tried again in "
        f"{retry_after_header(due.retry_at - now)} s",
        retry_after=due.retry_at - now,
    )


def check_model_allowed(policy: Policy, user: str, model: str) -> None:
    if not policy.may_use(user, model):
        raise model_forbidden(user, model)


# What each API's requests may not ask of a shared box, and why (None: nothing).
_REFUSED = {Api.OPENAI: openai_refusal, Api.ANTHROPIC: server_tools}


def refused_body(api: Api, path: str, values: dict[str, object]) -> str | None:
    """Why an OpenAI or Anthropic request is refused: a body no server takes, or what it may
    not ask of a shared box; None if neither."""
    return message_list_error(path, values) or _REFUSED[api](values)


def check_field_types(fields: Fields) -> None:
    """Ollama's own 400 for a field of the wrong type (found with the parse), before a slot
    is taken: sent on, it would be refused there only after a swap had unloaded another
    user's model for it."""
    if fields.type_error is not None:
        raise GatewayError(400, Reason.BAD_REQUEST, fields.type_error)


def quick_no(admission: Admission, user: str, possible: tuple[Lane, ...]) -> Refusal | None:
    """The quick no before the body is read, raised; where the person's lane is full but the
    body may be a task's (``possible``: its lanes), the person's refusal, kept for a body too
    large to be one; None where the person has room. The person's lane is asked once: most
    requests stop there, with room to start."""
    person_refused = admission.refuses_unseen(user, PEOPLE_ONLY) if possible[0] is PERSON else None
    if person_refused is not None or possible[0] is not PERSON:
        unseen = (
            person_refused
            if possible == PEOPLE_ONLY
            else admission.refuses_unseen(user, possible)  # a task's bound too
        )
        if unseen is not None:
            raise unseen.error()
    return person_refused
