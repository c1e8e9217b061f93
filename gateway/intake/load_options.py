"""The options Ollama fixes when it loads a model, read from a request body as Ollama reads
them, and the admin's say over them.

Ollama starts a model's runner with the request's ``num_ctx`` (one of the ``api.Runner``
options); a request whose ``num_ctx`` differs from the loaded runner's reloads the model,
holding every request that needs a load meanwhile (server/sched.go ``needsReload``).
Chat front ends set ``num_ctx`` per chat, so two people whose clients ask for different
sizes reload the model on every turn. The ``num_ctx`` policy (per model, like keep_alive's)
clamps or replaces the value, and the gateway forwards exactly the value it checked.
"""

from __future__ import annotations

from typing import Any, Literal, TypeGuard

from gateway.config.models import MIN_NUM_CTX, NumCtxPolicy
from gateway.core.errors import GatewayError
from gateway.core.vocabulary import Reason

__all__ = ["apply_num_ctx_policy", "num_ctx_of"]

_INT64 = 2**63


def num_ctx_of(fields: dict[str, Any]) -> int | None:
    """The ``num_ctx`` Ollama would load the model with for this body, or None for its
    default. ``Options.FromMap`` truncates a JSON number toward zero (Go's ``int64``
    conversion: out of range gives the smallest int64) and ``getRunner`` raises anything
    below 4 to 4. Another type fails the request in Ollama: nothing loads, None here."""
    options = fields.get("options")
    value = options.get("num_ctx") if isinstance(options, dict) else None
    if not _is_number(value):
        return None
    number = int(value)
    return max(MIN_NUM_CTX, number if -_INT64 <= number < _INT64 else MIN_NUM_CTX)


def apply_num_ctx_policy(fields: dict[str, Any], rules: NumCtxPolicy) -> bool:
    """Clamp or replace ``options.num_ctx`` in place; True when the body changed.

    With a rule in force the forwarded value is always a plain integer, the one checked. A
    ``num_ctx`` that is not a number is refused here (400): Ollama would fail it with a 500.
    A body whose ``options`` is not an object is left to Ollama, which refuses it (400)."""
    options = fields.get("options")
    if not rules.active or not isinstance(options, dict | None):
        return False
    given = None if options is None else options.get("num_ctx")
    if given is not None and not _is_number(given):
        raise GatewayError(400, Reason.BAD_REQUEST, "options.num_ctx must be a number")
    wanted = _wanted(num_ctx_of(fields) if given is not None else None, rules)
    if wanted == "default":
        if options is None or "num_ctx" not in options:
            return False
        options = {key: value for key, value in options.items() if key != "num_ctx"}
    elif wanted is None or (wanted == given and type(given) is int):
        return False
    else:  # a copy (the body's own options stay as parsed): the client's order kept
        options = {**(options or {}), "num_ctx": wanted}
    fields["options"] = options
    return True


def _is_number(value: object) -> TypeGuard[int | float]:
    """A JSON number (JSON's true and false are Python ints too, and not numbers to Go)."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def _wanted(asked: int | None, rules: NumCtxPolicy) -> int | Literal["default"] | None:
    """The num_ctx to send instead of ``asked`` (None: the server's default), or None to
    leave the request as it is."""
    if rules.override is not None:
        return rules.override
    if asked is None:
        return None  # the server's default: the admin sets it (OLLAMA_CONTEXT_LENGTH)
    if rules.max is not None and asked > rules.max:
        return rules.max
    if rules.min is not None and asked < rules.min:
        return rules.min
    return asked
