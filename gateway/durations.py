"""Durations as admins and Ollama write them: ``30s``, ``5m``, ``1h30m``, ``250ms``, or seconds.

Ollama's ``keep_alive`` uses Go's duration syntax and treats a negative value as "forever"
(https://github.com/ollama/ollama/blob/main/docs/faq.md), so negative values are kept as they are.
"""

from __future__ import annotations

import json
import re
from typing import Annotated

from pydantic import BeforeValidator

__all__ = ["Duration", "parse_duration", "parse_go_duration"]

_DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0}
_DURATION_UNITS.update({"m": 60.0, "h": 3600.0})
_DURATION_PART = re.compile(r"(\d*)(\.\d*)?([^\d.]*)")


def parse_go_duration(text: str) -> float:
    """Seconds from Go's time.ParseDuration syntax; ValueError carries Go's own message."""
    quoted = json.dumps(text, ensure_ascii=False)
    sign = -1.0 if text.startswith("-") else 1.0
    body = text[1:] if text[:1] in ("-", "+") else text
    if body == "0":
        return 0.0
    if not body:
        raise ValueError(f"time: invalid duration {quoted}")
    total = 0.0
    while body:
        match = _DURATION_PART.match(body)
        assert match is not None  # every group may be empty, so this always matches
        whole, fraction, unit = match.group(1), match.group(2) or "", match.group(3)
        if not whole and len(fraction) < 2:
            raise ValueError(f"time: invalid duration {quoted}")
        if not unit:
            raise ValueError(f"time: missing unit in duration {quoted}")
        if unit not in _DURATION_UNITS:
            raise ValueError(
                f"time: unknown unit {json.dumps(unit, ensure_ascii=False)} in duration {quoted}"
            )
        total += float(whole + fraction if whole else "0" + fraction) * _DURATION_UNITS[unit]
        body = body[match.end() :]
    return sign * total


def parse_duration(value: object) -> float:
    """Seconds from a number, a numeric string, or a Go duration string (``1h30m``)."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError("a duration such as 30s, 5m or 1h30m")
    if isinstance(value, int | float):
        return float(value)
    try:
        return float(value)
    except ValueError:
        pass
    try:
        return parse_go_duration(value.strip())
    except ValueError:
        raise ValueError(f"{value!r} is not a duration such as 30s, 5m or 1h30m") from None


Duration = Annotated[float, BeforeValidator(parse_duration)]
"""A duration in seconds that also accepts ``30s``-style strings in the YAML."""
