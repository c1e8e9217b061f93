"""Lanes: a person's own requests (interactive) and the work a front end or an agent does in
the background (titles, tags, follow-up suggestions, summaries, embeddings).

Open WebUI sends, with a chat's first message, a title task at the same moment (usually
arriving first), then tags and follow-ups after each reply; their prompts start with
``### Task:``. In one queue they took a person's place, or got the person's message refused.
In the background lane they have their own per-user bounds, hold at most
``background.max_slots`` of a backend, run only when no interactive request can use the
slot, and are the first refused when the room is full.

A request's lane, first match wins: the header the admin names (``lanes.header``; its value
``interactive`` or ``background``, and any other non-empty value is background: Open
WebUI's ``{{TASK}}`` template is empty for the person's own chat), then the rules (by user,
model, path, or the start of the last prompt; the ``open-webui`` preset is the ``### Task:``
rule), else interactive.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from functools import cached_property
from typing import Any, Literal

from pydantic import Field, field_validator

from gateway.config.base import HeaderName, SlotShare, Strict, model_key, slots_on
from gateway.config.problems import problem_at
from gateway.config.users import PERSON_SEPARATOR
from gateway.core.units import Duration
from gateway.core.vocabulary import GENERATION_PATHS, Lane
from gateway.wire.ambiguity import canonical_keys

__all__ = [
    "BackgroundLane",
    "InteractiveLane",
    "LaneRule",
    "Lanes",
    "lane_from_header",
    "lane_of",
    "possible_lanes",
]

# The prompts of Open WebUI's tasks (title, tags, follow-ups, queries, autocomplete).
_PRESETS = {"open-webui": "### Task:"}


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
    """Work nobody is watching: its own bounds, the slots interactive work leaves."""

    max_slots: SlotShare = Field(
        default="50%", description="Slots of each backend background work may hold."
    )
    max_concurrent: int = Field(default=1, ge=1, description="Running at once, per user.")
    max_queued: int = Field(default=4, ge=0, description="Waiting at once, per user.")
    max_wait: Duration = Field(default=120.0, gt=0, description="Longest wait before a 503.")

    def slots_on(self, backend_slots: int) -> int:
        return slots_on(self.max_slots, backend_slots)


class Lanes(Strict):
    header: HeaderName | None = Field(
        default=None,
        description="A request header naming the lane (e.g. X-OWUI-Task set to {{TASK}} in "
        "Open WebUI): 'interactive', 'background', or any other non-empty value: background.",
    )
    presets: list[Literal["open-webui"]] = Field(
        default_factory=list, description="Built-in rules: open-webui (### Task: prompts)."
    )
    rules: list[LaneRule] = Field(default_factory=list)
    interactive: InteractiveLane = InteractiveLane()
    background: BackgroundLane = BackgroundLane()

    @cached_property
    def all_interactive(self) -> bool:
        """No header, no rules, no presets (most policies): every request is interactive,
        known without a look at it."""
        return self.header is None and not self.rules and not self.presets


def possible_lanes(lanes: Lanes, headers: Mapping[str, str]) -> tuple[Lane, ...]:
    """The lanes a request may turn out to be in, known from its headers alone."""
    if lanes.all_interactive:
        return (Lane.INTERACTIVE,)
    named = lane_from_header(lanes, headers)
    if named is not None:
        return (named,)
    if lanes.presets or (lanes.rules and any(r.lane is Lane.BACKGROUND for r in lanes.rules)):
        return (Lane.INTERACTIVE, Lane.BACKGROUND)
    return (Lane.INTERACTIVE,)


def lane_from_header(lanes: Lanes, headers: Mapping[str, str]) -> Lane | None:
    """The lane the admin's header names, or None (no header configured, or none sent)."""
    if lanes.header is None:
        return None
    value = headers.get(lanes.header, "").strip().lower()
    if not value:
        return None
    return Lane.INTERACTIVE if value == Lane.INTERACTIVE else Lane.BACKGROUND


def lane_of(
    lanes: Lanes,
    headers: Mapping[str, str],
    user: str,
    model: str,
    path: str,
    fields: dict[str, Any],
) -> Lane:
    """The request's lane: the header, then the rules and presets, else interactive."""
    if lanes.all_interactive:
        return Lane.INTERACTIVE
    named = lane_from_header(lanes, headers)
    if named is not None:
        return named
    if not lanes.rules and not lanes.presets:  # a header alone: no prompt to read
        return Lane.INTERACTIVE
    prompt = _last_prompt(fields, path)
    for rule in lanes.rules:
        if rule.matches(user, model, path, prompt):
            return rule.lane
    for preset in lanes.presets:
        if prompt is not None and prompt.startswith(_PRESETS[preset]):
            return Lane.BACKGROUND
    return Lane.INTERACTIVE


def _last_prompt(fields: dict[str, Any], path: str) -> str | None:
    """The text a task would start with: the last message's, or the prompt (on the
    Responses API, the input or its last item's)."""
    messages = fields.get("messages")
    if path == "/v1/responses":
        given = fields.get("input")
        messages = [{"content": given}] if isinstance(given, str) else given
    if isinstance(messages, list) and messages and isinstance(messages[-1], dict):
        last = canonical_keys(messages[-1]) or messages[-1]  # as Go reads it: see classify
        content = last.get("content")
        return content if isinstance(content, str) else _text_blocks(content)
    prompt = fields.get("prompt")
    return prompt if isinstance(prompt, str) else None


_TEXT_BLOCKS = ("text", "input_text")  # Anthropic's and OpenAI's; the Responses API's


def _text_blocks(content: object) -> str | None:
    """A message's text given as content blocks (Anthropic's, as Claude Code sends every
    message; OpenAI's parts): its text blocks joined, as Ollama's anthropic.convertMessage
    joins them, each block's keys as Go reads them."""
    if not isinstance(content, list):
        return None
    texts = []
    for block in content:
        if isinstance(block, dict):
            block = canonical_keys(block) or block
            text = block.get("text")
            if block.get("type") in _TEXT_BLOCKS and isinstance(text, str):
                texts.append(text)
    return "".join(texts) if texts else None
