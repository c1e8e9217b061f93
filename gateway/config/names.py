"""Names one section of the policy gives and another defines: the model behind an alias, a
user a lane rule names. A name that matches nothing makes a rule that does nothing, without
a word; each is refused at load, at its line.

One rule for aliases: an alias is a name clients ask by, so a request and a user's
``models:`` list (what the user may ask for) may use it. Where the policy says what to do
with a model itself (``models:``, a backend's ``resident`` and ``keep_warm``, a lane rule's
``models``) it names the model: by then every request has been resolved to the model, and
an alias there would never match. Refused rather than resolved: re-pointing the alias must
not quietly move a rule (a num_ctx, a place in memory) onto another model.

Apart from ``config/policy.py`` as a concern of its own; it takes the sections it compares, so that
it needs no ``Policy``.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator, Mapping, Sequence

from gateway.config.backends import BackendConfig
from gateway.config.base import model_key
from gateway.config.lanes import LaneRule
from gateway.config.models import ModelPolicy
from gateway.config.problems import problem_at
from gateway.config.users import ANONYMOUS, PERSON_SEPARATOR, UserConfig
from gateway.config.yaml_reader import Loc

__all__ = ["check_lane_users", "check_model_names"]


def check_model_names(
    aliases: Mapping[str, str],
    models: Mapping[str, ModelPolicy],
    backends: Sequence[BackendConfig],
    rules: Sequence[LaneRule],
) -> None:
    """Refuse an alias where the model is meant, and two ``models:`` entries for one model
    (``llama3.2`` and ``llama3.2:latest``: only one could apply, the other silently not)."""
    for at, model in _models_named(models, backends, rules):
        if model in aliases:
            raise problem_at(at, f"{model!r} is an alias: name the model, {aliases[model]!r}")
    first: dict[str, str] = {}
    for name in models:
        earlier = first.setdefault(model_key(name), name)
        if earlier != name:
            message = f"names the same model as {earlier!r}: give its rules once"
            raise problem_at(("models", name), message, first=("models", earlier))


def _models_named(
    models: Mapping[str, ModelPolicy],
    backends: Sequence[BackendConfig],
    rules: Sequence[LaneRule],
) -> Iterator[tuple[Loc, str]]:
    """Every model the policy's rules name, with its place in the file."""
    for name in models:
        yield ("models", name), name
    for index, backend in enumerate(backends):
        for field in ("resident", "keep_warm"):
            for position, model in enumerate(getattr(backend, field)):
                yield ("backends", index, field, position), model
    for index, rule in enumerate(rules):
        for position, model in enumerate(rule.models or ()):
            yield ("lanes", "rules", index, "models", position), model


def check_lane_users(rules: Sequence[LaneRule], users: Mapping[str, UserConfig]) -> None:
    """Refuse a lane rule's user no request can be: not a user, nor a person a front end
    names (``owui/alice@example.com``, when ``owui`` has ``on_behalf``), nor ``anonymous``
    when the gateway is open (no users: everybody is anonymous)."""
    for index, rule in enumerate(rules):
        for position, name in enumerate(rule.users or ()):
            problem = _no_such_user(name, users)
            if problem is not None:
                raise problem_at(("lanes", "rules", index, "users", position), problem)


def _no_such_user(name: str, users: Mapping[str, UserConfig]) -> str | None:
    """Why no request can be ``name``, or None when one can."""
    if name in users or (name == ANONYMOUS and not users):
        return None
    front_end, separator, person = name.partition(PERSON_SEPARATOR)
    if not separator:
        return f"no user is named {name!r}{_guess(name, users)}"
    config = users.get(front_end)
    if config is None:
        return f"no user is named {front_end!r}{_guess(front_end, users)}"
    if config.on_behalf is None:
        return f"{front_end!r} names no people: only a user with on_behalf does"
    if not person.strip() or person != person.strip():
        return f"{name!r} names no person after the {PERSON_SEPARATOR!r}"
    return None


def _guess(name: str, users: Mapping[str, UserConfig]) -> str:
    if not users:
        return ": there are no users, so every request is 'anonymous'"
    close = difflib.get_close_matches(name, list(users), n=1)
    return f"; did you mean {close[0]!r}?" if close else f"; the users are {', '.join(users)}"
