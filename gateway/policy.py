"""The admin's YAML file: users and their keys, limits, the waiting room, backends, timeouts.

Validation errors name the file, the line and the field path, because the person reading
them is editing that file by hand; ``policy_file.py`` reads the file and words the errors.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping
from functools import cached_property
from ipaddress import IPv4Network, IPv6Network
from pathlib import Path
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from gateway.budget_policy import Budget, BudgetConfig, merged_budget
from gateway.durations import Duration
from gateway.forwarded import ForwardedHeader
from gateway.lanes import Lanes
from gateway.load_options import ModelPolicy, NumCtxPolicy
from gateway.origins import CorsPolicy
from gateway.policy_base import SlotShare, Strict, model_key, slots_on
from gateway.policy_file import PolicyError, describe, environment, problem_at, read_yaml
from gateway.sizes import Size
from gateway.vocabulary import Lane

__all__ = [
    "ANONYMOUS",
    "PERSON_SEPARATOR",
    "UNKNOWN",
    "BackendConfig",
    "Budget",
    "BudgetConfig",
    "Classes",
    "Costs",
    "HeavyClass",
    "KeepAlivePolicy",
    "Limits",
    "Monitoring",
    "OnBehalf",
    "Policy",
    "PolicyError",
    "QueueConfig",
    "RedisPolicy",
    "Timeouts",
    "UserConfig",
    "Warmth",
    "hashed_key",
    "load_policy",
    "parse_policy",
]

ANONYMOUS = "anonymous"
"""A user of this name catches requests that bring no key and match no client rule."""
PERSON_SEPARATOR = "/"
"""Between a front end's name and a person it names: ``owui/alice@example.com``."""
UNKNOWN = "unknown"
"""What metrics call a request no user could be found for (an unknown key): not a name for
a user, so that those refusals are never counted as someone's."""


BackendKind = Literal["ollama", "llamacpp", "openai"]


class BackendConfig(Strict):
    """One inference server the gateway sends work to."""

    name: str = Field(min_length=1, description="Name used in logs, metrics and /status.")
    url: str = Field(description="Base URL, e.g. http://127.0.0.1:11434.")
    kind: BackendKind = Field(default="ollama", description="ollama, llamacpp or openai.")
    slots: int | None = Field(
        default=None,
        ge=1,
        description="Requests it runs at once: llama-server's -np; for ollama, per loaded "
        "model, as OLLAMA_NUM_PARALLEL (which must equal it) applies to each.",
    )
    keep_warm: list[str] = Field(
        default_factory=list,
        description="Ollama models to keep loaded, with empty requests that take no slot.",
    )
    keep_alive: Duration = Field(
        default=1800.0, description="How long each ping holds a keep_warm model; -1: pinned."
    )
    max_loaded_models: int | None = Field(
        default=None,
        ge=1,
        description="ollama: models loaded at once, at most (OLLAMA_MAX_LOADED_MODELS if set, "
        "else its automatic 3 per GPU); the gateway plans swaps to stay within it.",
    )
    memory: Size | None = Field(
        default=None,
        description="ollama: what its loaded models may take together (24GiB), as /api/ps "
        "counts them (weights and KV cache); the gateway plans swaps to stay within it.",
    )
    resident: list[str] = Field(
        default_factory=list,
        description="ollama: models the gateway never unloads to make room for another "
        "(keep_warm models neither).",
    )
    default_num_ctx: int = Field(
        default=4096,
        ge=4,
        description="ollama: the context a request without num_ctx gets: OLLAMA_CONTEXT_LENGTH, "
        "else 4096 (32768 from 24 GiB of VRAM, 262144 from 48 GiB).",
    )

    @field_validator("url")
    @classmethod
    def _http_url(cls, url: str) -> str:
        if not url.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        return url.rstrip("/")

    @model_validator(mode="after")
    def _ollama_needs_slots(self) -> BackendConfig:
        # Ollama does not expose OLLAMA_NUM_PARALLEL, so the admin has to state it.
        if self.kind == "ollama" and self.slots is None:
            raise ValueError("an ollama backend needs slots (its OLLAMA_NUM_PARALLEL)")
        if self.kind != "ollama":
            given = [name for name in ("max_loaded_models", "memory") if getattr(self, name)]
            given += ["resident"] if self.resident else []
            if given:
                raise ValueError(f"{', '.join(given)}: only for an ollama backend")
        return self


