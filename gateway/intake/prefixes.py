"""A request's prompt as an engine's prompt cache sees it: its prefix, in hashed blocks.

A chat template renders the tools first, then the system prompt, then the messages in
order (the prompt of a completion after them): a conversation's next turn repeats all of
it and adds to the end. The gateway cannot render the model's template, so it renders the
same parts in the same order its own way (each part as compact JSON with sorted keys: a
front end that sends the same message twice sends the same bytes) and cuts the result
into blocks (``admission/prompt_caches.py``). Two requests share a cached prefix for the
engine where they share leading blocks here.

The share of the prompt found cached is a share of these bytes, and it is taken off the
prompt's tokens as counted (``intake/classify.py``): so each part weighs here what it
weighs there. What the count leaves out (an id, a role, a key's name) is written in a few
bytes at most, its digest if it is long, and an image as a digest and as many bytes as
its tokens' characters: a 200 KB ``id`` sent once, or an image, cannot make the new text
after it look cached.
"""

from __future__ import annotations

import hashlib
import secrets
from typing import Any

import orjson

from gateway.admission import BLOCK_BYTES, NO_PREFIX, Prefix
from gateway.intake.classify import CHARS_PER_TOKEN, IMAGE_PARTS, RENDERED_AS_JSON, STRUCTURE_KEYS

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


def prefix_of(fields: dict[str, Any], model: str, image_tokens: int = 768) -> Prefix:
    """The hashed blocks of the prompt ``fields`` carries for ``model``; none for a request
    that keeps llama-server from its cache (``cache_prompt: false``): the engine evaluates
    all of it, and what it reads from its cache then is no measure of what it holds. (A
    client's ``id_slot`` is overwritten on the way to llama-server: ``wire/engine_slot.py``.)
    ``image_tokens``: what the count takes an image for (the policy's ``costs``)."""
    if fields.get("cache_prompt") is False:
        return NO_PREFIX
    rendered = _rendered(fields, b"." * (image_tokens * CHARS_PER_TOKEN))
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
    return Prefix(tuple(blocks), len(rendered), model)


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


def _rendered(fields: dict[str, Any], image: bytes) -> bytes:
    parts: list[bytes] = []
    for name in _ORDER:
        value = fields.get(name)
        if value is None:
            continue
        if isinstance(value, str) or name in ("tools", "functions"):  # counted whole
            parts.append(_json(value))
            continue
        # Each message on its own: the history a next turn repeats is the same bytes.
        items = value if name in ("messages", "input") and isinstance(value, list) else [value]
        for item in items:
            parts.append(_json(_as_counted(item, image)))
    return _SEPARATOR.join(parts)


_SHORT = 32  # bytes: an id, a role or a key's name written out; past it, its digest


def _as_counted(value: object, image: bytes, depth: int = 0) -> object:
    """``value`` with each part as heavy as the count makes it (``classify._walked``): its
    text as it is, what the count leaves out short, an image as its weight."""
    if isinstance(value, str):
        return _image(value, image) if value.startswith("data:image/") else value
    if isinstance(value, list):
        return [_as_counted(item, image, depth + 1) for item in value] if depth < 32 else None
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


def _image(data: str, weight: bytes) -> str:
    """An image as the count takes it: its digest (another image is another prompt), and
    its tokens' worth of characters."""
    return _short(data + "!" * _SHORT) + weight.decode()


def _json(value: object) -> bytes:
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    except (orjson.JSONEncodeError, TypeError):  # an integer beyond 64 bits: refused later
        return b""
