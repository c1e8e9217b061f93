"""Durations as admins and Ollama write them: ``30s``, ``5m``, ``1h30m``, ``250ms``, or seconds.

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
from typing import Annotated

from pydantic import BeforeValidator

__all__ = ["Duration", "fits_go_duration", "parse_duration", "parse_go_duration"]

_LONGEST_GO_DURATION = 2**63 / 1e9  # seconds: time.Duration is an int64 of nanoseconds

_DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0}
_DURATION_UNITS.update({"m": 60.0, "h": 3600.0})
_DURATION_PART = re.compile(r"(\d*)(\.\d*)?([^\d.]*)")


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
    sign = -1.0 if text.startswith("-") else 1.0
    body = text[1:] if text[:1] in ("-", "+") else text
    if body == "0":
        return 0.0
    if not body:
        raise _invalid(text)
    total = 0.0
    while body:
        match = _DURATION_PART.match(body)
        assert match is not None  # every group may be empty, so this always matches
        whole, fraction, unit = match.group(1), match.group(2) or "", match.group(3)
        if not whole and len(fraction) < 2:
            raise _invalid(text)
        if not unit:
            raise ValueError(f"time: missing unit in duration {_quoted(text)}")
        if unit not in _DURATION_UNITS:
            raise ValueError(f"time: unknown unit {_quoted(unit)} in duration {_quoted(text)}")
        total += float(whole + fraction if whole else "0" + fraction) * _DURATION_UNITS[unit]
        body = body[match.end() :]
    if not fits_go_duration(total):
        raise _invalid(text)  # Go's overflow error
    return sign * total


_parse_cached = functools.lru_cache(maxsize=256)(_parse)


def _invalid(text: str) -> ValueError:
    return ValueError(f"time: invalid duration {_quoted(text)}")


def _quoted(text: str) -> str:
    # Go quotes the text in its errors. Only for an error: a keep_alive read on each
    # request would otherwise build a JSON encoder for nothing (a few microseconds).
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
            return parse_go_duration(str(value).strip())
        except ValueError:
            raise ValueError(f"{value!r} is not a duration such as 30s, 5m or 1h30m") from None
    if not fits_go_duration(number):
        # Sent to Ollama as keep_alive it would overflow; no wait here is that long either.
        raise ValueError(f"{value!r} is not a duration of at most about 292 years")
    return float(number)


Duration = Annotated[float, BeforeValidator(parse_duration)]
"""A duration in seconds that also accepts ``30s``-style strings in the YAML."""
