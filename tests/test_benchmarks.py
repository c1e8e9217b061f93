"""The in-process benchmarks still run against the gateway as it is: each measures a few
requests and reports a figure for every piece it names (one broke unseen for a session when
admission gained its quick yes)."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest

from benchmarks import bookkeeping, intake, relay_path

Figures = dict[str, float]
RUNS: dict[str, Callable[[], Figures]] = {
    "intake": lambda: intake.measure(40, rounds=2),
    "bookkeeping": lambda: bookkeeping.measure(40, "WARNING"),
    "relay_path": lambda: relay_path.measure(20),
}


@pytest.mark.parametrize("name", RUNS)
def test_an_in_process_benchmark_measures_the_gateway_of_today(name: str) -> None:
    """Every figure it reports is a positive, finite number of microseconds."""
    figures = RUNS[name]()
    assert figures and all(math.isfinite(v) and v > 0 for v in figures.values()), figures