class Timeouts(Strict):
    """How long the gateway waits on a backend, or on a client, before giving up on it."""

    connect: Duration = Field(default=5.0, gt=0, description="To open a connection.")
    first_byte: Duration = Field(
        default=300.0, gt=0, description="From sending to the first byte (covers model load)."
    )
    idle: Duration = Field(default=120.0, gt=0, description="Longest gap between two chunks.")
    client_stall: Duration = Field(
        default=30.0,
        gt=0,
        description="Longest a client may leave the reply unread before its stream is ended "
        "and its slot freed.",
    )


class Monitoring(Strict):
    """How the gateway watches its backends, in the background."""

    interval: Duration = Field(default=5.0, gt=0, description="Between two probes of a backend.")
    timeout: Duration = Field(default=3.0, gt=0, description="For one probe request.")
    unhealthy_after: int = Field(
        default=2, ge=1, description="Failed probes in a row before a backend leaves rotation."
    )
    healthy_after: int = Field(
        default=2, ge=1, description="Good probes in a row before it comes back."
    )


class KeepAlivePolicy(Strict):
    """What proxied requests may ask of Ollama's keep_alive (a client's 0 unloads the model
    for everybody)."""

    min: Duration | None = Field(default=None, description="Raise shorter keep_alive to this.")
    max: Duration | None = Field(
        default=None, description="Lower longer (or forever, negative) keep_alive to this."
    )
    override: Duration | None = Field(
        default=None, description="Replace whatever the client sent (or did not send)."
    )


class Warmth(Strict):
    """Keeping models loaded, and noticing when a request paid for a load."""

    interval: Duration = Field(default=60.0, gt=0, description="Between two keep-warm checks.")
    cold_start_after: Duration = Field(
        default=1.0, ge=0, description="A reply whose load_duration exceeds this was a cold start."
    )


class RedisPolicy(Strict):
    """What to do when the shared state (FAIRGATE_REDIS_URL) cannot be reached."""

    on_failure: Literal["local", "closed"] = Field(
        default="local",
        description="local: go on with per-replica limits (flagged in /status); closed: 503.",
    )


class Limits(Strict):
    """What one user may hold: running requests, waiting requests, a share, and a budget."""

    max_concurrent: int = Field(default=1, ge=1, description="Requests running at once.")
    max_queued: int = Field(default=2, ge=0, description="Requests waiting; more gets 503.")
    weight: float = Field(default=1.0, gt=0, description="Share of the GPU against others.")
    budget: BudgetConfig = BudgetConfig()


_SHA256_KEY = re.compile(r"sha256:[0-9a-f]{64}")
_ENVIRONMENT = "environment"
"""The validation context's variables for ``env:`` keys (``parse_policy`` adds ``.env``)."""


def _configured_key(key: str, info: ValidationInfo) -> str:
    if not key:
        raise ValueError("an empty key would let anyone in")
    if key.startswith("sha256:") and not _SHA256_KEY.fullmatch(key):
        raise ValueError("sha256: keys need 64 lowercase hex digits (sha256sum of the key)")
    if key.startswith("env:"):
        context = info.context if isinstance(info.context, Mapping) else {}
        variables: Mapping[str, str] = context.get(_ENVIRONMENT, os.environ)
        value = variables.get(key[4:])
        if value is None:
            raise ValueError(f"{key!r} needs {key[4:]}, set neither in the environment nor in .env")
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


class OnBehalf(Strict):
    """A front end that serves many people with one key, and names each in a header."""

    header: str = Field(
        description="The header naming the person (Open WebUI: X-OpenWebUI-User-Email, with "
        "ENABLE_FORWARD_USER_INFO_HEADERS=True). Trusted only with this user's keys."
    )


class UserConfig(Strict):
    """One person or device; unset limits come from ``defaults``."""

    keys: list[ConfiguredKey] = Field(
        default_factory=list,
        description="API keys: plain text, sha256:<hex of the key>, or env:VARIABLE (read "
        "when the file is loaded, from the environment or .env, and held as its sha256).",
    )
    clients: list[IPv4Network | IPv6Network] = Field(
        default_factory=list,
        description="Addresses or CIDR ranges identified as this user without a key (a TV).",
    )
    max_concurrent: int | None = Field(default=None, ge=1)
    max_queued: int | None = Field(default=None, ge=0)
    weight: float | None = Field(default=None, gt=0)
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


class QueueConfig(Strict):
    """The gateway's waiting room: short, so that saying no is fast and honest."""

    max_depth: int = Field(default=16, ge=0, description="Requests waiting, all users together.")
    max_wait: Duration = Field(default=30.0, gt=0, description="Longest wait before a 503.")


