"""The policy's ``users:`` and ``defaults:``: who may use the gateway (keys, client addresses,
the people a front end names) and what each may hold (limits).

Apart from ``config/policy.py`` so that what only needs a user's names or a key's digest
(``edge/identity.py``, ``observe/labels.py``, ``fairgate keys``) does not import the whole policy.
The
lookups that merge a user's settings with the defaults stay on ``Policy``, which holds both.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated

from pydantic import AfterValidator, Field, ValidationInfo

from gateway.config.base import AddressRange, HeaderName, Strict, Weight
from gateway.config.budgets import BudgetConfig
from gateway.config.problems import problem_at

__all__ = [
    "ANONYMOUS",
    "BACKGROUND_ACCOUNT",
    "KEY_VARIABLES",
    "PERSON_SEPARATOR",
    "TOGETHER_ACCOUNT",
    "UNKNOWN",
    "KeyVariables",
    "Limits",
    "OnBehalf",
    "Together",
    "UserConfig",
    "background_account",
    "check_users",
    "hashed_key",
    "is_background_account",
    "is_together_account",
    "key_of",
    "together_account",
]

ANONYMOUS = "anonymous"
"""A user of this name catches requests that bring no key and match no client rule."""
PERSON_SEPARATOR = "/"
"""Between a front end's name and a person it names: ``owui/alice@example.com``."""
BACKGROUND_ACCOUNT = "(background)"
"""The person a front end's background work is charged to: ``owui/(background)``. Its own
usage rows, its own budget (``lanes.background.budget``), its own fair share: never the
person's whose chat caused it."""
TOGETHER_ACCOUNT = "(all)"
"""What a front end's people hold and use together counts under ``owui/(all)``, against
``on_behalf.total``: never a person's name (a header naming it is refused), nor a row of
usage (the sum of the people's is read)."""
UNKNOWN = "unknown"
"""What metrics call a request no user could be found for (an unknown key): not a name for
a user, so that those refusals are never counted as someone's."""
KEY_VARIABLES = "environment"
"""The validation context's KeyVariables for ``env:`` keys (``parse_policy`` adds ``.env``)."""


@dataclass(frozen=True)
class KeyVariables:
    """What ``env:`` keys read, and where they were looked for: the message for a missing
    one sends the admin to the right file (``check-config --env-file`` reads no ``.env``)."""

    values: Mapping[str, str]
    where: str = "the environment nor in .env"


class Limits(Strict):
    """What one user may hold: running requests, waiting requests, a share, and a budget."""

    max_concurrent: int = Field(default=1, ge=1, description="Requests running at once.")
    max_queued: int = Field(default=2, ge=0, description="Requests waiting; more gets 503.")
    weight: Weight = Field(default=1.0, description="Share of the GPU against others.")
    budget: BudgetConfig = BudgetConfig()


_SHA256_KEY = re.compile(r"sha256:[0-9a-f]{64}")


def _configured_key(key: str, info: ValidationInfo) -> str:
    if not key:
        raise ValueError("an empty key would let anyone in")
    # Any case of the prefix: "SHA256:<digest>" taken as a key of its own would let in
    # whoever reads the file, and not the key whose digest it is.
    if key[:7].lower() == "sha256:" and not key.startswith("sha256:"):
        raise ValueError("write the sha256: prefix in lower case")
    if key.startswith("sha256:") and not _SHA256_KEY.fullmatch(key):
        raise ValueError("sha256: keys need 64 lowercase hex digits (sha256sum of the key)")
    if key.startswith("env:"):
        context = info.context if isinstance(info.context, Mapping) else {}
        variables: KeyVariables = context.get(KEY_VARIABLES) or KeyVariables(os.environ)
        value = variables.values.get(key[4:])
        if value is None:
            raise ValueError(f"{key!r} needs {key[4:]}, set neither in {variables.where}")
        if not value:
            raise ValueError(f"{key!r} needs {key[4:]}, which is empty")
        # Held as its digest: identity then needs no access to the variables, and no
        # plain secret is kept from the environment.
        return hashed_key(value)
    return key


def hashed_key(key: str) -> str:
    """``key`` as the policy may hold it without holding the key: ``sha256:<hex>``."""
    return f"sha256:{hashlib.sha256(key.encode()).hexdigest()}"


def _digest_of(key: str) -> str:
    return key[7:] if key.startswith("sha256:") else hashed_key(key)[7:]


ConfiguredKey = Annotated[str, AfterValidator(_configured_key)]


