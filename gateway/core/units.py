"""Units as admins and Ollama write them: durations (``30s``, ``5m``, ``1h30m``, ``250ms``,
or seconds) and sizes (``24GiB``, ``8GB``, or bytes).

Ollama's ``keep_alive`` uses Go's duration syntax and treats a negative value as "forever"
(https://github.com/ollama/ollama/blob/main/docs/faq.md), so negative values are kept as they are.

A Go ``time.Duration`` is an int64 of nanoseconds: at most about 292 years. ``ParseDuration``
refuses a longer string; ``Duration.UnmarshalJSON`` (ollama api/types.go) converts a longer
number with ``time.Duration(t * float64(time.Second))``, which overflows (on amd64 to the
most negative int64, read as "unload when idle"; on arm64 it saturates). So neither may
pass for "very long" here: strings are refused as Go refuses them, and ``fits_go_duration``
tells the callers that must decide about a number.
"""

from __future__ import annotations

import functools
import json
import re
from fractions import Fraction
from typing import Annotated

from pydantic import BeforeValidator

__all__ = [
    "Duration",
    "Size",
    "fits_go_duration",
    "format_size",
    "parse_duration",
    "parse_go_duration",
    "parse_size",
    "whole_seconds",
]

_LONGEST_GO_DURATION = 2**63 / 1e9  # seconds: time.Duration is an int64 of nanoseconds

# Nanoseconds in each unit, as Go's time package counts them.
_DURATION_UNITS = {"ns": 1, "us": 10**3, "µs": 10**3, "μs": 10**3, "ms": 10**6, "s": 10**9}
_DURATION_UNITS.update({"m": 60 * 10**9, "h": 3600 * 10**9})
_DURATION_PART = re.compile(r"(\d*)(\.\d*)?([^\d.]*)")
_INT64_EDGE = 1 << 63
_INT64_DIGITS = len(str(_INT64_EDGE))


# A client's keep_alive is read on each of its requests, and a household sends a handful of
# short spellings ("5m", "24h", "-1"): each parsed once. Only short ones are cached: a cache
# entry keeps its text, and a client's keep_alive may be a body's 32 MiB (Go takes any
# number of leading zeros), which 256 entries would keep for good.
_CACHED_LENGTH = 32


def parse_go_duration(text: str) -> float:
    """Seconds from Go's time.ParseDuration syntax; ValueError carries Go's own message."""
    if len(text) <= _CACHED_LENGTH:
        return _parse_cached(text)
    return _parse(text)


def _parse(text: str) -> float:
    """Go's ParseDuration, step for step in integer nanoseconds (its uint64), so that the
    same texts overflow: 9223372036854775807ns is a duration to Go (292 years), and a float
    sum would have called it too long, and Ollama then kept a model for that long."""
    negative = text.startswith("-")
    body = text[1:] if text[:1] in ("-", "+") else text
    if body == "0":
        return 0.0
    if not body:
        raise _invalid(text)
    total = 0
    while body:
        match = _DURATION_PART.match(body)
        assert match is not None  # every group may be empty, so this always matches
        whole, fraction, unit = match.group(1), (match.group(2) or "")[1:], match.group(3)
        if not whole and not fraction:
            raise _invalid(text)
        if not unit:
            raise ValueError(f"time: missing unit in duration {_quoted(text)}")
        scale = _DURATION_UNITS.get(unit)
        if scale is None:
            raise ValueError(f"time: unknown unit {_quoted(unit)} in duration {_quoted(text)}")
        digits = whole.lstrip("0")  # Go takes any number of leading zeros
        if len(digits) > _INT64_DIGITS:  # leadingInt: more than 2**63 overflows
            raise _invalid(text)
        value = int(digits or "0")
        if value > _INT64_EDGE // scale:  # Go: v > 1<<63/unit
            raise _invalid(text)
        value *= scale
        if fraction:
            digits, places = _leading_fraction(fraction)
            value += int(float(digits) * (float(scale) / places))  # Go's float64 step
            if value > _INT64_EDGE:
                raise _invalid(text)
        total += value
        if total > _INT64_EDGE:
            raise _invalid(text)
        body = body[match.end() :]
    if not negative and total > _INT64_EDGE - 1:
        raise _invalid(text)
    return (-total if negative else total) / 1e9


def _leading_fraction(digits: str) -> tuple[int, float]:
    """Go's leadingFraction: the digits it keeps (until one more would overflow an int64),
    and the power of ten they are over."""
    value, places = 0, 1.0
    # Past 40 digits nothing counts: either no more are kept, or what is kept is over at
    # least 10**40, less than a nanosecond of any unit. (A client's text may be megabytes.)
    for digit in digits[:40]:
        if value > (_INT64_EDGE - 1) // 10:
            break
        bigger = value * 10 + int(digit)
        if bigger > _INT64_EDGE:
            break
        value, places = bigger, places * 10
    return value, places


_parse_cached = functools.lru_cache(maxsize=256)(_parse)


def _invalid(text: str) -> ValueError:
    return ValueError(f"time: invalid duration {_quoted(text)}")


def _quoted(text: str) -> str:
    # Go quotes the text in its errors. Only for an error: a keep_alive read on each
    # request would otherwise build a JSON encoder for nothing.
    return json.dumps(text, ensure_ascii=False)


def fits_go_duration(seconds: float) -> bool:
    """Whether ``seconds`` (either sign; an int of any size) fits a Go ``time.Duration``."""
    return abs(seconds) < _LONGEST_GO_DURATION  # False for NaN too


def parse_duration(value: object) -> float:
    """Seconds from a number, a numeric string, or a Go duration string (``1h30m``)."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError("a duration such as 30s, 5m or 1h30m")
    try:
        number = float(value) if isinstance(value, str) else value
    except ValueError:
        try:
            number = parse_go_duration(str(value).strip())
        except ValueError:
            raise ValueError(f"{value!r} is not a duration such as 30s, 5m or 1h30m") from None
    # Go's longest itself, as seconds, would be a nanosecond count past int64 once written
    # back (a keep_alive the gateway sends): refused, as a number that long is.
    if not fits_go_duration(number):
        # Sent to Ollama as keep_alive it would overflow; no wait here is that long either.
        raise ValueError(f"{value!r} is not a duration of at most about 292 years")
    return float(number)


Duration = Annotated[float, BeforeValidator(parse_duration)]
"""A duration in seconds that also accepts ``30s``-style strings in the YAML."""


# Sizes as admins write them: ``24GiB``, ``512MiB``, ``8GB`` or a count of bytes.
#
# ``G`` alone is 1024-based, as llama.cpp and Docker read it; ``GB`` is 1000-based.

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


def whole_seconds(value: float) -> int | float:
    """Seconds as Ollama reads a number of them; whole numbers keep the JSON tidy."""
    return int(value) if float(value).is_integer() else value
