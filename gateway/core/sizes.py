"""Sizes as admins write them: ``24GiB``, ``512MiB``, ``8GB`` or a count of bytes.

``G`` alone is 1024-based, as llama.cpp and Docker read it; ``GB`` is 1000-based.
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Annotated

from pydantic import BeforeValidator

__all__ = ["Size", "format_size", "parse_size"]

_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([kmgt]?)(i?)(b?)", re.IGNORECASE)


def parse_size(value: object) -> int:
    """Bytes from ``6GiB``, ``512MiB``, ``6GB`` (1000-based), ``6G`` (1024-based) or a
    whole number; ValueError otherwise."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    match = _SIZE.fullmatch(value.strip()) if isinstance(value, str) else None
    if match is None:
        raise ValueError(f"{value!r} is not a size such as 24GiB, 512MiB or 8GB")
    number, unit, binary, byte = match.groups()
    power = "kmgt".index(unit.lower()) + 1 if unit else 0
    base = 1000 if byte and not binary and unit else 1024
    return int(Fraction(number) * base**power)


def format_size(size: float) -> str:
    """``23.4 GiB``: bytes as an admin reads them."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(size) >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size:.0f} B"


Size = Annotated[int, BeforeValidator(parse_size)]
"""Bytes that also accept ``24GiB``-style strings in the YAML."""