class Together(Strict):
    """What all the people a front end names may hold together, whatever names it sends:
    each person has the front end's limits of their own, and these bound their sum (their
    bodies still arriving count). Its tasks (the background lane) keep each person's
    lanes.background places; its budget counts them."""

    max_concurrent: int | None = Field(
        default=None, ge=1, description="Its people's requests running at once, together."
    )
    max_queued: int | None = Field(
        default=None, ge=0, description="Its people's requests waiting, together; more gets 503."
    )
    budget: BudgetConfig | None = Field(
        default=None,
        description="A budget for its people together (the front end's own requests and its "
        "background work included); nothing is taken from the defaults.",
    )


class OnBehalf(Strict):
    """A front end that serves many people with one key, and names each in a header."""

    header: HeaderName = Field(
        description="The header naming the person (Open WebUI: X-OpenWebUI-User-Email, with "
        "ENABLE_FORWARD_USER_INFO_HEADERS=True). Trusted only with this user's keys."
    )
    total: Together | None = Field(
        default=None,
        description="Bounds on all its people together. Unset, whoever holds the key gets a "
        "person's places for every name it sends, up to the house's queue.max_depth.",
    )


class UserConfig(Strict):
    """One person or device; unset limits come from ``defaults``."""

    keys: list[ConfiguredKey] = Field(
        default_factory=list,
        description="API keys: plain text, sha256:<hex of the key>, or env:VARIABLE (read "
        "when the file is loaded, from the environment or .env, and held as its sha256).",
    )
    clients: list[AddressRange] = Field(
        default_factory=list,
        description="Addresses or CIDR ranges identified as this user without a key (a TV).",
    )
    max_concurrent: int | None = Field(default=None, ge=1)
    max_queued: int | None = Field(default=None, ge=0)
    weight: Weight | None = None
    models: list[str] | None = Field(
        default=None, description="Models this user may use; unset means every model."
    )
    admin: bool = Field(default=False, description="May read /status from other machines.")
    on_behalf: OnBehalf | None = Field(
        default=None,
        description="Each person the header names is a user of their own (front-end/person), "
        "with this user's limits and models.",
    )
    budget: BudgetConfig | None = Field(
        default=None, description="Overrides of the defaults' budget, field by field."
    )


def check_users(users: dict[str, UserConfig]) -> dict[str, UserConfig]:
    """``users`` as given, if each is reachable by its own keys and names; else the first
    problem, at the user or key it is about (``Policy`` validates ``users:`` with this)."""
    if UNKNOWN in users:
        message = "metrics count requests from unknown keys as 'unknown': choose another name"
        raise problem_at((UNKNOWN,), message)
    for name, user in users.items():
        if PERSON_SEPARATOR in name:
            message = "a user's name cannot contain '/': it joins a front end and a person"
            raise problem_at((name,), message)
        if not (user.keys or user.clients or name == ANONYMOUS):
            message = "no keys and no clients, so no request can ever be this user"
            raise problem_at((name,), message)
        if name == ANONYMOUS and user.admin:
            message = (
                "anonymous is whoever brings no key: as an admin, anyone on the network "
                "would read /status; give an admin a key of their own"
            )
            raise problem_at((name, "admin"), message)
    first: dict[str, tuple[str, int]] = {}
    for name, user in users.items():
        for index, key in enumerate(user.keys):
            # Compared as digests: a plain key and its sha256: form are the same key.
            owner, earlier = first.setdefault(_digest_of(key), (name, index))
            if (owner, earlier) != (name, index):
                said = "listed twice" if owner == name else f"{owner} has this key too"
                raise problem_at((name, "keys", index), said, first=(owner, "keys", earlier))
    return users


def key_of(user: str) -> str:
    """The configured user whose key ``user``'s requests came with: the front end of a
    person it names (``owui`` for ``owui/alice``), else the user itself (the same object:
    ``key_of(user) is user`` says a user is nobody's person, without comparing)."""
    if PERSON_SEPARATOR not in user:
        return user
    return user.partition(PERSON_SEPARATOR)[0]


def background_account(user: str) -> str:
    """Whom ``user``'s background work is charged to: the front end's background account
    (``alice`` for her own key, ``owui`` for the people an Open WebUI names)."""
    return key_of(user) + PERSON_SEPARATOR + BACKGROUND_ACCOUNT


def is_background_account(user: str) -> bool:
    # The whole person's part, not its end: a person named "x/(background)" is a person.
    return user.partition(PERSON_SEPARATOR)[2] == BACKGROUND_ACCOUNT


def together_account(front_end: str) -> str:
    """Where ``front_end``'s people count together: ``owui/(all)``."""
    return front_end + PERSON_SEPARATOR + TOGETHER_ACCOUNT


def is_together_account(user: str) -> bool:
    return user.partition(PERSON_SEPARATOR)[2] == TOGETHER_ACCOUNT
