"""The admin's YAML file: users and their keys, limits, the waiting room, backends, timeouts.

Validation errors name the file, the line and the field path, because the person reading
them is editing that file by hand; ``config/problems.py`` reads the file and words the errors.
Each section's models live with their concern (``config/users.py``, ``config/backends.py``,
``config/scheduling.py``, ``config/tuning.py``, ``intake/lanes.py``, ``intake/load_options.py``,
``config/budgets.py``); here is the whole, the lookups that need more than one section, and
the checks across sections.
"""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from gateway.config.backends import SWAP_PATIENCE, BackendConfig, check_backends, check_swap_waits
from gateway.config.base import AddressRange, Strict, model_key
from gateway.config.budgets import Budget, BudgetConfig, merged_budget
from gateway.config.cors import CorsPolicy
from gateway.config.lanes import Lanes
from gateway.config.models import ModelPolicy, NumCtxPolicy
from gateway.config.names import check_lane_users, check_model_names
from gateway.config.network import ForwardedHeader, HostName
from gateway.config.problems import describe, environment, problem_at
from gateway.config.scheduling import Classes, Costs, QueueConfig
from gateway.config.tuning import KeepAlivePolicy, Monitoring, RedisPolicy, Timeouts, Warmth
from gateway.config.users import (
    KEY_VARIABLES,
    PERSON_SEPARATOR,
    KeyVariables,
    Limits,
    Together,
    UserConfig,
    check_users,
    is_background_account,
    is_together_account,
    key_of,
    together_account,
)
from gateway.config.yaml_reader import PolicyError, read_yaml
from gateway.core import Lane

