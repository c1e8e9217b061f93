"""Refuse JSON bodies whose meaning depends on who reads them.

Ollama decodes request bodies with Go's ``encoding/json``, which matches an object key to a
struct field case-insensitively and, when several keys match one field, keeps the last:
``{"model": "a", "MODEL": "b"}`` runs model ``b`` there, while Python's ``json`` (and so
this gateway's checks) sees ``model`` = ``a``. Exact duplicates are no better: parsers
disagree on them (the first, the last, or an error) and Python's ``json`` hides them. A body
in which two keys of one object fold to the same name is therefore ambiguous, and refusing
it is the only reading that holds for every backend. See Go's decoder (exact match first,
then ``foldName``): https://github.com/golang/go/blob/master/src/encoding/json/decode.go
and its fold:
https://github.com/golang/go/blob/master/src/encoding/json/fold.go

Pure (no aiohttp): ``load_checked`` is what a request path calls (it counts the body's
values first: ``json_counts``); ``go_fold`` is the one copy of Go's key folding, which the
simulator (``fairsim.gojson``) imports as well.
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Callable
from typing import Any

from gateway.json_counts import check_counts

__all__ = [
    "AmbiguousField",
    "NestedTooDeeply",
    "NotAnObject",
    "Pairs",
    "TooManyObjects",
    "ambiguous_field",
    "canonical_keys",
    "go_fold",
    "load_checked",
    "parse_object_pairs",
]


class AmbiguousField(ValueError):
    """Two or more keys of one JSON object name the same field for Go's decoder.

    ``path`` locates the field (``"model"``, ``"options.num_ctx"``, ``"messages[0].role"``),
    ``keys`` are the spellings found, in document order."""

    def __init__(self, path: str, keys: tuple[str, ...] = ()) -> None:
        self.path = path
        self.keys = keys
        spellings = f" (as {', '.join(json.dumps(key) for key in keys)})" if keys else ""
        super().__init__(
            f"the JSON field {path} is given more than once{spellings}; Ollama reads keys "
            "that differ only in letter case as one field and keeps the last, so the "
            "request is ambiguous"
        )


class NestedTooDeeply(ValueError):
    """The JSON nests deeper than Python's parser can follow."""

    def __init__(self) -> None:
        super().__init__("nested too deeply")


class NotAnObject(ValueError):
    """Valid JSON, but not an object at the top."""

    def __init__(self) -> None:
        super().__init__("the JSON value is not an object")


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


@functools.lru_cache(maxsize=4096)
def _fold_char(char: str) -> str:
    # Go's decoder turns an unpaired surrogate escape into U+FFFD before matching.
    if "\ud800" <= char <= "\udfff":
        return "\ufffd"
    # Unicode simple case folding (CaseFolding.txt statuses C and S), which is what Go's
    # unicode.SimpleFold orbits are. str.casefold() is the full folding (C and F): where it
    # gives one character that is the C mapping; where it gives several (F), the S mapping,
    # when there is one, is the simple lower case (U+1E9E -> U+00DF, U+1FBC -> U+1FB3), and
    # otherwise the character folds only to itself (U+0130, U+00DF).
    folded = char.casefold()
    if len(folded) == 1:
        return folded
    lower = char.lower()
    return lower if len(lower) == 1 else char


def go_fold(name: str) -> str:
    """``name`` folded so that ``go_fold(a) == go_fold(b)`` exactly when Go's
    ``bytes.EqualFold`` (and so ``encoding/json``'s field matching) takes them as equal.

    ASCII letters fold to lower case; beyond ASCII, each character folds to its simple case
    folding, so the Kelvin sign (U+212A) folds to ``k`` and the long s (U+017F) to ``s``,
    while the Turkish dotted capital I (U+0130) and dotless i (U+0131) fold to nothing
    else. The result for a struct
    field's name as Ollama spells it (lower-case snake_case) is that name itself.
    (Go's own ``foldName`` picks the smallest rune of each fold set instead, upper case for
    ASCII; the equalities are the same.)"""
    if name.isascii():
        return name.lower()
    return "".join(map(_fold_char, name))


