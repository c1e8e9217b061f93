"""Request bodies read the way Ollama's Go server reads them.

Ollama binds every request body with gin's ``ShouldBindJSON``, that is Go's
``encoding/json``, into structs such as ``api.ChatRequest`` or
``openai.ChatCompletionRequest``. For a struct, Go's decoder matches each object key to a
field exactly or, failing that, case-insensitively (``bytes.EqualFold``), and every key
that matches writes the field again, so the last one wins:
``{"model": "llama3.2:3b", "MODEL": "qwen2.5:7b"}`` runs qwen2.5:7b. Python's ``json``
keeps both keys apart, so a simulator reading bodies with it could not show what a proxy
checking only ``"model"`` lets through. ``go_decode`` returns the object Go would have
filled instead. See ``object()`` in
https://github.com/golang/go/blob/master/src/encoding/json/decode.go (``byExactName``,
then ``byFoldedName[foldName(key)]``) and
https://github.com/golang/go/blob/master/src/encoding/json/fold.go; Ollama's structs are
in https://github.com/ollama/ollama/blob/main/api/types.go and openai/openai.go.

Not every object in a request is a struct, and this follows Ollama's types there:

* ``options`` is a ``map[string]any``: its keys stay exact (``Options.FromMap`` then looks
  each one up by its exact name and ignores ``NUM_CTX``), and a repeated ``options`` adds
  to the map already decoded, as Go reuses a non-nil map.
* ``format`` and ``schema`` (``json.RawMessage``), ``content``, ``input``, ``stop``,
  ``items``, ``$defs`` and ``enum`` (``any``) and tool-call ``arguments`` (an ordered map)
  keep exact keys at every depth and are replaced whole when repeated.
* ``properties`` (a tool's ordered map of properties) keeps its property names exact; each
  property is a struct again.
* A repeated struct-valued field (``stream_options``, ``response_format``) is decoded into
  the struct already there, so fields the later object leaves out keep their values.

Not modelled: a ``null`` for a plain (non-pointer) field leaves Go's value unchanged but
replaces it here; a repeated array of structs without its own ``UnmarshalJSON`` is reused
element by element in Go but replaced here (``api.Message`` resets each element, so
native ``messages`` are replaced in Go too); Go accepts 10,000 levels of nesting, Python's
parser fewer. Key folding itself is ``gateway.wire.ambiguity.go_fold``, the same one the gateway
uses to refuse such bodies.
"""

from __future__ import annotations

from typing import Any

from gateway.wire import NestedTooDeeply, Pairs, go_fold, parse_object_pairs

__all__ = ["go_decode"]

_MAPS = frozenset({"options"})
"""Go ``map[string]any`` fields: exact keys; a repeat merges into the first map."""

_OPAQUE = frozenset(
    {"format", "schema", "content", "input", "stop", "items", "$defs", "enum", "arguments"}
)
"""``any``, ``json.RawMessage`` and fresh-map fields: exact keys all the way down."""

_MAPS_OF_STRUCTS = frozenset({"properties"})
"""Ordered maps whose values are structs: exact keys, folded fields in each value."""


def go_decode(text: str) -> Any:
    """Parse ``text`` and return what Ollama's Go structs would hold: in each struct-typed
    object, keys that fold alike (``MODEL``, ``Model``, ``model``) collapse into one entry
    under the lower-case name, holding the value of the last of them in the document.

    Raises ``json.JSONDecodeError`` for malformed JSON and ``NestedTooDeeply`` (a
    ``ValueError``) when the nesting is too deep to follow."""
    try:
        return _struct_value(parse_object_pairs(text))
    except RecursionError:
        raise NestedTooDeeply from None


def _struct_value(value: Any) -> Any:
    if isinstance(value, Pairs):
        return _struct(value)
    if isinstance(value, list):
        return [_struct_value(item) for item in value]
    return value


def _struct(pairs: Pairs) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    for key, raw in pairs:
        name = go_fold(key)
        _assign(fields, name, _field_value(name, raw))
    return fields


def _field_value(name: str, raw: Any) -> Any:
    if name in _MAPS or name in _OPAQUE:
        return _plain(raw)
    if name in _MAPS_OF_STRUCTS and isinstance(raw, Pairs):
        return {key: _struct_value(item) for key, item in raw}
    return _struct_value(raw)


def _assign(fields: dict[str, Any], name: str, value: Any) -> None:
    """Store a field as Go does when it may already hold a value: a map or a struct is
    decoded into the one already there, anything else replaced."""
    earlier = fields.get(name)
    if isinstance(earlier, dict) and isinstance(value, dict):
        if name in _MAPS:
            value = earlier | value
        elif name not in _OPAQUE and name not in _MAPS_OF_STRUCTS:
            merged = dict(earlier)
            for inner, item in value.items():
                _assign(merged, inner, item)
            value = merged
    fields[name] = value


def _plain(value: Any) -> Any:
    """A value held in Go as ``any`` (or raw): maps with exact keys, the last duplicate
    winning, as Python's ``json`` reads it too."""
    if isinstance(value, Pairs):
        return {key: _plain(item) for key, item in value}
    if isinstance(value, list):
        return [_plain(item) for item in value]
    return value
