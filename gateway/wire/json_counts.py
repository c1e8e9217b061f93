"""How many values a JSON body holds, counted before Python's parser makes one of them.

Python's ``json`` parser holds the GIL while it makes numbers, strings and arrays in C, and
each one lives on as a Python object: a 32 MiB body of ``[1,1,1,...]`` holds the event
loop while 16 million of them are made and grows the process by a pointer for each
(128 MB), ``[[],[],...]`` several times that (an empty list is 56 bytes for 3 bytes of
JSON, and the garbage collector walks every one). So a body may hold ``MAX_VALUES`` values and
``MAX_ARRAYS`` arrays, counted here at C speed first.

The count: every value is either the first in its array or object, which follows its
opening bracket, or follows a comma; so the values are one (the outermost) plus the commas
and opening brackets outside strings. It is exact, except that an empty array or object
counts twice (it has a bracket and no first value), which is about what it costs. Strings
count as one value each, whatever they hold: a prompt full of commas is one value.

Pure: ``check_counts`` is what ``ambiguity.load_checked`` calls before it parses.
"""

from __future__ import annotations

from collections.abc import Iterator

__all__ = ["MAX_ARRAYS", "MAX_VALUES", "TooManyValues", "check_counts", "count_values"]

# Ollama's /api/generate `context` holds one token id for each token of the conversation so
# far, up to num_ctx: 128k for most models today, 1M for the longest. OpenAI's embeddings
# take at most 300k tokens a request as token ids. Open WebUI's 36 tools are about 500
# objects, a few thousand values. The C parser makes a million in tens of milliseconds,
# and they take at most about 64 MB (an empty list and its slot).
MAX_VALUES = 1_000_000
# Arrays are what the garbage collector walks, which costs more than parsing them:
# messages, content parts, a schema's lists, the [][]int of a batch of token ids; as many
# as the objects ``json_decode.MAX_OBJECTS`` allows.
MAX_ARRAYS = 100_000

# Shorter than this, a body holds no more than the bounds: each value or bracket counted
# takes a byte at least, each array two (its brackets: ``[[[[]]]]``, nested as deep as the
# parser follows, is two bytes an array). So chat messages are never counted.
_COUNTED_FROM = min(MAX_VALUES, 2 * MAX_ARRAYS)
# The C passes over a piece this long take well under a millisecond each; a thread that
# counts gives the GIL back between pieces.
_PIECE = 256 * 1024
_BACKSLASH = ord("\\")
_COUNTED = b'",[{'
_NOT_COUNTED = bytes(sorted(set(range(256)) - set(_COUNTED)))


class TooManyValues(ValueError):
    """More JSON values, or arrays, than any request needs (see ``MAX_VALUES``)."""

    def __init__(self, limit: int, what: str) -> None:
        self.limit = limit
        super().__init__(f"the request body holds more than {limit:,} JSON {what}")


def check_counts(body: bytes | str) -> None:
    """Raise ``TooManyValues`` when ``body`` holds more than ``MAX_VALUES`` values or
    ``MAX_ARRAYS`` arrays, before any of them is made."""
    if len(body) < _COUNTED_FROM:
        return
    values, arrays = count_values(body.encode() if isinstance(body, str) else body)
    if values > MAX_VALUES:
        raise TooManyValues(MAX_VALUES, "values (numbers, strings, arrays and objects)")
    if arrays > MAX_ARRAYS:
        raise TooManyValues(MAX_ARRAYS, "arrays")


def count_values(body: bytes, piece: int = _PIECE) -> tuple[int, int]:
    """(values, arrays) in the JSON ``body``, counted outside strings as the module says;
    once either is past its bound, the rest of the body is not read.

    Valid JSON has backslashes only inside strings, each escaping the next character, so
    once the escaped backslashes and quotes are gone, every quote left opens or closes a
    string. Outside them is the structure, of which only commas and opening brackets are
    kept (``translate``), a piece of ``piece`` bytes at a time, carrying whether the next
    piece starts inside a string. In a body that is not JSON, the parser stops at the
    first place where this reading goes wrong, having made fewer values than counted."""
    values, arrays, inside = 1, 0, False
    for text in _pieces(body, piece):
        if b"\\" in text:  # most pieces of an image have none: skip the slower passes
            text = text.replace(b"\\\\", b"").replace(b'\\"', b"")
        skeleton = text.translate(None, _NOT_COUNTED)
        # Two quotes side by side enclose, or separate, nothing counted: dropping them keeps
        # the split short for bodies of many short strings.
        parts = skeleton.replace(b'""', b"").split(b'"')
        outside = b"".join(parts[1 if inside else 0 :: 2])
        values += len(outside)  # every byte of it a comma or an opening bracket
        arrays += outside.count(b"[")
        inside ^= len(parts) % 2 == 0  # an odd number of quotes
        if values > MAX_VALUES or arrays > MAX_ARRAYS:
            break
    return values, arrays


def _pieces(body: bytes, size: int) -> Iterator[bytes]:
    """``body`` in pieces of about ``size`` bytes, none ending in a backslash: so no piece
    ends between a backslash and the character it escapes."""
    start = 0
    while start < len(body):
        end = min(start + size, len(body))
        while end < len(body) and body[end - 1] == _BACKSLASH:
            end += 1
        yield body[start:end]
        start = end
