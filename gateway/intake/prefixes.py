"""A request's prompt as an engine's prompt cache sees it: its prefix, in hashed blocks.

A chat template renders the tools first, then the system prompt, then the messages in
order (the prompt of a completion after them): a conversation's next turn repeats all of
it and adds to the end. The gateway cannot render the model's template, so it renders the
same parts in the same order its own way (each part as compact JSON with sorted keys: a
front end that sends the same message twice sends the same bytes) and cuts the result
into blocks (``admission/prompt_caches.py``). Two requests share a cached prefix for the
engine where they share leading blocks here.
"""

from __future__ import annotations

import hashlib
import secrets
from typing import Any

import orjson

from gateway.admission import BLOCK_BYTES, NO_PREFIX, Prefix

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


def prefix_of(fields: dict[str, Any], model: str) -> Prefix:
    """The hashed blocks of the prompt ``fields`` carries for ``model``; none for a request
    that keeps llama-server from its cache (``cache_prompt: false``): the engine evaluates
    all of it, and what it reads from its cache then is no measure of what it holds. (A
    client's ``id_slot`` is overwritten on the way to llama-server: ``wire/engine_slot.py``.)"""
    if fields.get("cache_prompt") is False:
        return NO_PREFIX
    rendered = _rendered(fields)
    whole = min(len(rendered) // BLOCK_BYTES, _MAX_BLOCKS)
    if not whole:  # a short prompt: no block a cache could be known to hold
        return Prefix((), len(rendered))
    blocks = []
    chain = _seed(model)
    for start in range(0, whole * BLOCK_BYTES, BLOCK_BYTES):
        chain = hashlib.blake2b(
            chain + rendered[start : start + BLOCK_BYTES], digest_size=8, key=_KEY
        ).digest()
        blocks.append(int.from_bytes(chain, "little"))
    return Prefix(tuple(blocks), len(rendered))


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


def _rendered(fields: dict[str, Any]) -> bytes:
    parts: list[bytes] = []
    for name in _ORDER:
        value = fields.get(name)
        if value is None:
            continue
        # Each message on its own: the history a next turn repeats is the same bytes.
        items = value if name in ("messages", "input") and isinstance(value, list) else [value]
        for item in items:
            parts.append(_json(item))
    return _SEPARATOR.join(parts)


def _json(value: object) -> bytes:
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    except (orjson.JSONEncodeError, TypeError):  # an integer beyond 64 bits: refused later
        return b""
