"""The JSON types of the fields Ollama's native request structs hold, and Go's error for a
body whose field has another type.

Ollama binds a body into ``api.GenerateRequest``, ``api.ChatRequest``... (api/types.go) and
answers 400 (``json: cannot unmarshal string into Go struct field ...``) before its
scheduler does anything. The gateway checks the same before it takes a slot or plans a
swap: a request Ollama would refuse must not unload anybody's model first. Only the plain
types are checked here (strings, booleans, integers, maps, lists and their items where Go
knows them); a ``format`` schema, ``keep_alive`` and ``think`` are read elsewhere or are
any JSON. Pure: the simulator answers with the same errors.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import NoneType
from typing import Any

__all__ = [
    "STRUCTS",
    "STRUCT_OF_PATH",
    "field_type_error",
    "go_int64",
    "go_type_name",
    "option_type_error",
]

_Check = Callable[[Any], bool]


def _string(value: Any) -> bool:
    return isinstance(value, str)


def _bool(value: Any) -> bool:
    return isinstance(value, bool)


# Go's int on the 64-bit machines Ollama runs on: a number beyond it is Go's 400 too.
_INT_MIN, _INT_MAX = -(2**63), 2**63 - 1


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and _INT_MIN <= value <= _INT_MAX


def _map(value: Any) -> bool:
    return isinstance(value, dict)


def _list(value: Any) -> bool:
    return isinstance(value, list)


# The types each item check passes, as the JSON parser makes them: a list of a million
# token ids is checked at C speed (``set(map(type, ...))``) instead of by a Python call
# per item; only a list holding another type is walked for Go's error. Integers
# must be in Go's range as well: a list of them is checked by its min and max (C speed
# too), and one with a null among them is walked.
_PASSING: dict[_Check, frozenset[type]] = {
    _string: frozenset({str, NoneType}),
    _int: frozenset({int}),
    _map: frozenset({dict, NoneType}),
}

# A field: what its JSON must be (null always passes: Go leaves the field as it is), Go's
# name for its type, and for a list the check and Go's name of each item (None: any item).
_Field = tuple[_Check, str, tuple[_Check, str] | None]
_STRING: _Field = (_string, "string", None)
_BOOL: _Field = (_bool, "bool", None)
_INT: _Field = (_int, "int", None)
_OPTIONS: _Field = (_map, "map[string]interface {}", None)
_COMMON: dict[str, _Field] = {
    "model": _STRING,
    "options": _OPTIONS,
    "truncate": _BOOL,
    "shift": _BOOL,
    "_debug_render_only": _BOOL,
    "logprobs": _BOOL,
    "top_logprobs": _INT,
}
STRUCTS: Mapping[str, Mapping[str, _Field]] = {
    "api.GenerateRequest": {
        **_COMMON,
        "prompt": _STRING,
        "suffix": _STRING,
        "system": _STRING,
        "template": _STRING,
        "context": (_list, "[]int", (_int, "int")),
        "stream": _BOOL,
        "raw": _BOOL,
        "images": (_list, "[]api.ImageData", (_string, "api.ImageData")),
    },
    "api.ChatRequest": {
        **_COMMON,
        "messages": (_list, "[]api.Message", (_map, "api.Message")),
        "stream": _BOOL,
        "tools": (_list, "api.Tools", (_map, "api.Tool")),
    },
    "api.EmbedRequest": {
        "model": _STRING,
        "options": _OPTIONS,
        "truncate": _BOOL,
        "dimensions": _INT,
    },
    "api.EmbeddingRequest": {"model": _STRING, "prompt": _STRING, "options": _OPTIONS},
}
"""By Go struct: each top-level field whose JSON type Go checks (api/types.go)."""

STRUCT_OF_PATH = {
    "/api/generate": "api.GenerateRequest",
    "/api/chat": "api.ChatRequest",
    "/api/embed": "api.EmbedRequest",
    "/api/embeddings": "api.EmbeddingRequest",
}
"""Ollama's struct (a key of ``STRUCTS``) for each of its native routes (api/types.go)."""


