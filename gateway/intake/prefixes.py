"""A request's prompt as an engine's prompt cache sees it: its prefix, in hashed blocks.

A chat template renders the tools first, then the system prompt, then the messages in
order (the prompt of a completion after them): a conversation's next turn repeats all of
it and adds to the end. The gateway cannot render the model's template, so it renders the
same parts in the same order its own way (each part as compact JSON with sorted keys: a
front end that sends the same message twice sends the same bytes) and cuts the result
into blocks (``admission/prompt_caches.py``). Two requests share a cached prefix for the
engine where they share leading blocks here.

The share of the prompt found cached is taken off the prompt's tokens as counted
(``intake/classify.py``), so it is a share of what the count weighs, part by part
(``Prefix.weights``), not of bytes: a message of 200 KB the count does not see (an id, keys,
numbers), sent once, cannot make the new text after it look cached. The bytes are shaped
to the count too (what it leaves out in a few bytes, an image as its tokens' characters),
so that a share within one part is near its weight as well.
"""

from __future__ import annotations

import hashlib
import secrets
from typing import Any

import orjson

from gateway.admission import BLOCK_BYTES, CHARS_PER_TOKEN, NO_PREFIX, Prefix
from gateway.intake.classify import (
    IMAGE_PARTS,
    RENDERED_AS_JSON,
    STRUCTURE_KEYS,
    counted_characters,
)

__all__ = ["prefix_of"]

# Keyed with a secret of this process: a client cannot write a prompt whose hash is
# another's, to make it look cheap or dear.
_KEY = secrets.token_bytes(16)
# A prompt is hashed up to this many blocks (1 MiB): beyond, it is counted as uncached,
# which makes it no cheaper than it is.
_MAX_BLOCKS = 4096
# The parts a template renders, in its order: definitions, instructions, then the turns.
_ORDER = ("tools", "functions", "system", "instructions", "messages", "input", "prompt", "suffix")
_SEPARATOR = b"\x1e"  # between parts: no JSON text contains it unescaped


def prefix_of(fields: dict[str, Any], model: str, image_tokens: int) -> Prefix:
    """The hashed blocks of the prompt ``fields`` carries for ``model``; none for a request
    that keeps llama-server from its cache (``cache_prompt: false``): the engine evaluates
    all of it, and what it reads from its cache then is no measure of what it holds. (A
    client's ``id_slot`` is overwritten on the way to llama-server: ``wire/engine_slot.py``.)
    ``image_tokens``: what the count takes an image for (the policy's ``costs``)."""
    if fields.get("cache_prompt") is False:
        return NO_PREFIX
    image = "." * (image_tokens * CHARS_PER_TOKEN)
    parts = _rendered(fields, image)
    rendered = _SEPARATOR.join(data for data, _ in parts)
    whole = min(len(rendered) // BLOCK_BYTES, _MAX_BLOCKS)
    if not whole:  # a short prompt: no block a cache could be known to hold
        return Prefix((), len(rendered), model)
    blocks = []
    chain = _seed(model)
    for start in range(0, whole * BLOCK_BYTES, BLOCK_BYTES):
        chain = hashlib.blake2b(
            chain + rendered[start : start + BLOCK_BYTES], digest_size=8, key=_KEY
        ).digest()
        blocks.append(int.from_bytes(chain, "little"))
    weights, weight = _weights(parts, whole)
    return Prefix(tuple(blocks), len(rendered), model, weights, weight)


def _weights(parts: list[tuple[bytes, int]], whole: int) -> tuple[tuple[int, ...], int]:
    """What the count weighs through the end of each of the ``whole`` blocks, and in all:
    each part's weight spread evenly over its bytes. A message of 200 KB the count does not
    see (ids, keys, numbers) weighs nothing, and cached, passes nothing after it for cached."""
    ends, sums, start, total = [], [], 0, 0
    for data, weight in parts:
        start += len(data)
        total += weight
        ends.append(start)
        sums.append(total)
        start += len(_SEPARATOR)
    weights, part = [], 0
    for block in range(1, whole + 1):
        end = block * BLOCK_BYTES
        while ends[part] < end:
            part += 1
        before = sums[part - 1] if part else 0
        first = ends[part - 1] + len(_SEPARATOR) if part else 0
        size = ends[part] - first
        within = max(0, end - first) * (sums[part] - before) // size if size else 0
        weights.append(before + within)
    return tuple(weights), total


_SEEDS: dict[str, bytes] = {}
_SEEDS_KEPT = 1024  # model names: a client may send many, the dict stays bounded


def _seed(model: str) -> bytes:
    """The hash every chain of ``model`` starts from (a cache holds one model's prompts)."""
    seed = _SEEDS.get(model)
    if seed is None:
        seed = hashlib.blake2b(model.encode(), digest_size=8, key=_KEY).digest()
        if len(_SEEDS) < _SEEDS_KEPT:
            _SEEDS[model] = seed
    return seed


def _rendered(fields: dict[str, Any], image: str) -> list[tuple[bytes, int]]:
    """The prompt's parts in a template's order, each as bytes and as the count weighs it."""
    parts: list[tuple[bytes, int]] = []
    for name in _ORDER:
        value = fields.get(name)
        if value is None:
            continue
        schema = name in ("tools", "functions")
        if isinstance(value, str) or schema:  # counted whole
            parts.append((_json(value), counted_characters(value, len(image), schema)))
            continue
        # Each message on its own: the history a next turn repeats is the same bytes.
        items = value if name in ("messages", "input") and isinstance(value, list) else [value]
        for item in items:
            weight = counted_characters(item, len(image))
            parts.append((_json(_as_counted(item, image)), weight))
    return parts


_SHORT = 32  # bytes: an id, a role or a key's name written out; past it, its digest


def _as_counted(value: object, image: str, depth: int = 0) -> object:
    """``value`` with each part as heavy as the count makes it (``classify._walked``): its
    text as it is, what the count leaves out short, an image as its weight."""
    if isinstance(value, str):
        return _image(value, image) if value.startswith("data:image/") else value
    if depth >= 32:  # deeper than any message: the body's parser bounds nesting anyway
        return None
    if isinstance(value, list):
        return [_as_counted(item, image, depth + 1) for item in value]
    if not isinstance(value, dict):
        return value
    kind = value.get("type")
    if isinstance(kind, str) and kind in IMAGE_PARTS:  # a list there is no hashable kind
        return _image(_json(value).decode(), image)
    shown: dict[str, object] = {}
    for key, item in value.items():
        name = key.lower()
        if name in STRUCTURE_KEYS:
            item = _short(item if isinstance(item, str) else _json(item).decode())
        elif name == "images" and isinstance(item, list):
            item = [_image(_json(one).decode(), image) for one in item]
        elif not (name in RENDERED_AS_JSON and isinstance(item, dict)):
            item = _as_counted(item, image, depth + 1)
        shown[_short(key)] = item
    return shown


def _short(text: str) -> str:
    if len(text) <= _SHORT:
        return text
    return hashlib.blake2b(text.encode(errors="replace"), digest_size=8, key=_KEY).hexdigest()


def _image(data: str, weight: str) -> str:
    """An image as the count takes it: its digest (another image is another prompt), and
    its tokens' worth of characters."""
    return _short(data + "!" * _SHORT) + weight


def _json(value: object) -> bytes:
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    except (orjson.JSONEncodeError, TypeError):  # an integer beyond 64 bits: refused later
        return b""
