"""Old code against new, side by side: a benchmark script run in each tree's own processes,
taking turns, with the best of the rounds kept (what other processes take only ever adds).

For the in-process benchmarks (``bookkeeping.py``, ``intake.py``, ``relay_path.py``); only
the process comparing imports this, so an older tree without it can still be measured:

    git archive main | tar -x -C /tmp/old
    python -m benchmarks.<script> --tree /tmp/old --tree . [--rounds 5]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

__all__ = ["best_of_rounds", "print_header", "print_row"]


def best_of_rounds(
    script: str, trees: list[str], rounds: int, arguments: list[str]
) -> list[dict[str, float]]:
    """Each tree's figures (``script --json`` run with that tree's code), each figure the
    lowest of ``rounds`` rounds taken in turns."""
    runs: dict[str, list[dict[str, float]]] = {tree: [] for tree in trees}
    for _ in range(rounds):
        for tree in trees:
            env = {**os.environ, "PYTHONPATH": str(Path(tree).resolve())}
            command = [sys.executable, script, "--json", *arguments]
            output = subprocess.run(command, env=env, check=True, capture_output=True)
            runs[tree].append(json.loads(output.stdout))
    names = list(runs[trees[0]][0])
    return [{name: min(run[name] for run in runs[tree]) for name in names} for tree in trees]


def print_header(first: str, trees: list[str], width: int) -> None:
    names = "".join(f"{Path(tree).resolve().name:>16}" for tree in trees)
    print(f"{first:<{width}}{names}   ratio")


def print_row(label: str, values: list[float], width: int) -> None:
    """One figure for each tree, and the last tree's ratio to the first."""
    ratio = values[-1] / values[0] if values[0] > 0 else float("nan")
    print(f"{label:<{width}}" + "".join(f"{value:16.2f}" for value in values) + f"{ratio:8.2f}")
