"""What a request will cost, read from its body before it runs: prompt tokens and its class.

The count is an estimate (about four characters a token, a fixed cost per image): good
enough to tell a 6,000-token summary from a quick question before the backend has seen it.
The backend's own counts correct the fair scheduler afterwards.

Everything Ollama puts into the prompt counts: ``/api/generate``'s ``template`` is rendered
as the prompt (its text is prompt text), and its ``context``, the token ids of an earlier
exchange, is detokenized and put before the prompt (server/routes.go): those are tokens
already, counted one each.

Tool schemas, function definitions and output schemas count too: the model's template
renders them into the prompt as JSON, and Open WebUI sends 36 tools (about 25 KB) with a
one-line question. Compact JSON tokenizes at about the same four characters a token.

What the engine already holds in its prompt cache it does not evaluate again
(``admission/prompt_caches.py``): the class and the charge are of the rest, so a chat's
later turns are light however long the tools and history they repeat.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from gateway.config import Policy
from gateway.core import RequestClass
from gateway.intake.load_options import num_ctx_of
from gateway.wire import canonical_keys

__all__ = ["Estimate", "classify"]

_CHARS_PER_TOKEN = 4


@dataclass(slots=True)  # not frozen: that sets each field by a call, on every request's path
class Estimate:
    """The estimated prompt size of a request, and the class that follows from it; made
    once for a request, never changed."""

    input_tokens: int  # the prompt the engine will evaluate: what its cache does not hold
    request_class: RequestClass
    weight: float  # the class's share multiplier
    num_ctx: int | None = None  # the context Ollama would load the model with (num_ctx_of)
    prompt_tokens: int = 0  # the whole prompt, cached or not


def classify(fields: dict[str, Any], policy: Policy, cached_share: float = 0.0) -> Estimate:
    """Estimate the prompt of an Ollama or OpenAI request body and decide its class;
    ``cached_share``: the part of it the engine likely holds in its prompt cache."""
    characters, images = _prompt_size(fields)
    prompt = characters // _CHARS_PER_TOKEN + images * policy.costs.image_tokens
    prompt += _count(fields.get("context"))
    tokens = prompt - int(prompt * cached_share)
    heavy = policy.classes.heavy
    # The context Ollama loads the model with (16384.9 loads 16384), not the JSON's type.
    num_ctx = num_ctx_of(fields)
    wants_long_context = (
        heavy.min_num_ctx is not None and num_ctx is not None and num_ctx >= heavy.min_num_ctx
    )
    if tokens >= heavy.min_prompt_tokens or wants_long_context:
        return Estimate(tokens, RequestClass.HEAVY, heavy.weight, num_ctx, prompt)
    return Estimate(tokens, RequestClass.LIGHT, policy.classes.light.weight, num_ctx, prompt)


# Every place a prompt can be, by field: text (a string, a list of strings, or content
# parts), a schema the template renders as JSON, images, or messages.
_TEXT, _SCHEMA, _IMAGES, _MESSAGES = "text", "schema", "images", "messages"
_PROMPT_FIELDS = {
    **dict.fromkeys(("prompt", "system", "suffix", "input", "template", "instructions"), _TEXT),
    **dict.fromkeys(("tools", "functions", "format", "response_format"), _SCHEMA),
    "images": _IMAGES,
    "messages": _MESSAGES,
}


def _prompt_size(fields: dict[str, Any]) -> tuple[int, int]:
    """(characters of text, number of images) in every place a prompt can be: the body's
    few fields looked up among them, rather than each of them in the body."""
    characters, images = 0, 0
    for key, value in fields.items():
        kind = _PROMPT_FIELDS.get(key)
        if kind is None:
            continue
        if kind is _MESSAGES:
            text_chars, text_images = _messages_size(value)
        elif kind is _TEXT:
            text_chars, text_images = _content_size(value)
        elif kind is _SCHEMA:
            text_chars, text_images = _schema_size(value), 0
        else:
            text_chars, text_images = 0, _count(value)
        characters, images = characters + text_chars, images + text_images
    return characters, images


def _messages_size(messages: object) -> tuple[int, int]:
    """Text and images of every message (a message's content is most often one string)."""
    # A body is the client's: any field may hold any JSON type. The backend refuses the
    # wrong ones in its own words; the estimate only must not fail on them.
    if not isinstance(messages, list):
        return 0, 0
    characters, images = 0, 0
    for message in messages:
        if isinstance(message, dict):
            # Its keys as Go's decoder reads them into a message (a "Content" is content).
            message = canonical_keys(message) or message
            content = message.get("content")
            if isinstance(content, str):
                characters += len(content)
            else:
                text_chars, text_images = _content_size(content)
                characters, images = characters + text_chars, images + text_images
            pictures = message.get("images")
            if isinstance(pictures, list):
                images += len(pictures)
    return characters, images


def _schema_size(value: object) -> int:
    """Characters of a schema as a template renders it: compact JSON (a plain string such
    as format: "json" is a word, not a schema)."""
    if not isinstance(value, list | dict):
        return 0
    try:
        return len(orjson.dumps(value))
    except orjson.JSONEncodeError:  # an integer beyond 64 bits: the backend will refuse it
        return 0


def _count(value: object) -> int:
    return len(value) if isinstance(value, list) else 0


# Content parts that are an image: OpenAI's chat and Responses parts, Anthropic's block.
_IMAGE_PARTS = frozenset(("image_url", "input_image", "image"))
# How deep a tool result's blocks are read: Ollama reads one level of them
# (anthropic.convertToolResultContent); a little more costs nothing and hides nothing.
_MAX_DEPTH = 3


def _content_size(content: object, depth: int = 0) -> tuple[int, int]:
    """Text and images of a string, a list of strings, OpenAI content parts or Anthropic
    content blocks: text, thinking, a tool call's input (compact JSON, as the template
    renders it: Claude Code's Write and Edit carry whole files there) and a tool result's
    content, each block's keys as Go's decoder reads them into Ollama's ContentBlock."""
    if isinstance(content, str):
        return len(content), 0
    if not isinstance(content, list):
        return 0, 0
    characters, images = 0, 0
    for part in content:
        if isinstance(part, str):
            characters += len(part)
        elif isinstance(part, dict):
            # {"Type": "text", "TEXT": ...} is a text block to Go: its keys fold.
            part = canonical_keys(part) or part
            if part.get("type") in _IMAGE_PARTS:
                images += 1
            text, thinking = part.get("text"), part.get("thinking")
            characters += len(text) if isinstance(text, str) else 0
            characters += len(thinking) if isinstance(thinking, str) else 0
            arguments = part.get("input")
            if isinstance(arguments, dict):
                characters += _schema_size(arguments)
            # A tool result's own content (a string or blocks): what an agent such as
            # Claude Code sends most of, files and command output.
            inner = part.get("content")
            if inner is not None and depth < _MAX_DEPTH:
                inner_chars, inner_images = _content_size(inner, depth + 1)
                characters, images = characters + inner_chars, images + inner_images
    return characters, images
