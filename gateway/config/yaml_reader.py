"""Reading the admin's policy file as YAML, without silent surprises, and finding a place in it.

PyYAML reads YAML 1.1, whose plain scalars hold surprises for a hand-edited file:

- the last of two equal mapping keys wins without a word, so a second ``users:`` block
  appended to the file would quietly replace the first;
- a number with a leading zero is octal (``max_queued: 010`` is 8, while ``09`` is the text
  "09", which a number field reads as 9), and digits joined by colons are base 60
  (``max_wait: 1:30`` is 90; in YAML 1.2 both are text).

Both are looked for on the composed node tree, before anything is built from it, and refused
at their line. ``off``, ``no``, ``yes`` and ``on`` are booleans to YAML 1.1 as well: where a
number is meant the models refuse them (``policy_base.Strict``), and the messages show them
as written (``written_at``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import yaml

__all__ = ["Loc", "PolicyError", "line_of", "read_yaml", "where", "written_at"]

Loc = tuple[int | str, ...]


class PolicyError(Exception):
    """The policy file cannot be used; the message names the file, line and field."""


def read_yaml(text: str, source: str) -> tuple[Any, yaml.Node | None, list[str]]:
    """The document in ``text``, its node tree, and its repeated keys, each a ``file:line:
    ...`` sentence: the caller reports them with the schema's own problems, so that one read
    of the file shows every mistake (the last of two values is read, as YAML's own loaders
    do). PolicyError for YAML that cannot be read, a key that is not text or a number YAML
    reads as other than it looks: the document is then not what its author wrote."""
    try:
        loader = yaml.SafeLoader(text)
    except yaml.reader.ReaderError as exc:
        raise _unreadable(exc, text, source) from exc
    try:
        root = loader.get_single_node()
        repeated = _repeated_keys(root)
        distorting = [*_keys_not_text(root), *_surprising_numbers(root)]
        found = sorted([*repeated, *distorting])
        said = [f"{where(source, line, at)}{what}" for line, at, what in found]
        if distorting:  # the document is not what its author wrote: nothing more to check
            raise PolicyError("\n".join(said))
        return (loader.construct_document(root) if root is not None else None), root, said
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        place = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source
        problem = exc.problem or exc.context or ""
        hint = _INDENTATION_HINT if any(s in problem for s in _NESTING_PROBLEMS) else ""
        raise PolicyError(f"{place}: invalid YAML: {problem}{hint}") from exc
    except yaml.reader.ReaderError as exc:
        raise _unreadable(exc, text, source) from exc
    finally:
        loader.dispose()


# What PyYAML says when a line is indented as no block around it is: its words are about
# the parser's tokens, not the admin's spaces.
_NESTING_PROBLEMS = ("expected <block end>", "mapping values are not allowed here")
_INDENTATION_HINT = (
    " (check this line's indentation against the lines above it: YAML nests a field under "
    "the one above it by its spaces, and each level must line up)"
)


def _unreadable(exc: yaml.reader.ReaderError, text: str, source: str) -> PolicyError:
    """A character YAML does not allow (a NUL, an escape pasted from a terminal), at its
    line: PyYAML's own error gives a position in the text and no mark."""
    line = text.count("\n", 0, exc.position) + 1
    what = chr(exc.character) if isinstance(exc.character, int) else repr(exc.character)
    return PolicyError(f"{source}:{line}: invalid YAML: the character {what!r} is not allowed")


def _repeated_keys(root: yaml.Node | None) -> list[tuple[int, Loc, str]]:
    found: list[tuple[int, Loc, str]] = []
    for mapping, at in _nodes(root, (), set()):
        if not isinstance(mapping, yaml.MappingNode):
            continue
        first: dict[tuple[str, str], int] = {}
        for key, _ in mapping.value:
            if not isinstance(key, yaml.ScalarNode):
                continue
            line = key.start_mark.line + 1
            # The tag too: 1 and "1" are different keys once built. Seen before is what
            # counts, not another line: {slots: 2, slots: 6} repeats a key on one line.
            earlier = first.get((key.tag, key.value))
            if earlier is None:
                first[(key.tag, key.value)] = line
            else:
                found.append((line, at, f"duplicate key {key.value!r} (first at line {earlier})"))
    return found


