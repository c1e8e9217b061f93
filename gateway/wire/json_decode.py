"""Request JSON decoded as Go's ``encoding/json`` accepts it, and within bounds.

Python's ``json`` takes ``NaN`` and ``Infinity`` and numbers beyond float64 (``1e400``
becomes an infinity that ``int()`` cannot take), where Go's decoder, Ollama's, refuses them;
and each object costs the parser a Python call on the event loop, so their number is
bounded. ``decode`` makes each object with a hook of the caller's: ``Pairs`` keeps
duplicate keys (``parse_object_pairs``), wire/ambiguity.py's check refuses keys that fold alike.
``loads`` is ``json.loads`` with a decoder built once (``scanner``), for a short body.

Apart from wire/ambiguity.py, which decides what a body's keys mean to Go: this is only how JSON
is turned into values, which the simulator (``fairsim.gojson``) reads bodies with too.
Pure (no aiohttp).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from typing import Any

__all__ = [
    "MAX_OBJECTS",
    "NestedTooDeeply",
    "Pairs",
    "Scan",
    "TooManyObjects",
    "decode",
    "loads",
    "parse_object_pairs",
    "scanner",
]


class NestedTooDeeply(ValueError):
    """The JSON nests deeper than Python's parser can follow."""

    def __init__(self) -> None:
        super().__init__("nested too deeply")


class TooManyObjects(ValueError):
    """More JSON objects than any request needs: each costs the parser a Python call on the
    event loop, so a 32 MiB body of ``{}`` would hold every stream for seconds."""

    def __init__(self) -> None:
        super().__init__(f"the request body holds more than {MAX_OBJECTS:,} JSON objects")


# A chat with Open WebUI's 36 tools is about 500 objects; a thousand messages with their
# tool calls a few thousand. Parsing this many takes tens of milliseconds.
MAX_OBJECTS = 100_000


class Pairs(list[tuple[str, Any]]):
    """A JSON object as parsed: every (key, value) in document order, duplicates kept."""


def parse_object_pairs(body: bytes | str, *, in_thread: bool = False) -> Any:
    """The JSON value with every object as ``Pairs``, so that duplicate keys survive.

    Raises ``NestedTooDeeply`` rather than ``RecursionError`` for deep nesting;
    ``in_thread`` as for ``decode``."""
    try:
        return decode(body, Pairs, in_thread)
    except RecursionError:
        raise NestedTooDeeply from None


def decode(
    body: bytes | str, make: Callable[[list[tuple[str, Any]]], Any], in_thread: bool = False
) -> Any:
    """``json.loads`` as Go's decoder reads: no NaN or Infinity, no number beyond float64,
    and at most ``MAX_OBJECTS`` objects, each made by ``make`` from its pairs.

    ``in_thread``: the caller is a worker thread beside the event loop. The C parser holds
    the GIL until it calls Python, which it does for each object and fraction but not for
    an integer; so each integer is made by a Python call too, which slows the parse but
    gives the loop the GIL back every few milliseconds."""
    left = MAX_OBJECTS

    def counted(pairs: list[tuple[str, Any]]) -> Any:
        nonlocal left
        left -= 1
        if left < 0:
            raise TooManyObjects
        return make(pairs)

    return json.loads(
        body,
        object_pairs_hook=counted,
        parse_constant=_constant,
        parse_float=_finite,
        parse_int=_integer if in_thread else None,
    )


Scan = Callable[[str, int], tuple[Any, int]]


def scanner(make: Callable[[list[tuple[str, Any]]], Any]) -> Scan:
    """The scanner of a decoder built once, reading numbers as ``decode`` does and making
    each object with ``make``, uncounted: for ``loads`` on a body too short to hold
    ``MAX_OBJECTS`` objects (two bytes each)."""
    decoder = json.JSONDecoder(
        object_pairs_hook=make, parse_constant=_constant, parse_float=_finite
    )
    scan: Scan = decoder.scan_once  # type: ignore[attr-defined]  # not in typeshed
    return scan


def loads(scan: Scan, text: str) -> Any:
    """``json.loads(text)`` with a decoder built once (building one per body would add
    much to a chat's parse) and ``scan``, its scanner; its BOM check kept, with its words.

    The decoder's ``decode`` itself, without its two calls around the scanner and, for a
    body that starts with its object and ends with it (nearly all), without its two
    matches of whitespace: the same errors, in the same words, in less time."""
    if text.startswith("\ufeff"):
        raise json.JSONDecodeError("Unexpected UTF-8 BOM (decode using utf-8-sig)", text, 0)
    # (_WHITESPACE matches the empty string: never None.)
    start = 0 if text.startswith("{") else _WHITESPACE(text).end()  # type: ignore[union-attr]
    try:
        value, end = scan(text, start)
    except StopIteration as exc:
        raise json.JSONDecodeError("Expecting value", text, exc.value) from None
    if end != len(text):
        end = _WHITESPACE(text, end).end()  # type: ignore[union-attr]
        if end != len(text):
            raise json.JSONDecodeError("Extra data", text, end)
    return value


# What json.decoder.JSONDecoder.decode skips around the value (its WHITESPACE).
_WHITESPACE = re.compile(r"[ \t\n\r]*").match


def _constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")


def _integer(text: str) -> int:
    return int(text)


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text[:30]} is out of range")
    return value
