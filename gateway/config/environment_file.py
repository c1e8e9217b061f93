"""systemd's ``EnvironmentFile=`` syntax, read as systemd reads it.

``fairgate check-config --env-file`` must see the values the service will get, and systemd's
rules are neither the shell's nor python-dotenv's. They are read from systemd's own parser,
``parse_env_file_internal()`` and ``load_env_file()`` in src/basic/env-file.c, the clean-up
``exec_context_load_environment()`` applies (``strv_env_clean_with_callback()`` and
``env_assignment_is_valid()`` in src/basic/env-util.c), and the cases of
src/test/test-env-file.c (https://github.com/systemd/systemd, v254 and later). In short:

- a comment is a line whose first non-blank character is ``#`` or ``;``; ``A=b # c`` is
  ``b # c``, and ``A="b" # c`` is ``b#c`` (quoted and unquoted parts join);
- nothing is expanded: ``$X`` and ``${X}`` stay as written (EnvironmentFile= is read with
  ``load_env_file()``, not the expanding ``merge_env_file()``); there is no ``export``;
- a quote opens only where a value starts (or right after another quote closes): in ``'...'``
  everything is literal, newlines too; in ``"..."`` a backslash escapes only ``"`` ``\\``
  `````` ``$`` and a newline (which it removes); before any other character it stays;
- unquoted, a backslash takes the next character as it is, and removes a newline (the line
  continues); blanks around an unquoted value are dropped, escaped ones kept;
- a line without ``=`` is ignored, and so is a name that is not ``[A-Za-z_][A-Za-z0-9_]*``
  (systemd logs "Ignoring invalid environment assignment"); the last assignment of a name wins;
- a NUL byte anywhere, or invalid UTF-8 in a name or value, makes systemd refuse the whole file
  (with ``EnvironmentFile=-``, silently: the service starts without any of its variables).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum, auto
from pathlib import Path

__all__ = [
    "EnvironmentFile",
    "EnvironmentFileError",
    "parse_environment_file",
    "read_environment_file",
]

MAX_BYTES = 1024 * 1024
"""Largest file read: far past what execve() takes (128 KiB for any one variable)."""

_BLANK = " \t\n\r"
_NEWLINE = "\n\r"
_COMMENT = "#;"
_ESCAPED_IN_DOUBLE_QUOTES = '"\\`$'  # systemd's SHELL_NEED_ESCAPE
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class EnvironmentFileError(Exception):
    """systemd would read none of the file: the service would start without its variables
    (``EnvironmentFile=-``) or not at all."""


@dataclass(frozen=True)
class EnvironmentFile:
    """The variables systemd passes, where each was set, and the lines it would ignore."""

    variables: dict[str, str]
    lines: dict[str, int]
    """The line each variable's name is on (its last assignment)."""
    warnings: list[tuple[int, str]]
    """(line, sentence) for each line systemd ignores or reads in a surprising way."""


class _State(Enum):
    PRE_KEY = auto()
    KEY = auto()
    PRE_VALUE = auto()
    VALUE = auto()
    VALUE_ESCAPE = auto()
    SINGLE_QUOTE = auto()
    DOUBLE_QUOTE = auto()
    DOUBLE_QUOTE_ESCAPE = auto()
    COMMENT = auto()
    COMMENT_ESCAPE = auto()