_INT, _FLOAT = "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"
_KINDS_OF_KEY = {
    "tag:yaml.org,2002:bool": "a yes/no",
    _INT: "a number",
    _FLOAT: "a number",
    "tag:yaml.org,2002:null": "empty (null)",
}


def _keys_not_text(root: yaml.Node | None) -> list[tuple[int, Loc, str]]:
    """Mapping keys YAML reads as other than text: every key in a policy is a name (a
    field, a user, a model), and a user called ``no`` would be ``false``, reported at no
    line the admin could find."""
    found = []
    for mapping, at in _nodes(root, (), set()):
        if not isinstance(mapping, yaml.MappingNode):
            continue
        for key, _ in mapping.value:
            kind = _KINDS_OF_KEY.get(key.tag) if isinstance(key, yaml.ScalarNode) else None
            if kind is not None and key.style is None:
                message = (
                    f"the key {key.value} is {kind} to YAML: write it in quotes, '{key.value}'"
                )
                found.append((key.start_mark.line + 1, at, message))
    return found


_OCTAL = re.compile(r"[-+]?0[0-7_]+")  # PyYAML's octal: a leading 0, then digits


def _surprising_numbers(root: yaml.Node | None) -> list[tuple[int, Loc, str]]:
    """Plain numbers YAML 1.1 reads otherwise than they look: octal (a leading zero) and
    base 60 (colons). Hexadecimal (0x10) and binary (0b11) are what they say."""
    found = []
    for node, at in _nodes(root, (), set()):
        if not isinstance(node, yaml.ScalarNode) or node.style is not None:
            continue  # quoted: text, as written
        if node.tag == _INT and _OCTAL.fullmatch(node.value):
            why = "octal, for its leading 0"
        elif node.tag in (_INT, _FLOAT) and ":" in node.value:
            why = "base 60, for its colons"
        else:
            continue
        number = yaml.safe_load(node.value)
        message = f"YAML reads {node.value} as {number} ({why}): write {number} if that is meant"
        found.append((node.start_mark.line + 1, at, message))
    return found


def _nodes(node: yaml.Node | None, at: Loc, seen: set[int]) -> Iterator[tuple[Any, Loc]]:
    """Every node under ``node`` with its place, mapping keys aside; an alias is visited
    once."""
    if node is None or id(node) in seen:
        return
    seen.add(id(node))
    yield node, at
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            yield from _nodes(value, (*at, str(key.value)), seen)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            yield from _nodes(item, (*at, index), seen)


def where(source: str, line: int, at: Loc) -> str:
    """``file:line: field: `` to start a problem's sentence."""
    field = _dotted(at)
    return f"{source}:{line}: {field}: " if field else f"{source}:{line}: "


def _dotted(loc: Loc) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else f".{part}" if text else str(part)
    return text


def line_of(node: yaml.Node | None, loc: Loc) -> int:
    """The 1-based line of the deepest YAML node that ``loc`` reaches."""
    line = node.start_mark.line + 1 if node is not None else 1
    for part in loc:
        child = _child(node, part)
        if child is None:
            break
        key_node, node = child
        line = key_node.start_mark.line + 1
    return line


def written_at(node: yaml.Node | None, loc: Loc) -> str | None:
    """The scalar at ``loc`` as the file spells it (``off``, where the value is false), or
    None where ``loc`` reaches no scalar (a merge key's, a default's)."""
    for part in loc:
        child = _child(node, part)
        if child is None:
            return None
        node = child[1]
    return node.value if isinstance(node, yaml.ScalarNode) else None


def _child(node: yaml.Node | None, part: int | str) -> tuple[yaml.Node, yaml.Node] | None:
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            if key.value == str(part):
                return key, value
    if isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
        item: Any = node.value[part]
        return item, item
    return None
