"""The policy file's reference, written from the policy's own schema, so that it cannot drift.

Every field the YAML may hold, section by section (one per kind of mapping, linked from where
it is used), with its type, its default and the sentence its definition carries. ``docs/
policy.md`` is this module's output; a test checks that the two agree, and ``make docs``
writes it again: ``python -m gateway.config.reference > docs/policy.md``.
"""

from __future__ import annotations

import json
from typing import Any

from gateway.config.policy import Policy

__all__ = ["policy_reference"]

_HEAD = """\
# The policy file, field by field

Written from the policy's own definitions (`gateway/config/reference.py`): every field the
YAML may hold, its type, its default and what it does. A field not set takes its default.
Durations are seconds, or `250ms`, `30s`, `5m`, `1h30m`; sizes of memory are bytes, or
`512MiB`, `8GiB`. `fairgate check-config FILE` checks a file against all of this, naming
the line and the field of each mistake; the commented example is
[`deploy/fairgate.example.yaml`](../deploy/fairgate.example.yaml).
"""


def policy_reference() -> str:
    schema = Policy.model_json_schema()
    definitions: dict[str, Any] = schema["$defs"]
    sections = [_section("The top level", "top-level", schema, definitions)]
    for name, path in _reachable(schema, definitions).items():
        sections.append(_section(f"`{path}`", _anchor(name), definitions[name], definitions))
    return _HEAD + "".join(sections)


def _reachable(schema: dict[str, Any], definitions: dict[str, Any]) -> dict[str, str]:
    """The definitions a policy uses, each with the first path it is met at from the top
    (breadth first: the shortest)."""
    found: dict[str, str] = {}
    pending: list[tuple[dict[str, Any], str]] = [(schema, "")]
    while pending:
        node, path = pending.pop(0)
        for field, value in node.get("properties", {}).items():
            for name, suffix in _refs(value):
                if name not in found:
                    found[name] = f"{path}{field}{suffix}"
                    pending.append((definitions[name], found[name] + "."))
    return found


def _refs(node: dict[str, Any], suffix: str = "") -> list[tuple[str, str]]:
    """The definitions a field's type names, each with how its path goes on from the field
    (``.NAME`` into a map, ``[]`` into a list)."""
    if "$ref" in node:
        return [(node["$ref"].rsplit("/", 1)[-1], suffix)]
    found = []
    for kind in node.get("anyOf", ()):
        found += _refs(kind, suffix)
    if isinstance(node.get("items"), dict):
        found += _refs(node["items"], suffix + "[]")
    if isinstance(node.get("additionalProperties"), dict):
        found += _refs(node["additionalProperties"], suffix + ".NAME")
    return found


def _section(title: str, anchor: str, node: dict[str, Any], definitions: dict[str, Any]) -> str:
    lines = [f'\n<a id="{anchor}"></a>\n\n## {title}\n']
    if node.get("description"):
        lines.append(f"\n{_one_line(node['description'])}\n")
    if node.get("enum"):
        lines.append(f"\nOne of: {', '.join(f'`{v}`' for v in node['enum'])}.\n")
        return "".join(lines)
    properties: dict[str, Any] = node.get("properties", {})
    required = set(node.get("required", ()))
    lines.append("\n| field | type | default | what it is |\n|---|---|---|---|\n")
    for name, field in properties.items():
        default = "required" if name in required else _default(field)
        said = _one_line(field.get("description") or _described(field, definitions))
        lines.append(f"| `{name}` | {_type(field)} | {default} | {said} |\n")
    return "".join(lines)


def _described(field: dict[str, Any], definitions: dict[str, Any]) -> str:
    """A field without a sentence of its own: its type's."""
    named = _refs(field)
    return definitions[named[0][0]].get("description", "") if named else ""


def _type(node: dict[str, Any]) -> str:
    if "$ref" in node:
        name = node["$ref"].rsplit("/", 1)[-1]
        return f"[{name}](#{_anchor(name)})"
    if "anyOf" in node:
        kinds = [_type(kind) for kind in node["anyOf"] if kind.get("type") != "null"]
        unset = any(kind.get("type") == "null" for kind in node["anyOf"])
        return " or ".join(dict.fromkeys(kinds)) + (" (or unset)" if unset else "")
    if "enum" in node:
        return "one of " + ", ".join(f"`{value}`" for value in node["enum"])
    if "const" in node:
        return f"`{node['const']}`"
    kind = node.get("type", "any")
    if kind == "array":
        return f"list of {_type(node.get('items', {}))}"
    if kind == "object":
        values = node.get("additionalProperties")
        return f"map of name to {_type(values)}" if isinstance(values, dict) else "mapping"
    return str(kind) + _bounds(node)


def _bounds(node: dict[str, Any]) -> str:
    said = [
        f"{sign} {node[key]}"
        for key, sign in (("minimum", "≥"), ("exclusiveMinimum", ">"), ("maximum", "≤"))
        if key in node
    ]
    return f" ({', '.join(said)})" if said else ""


def _default(field: dict[str, Any]) -> str:
    if "default" not in field:
        return ""
    value = field["default"]
    if isinstance(value, dict) and value and "$ref" in field:
        return "as below"
    return f"`{json.dumps(value, ensure_ascii=False)}`"


def _anchor(name: str) -> str:
    return name.lower()


def _one_line(text: str) -> str:
    # A "|" would end the table's cell; a "<" would open an HTML tag (sha256:<hex>), hidden.
    return " ".join(text.split()).replace("|", "\\|").replace("<", "&lt;")


if __name__ == "__main__":
    print(policy_reference(), end="")
