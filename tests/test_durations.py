"""Durations as the YAML and Ollama's keep_alive write them."""

from __future__ import annotations

import gc
import tracemalloc

import pytest

from gateway.core.units import parse_duration, parse_go_duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30s", 30.0),
        ("5m", 300.0),
        ("1h30m", 5400.0),
        ("250ms", 0.25),
        ("-1", -1.0),
        ("-5m", -300.0),
        (12, 12.0),
        (1.5, 1.5),
        ("0", 0.0),
        ("2562047h", 2562047 * 3600.0),  # Go's longest duration is 2562047h47m16.854775807s
        (9.2e9, 9.2e9),
    ],
)
def test_durations_read_as_seconds(text: object, seconds: float) -> None:
    """Go-style strings and plain numbers all become seconds, negatives kept."""
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    "text", ["soon", "5 minutes", "", "1x", True, None, "m5", "1e10s", "nan", float("nan")]
)
def test_malformed_durations_are_refused(text: object) -> None:
    """Anything else is a ValueError naming the value."""
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)


@pytest.mark.parametrize(
    "text",
    ["300000000h", "-300000000h", 1e10, "1e10", 10**30, -(10**30), "9223372036854775807ns"],
)
def test_durations_longer_than_gos_are_refused(text: object) -> None:
    """Past about 292 years Go refuses the string and overflows the number: refused here."""
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)


def _parse_a_long_keep_alive() -> None:
    # Valid for Go too (leading zeros): a client may send it as keep_alive on every request.
    assert parse_go_duration("0" * 1_000_000 + "5m") == 300.0


def test_a_long_duration_string_is_not_kept_once_it_is_parsed() -> None:
    """A client's megabyte-long keep_alive is not remembered after its request: the parse's
    cache holds the few short spellings, not whatever a client sends (256 of 32 MiB each)."""
    tracemalloc.start()
    try:
        _parse_a_long_keep_alive()
        gc.collect()
        kept, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert kept < 100_000, kept


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("9223372036854775807ns", (2**63 - 1) / 1e9),
        ("-9223372036854775808ns", -(2**63) / 1e9),
        ("2562047h47m16.854775807s", (2**63 - 1) / 1e9),
        ("-2562047h47m16.854775808s", -(2**63) / 1e9),
        ("9223372036854775.807us", (2**63 - 1) / 1e9),
        ("0.000000000000000000000000000000000000000000001s", 0.0),
    ],
)
def test_gos_longest_durations_are_durations(text: str, seconds: float) -> None:
    """Go's own edge cases (time's parseDurationTests): valid to Ollama, which would keep a
    model that long; so valid here, and clamped by a keep_alive max."""
    assert parse_go_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["9223372036854775808ns", "2562047h47m16.854775808s", ".s"])
def test_one_past_gos_longest_is_not(text: str) -> None:
    with pytest.raises(ValueError, match="invalid duration"):
        parse_go_duration(text)