def field_type_error(struct: str, fields: Mapping[str, Any]) -> str | None:
    """Go's error for the first field of ``fields`` (keys as Go matched them) that cannot
    be decoded into ``struct``, or None."""
    known = STRUCTS[struct]
    # Checked in the body's few keys first (a chat's three or four, not the struct's ten):
    # nearly every body passes, and for the others Go names the first in the struct's order.
    # A loop, not all(): no generator made for each request.
    for name, value in fields.items():
        field = known.get(name)
        if field is not None and not _fits(field, value):
            break
    else:
        return None
    name_in_error = struct.rpartition(".")[2]
    for name, field in known.items():
        value = fields.get(name)
        if value is not None and not _fits(field, value):
            return _error(f"{name_in_error}.{name}", field, value)
    return None


# The type Options.FromMap (api/types.go) wants for each option it knows (Options and
# Runner), by its JSON name; it ignores the others, and nulls.
_OPTION_TYPES = {
    **dict.fromkeys(
        ("num_ctx", "num_batch", "num_gpu", "main_gpu", "num_thread", "draft_num_predict"),
        "integer",
    ),
    **dict.fromkeys(("num_keep", "seed", "num_predict", "top_k", "repeat_last_n"), "integer"),
    **dict.fromkeys(
        ("top_p", "min_p", "typical_p", "temperature", "repeat_penalty", "presence_penalty"),
        "float32",
    ),
    "frequency_penalty": "float32",
    "use_mmap": "boolean",
    "stop": "array",
}


def option_type_error(options: object) -> str | None:
    """Ollama's error for an option of a type it cannot take, or None.

    Ollama reads ``options`` after the body (``Options.FromMap``), when it schedules the
    request, and answers such an option with a 500: the client's mistake would read as
    the server's. The gateway names it first, in Ollama's words, as a 400."""
    if not isinstance(options, dict):
        return None  # not an object: the struct's own type error, found before this
    for name, value in options.items():
        wanted = _OPTION_TYPES.get(name)
        if wanted is None or value is None:
            continue
        if wanted == "boolean":
            fits = isinstance(value, bool)
        elif wanted == "array":
            fits = isinstance(value, list)
            # Each item too, a null included (Go's item.(string) fails for it).
            if fits and not all(isinstance(item, str) for item in value):
                return f'option "{name}" must be of an array of strings'
        else:  # integer or float32: a JSON number either way
            fits = isinstance(value, int | float) and not isinstance(value, bool)
        if not fits:
            return f'option "{name}" must be of type {wanted}'
    return None


def _fits(field: _Field, value: Any) -> bool:
    check, _, items = field
    if value is None or items is None:
        return value is None or check(value)
    return check(value) and (_all_pass(items[0], value) or _failing_item(items[0], value) is None)


def _failing_item(check: _Check, items: list[Any]) -> Any:
    """The first item (not null) that fails ``check``, or None (a failing one, such as 0 or
    false, may be falsy)."""
    return next((item for item in items if item is not None and not check(item)), None)


def _error(field_name: str, field: _Field, value: Any) -> str:
    check, go_type, items = field
    if not check(value) or items is None:
        return _cannot(value, field_name, go_type)
    return _cannot(_failing_item(items[0], value), field_name, items[1])


def _all_pass(check: _Check, items: list[Any]) -> bool:
    """Whether every one of ``items`` passes ``check``, found at C speed (``_PASSING``);
    False may only mean that they must be walked to find the one that fails."""
    if not set(map(type, items)) <= _PASSING[check]:
        return False
    return check is not _int or not items or (_int(min(items)) and _int(max(items)))


def _cannot(value: Any, field: str, go_type: str) -> str:
    kind = go_type_name(value)
    if kind == "number" and go_type == "int":  # a fraction, or out of range: Go says which
        kind = f"number {value}"
    return f"json: cannot unmarshal {kind} into Go struct field {field} of type {go_type}"


def go_type_name(value: Any) -> str:
    """The JSON kind Go names in its unmarshal errors."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


_INT64 = 2**63


def go_int64(number: int | float) -> int:
    """A JSON number as Ollama's options make it an integer (``Options.FromMap``): decoded
    into a ``map[string]any`` it is a float64 first, then Go's ``int64(float64)``, toward
    zero, and out of range (2**63 itself, which 9223372036854775807 rounds to) the smallest
    int64, as amd64 gives it. (Exact Python integers would keep 9223372036854775807.)"""
    try:
        as_go = float(number)
    except OverflowError:  # beyond any float64: Go's decoder gives +-Inf, then the same
        return -_INT64
    return int(as_go) if -_INT64 <= as_go < _INT64 else -_INT64