class HeavyClass(Strict):
    """Long-context requests: they may hold only some of a backend's slots at once."""

    min_prompt_tokens: int = Field(
        default=2048, ge=1, description="An estimated prompt this long (or longer) is heavy."
    )
    min_num_ctx: int | None = Field(
        default=None, ge=1, description="A requested options.num_ctx this large is heavy."
    )
    max_slots: SlotShare = Field(
        default="50%",
        description="Slots of each backend heavy requests may hold: a count, or a share (50%).",
    )
    weight: float = Field(default=1.0, gt=0, description="Share multiplier for heavy requests.")
    wait_for_light: Duration = Field(
        default=2.0,
        ge=0,
        description="How long a heavy request that could start waits for the light requests "
        "running on its backend to end: its prefill would stall them all (llama.cpp and Ollama "
        "batch every slot together). 0: start at once.",
    )

    def slots_on(self, backend_slots: int) -> int:
        """How many of ``backend_slots`` heavy requests may hold; at least one."""
        return slots_on(self.max_slots, backend_slots)


class LightClass(Strict):
    """Everything that is not heavy: chats, short questions."""

    weight: float = Field(default=1.0, gt=0, description="Share multiplier for light requests.")


class Classes(Strict):
    heavy: HeavyClass = HeavyClass()
    light: LightClass = LightClass()


class Costs(Strict):
    """What a request costs the fair scheduler, in weighted tokens."""

    input: float = Field(default=1.0, ge=0, description="Weight of one prompt token.")
    output: float = Field(default=2.0, ge=0, description="Weight of one generated token.")
    image_tokens: int = Field(default=768, ge=0, description="Prompt tokens counted per image.")
    load: float = Field(
        default=50.0,
        ge=0,
        description="A second of model load (or reload, or swap) counts as this many generated "
        "tokens, charged to the request that caused it.",
    )


