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
values first: ``json_counts``, and decodes them as Go accepts them: ``json_decode``);
``go_fold`` is the one copy of Go's key folding, which the simulator (``fairsim.gojson``)
imports as well.
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any

from gateway.wire.json_counts import check_counts
from gateway.wire.json_decode import (
    MAX_OBJECTS,
    NestedTooDeeply,
    Pairs,
    decode,
    loads,
    parse_object_pairs,
    scanner,
)

__all__ = [
    "AmbiguousField",
    "NotAnObject",
    "ambiguous_field",
    "canonical_keys",
    "go_fold",
    "load_checked",
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


class NotAnObject(ValueError):
    """Valid JSON, but not an object at the top."""

    def __init__(self) -> None:
        super().__init__("the JSON value is not an object")


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
    ``json.JSONDecodeError`` or ``UnicodeDecodeError`` for a body that is not JSON in UTF-8
    (or that Go's decoder would refuse: ``json_decode``); all are ``ValueError``.

    ``in_thread``: the caller is a worker thread beside the event loop, which then gets
    the GIL back every few milliseconds (``json_decode.decode``)."""
    check_counts(body)
    # UTF-8 only, as Go reads it (and as counted above). Given bytes, json.loads guesses
    # UTF-16 or UTF-32 from the first four, where a character's bytes can look like a quote
    # to the count: a UTF-16 body of five million arrays would pass it and be parsed whole.
    # The error handler is the one json.loads decodes with.
    text = body.decode("utf-8", "surrogatepass") if isinstance(body, bytes) else body
    try:
        if not in_thread and len(text) < 2 * MAX_OBJECTS:  # too short to hold too many
            value = loads(_SCAN_CHECKED, text)
        else:
            value = decode(text, _checked_object, in_thread)
    except _Ambiguous:
        found = _first_ambiguity(parse_object_pairs(text, in_thread=in_thread))
        if found is not None:
            raise AmbiguousField(*found) from None
        # Only inside what Ollama reads as a map or as raw JSON (options, a format's schema,
        # tool arguments), where keys are matched exactly, as Python reads them too.
        value = decode(text, dict, in_thread)
    except RecursionError:
        raise NestedTooDeeply from None
    if not isinstance(value, dict):
        raise NotAnObject
    return value


# ``load_checked``'s reading of a body too short to hold ``MAX_OBJECTS`` objects.
_SCAN_CHECKED = scanner(_checked_object)


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
# Anthropic's MessagesRequest (Ollama's anthropic package) holds ``system`` and a tool
# result's ``content`` as ``any``, a tool's ``input_schema`` as raw JSON and a tool call's
# ``input`` as a map: exact keys there too (Claude Code's schemas are the client's own).
# So does the Responses API's (openai/responses.go): a tool's ``parameters`` (a namespace
# tool's tools' too), ``text.format.schema`` and ``conversation``.
_EXACT_KEYS = re.compile(
    r"options|format|response_format\.json_schema\.schema"
    r"|messages\[\d+\]\.tool_calls\[\d+\]\.function\.arguments"
    r"|tools\[\d+\]\.function\.parameters\.properties"
    r"|system|tools\[\d+\]\.input_schema|messages\[\d+\]\.content\[\d+\]\.(?:input|content)"
    r"|tools\[\d+\](?:\.tools\[\d+\])?\.parameters|text\.format\.schema|conversation"
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
