"""The ``lanes:`` section: which requests are background work, and its bounds.

The behaviour (a request's lane, read from its headers and body) is ``gateway.intake.lanes``.
"""

from __future__ import annotations

import difflib
from functools import cached_property
from typing import Literal

from pydantic import Field, field_validator

from gateway.config.base import HeaderName, SlotShare, Strict, model_key, slots_on
from gateway.config.budgets import Budget, BudgetConfig, merged_budget
from gateway.config.problems import problem_at
from gateway.config.users import PERSON_SEPARATOR
from gateway.core import GENERATION_PATHS, Duration, Lane

__all__ = [
    "AWAITED_TASKS",
    "PRESETS",
    "PRESET_CHATS",
    "BackgroundLane",
    "InteractiveLane",
    "LaneRule",
    "Lanes",
]

# The prompts of Open WebUI's tasks (title, tags, follow-ups, queries, autocomplete).
PRESETS = {"open-webui": "### Task:"}
# Of those, what the person waits for, by the start of Open WebUI's own templates
# (backend/open_webui/config.py): its RAG template (a chat with a document, a knowledge base
# or a web search) wraps the person's question in a "### Task:", and the search queries,
# autocomplete and the image prompt come before the reply or as they type (``AWAITED_TASKS``
# below names the same in its header). A template the admin rewrote is a task again.
PRESET_CHATS = {
    "open-webui": (
        "### Task:\nRespond to the user query",
        "### Task:\nAnalyze the chat history to determine the necessity of generating search",
        "### Task:\nYou are an autocompletion system",
        "### Task:\nGenerate a detailed prompt for am image generation task",  # sic
    )
}
# Open WebUI's tasks (its {{TASK}} names) whose outcome the person's reply waits for: the
# search queries and the tool choice come before it, autocomplete as they type, the image
# prompt and the mixture of answers are the reply. In a header, these are interactive.
AWAITED_TASKS = frozenset(
    {
        "query_generation",
        "function_calling",
        "autocomplete_generation",
        "image_prompt_generation",
        "moa_response_generation",
    }
)


Preset = Literal["open-webui"]
_DEFAULT_PRESETS: tuple[Preset, ...] = ("open-webui",)


class LaneRule(Strict):
    """A rule that puts matching requests in ``lane``; every field given must match."""

    lane: Lane
    users: list[str] | None = None
    models: list[str] | None = None
    paths: list[str] | None = Field(default=None, description="Such as /api/embed.")
    prompt_prefix: str | None = Field(
        default=None, description="The last message (or the prompt) starts with this."
    )

    def matches(self, user: str, model: str, path: str, prompt: str | None) -> bool:
        return (
            (self.users is None or _names_user(self.users, user))
            and (self.models is None or _names_model(self.models, model))
            and (self.paths is None or path in self.paths)
            and (
                self.prompt_prefix is None
                or (prompt is not None and prompt.startswith(self.prompt_prefix))
            )
        )

    @field_validator("users", "models", "paths")
    @classmethod
    def _not_empty(cls, names: list[str] | None) -> list[str] | None:
        # Every field given must match, and nothing is in an empty list: the rule would
        # match no request.
        if names == []:
            raise ValueError("an empty list matches no request: leave it out to match any")
        return names

    @field_validator("paths")
    @classmethod
    def _generation_paths(cls, paths: list[str] | None) -> list[str] | None:
        # A request's path is compared as it is routed, exactly: "/api/embed/" or "api/chat"
        # would match no request, and the rule would do nothing without a word.
        for position, path in enumerate(paths or ()):
            if path not in GENERATION_PATHS:
                close = difflib.get_close_matches(path, GENERATION_PATHS, n=1)
                guess = f"did you mean {close[0]!r}? " if close else ""
                listed = ", ".join(GENERATION_PATHS)
                message = f"{path!r} is no model's route: {guess}the routes are {listed}"
                raise problem_at((position,), message)
        return paths


def _names_user(users: list[str], user: str) -> bool:
    """Whether ``users`` names ``user``, or the front end that names this person
    (``owui`` for ``owui/alice@example.com``): the people a front end names have its limits
    and models, and its lane rules too. A name holding the separator is always such a
    person: no configured user's name may hold it."""
    return user in users or (
        PERSON_SEPARATOR in user and user.partition(PERSON_SEPARATOR)[0] in users
    )


def _names_model(models: list[str], model: str) -> bool:
    """Whether ``models`` names ``model`` in any of Ollama's spellings of it."""
    key = model_key(model)
    return any(model_key(named) == key for named in models)


class InteractiveLane(Strict):
    """A person waiting in front of a screen: the user's own limits apply."""

    max_wait: Duration | None = Field(
        default=None, gt=0, description="Longest wait before a 503; unset: queue.max_wait."
    )


class BackgroundLane(Strict):
    """Work nobody is watching: its own bounds, the slots interactive work leaves, and the
    slot given up at once when a person would wait for it (preemption)."""

    # Every idle slot by default: a person who needs one takes it back at once.
    max_slots: SlotShare = Field(
        default="100%", description="Slots of each backend background work may hold."
    )
    beside_people: bool = Field(
        default=False,
        description="Run background work on a backend while a person's request runs there "
        "(more done on a GPU that batches well; people slowed on a CPU). Off: it runs only "
        "on a backend no person is using, and gives way when one starts.",
    )
    max_restarts: int = Field(
        default=3,
        ge=0,
        description="Times one background request may give its slot to a person and run "
        "again from its saved body; after that it keeps its slot to the end. 0: never.",
    )
    max_concurrent: int = Field(default=1, ge=1, description="Running at once, per user.")
    max_queued: int = Field(default=4, ge=0, description="Waiting at once, per user.")
    max_wait: Duration = Field(default=120.0, gt=0, description="Longest wait before a 503.")
    budget: BudgetConfig = Field(
        default_factory=BudgetConfig,
        description="What each key's background work may use (its own account, never a "
        "person's budget); unset: as much as the key's own budget, or where a front end's "
        "on_behalf.total has a budget, what that leaves.",
    )

    def slots_on(self, backend_slots: int) -> int:
        return slots_on(self.max_slots, backend_slots)

    @cached_property
    def budget_in_force(self) -> Budget:
        return merged_budget(BudgetConfig(), self.budget)


class Lanes(Strict):
    header: HeaderName | None = Field(
        default=None,
        description="A request header naming the lane (e.g. X-OWUI-Task set to {{TASK}} in "
        "Open WebUI): 'interactive', empty, or a task the person waits for (query_generation, "
        "function_calling, autocomplete_generation, image_prompt_generation, "
        "moa_response_generation): interactive; any other value: background. Not sent: the "
        "rules and presets decide.",
    )
    # On unless the policy says otherwise (presets: []): an admin who never read about
    # Open WebUI's tasks should not find them taking people's places.
    presets: list[Preset] = Field(
        default_factory=lambda: list(_DEFAULT_PRESETS),
        description="Built-in rules, on by default: open-webui (### Task: prompts); [] for none.",
    )
    rules: list[LaneRule] = Field(default_factory=list)
    interactive: InteractiveLane = InteractiveLane()
    background: BackgroundLane = BackgroundLane()

    @cached_property
    def all_interactive(self) -> bool:
        """No header, no rules, no presets (most policies): every request is interactive,
        known without a look at it."""
        return self.header is None and not self.rules and not self.presets