class _Ambiguous(Exception):
    """Raised inside the parser to stop at the first ambiguous object."""


def _checked_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        raise _Ambiguous
    # Keys that are already their own fold (lower-case ASCII, all of them at once) cannot
    # collide with each other once they are distinct; fold them only otherwise.
    keys = "".join(obj)
    if not (keys.isascii() and keys.islower()) and len({go_fold(k) for k in obj}) != len(obj):
        raise _Ambiguous
    return obj


def load_checked(body: bytes | str, *, in_thread: bool = False) -> dict[str, Any]:
    """The body's JSON object, unless a reader could take it for another.

    Raises ``TooManyValues`` (before parsing) or ``TooManyObjects`` for a body that holds
    more than any request needs, ``AmbiguousField`` when some object at any depth has keys
    that fold alike (exact duplicates included), ``NestedTooDeeply`` when the parser runs
    out of stack, ``NotAnObject`` for valid JSON that is not an object, and
    ``json.JSONDecodeError`` or ``UnicodeDecodeError`` for a body that is not JSON in UTF-8;
    all are ``ValueError``.

    ``in_thread``: the caller is a worker thread beside the event loop. The C parser holds
    the GIL until it calls Python, which it does for each object and fraction but not for
    an integer; so each integer is made by a Python call too (a million token ids parse in
    about 150 ms instead of 60), and the loop gets the GIL back every few milliseconds."""
    check_counts(body)
    # UTF-8 only, as Go reads it (and as counted above). Given bytes, json.loads guesses
    # UTF-16 or UTF-32 from the first four, where a character's bytes can look like a quote
    # to the count: a UTF-16 body of five million arrays was parsed whole (4 s, 400 MB).
    # The error handler is the one json.loads decodes with.
    text = body.decode("utf-8", "surrogatepass") if isinstance(body, bytes) else body
    integer = _integer if in_thread else None
    try:
        if integer is None and len(text) < 2 * MAX_OBJECTS:  # too short to hold too many
            value = _loads(_SCAN_CHECKED, text)
        else:
            value = _decode(text, _checked_object, integer)
    except _Ambiguous:
        found = _first_ambiguity(parse_object_pairs(text, in_thread=in_thread))
        if found is not None:
            raise AmbiguousField(*found) from None
        # Only inside what Ollama reads as a map or as raw JSON (options, a format's schema,
        # tool arguments), where keys are matched exactly, as Python reads them too.
        value = _decode(text, dict, integer)
    except RecursionError:
        raise NestedTooDeeply from None
    if not isinstance(value, dict):
        raise NotAnObject
    return value


def parse_object_pairs(body: bytes | str, *, in_thread: bool = False) -> Any:
    """The JSON value with every object as ``Pairs``, so that duplicate keys survive.

    Raises ``NestedTooDeeply`` rather than ``RecursionError`` for deep nesting;
    ``in_thread`` as for ``load_checked``."""
    try:
        return _decode(body, Pairs, _integer if in_thread else None)
    except RecursionError:
        raise NestedTooDeeply from None


def _decode(
    body: bytes | str,
    make: Callable[[list[tuple[str, Any]]], Any],
    integer: Callable[[str], int] | None = None,
) -> Any:
    """``json.loads`` as Go's decoder reads: no NaN or Infinity, no number beyond float64
    (Python would make 1e400 an infinity that ``int()`` cannot take), and at most
    ``MAX_OBJECTS`` objects, each made by ``make`` from its pairs; ``integer``, when given,
    makes each integer."""
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
        parse_int=integer,
    )


_Scan = Callable[[str, int], tuple[Any, int]]