@dataclass
class _Scanner:
    """systemd's state machine, one character at a time; each state's handler returns the
    next state. Assignments are kept in order, names unchecked, as systemd pushes them."""

    assignments: list[tuple[int, str, str]] = field(default_factory=list)
    warnings: list[tuple[int, str]] = field(default_factory=list)
    line: int = 1
    _key: list[str] = field(default_factory=list)
    _key_line: int = 1
    _key_blank: int | None = None  # where the key's trailing blanks start
    _value: list[str] = field(default_factory=list)
    _value_blank: int | None = None  # where the unquoted value's trailing blanks start
    _quote_line: int = 1
    _continued_comment: int = 0  # a line that systemd before v254 took as comment too

    def scan(self, text: str) -> None:
        handlers: dict[_State, Callable[[str], _State]] = {
            _State.PRE_KEY: self._pre_key,
            _State.KEY: self._in_key,
            _State.PRE_VALUE: self._pre_value,
            _State.VALUE: self._in_value,
            _State.VALUE_ESCAPE: self._value_escape,
            _State.SINGLE_QUOTE: self._single_quote,
            _State.DOUBLE_QUOTE: self._double_quote,
            _State.DOUBLE_QUOTE_ESCAPE: self._double_quote_escape,
            _State.COMMENT: self._comment,
            _State.COMMENT_ESCAPE: self._comment_escape,
        }
        state = _State.PRE_KEY
        for char in text:
            state = handlers[state](char)
            self.line += char == "\n"
        self._end(state)

    def _end(self, state: _State) -> None:
        """At the end of the file a value ends as at a newline; a name without ``=`` is
        dropped; an open quote takes the rest of the file."""
        if state == _State.KEY:
            self._no_equals()
        elif state in (_State.SINGLE_QUOTE, _State.DOUBLE_QUOTE, _State.DOUBLE_QUOTE_ESCAPE):
            sentence = "the quote opened here is never closed: the value is the rest of the file"
            self.warnings.append((self._quote_line, sentence))
            self._push(trim=False, closed=False)
        elif state in (_State.PRE_VALUE, _State.VALUE, _State.VALUE_ESCAPE):
            self._push(trim=state == _State.VALUE)

    def _pre_key(self, char: str) -> _State:
        if char in _COMMENT:
            return _State.COMMENT
        if char in _BLANK:
            return _State.PRE_KEY
        if self.line == self._continued_comment:
            sentence = "systemd before v254 ignores this line: the comment above ends in '\\'"
            self.warnings.append((self.line, sentence))
        self._key, self._key_line, self._key_blank = [char], self.line, None
        return _State.KEY

    def _in_key(self, char: str) -> _State:
        if char in _NEWLINE:
            self._no_equals()
            return _State.PRE_KEY
        if char == "=":
            self._value, self._value_blank = [], None
            return _State.PRE_VALUE
        self._key_blank = _blank_start(char, self._key_blank, len(self._key))
        self._key.append(char)
        return _State.KEY

    def _pre_value(self, char: str) -> _State:
        if char in _NEWLINE:
            self._push(trim=False)
            return _State.PRE_KEY
        if char in "'\"":
            self._quote_line = self.line  # for a quote never closed
            return _State.SINGLE_QUOTE if char == "'" else _State.DOUBLE_QUOTE
        if char == "\\":
            return _State.VALUE_ESCAPE
        if char in _BLANK:
            return _State.PRE_VALUE
        self._value.append(char)
        return _State.VALUE

    def _in_value(self, char: str) -> _State:
        if char in _NEWLINE:
            self._push(trim=True)
            return _State.PRE_KEY
        if char == "\\":
            self._value_blank = None
            return _State.VALUE_ESCAPE
        self._value_blank = _blank_start(char, self._value_blank, len(self._value))
        self._value.append(char)
        return _State.VALUE

    def _value_escape(self, char: str) -> _State:
        if char not in _NEWLINE:  # an escaped newline continues the line
            self._value.append(char)
        return _State.VALUE

    def _single_quote(self, char: str) -> _State:
        if char == "'":
            return _State.PRE_VALUE
        self._value.append(char)
        return _State.SINGLE_QUOTE

    def _double_quote(self, char: str) -> _State:
        if char == '"':
            return _State.PRE_VALUE
        if char == "\\":
            return _State.DOUBLE_QUOTE_ESCAPE
        self._value.append(char)
        return _State.DOUBLE_QUOTE

    def _double_quote_escape(self, char: str) -> _State:
        if char in _ESCAPED_IN_DOUBLE_QUOTES:
            self._value.append(char)
        elif char != "\n":  # kept with its backslash, as the shell does
            self._value += ["\\", char]
        return _State.DOUBLE_QUOTE

    def _comment(self, char: str) -> _State:
        if char == "\\":
            return _State.COMMENT_ESCAPE
        return _State.PRE_KEY if char in _NEWLINE else _State.COMMENT

    def _comment_escape(self, char: str) -> _State:
        if char == "\n":
            self._continued_comment = self.line + 1
        return _State.PRE_KEY if char in _NEWLINE else _State.COMMENT

    def _no_equals(self) -> None:
        self.warnings.append((self._key_line, "no '=' on this line: systemd ignores it"))

    def _push(self, *, trim: bool, closed: bool = True) -> None:
        key = "".join(self._key[: self._key_blank])
        value = "".join(self._value[: self._value_blank if trim else None])
        if closed and "\n" in value:  # a quote left open by mistake closes on a later line
            sentence = f"a quoted value runs on to line {self.line}: it holds line breaks"
            self.warnings.append((self._key_line, sentence))
        self.assignments.append((self._key_line, key, value))


