"""The admin's policy file's problems as sentences, each at the line of its field.

pydantic's errors name parts of its schema (union branches, validator reprs) that mean nothing
to the person editing the file; each is rewritten here as one sentence at the line of the
field, showing a value as the file spells it. Reading the YAML itself is ``config/yaml_reader.py``.
Nothing here knows the policy's fields: the model is an argument, so ``config/policy.py`` imports
this module and not the reverse.
"""

from __future__ import annotations

import difflib
import os
import re
import types
from collections.abc import Sequence
from ipaddress import IPv4Network, IPv6Network, ip_network
from pathlib import Path
from typing import Annotated, Any, Union, cast, get_args, get_origin

import yaml
from dotenv.parser import parse_stream
from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails, PydanticCustomError
from pydantic_settings import DotEnvSettingsSource

from gateway.config.settings import Settings
from gateway.config.yaml_reader import Loc, PolicyError, line_of, where, written_at

# Loc and PolicyError re-exported: the section modules word their problems with them.
__all__ = [
    "Loc",
    "PolicyError",
    "describe",
    "dotenv_problems",
    "environment",
    "problem_at",
    "yes_no_for_a_number",
]


def environment() -> dict[str, str]:
    """Variables as the process settings see them: the ``.env`` file, overridden by the
    environment. Read with the settings' own source, so both find the same file."""
    dotenv = DotEnvSettingsSource(Settings, case_sensitive=True).env_vars
    from_file = {name: value for name, value in dotenv.items() if value is not None}
    return from_file | dict(os.environ)


def dotenv_problems(path: Path = Path(".env")) -> list[str]:
    """A sentence for each line of ``path`` (the ``.env`` file) that python-dotenv cannot
    read, which every reader of the file then skips without saying where; none if there is
    no such file. Its own warnings name neither the file nor what is wrong, once a reader."""
    try:
        with path.open(encoding="utf-8") as text:
            bindings = list(parse_stream(text))
    except (OSError, UnicodeDecodeError):
        return []  # no file, or one no reader can read either: the settings say so
    return [
        f"{path}:{found.original.line}: not NAME=value, nor a comment: the line is ignored "
        f"({found.original.string.strip()[:60]!r})"
        for found in bindings
        if found.error
    ]


def problem_at(at: Loc, message: str, first: Loc | None = None) -> PydanticCustomError:
    """An error about a place below the validator that found it (one user's key, seen while
    checking all users). ``at`` and ``first`` (the earlier of two that clash) are relative to
    the validated value; ``describe`` reports the problem at their lines."""
    context = {"message": message, "at": at, "first": first}
    return PydanticCustomError("policy_problem", "{message}", context)


def yes_no_for_a_number(at: Loc, value: bool) -> PydanticCustomError:
    """A yes/no where a number is meant, at ``at`` below the validator that found it: YAML
    reads ``off``, ``no``, ``yes`` and ``on`` as booleans, and pydantic would take them for
    0 and 1 (``max_queued: off`` let nobody queue)."""
    return PydanticCustomError(
        "yes_no_number", "a number, not a yes/no", {"at": at, "value": value}
    )


def describe(exc: ValidationError, root: yaml.Node | None, source: str, model: type[Any]) -> str:
    """One line per problem: ``file:line: field: sentence``; union branches merged into one."""
    problems: dict[Loc, str] = {}
    for error in exc.errors(include_url=False):
        at, message = _problem(error, root, model)
        problems.setdefault(at, message)
    return "\n".join(f"{where(source, line_of(root, at), at)}{m}" for at, m in problems.items())


def _problem(error: ErrorDetails, root: yaml.Node | None, model: type[Any]) -> tuple[Loc, str]:
    context = error.get("ctx") or {}
    if error["type"] == "policy_problem":
        at = (*error["loc"], *context["at"])
        first = context["first"]
        line = f" (first at line {line_of(root, (*error['loc'], *first))})" if first else ""
        return at, f"{context['message']}{line}"
    if error["type"] == "yes_no_number":
        at = (*error["loc"], *context["at"])
        return at, f"{_shown(context['value'], written_at(root, at))} {_YES_NO}, not a number"
    at, union = _place_in_file(model, error["loc"])
    if union:
        return at, _none_of(union, error["input"])
    if error["type"] == "extra_forbidden":
        return at, _unknown_field(str(at[-1]), _fields_of(model, at[:-1]))
    if "keys" in at or (at[:1] == ("users",) and isinstance(error["input"], list | dict)):
        # Keys are secrets: the error goes to the log and to /status, so their value is not
        # repeated there, only what kind of value it is.
        error = cast(ErrorDetails, {**error, "input": _Withheld(error["input"])})
    return at, _sentence(error, written_at(root, at))


class _Withheld:
    """A value an error does not repeat: it holds keys, or may."""

    def __init__(self, value: object) -> None:
        shapes: dict[Any, str] = {**_KINDS, list: "a list", dict: "a mapping"}
        self._kind = shapes.get(type(value), "a value")

    def __repr__(self) -> str:
        return f"{self._kind} (not shown: it holds keys)"


_TYPE_ERRORS = {
    "int_parsing": "a whole number",
    "int_type": "a whole number",
    "int_from_float": "a whole number",
    "float_parsing": "a number",
    "float_type": "a number",
    "bool_parsing": "true or false",
    "bool_type": "true or false",
    "string_type": "text (put it in quotes)",
    "dict_type": "a mapping (name: value lines)",
    "model_type": "a mapping (name: value lines)",
}
_BOUNDS = {
    "greater_than_equal": "must be at least {ge}",
    "greater_than": "must be more than {gt}",
    "less_than_equal": "must be at most {le}",
    "less_than": "must be less than {lt}",
    "finite_number": "must be a finite number",
}