class Policy(Strict):
    """Everything the admin controls; reloaded live from the YAML file."""

    scheduling: Literal["fair", "fifo"] = Field(
        default="fair",
        description="fair: weighted virtual token counters, the smallest finish first; fifo: "
        "first come, first served.",
    )
    classes: Classes = Classes()
    costs: Costs = Costs()

    defaults: Limits = Limits()
    queue: QueueConfig = QueueConfig()
    users: dict[str, UserConfig] = Field(
        default_factory=dict,
        description="Who may use the gateway. Without any user, everyone is anonymous.",
    )
    backends: list[BackendConfig] = Field(min_length=1)
    monitoring: Monitoring = Monitoring()
    warmth: Warmth = Warmth()
    keep_alive: KeepAlivePolicy = KeepAlivePolicy()
    num_ctx: NumCtxPolicy = Field(
        default=NumCtxPolicy(),
        description="What Ollama requests may ask of options.num_ctx, every model.",
    )
    models: dict[str, ModelPolicy] = Field(
        default_factory=dict, description="Rules for one model's requests (num_ctx)."
    )
    redis: RedisPolicy = RedisPolicy()
    timeouts: Timeouts = Timeouts()
    lanes: Lanes = Lanes()
    aliases: dict[str, Annotated[str, Field(min_length=1)]] = Field(
        default_factory=dict,
        description="Other names for models (family: llama3.2:3b): a request, a models: "
        "list and the listings may use the alias; the backend is sent the model it names.",
    )
    cors: CorsPolicy = CorsPolicy()
    trusted_proxies: list[IPv4Network | IPv6Network] = Field(
        default_factory=list,
        description="Reverse proxies in front of the gateway (TLS: Caddy, nginx): only from "
        "these addresses is forwarded_header believed, for the client's address.",
    )
    forwarded_header: ForwardedHeader = Field(
        default="x-forwarded-for",
        description="The header the trusted proxies write, and the only one read: "
        "x-forwarded-for (Caddy, nginx, Traefik) or forwarded (RFC 7239).",
    )

    def max_wait_of(self, lane: Lane) -> float:
        """How long a request of ``lane`` may wait for a slot."""
        if lane is Lane.BACKGROUND:
            return self.lanes.background.max_wait
        return self.lanes.interactive.max_wait or self.queue.max_wait

    def limits_of(self, user: str) -> Limits:
        """The user's limits, each unset field taken from ``defaults``."""
        return self._limits.get(self.account_of(user), self.defaults)

    def budget_of(self, user: str) -> Budget:
        """The user's budget, each unset field taken from ``defaults``; a person named by a
        front end has the front end's, counted on their own."""
        found = self._budgets.get(self.account_of(user))  # empty is falsy: compare with None
        return self._default_budget if found is None else found

    def may_use(self, user: str, model: str) -> bool:
        """Whether the user's ``models:`` list (if any) names ``model``, either of them
        perhaps by an alias: what is compared is the model the backend would be sent."""
        config = self.users.get(self.account_of(user))
        if config is None or config.models is None:
            return True
        return self.resolve(model) in {self.resolve(allowed) for allowed in config.models}

    def num_ctx_for(self, model: str) -> NumCtxPolicy:
        """The num_ctx rules for ``model``'s requests: its own, else every model's."""
        rules = self._model_rules.get(model_key(model))
        return self.num_ctx if rules is None or rules.num_ctx is None else rules.num_ctx

    @cached_property
    def _model_rules(self) -> dict[str, ModelPolicy]:
        return {model_key(name): rules for name, rules in self.models.items()}

    def resolve(self, model: str) -> str:
        """The model an alias names; any other name as it is."""
        return self.aliases.get(model, model)

    def account_of(self, user: str) -> str:
        """The configured user ``user`` counts under: itself, or for a person named by a
        front end (``owui/alice@example.com``) that front end."""
        front_end, _, person = user.partition(PERSON_SEPARATOR)
        config = self.users.get(front_end)
        if person and config is not None and config.on_behalf is not None:
            return front_end
        return user

    @cached_property
    def _limits(self) -> dict[str, Limits]:
        merged = {}
        fields = set(Limits.model_fields) - {"budget"}  # merged field by field, below
        for name, config in self.users.items():
            given = config.model_dump(include=fields, exclude_none=True)
            merged[name] = self.defaults.model_copy(update=given)
        return merged

    @cached_property
    def _default_budget(self) -> Budget:
        return merged_budget(self.defaults.budget, None)

    @cached_property
    def _budgets(self) -> dict[str, Budget]:
        defaults = self.defaults.budget
        return {name: merged_budget(defaults, user.budget) for name, user in self.users.items()}

    @field_validator("users")
    @classmethod
    def _each_reachable_by_own_keys(cls, users: dict[str, UserConfig]) -> dict[str, UserConfig]:
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
        first: dict[str, tuple[str, int]] = {}
        for name, user in users.items():
            for index, key in enumerate(user.keys):
                # Compared as digests: a plain key and its sha256: form are the same key.
                owner, earlier = first.setdefault(_digest_of(key), (name, index))
                if (owner, earlier) != (name, index):
                    said = "listed twice" if owner == name else f"{owner} has this key too"
                    raise problem_at((name, "keys", index), said, first=(owner, "keys", earlier))
        return users

    @model_validator(mode="after")
    def _keep_warm_names_models(self) -> Policy:
        # Pings go to the backend as written, and a backend knows no alias: say so here
        # rather than log a failed ping every minute.
        for index, backend in enumerate(self.backends):
            for position, model in enumerate(backend.keep_warm):
                if model in self.aliases:
                    message = f"{model!r} is an alias: name the model, {self.aliases[model]!r}"
                    raise problem_at(("backends", index, "keep_warm", position), message)
        return self

    @field_validator("aliases")
    @classmethod
    def _aliases_name_models(cls, aliases: dict[str, str]) -> dict[str, str]:
        # One step only: a chain would make "what does family run" a puzzle, and a loop
        # would never end.
        for alias, model in aliases.items():
            if model in aliases:
                message = f"names another alias, {model!r}: name the model itself"
                raise problem_at((alias,), message)
        return aliases

    @field_validator("backends")
    @classmethod
    def _unique_names(cls, backends: list[BackendConfig]) -> list[BackendConfig]:
        first: dict[str, int] = {}
        for index, backend in enumerate(backends):
            earlier = first.setdefault(backend.name, index)
            if earlier != index:
                message = f"another backend is named {backend.name!r}"
                raise problem_at((index, "name"), message, first=(earlier, "name"))
        return backends


def load_policy(path: Path) -> Policy:
    """Read and validate the policy file at ``path``."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise PolicyError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    return parse_policy(text, source=str(path))


def parse_policy(text: str, source: str = "<policy>") -> Policy:
    """Validate policy YAML ``text``; ``source`` names it in error messages."""
    data, root = read_yaml(text, source)
    if not isinstance(data, dict):
        raise PolicyError(f"{source}:1: the file must be a mapping (backends:, users:, ...)")
    try:
        return Policy.model_validate(data, context={_ENVIRONMENT: environment()})
    except ValidationError as exc:
        raise PolicyError(describe(exc, root, source, Policy)) from exc