def _blank_start(char: str, start: int | None, length: int) -> int | None:
    """Where a run of trailing blanks starts, after ``char`` is added at ``length``."""
    if char not in _BLANK:
        return None
    return length if start is None else start


def parse_environment_file(data: bytes) -> EnvironmentFile:
    """The variables systemd's ``EnvironmentFile=`` passes for a file holding ``data``;
    EnvironmentFileError when systemd would read none of it."""
    if b"\0" in data:
        line = data[: data.index(b"\0")].count(b"\n") + 1
        raise EnvironmentFileError(f"line {line}: a NUL byte, so systemd reads none of the file")
    scanner = _Scanner()
    scanner.scan(data.decode("utf-8", errors="surrogateescape"))
    variables: dict[str, str] = {}
    lines: dict[str, int] = {}
    warnings = scanner.warnings
    for line, name, value in scanner.assignments:
        if not _systemd_utf8(name + value):
            raise EnvironmentFileError(
                f"line {line}: not UTF-8, so systemd reads none of the file: save it as UTF-8"
            )
        if not _NAME.fullmatch(name):
            warnings.append((line, _bad_name(name)))
            continue
        if name in lines:
            warnings.append((lines[name], f"{name} is set again on line {line}, which wins"))
        variables[name], lines[name] = value, line
    return EnvironmentFile(variables, lines, sorted(warnings))


def _systemd_utf8(text: str) -> bool:
    """Whether systemd's utf8_is_valid() accepts ``text`` (decoded with surrogateescape, so
    a bad byte is a lone surrogate): unichar_is_valid() also refuses U+FDD0..U+FDEF and
    every U+xxFFFE and U+xxFFFF, which Python's UTF-8 decoder lets through."""
    return not any(
        0xD800 <= code <= 0xDFFF or 0xFDD0 <= code <= 0xFDEF or code & 0xFFFE == 0xFFFE
        for code in map(ord, text)
    )


def _bad_name(name: str) -> str:
    sentence = f"{name!r} is not a variable name: systemd ignores this line"
    if name.startswith("export "):
        return sentence + " (write it without 'export')"
    if name.startswith("\ufeff"):
        return sentence + " (the file starts with a byte-order mark: save it without one)"
    return sentence


def read_environment_file(path: Path) -> EnvironmentFile:
    """``path`` read as systemd reads it; EnvironmentFileError if it cannot be."""
    try:
        with path.open("rb") as file:
            data = file.read(MAX_BYTES + 1)
    except OSError as exc:
        raise EnvironmentFileError(f"cannot read: {exc.strerror or exc}") from exc
    if len(data) > MAX_BYTES:
        raise EnvironmentFileError(f"larger than {MAX_BYTES} bytes: not an environment file")
    return parse_environment_file(data)