_YES_NO = "is a yes/no to YAML"  # off, no, yes, on: as true and false


def _sentence(error: ErrorDetails, written: str | None) -> str:
    """The sentence for one of pydantic's errors; ``written`` is the value as the file
    spells it, where the error is about one scalar."""
    kind, value, context = error["type"], error["input"], error.get("ctx") or {}
    if kind == "missing":
        return "required, but not given"
    if value is None and kind in {*_TYPE_ERRORS, "list_type"}:
        return "is empty: give it a value or remove the line"
    if isinstance(value, bool) and kind in _TYPE_ERRORS:
        return f"{_shown(value, written)} {_YES_NO}, not {_TYPE_ERRORS[kind]}"
    if kind in _TYPE_ERRORS:
        return f"{_shown(value)} is not {_TYPE_ERRORS[kind]}"
    if kind == "list_type":
        hint = f"; write [{value!r}]" if isinstance(value, str | int | float) else ""
        if isinstance(value, _Withheld):
            hint = "; write it in brackets, as a list"
        return f"{_shown(value)} is not a list{hint}"
    if kind == "literal_error":
        return _not_one_of(value, context["expected"])
    if kind in _BOUNDS:
        return f"{_BOUNDS[kind].format(**context)}, not {_shown(value)}"
    if kind == "too_short":
        least = context["min_length"]
        return "must not be empty" if least == 1 else f"needs at least {least} entries"
    message = error["msg"].removeprefix("Value error, ")
    # A message that quotes the text it refused needs no "got"; a number is always shown,
    # since "0" could be found in any message.
    quoted = isinstance(value, str) and repr(value) in message
    shown = isinstance(value, str | int | float | bool) and not quoted
    return f"{message} (got {_shown(value, written)})" if shown else message


def _shown(value: object, written: str | None = None) -> str:
    """``value`` as YAML spells it where that differs from Python: a yes/no as the file
    wrote it (``off``) when known, else ``true`` or ``false``."""
    if isinstance(value, bool):
        return written or str(value).lower()
    return repr(value)


def _not_one_of(value: object, expected: str) -> str:
    choices = re.findall(r"'([^']*)'", expected)
    close = difflib.get_close_matches(str(value), choices, n=1)
    guess = f"; did you mean {close[0]!r}?" if close else ""
    return f"{value!r} is not {expected}{guess}"


def _unknown_field(name: str, known: Sequence[str]) -> str:
    close = difflib.get_close_matches(name, known, n=1)
    if close:
        return f"unknown field; did you mean {close[0]!r}?"
    return f"unknown field; the fields here are {', '.join(known)}"


_KINDS: dict[Any, str] = {
    int: "a whole number",
    float: "a number",
    str: "text",
    bool: "true or false",
}


def _none_of(members: tuple[Any, ...], value: object) -> str:
    """Why ``value`` fits no member of a union, said once rather than once per member."""
    if set(members) <= {IPv4Network, IPv6Network}:
        return _not_a_network(value)
    kinds = dict.fromkeys(_KINDS.get(_bare(m), getattr(m, "__name__", str(m))) for m in members)
    return f"{_shown(value)} is not {' or '.join(kinds)}"


def _not_a_network(value: object) -> str:
    try:
        network = ip_network(str(value), strict=False)
    except ValueError:
        return f"{value!r} is not an IP address or CIDR range"
    # It parses when host bits may be set, so that is the one thing wrong with it.
    return f"{value!r} has host bits set; did you mean '{network}'?"


def _place_in_file(model: type[Any], loc: Loc) -> tuple[Loc, tuple[Any, ...] | None]:
    """The part of ``loc`` that names places in the file, and the union it ends at, if any:
    after a union, pydantic's location names the branch tried (``int``, a validator repr)."""
    annotation: Any = model
    for index, part in enumerate(loc):
        members = _union_members(annotation)
        if members:
            return loc[:index], members
        if part == "[key]":  # the mapping key just before it is the place, and is in loc
            return loc[:index], None
        annotation = _step(annotation, part)
    return loc, None


def _fields_of(model: type[Any], at: Loc) -> list[str]:
    annotation: Any = model
    for part in at:
        annotation = _step(annotation, part)
    annotation = _bare(annotation)
    is_model = isinstance(annotation, type) and issubclass(annotation, BaseModel)
    return list(annotation.model_fields) if is_model else []


def _step(annotation: Any, part: int | str) -> Any:
    """The type one step into a model, mapping or list; None where the schema is unknown."""
    annotation = _bare(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        field = annotation.model_fields.get(str(part))
        return field.annotation if field else None
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is dict:
        return args[1]
    if origin is list:
        return args[0]
    return None


def _bare(annotation: Any) -> Any:
    """``annotation`` without Annotated metadata or an Optional's None."""
    while True:
        if get_origin(annotation) is Annotated:
            annotation = get_args(annotation)[0]
        elif get_origin(annotation) in (Union, types.UnionType) and len(_non_none(annotation)) == 1:
            annotation = _non_none(annotation)[0]
        else:
            return annotation


def _union_members(annotation: Any) -> tuple[Any, ...] | None:
    annotation = _bare(annotation)
    if get_origin(annotation) in (Union, types.UnionType):
        return _non_none(annotation)
    return None


def _non_none(union: Any) -> tuple[Any, ...]:
    return tuple(member for member in get_args(union) if member is not type(None))