def _loads(scan: _Scan, text: str) -> Any:
    """``json.loads(text)`` with a decoder built once (building one per body costs a
    chat's parse a third again) and ``scan``, its scanner; its BOM check kept, with its
    words.

    The decoder's ``decode`` itself, without its two calls around the scanner and, for a
    body that starts with its object and ends with it (nearly all), without its two
    matches of whitespace: the same errors, in the same words, a fifth less time."""
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


# ``_decode``'s reading for a body too short to hold ``MAX_OBJECTS`` objects (two bytes each).
_CHECKED = json.JSONDecoder(
    object_pairs_hook=_checked_object, parse_constant=_constant, parse_float=_finite
)
_SCAN_CHECKED: _Scan = _CHECKED.scan_once  # type: ignore[attr-defined]  # not in typeshed


def ambiguous_field(fields: object) -> str | None:
    """The path of the first object (outermost first, then in document order) that has two
    keys folding alike, or ``None``.

    ``fields`` is a parsed value: from ``parse_object_pairs`` to see exact duplicates, or
    plain dicts and lists, where only keys differing in case can show. The path spells each
    enclosing key as the document does and the ambiguous one by its folded name, so
    ``{"options": {"num_ctx": 1, "NUM_CTX": 2}}`` gives ``options.num_ctx``."""
    found = _first_ambiguity(fields)
    return found[0] if found else None


_PLAIN_KEY = re.compile(r"[A-Za-z_$][A-Za-z0-9_$-]*")
# Where Ollama's request structs hold a map or raw JSON rather than a struct: there Go
# matches keys exactly (``Options.FromMap``, a ``json.RawMessage`` schema, ``map[string]any``
# tool arguments and schema properties), so keys differing in case are different keys for
# Ollama as for Python, and a schema may rightly have both "ID" and "id".
_EXACT_KEYS = re.compile(
    r"options|format|response_format\.json_schema\.schema"
    r"|messages\[\d+\]\.tool_calls\[\d+\]\.function\.arguments"
    r"|tools\[\d+\]\.function\.parameters\.properties"
)


def _child(path: str, key: str) -> str:
    if _PLAIN_KEY.fullmatch(key):
        return f"{path}.{key}" if path else key
    return f"{path}[{json.dumps(key)}]"


def _first_ambiguity(fields: object) -> tuple[str, tuple[str, ...]] | None:
    # Iterative, so that no depth the parser accepted can overflow the stack here.
    stack: list[tuple[object, str]] = [(fields, "")]
    while stack:
        value, path = stack.pop()
        if path and _EXACT_KEYS.fullmatch(go_fold(path)):
            continue
        if isinstance(value, Pairs | dict):
            items = list(value) if isinstance(value, Pairs) else list(value.items())
            seen: set[str] = set()
            for key, _ in items:
                folded = go_fold(key)
                if folded in seen:
                    spellings = tuple(k for k, _ in items if go_fold(k) == folded)
                    return _child(path, folded), spellings
                seen.add(folded)
            stack.extend(
                (item, _child(path, key))
                for key, item in reversed(items)
                if isinstance(item, list | dict)
            )
        elif isinstance(value, list):
            stack.extend(
                (item, f"{path}[{index}]")
                for index, item in reversed(list(enumerate(value)))
                if isinstance(item, list | dict)
            )
    return None


def canonical_keys(fields: dict[str, Any]) -> dict[str, Any] | None:
    """``fields`` with each top-level key spelled as Go's decoder matches it (``KEEP_ALIVE``
    -> ``keep_alive``), or None when every key already is. Only for a body ``load_checked``
    accepted, where no two keys fold alike; the policy then reads the fields Ollama acts on."""
    keys = "".join(fields)  # lower-case ASCII (nearly every body): each its own fold
    if (keys.isascii() and keys.islower()) or all(key == go_fold(key) for key in fields):
        return None
    return {go_fold(key): value for key, value in fields.items()}
