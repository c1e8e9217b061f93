"""The in-process benchmarks still run against the gateway as it is: each measures a few
requests and reports a figure for every piece it names (one broke unseen for a session when
admission gained its quick yes). Each runs in a process of its own, as ``trees.py`` runs
them: they configure logging as the gateway does, for the whole process."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

RUNS = {
    "intake": "intake.measure(40, 2)",
    "bookkeeping": "bookkeeping.measure(40, 'WARNING')",
    "relay_path": "relay_path.measure(20)",
}


@pytest.mark.parametrize("name", RUNS)
def test_an_in_process_benchmark_measures_the_gateway_of_today(name: str) -> None:
    """Every figure it reports is a positive, finite number of microseconds."""
    program = f"import json\nfrom benchmarks import {name}\nprint(json.dumps({RUNS[name]}))"
    run = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr[-2000:]
    figures = json.loads(run.stdout.strip().splitlines()[-1])
    assert figures and all(math.isfinite(v) and v > 0 for v in figures.values()), figures


def test_the_open_webui_replay_runs_the_lanes_setting_the_page_documents() -> None:
    """The replay's "documented lanes setting" is the one docs/open-webui.md tells admins
    to copy, value for value: its figures are quoted there as that setting's."""
    from benchmarks.openwebui import DOCUMENTED_LANES

    page = (Path(__file__).parent.parent / "docs" / "open-webui.md").read_text()
    written = [line.split("#")[0].strip() for line in page.splitlines()]
    for line in DOCUMENTED_LANES.splitlines():
        assert line.strip() in written, line
