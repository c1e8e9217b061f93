"""The options Ollama fixes when it loads a model (``num_ctx``) or that decide how long it
stays loaded (``keep_alive``), read from a request body as Ollama reads them, and the
admin's say over them.

Ollama starts a model's runner with the request's ``num_ctx`` (one of the ``api.Runner``
options); a request whose ``num_ctx`` differs from the loaded runner's reloads the model,
holding every request that needs a load meanwhile (server/sched.go ``needsReload``).
Chat front ends set ``num_ctx`` per chat, so two people whose clients ask for different
sizes reload the model on every turn. The ``num_ctx`` policy (per model, like keep_alive's)
clamps or replaces the value, and the gateway forwards exactly the value it checked.
"""

from __future__ import annotations

from typing import Any, Literal, TypeGuard

from gateway.config import (
    MIN_NUM_CTX,
    BackendConfig,
    KeepAlivePolicy,
    NumCtxPolicy,
    Policy,
    model_key,
)
from gateway.core import GatewayError, Reason, fits_go_duration, parse_go_duration, whole_seconds
from gateway.wire import go_int64

__all__ = [
    "apply_keep_alive_policy",
    "apply_load_policy",
    "apply_num_ctx_policy",
    "kept_alive",
    "num_ctx_of",
]

# Go's longest duration, spelt out, is 25 characters ("-2562047h47m16.854775807s").
_LONGEST_KEEP_ALIVE = 64


# The other options of Ollama's api.Runner: needsReload compares them all with the loaded
# runner's (server/sched.go), so a client's differing value reloads the model for everybody.
RUNNER_OPTIONS = frozenset(("num_batch", "num_gpu", "main_gpu", "use_mmap", "num_thread"))


def apply_load_policy(fields: dict[str, Any], policy: Policy, model: str) -> bool:
    """The keep_alive, num_ctx and runner options rules applied to an Ollama body in place;
    True when it changed. All are applied before the one re-encoding, so that what they
    checked is what Ollama reads.

    A model a backend holds ``resident`` is never reloaded by a client either: its requests'
    own ``num_ctx`` is dropped (the admin's num_ctx rules, if any, still set one value for
    all), as the runner options are."""
    kept = kept_alive(policy.backends, model)
    changed = apply_keep_alive_policy(fields, policy.keep_alive, kept)
    rules = policy.num_ctx_for(model)
    if not rules.active and kept is not None and kept < 0 and _resident(policy, model):
        rules = _DROP_NUM_CTX
    changed = apply_num_ctx_policy(fields, rules) or changed
    if policy.runner_options == "drop":
        changed = _drop_runner_options(fields) or changed
    return changed


_DROP_NUM_CTX = NumCtxPolicy(override="default")


def _resident(policy: Policy, model: str) -> bool:
    key = model_key(model)
    return any(key in map(model_key, b.resident) for b in policy.backends if b.resident)


def _drop_runner_options(fields: dict[str, Any]) -> bool:
    """Remove the runner options from ``options`` (a copy: the parsed body stays as it
    was); True when there were any. Ollama matches option names exactly (``FromMap``)."""
    options = fields.get("options")
    if not isinstance(options, dict) or RUNNER_OPTIONS.isdisjoint(options):
        return False
    fields["options"] = {k: v for k, v in options.items() if k not in RUNNER_OPTIONS}
    return True


def num_ctx_of(fields: dict[str, Any]) -> int | None:
    """The ``num_ctx`` Ollama would load the model with for this body, or None for its
    default. ``Options.FromMap`` truncates a JSON number toward zero (Go's ``int64``
    conversion: out of range gives the smallest int64) and ``getRunner`` raises anything
    below 4 to 4. Another type fails the request in Ollama: nothing loads, None here."""
    options = fields.get("options")
    value = options.get("num_ctx") if isinstance(options, dict) else None
    if not _is_number(value):
        return None
    return max(MIN_NUM_CTX, go_int64(value))


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


