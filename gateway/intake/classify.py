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

A message or an input item is walked whole: every string in it counts (a tool call's
arguments, a tool's output, a thought, a reasoning item's content), but for the few keys
that say what a part is; so a field no one listed is not silently zero.

What the engine already holds in its prompt cache it does not evaluate again
(``admission/prompt_caches.py``): the class and the charge are of the rest, so a chat's
later turns are light however long the tools and history they repeat.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from gateway.admission import CHARS_PER_TOKEN
from gateway.config import Policy
from gateway.core import RequestClass
from gateway.intake.load_options import num_ctx_of
from gateway.wire import canonical_keys

__all__ = [
    "IMAGE_PARTS",
    "RENDERED_AS_JSON",
    "STRUCTURE_KEYS",
    "Estimate",
    "classify",
    "counted_characters",
]


@dataclass(slots=True)  # not frozen: that sets each field by a call, on every request's path
class Estimate:
    """The estimated prompt size of a request, and the class that follows from it; made
    once for a request, never changed."""

    input_tokens: int  # the prompt the engine will evaluate: what its cache does not hold
    request_class: RequestClass
    weight: float  # the class's share multiplier
    num_ctx: int | None = None  # the context Ollama would load the model with (num_ctx_of)
    prompt_tokens: int = 0  # the whole prompt, cached or not
    output_tokens: int | None = None  # the most it may generate, if the body says


def classify(
    fields: dict[str, Any], policy: Policy, cached_share: float = 0.0, native: bool = False
) -> Estimate:
    """Estimate the prompt of an Ollama or OpenAI request body and decide its class;
    ``cached_share``: the part of it the engine likely holds in its prompt cache; ``native``:
    a body of Ollama's own API."""
    characters, images = _prompt_size(fields)
    prompt = characters // CHARS_PER_TOKEN + images * policy.costs.image_tokens
    prompt += _count(fields.get("context"))
    tokens = prompt - int(prompt * cached_share)
    heavy = policy.classes.heavy
    # The context Ollama loads the model with (16384.9 loads 16384), not the JSON's type.
    num_ctx = num_ctx_of(fields)
    wants_long_context = (
        heavy.min_num_ctx is not None and num_ctx is not None and num_ctx >= heavy.min_num_ctx
    )
    output = output_limit(fields, native)
    if tokens >= heavy.min_prompt_tokens or wants_long_context:
        return Estimate(tokens, RequestClass.HEAVY, heavy.weight, num_ctx, prompt, output)
    light = policy.classes.light.weight
    return Estimate(tokens, RequestClass.LIGHT, light, num_ctx, prompt, output)


# Where the APIs put the most a reply may generate: Ollama's options.num_predict (-1, -2:
# until the context is full), OpenAI's max_tokens and max_completion_tokens, the Responses
# API's max_output_tokens, Anthropic's max_tokens, and llama-server's own n_predict, which it
# reads before max_tokens (params_from_json_cmpl).
_OUTPUT_LIMITS = ("max_tokens", "max_completion_tokens", "max_output_tokens", "n_predict")


def output_limit(fields: dict[str, Any], native: bool = False) -> int | None:
    """The most tokens the reply may generate, as the body bounds it; None when it does not.

    Each backend reads its own field, and may ignore the others: so the largest any says,
    and none when any says "unbounded" (a number below 1), lest a small figure in a field
    the backend ignores make the request look cheaper than what it will run. Ollama's own
    API (``native``) reads ``options.num_predict`` alone: a ``max_tokens`` beside it bounds
    nothing."""
    options = fields.get("options")
    found = [options.get("num_predict")] if isinstance(options, dict) else []
    if native and not found:
        return None
    if not native:
        found += [fields.get(name) for name in _OUTPUT_LIMITS]
    limits = [n for n in found if isinstance(n, int) and not isinstance(n, bool)]
    if not limits or min(limits) < 1:
        return None
    return max(limits)


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
        if kind is _SCHEMA:
            text_chars, text_images = _schema_size(value), 0
        elif kind is _IMAGES:
            text_chars, text_images = 0, _count(value)
        else:  # text, or messages (or the Responses API's input items)
            text_chars, text_images = _walked(value)
        characters, images = characters + text_chars, images + text_images
    return characters, images


def counted_characters(value: object, image_chars: int, schema: bool = False) -> int:
    """What the count makes of one part of a prompt, in characters, an image as
    ``image_chars``: the weight ``intake/prefixes.py`` gives that part's bytes."""
    if schema:
        return _schema_size(value)
    characters, images = _walked(value)
    return characters + images * image_chars


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
IMAGE_PARTS = frozenset(("image_url", "input_image", "image"))
# Keys (folded, as Go's decoder folds them) whose values say what a part is, not what the
# model reads: a role, a block's type, ids, a thought's signature, cache hints.
STRUCTURE_KEYS = frozenset(
    ("type", "role", "id", "name", "tool_use_id", "call_id", "cache_control", "media_type",
     "status", "index", "signature")
)  # fmt: skip
# Keys whose object a template writes out as JSON: a tool call's input or arguments.
RENDERED_AS_JSON = frozenset(("input", "arguments", "parameters"))
_MAX_DEPTH = 32  # deeper than any message; the body's parser bounds nesting anyway


def _walked(value: object, depth: int = 0) -> tuple[int, int]:
    """Text and images in a prompt-carrying value, however deep: every string counts
    (a message's content, a tool call's arguments, a tool's output, a thought, a reasoning
    item: no field the gateway has not listed is silently zero), but for the few keys that
    only say what a part is; an image part, a data: URL or an ``images`` list counts as
    images. Keys are read as Go's decoder reads them (``"Content"`` is content)."""
    if isinstance(value, str):
        return (0, 1) if value.startswith("data:image/") else (len(value), 0)
    if depth >= _MAX_DEPTH:
        return 0, 0
    characters, images = 0, 0
    if isinstance(value, list):
        for item in value:
            item_chars, item_images = _walked(item, depth + 1)
            characters, images = characters + item_chars, images + item_images
        return characters, images
    if not isinstance(value, dict):
        return 0, 0  # a number or a boolean: no prompt text
    folded = canonical_keys(value) or value
    kind = folded.get("type")
    if isinstance(kind, str) and kind in IMAGE_PARTS:  # a list there is no hashable kind
        return 0, 1
    for key, item in folded.items():
        if type(item) is str and not item.startswith("data:image/"):  # most: no call
            if key not in STRUCTURE_KEYS and key.lower() not in STRUCTURE_KEYS:
                characters += len(item)
            continue
        name = key.lower()
        if name in STRUCTURE_KEYS:
            continue
        if name == "images" and isinstance(item, list):
            images += len(item)
        elif name in RENDERED_AS_JSON and isinstance(item, dict):
            characters += _schema_size(item)
        else:
            item_chars, item_images = _walked(item, depth + 1)
            characters, images = characters + item_chars, images + item_images
    return characters, images
