"""Lanes: a person's own requests (interactive) and the work a front end or an agent does in
the background (titles, tags, follow-up suggestions, summaries, embeddings).

Open WebUI sends, with a chat's first message, a title task at the same moment (usually
arriving first), then tags and follow-ups after each reply; their prompts start with
``### Task:``. In one queue they took a person's place, or got the person's message refused.
In the background lane they have their own per-user bounds, hold at most
``background.max_slots`` of a backend, run only when no interactive request can use the
slot, and are the first refused when the room is full.

A request's lane, first match wins: the header the admin names (``lanes.header``; its value
``interactive``, empty (Open WebUI's ``{{TASK}}`` for the person's own chat) or a task the
person's reply waits for (``AWAITED_TASKS``) is interactive, any other background), then the
rules (by user, model, path, or the start of the last prompt; the ``open-webui`` preset is
the ``### Task:`` rule, but for its RAG template, a person's chat with a document), else
interactive.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.config import AWAITED_TASKS, PRESET_CHATS, PRESETS, Lanes
from gateway.core import Lane
from gateway.wire import canonical_keys

__all__ = ["lane_from_header", "lane_of", "possible_lanes"]


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
    """The lane the admin's header names, or None (no header configured, or none sent).
    Sent empty, it is the person's own chat (Open WebUI's {{TASK}}), whatever its prompt."""
    if lanes.header is None:
        return None
    value = headers.get(lanes.header)
    if value is None:
        return None
    value = value.strip().lower()
    if not value or value == Lane.INTERACTIVE or value in AWAITED_TASKS:
        return Lane.INTERACTIVE
    return Lane.BACKGROUND


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
        if prompt is not None and prompt.startswith(PRESETS[preset]):
            return Lane.INTERACTIVE if prompt.startswith(PRESET_CHATS[preset]) else Lane.BACKGROUND
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