def apply_keep_alive_policy(
    fields: dict[str, Any], rules: KeepAlivePolicy, kept: float | None = None
) -> bool:
    """Clamp or override ``fields["keep_alive"]`` in place; True when the body changed.

    ``kept`` (``kept_alive``): a model the policy keeps loaded is protected from a
    client's shorter keep_alive, a ``0`` above all, which would unload it for everybody."""
    given = fields.get("keep_alive")
    if given is None and rules.override is None and kept is None:
        return False  # nothing asked, nothing imposed: most requests, on their first byte's path
    wanted = _wanted_keep_alive(given, rules)
    if kept is not None:
        wanted = _protected(given if wanted is None else wanted, kept) or wanted
    if wanted is None:
        return False
    fields["keep_alive"] = whole_seconds(wanted)
    return True


def kept_alive(backends: list[BackendConfig], model: str) -> float | None:
    """How long ``model`` must stay loaded after a request: forever (-1) when a backend
    holds it ``resident``, the longest keep-warm ``keep_alive`` when one keeps it warm."""
    key, floors = "", []
    for backend in backends:
        if not backend.resident and not backend.keep_warm:  # most: nothing kept
            continue
        key = key or model_key(model)  # only then: on every request's path
        if key in map(model_key, backend.resident):
            return -1.0
        if key in map(model_key, backend.keep_warm):
            floors.append(backend.keep_alive)
    if not floors:
        return None
    return -1.0 if min(floors) < 0 else max(floors)


def _protected(given: object, kept: float) -> float | None:
    """The keep_alive that keeps the model loaded for ``kept``, or None if ``given`` does.

    Pinned (``kept`` negative): always -1, as a request without keep_alive leaves the
    runner's, which a load without one sets to Ollama's 5 minutes. Kept warm: only a
    shorter one is raised; without one the runner keeps the keep-warm pings' value."""
    asked = _asked(given)
    if kept < 0:
        return None if asked is not None and asked < 0 else kept
    return kept if asked is not None and 0 <= asked < kept else None


def _wanted_keep_alive(given: object, rules: KeepAlivePolicy) -> float | None:
    """The keep_alive to send instead of ``given``, or None to leave the request alone."""
    if rules.override is not None:
        return rules.override
    asked = _asked(given)
    if asked is None:
        return None
    forever = asked < 0
    if rules.max is not None and (forever or asked > rules.max):
        return rules.max
    if rules.min is not None and not forever and asked < rules.min:
        return rules.min
    return None


def _asked(given: object) -> float | None:
    """The client's keep_alive in seconds; None when absent or malformed: Ollama answers
    those itself (a string longer than Go's durations too: ``time.ParseDuration`` refuses it).

    A number that long is refused here (400): Ollama does not refuse it but overflows it
    (``Duration.UnmarshalJSON``), to "unload when idle" on amd64 and to its "forever" on
    arm64. Read as "very long" it would pass ``min``, and a ``keep_warm`` model would not be
    raised, while Ollama unloaded it for everybody; read as either of Ollama's meanings it
    would depend on the backend's CPU. Refused, nothing is forwarded, so no rule and no kept
    model depends on it; and the client learns that -1 says "forever"."""
    if given is None or isinstance(given, bool) or not isinstance(given, int | float | str):
        return None
    if isinstance(given, str):
        if len(given) > _LONGEST_KEEP_ALIVE:
            # Parsed on the event loop in time that grows with its square: a client's
            # 32 MiB of "1s" (valid Go) would hold every stream for hours.
            raise GatewayError(
                400,
                Reason.BAD_REQUEST,
                f"keep_alive is {len(given):,} characters long; a duration such as 5m or "
                f"24h is at most {_LONGEST_KEEP_ALIVE}",
            )
        try:
            return parse_go_duration(given)
        except ValueError:
            return None
    if given < 0:
        return -1.0  # forever, however large
    if not fits_go_duration(given):
        raise GatewayError(
            400,
            Reason.BAD_REQUEST,
            "keep_alive is longer than Ollama's durations can hold (about 292 years): "
            "use -1 to keep the model loaded",
        )
    return float(given)