__all__ = ["Policy", "PolicyError", "load_policy", "parse_policy"]


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
    runner_options: Literal["drop", "forward"] = Field(
        default="drop",
        description="Ollama's other options fixed at load (num_batch, num_gpu, main_gpu, "
        "use_mmap, num_thread): a request whose value differs from the loaded runner's "
        "reloads the model for everybody. drop: removed from every request (the server's "
        "own settings hold); forward: sent as the client wrote them.",
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
    hosts: tuple[HostName, ...] = Field(
        default=(),
        description="Names the gateway answers to without a key besides addresses, "
        "localhost, one-label names (gpubox) and local suffixes (.lan, .local, .home.arpa, "
        ".internal): the name a TLS proxy passes on (gpu.example.com, *.example.com; * for "
        "any). Another name could be a site's that rebinds it to the gateway (DNS rebinding).",
    )
    trusted_proxies: list[AddressRange] = Field(
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

    def swap_patience(self, lane: Lane) -> float:
        """The longest a request of ``lane`` waits for a swap to be due (``SWAP_PATIENCE``)."""
        return self.max_wait_of(lane) / SWAP_PATIENCE

    def limits_of(self, user: str) -> Limits:
        """The user's limits, each unset field taken from ``defaults``."""
        return self._limits.get(self.account_of(user), self.defaults)

    def budget_of(self, user: str) -> Budget:
        """The user's budget, each unset field taken from ``defaults``; a person named by a
        front end has the front end's, counted on their own."""
        if is_together_account(user):
            return self._together_budgets.get(user, Budget())
        if is_background_account(user):  # rarely asked: only with a budget somewhere
            # Its own, else its key's (a prompt dressed as a task gets one as large), but where
            # a front end's total has a budget: that bounds its people's tasks together.
            own, key = self.lanes.background.budget_in_force, user.partition(PERSON_SEPARATOR)[0]
            total = self._together_budgets.get(together_account(key))
            return own if own or total else self.budget_of(key)
        found = self._budgets.get(self.account_of(user))  # empty is falsy: compare with None
        return self._default_budget if found is None else found

    @cached_property
    def budgeted(self) -> bool:
        """Whether any budget is set, in ``defaults`` or for some user: when none is, no
        request needs its user's looked up (most households)."""
        return (
            bool(self._default_budget)
            or any(self._budgets.values())
            or bool(self.lanes.background.budget_in_force)
            or any(self._together_budgets.values())
        )

    def together_of(self, user: str) -> tuple[str, Together] | None:
        """The account where ``user``'s requests count with the other people of its front
        end (``owui/(all)``), and the bounds on them together; None when its front end sets
        none (or it is nobody's)."""
        totals = self._totals
        if not totals:  # no front end bounds its people: every request asks
            return None
        front_end = key_of(user)
        total = totals.get(front_end)
        return None if total is None else (together_account(front_end), total)

    def bodies_at_once(self, key: str) -> int:
        """How many bodies of the largest size may be on their way at once with ``key``
        (a user's own, or a front end's with its people's): one, or for a front end as many
        as its people's places together (``on_behalf.total``), else ``FRONT_END_BODIES``."""
        return self._bodies_at_once.get(key, 1)

    @cached_property
    def _bodies_at_once(self) -> dict[str, int]:
        at_once = {}
        for name, user in self.users.items():
            if user.on_behalf is None:
                continue
            total = user.on_behalf.total
            if total is None or total.max_concurrent is None:
                at_once[name] = FRONT_END_BODIES
            else:
                at_once[name] = total.max_concurrent + (total.max_queued or 0)
        return at_once

    @cached_property
    def bounds_people_together(self) -> bool:
        """Whether some front end sets ``on_behalf.total``: asked first on every request's
        path, where a household without one has nothing more to look up."""
        return bool(self._totals)

    @cached_property
    def _totals(self) -> dict[str, Together]:
        return {
            name: user.on_behalf.total
            for name, user in self.users.items()
            if user.on_behalf is not None and user.on_behalf.total is not None
        }

    @cached_property
    def _together_budgets(self) -> dict[str, Budget]:
        none = BudgetConfig()  # the defaults are each person's, not the sum's
        return {
            together_account(name): merged_budget(none, total.budget)
            for name, total in self._totals.items()
        }

    def may_use(self, user: str, model: str) -> bool:
        """Whether the user's ``models:`` list (if any) names ``model``, either of them
        perhaps by an alias: what is compared is the model the backend would be sent."""
        lists = self._allowed_models
        if not lists:  # nobody's models are listed (most households): on every request's path
            return True
        allowed = lists.get(self.account_of(user))
        return allowed is None or model_key(self.resolve(model)) in allowed

    @cached_property
    def _allowed_models(self) -> dict[str, frozenset[str]]:
        """By user with a ``models:`` list, the models it names, as Ollama names them
        (``phi3`` and ``phi3:latest`` are one model), aliases resolved."""
        return {
            name: frozenset(model_key(self.resolve(model)) for model in config.models)
            for name, config in self.users.items()
            if config.models is not None
        }

    def num_ctx_for(self, model: str) -> NumCtxPolicy:
        """The num_ctx rules for ``model``'s requests: its own, else every model's."""
        by_model = self._model_rules
        if not by_model:  # no model has rules of its own: on every request's path
            return self.num_ctx
        rules = by_model.get(model_key(model))
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
        if PERSON_SEPARATOR not in user:  # nobody named by a front end: every request asks
            return user
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
        return check_users(users)

    @model_validator(mode="after")
    def _names_match(self) -> Policy:
        check_model_names(self.aliases, self.models, self.backends, self.lanes.rules)
        check_lane_users(self.lanes.rules, self.users)
        return self

    @model_validator(mode="after")
    def _swaps_can_wait(self) -> Policy:
        where = "lanes.interactive" if self.lanes.interactive.max_wait else "queue"
        check_swap_waits(self.backends, self.swap_patience(Lane.INTERACTIVE), where)
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
        return check_backends(backends)


# Bodies of the largest size a front end's people may have on their way at once, when no
# total says: a household's few uploading pictures at the same moment.
FRONT_END_BODIES = 4

# A household's policy is a few KB; thousands of users with digests stay far below this.
MAX_POLICY_BYTES = 4 * 2**20


def load_policy(path: Path, variables: KeyVariables | None = None) -> Policy:
    """Read and validate the policy file at ``path``; ``env:`` keys read ``variables``
    (by default the environment over ``.env``, as the settings see them)."""
    try:
        with path.open("rb") as file:
            raw = file.read(MAX_POLICY_BYTES + 1)  # bounded: a path to /dev/zero never ends
    except OSError as exc:
        raise PolicyError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    if len(raw) > MAX_POLICY_BYTES:
        raise PolicyError(f"{path}: over {MAX_POLICY_BYTES // 2**20} MiB: is it the policy?")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        byte = raw[exc.start]
        raise PolicyError(f"{path}:{line}: not UTF-8 (byte {byte:#04x}): save it as UTF-8") from exc
    return parse_policy(text, source=str(path), variables=variables)


def parse_policy(
    text: str, source: str = "<policy>", variables: KeyVariables | None = None
) -> Policy:
    """Validate policy YAML ``text``; ``source`` names it in error messages."""
    data, root, surprises = read_yaml(text, source)
    if not isinstance(data, dict):
        raise PolicyError(f"{source}:1: the file must be a mapping (backends:, users:, ...)")
    try:
        context = {KEY_VARIABLES: variables or KeyVariables(environment())}
        policy = Policy.model_validate(data, context=context)
    except ValidationError as exc:
        # Every mistake at once, in the file's order: the YAML's surprises and the schema's.
        problems = [*surprises, *describe(exc, root, source, Policy).splitlines()]
        raise PolicyError("\n".join(sorted(problems, key=_line_of))) from exc
    if surprises:
        raise PolicyError("\n".join(surprises))
    return policy


def _line_of(problem: str) -> int:
    """The line a ``file:line: ...`` sentence is about (0 when it names none)."""
    _, _, rest = problem.partition(":")
    number = rest.partition(":")[0]
    return int(number) if number.isdigit() else 0
