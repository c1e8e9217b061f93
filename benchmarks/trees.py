"""The command line of the in-process benchmarks (``bookkeeping.py``, ``intake.py``,
``relay_path.py``): one tree's figures, or old code against new, side by side, each tree
measured in its own processes, taking turns, with the best of the rounds kept (what other
processes take only ever adds).

    git archive main | tar -x -C /tmp/old
    python -m benchmarks.<script> --tree /tmp/old --tree . [--rounds 5]

A tree's process runs this checkout's ``measure`` of the script (``runpy``) with the
tree's code on its path, in the tree's directory: a difference between trees is theirs,
and a tree exported from before this file was written can still be measured.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["print_header", "print_row", "run"]

Figures = dict[str, float]
# A tree's process: the script's measure(*arguments), as JSON on stdout.
_CHILD = (
    "import json, runpy, sys; "
    "measure = runpy.run_path(sys.argv[1])['measure']; "
    "print(json.dumps(measure(*json.loads(sys.argv[2]))))"
)


def run(
    script: str,
    doc: str,
    measure: Callable[..., Figures],
    report: Callable[[list[str], list[Figures]], None],
    requests: int,
    options: dict[str, dict[str, Any]] | None = None,
) -> None:
    """Parse the command line; print this tree's figures, or ``report`` the trees'.
    ``options``: the script's own, passed to ``measure`` after the request count."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--requests", type=int, default=requests)
    for name, spec in (options or {}).items():
        parser.add_argument(f"--{name}", **spec)
    parser.add_argument("--tree", action="append", help="a checkout to measure (repeatable)")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    arguments = [args.requests, *(getattr(args, name) for name in options or {})]
    if not args.tree:
        report(["."], [measure(*arguments)])  # this checkout alone, measured here
        return
    print(f"best of {args.rounds} rounds of {args.requests} requests")
    report(args.tree, _best_of_rounds(script, args.tree, args.rounds, arguments))


def _best_of_rounds(
    script: str, trees: list[str], rounds: int, arguments: list[Any]
) -> list[Figures]:
    """Each tree's figures, each the lowest of ``rounds`` rounds taken in turns."""
    runs: dict[str, list[Figures]] = {tree: [] for tree in trees}
    for _ in range(rounds):
        for tree in trees:
            where = Path(tree).resolve()
            env = {**os.environ, "PYTHONPATH": str(where)}
            command = [sys.executable, "-c", _CHILD, str(Path(script).resolve())]
            command.append(json.dumps(arguments))
            output = subprocess.run(command, env=env, cwd=where, check=True, capture_output=True)
            runs[tree].append(json.loads(output.stdout))
    names = list(runs[trees[0]][0])
    return [{name: min(run[name] for run in runs[tree]) for name in names} for tree in trees]


def print_header(first: str, trees: list[str]) -> None:
    names = "".join(f"{Path(tree).resolve().name:>16}" for tree in trees)
    print(f"{first:<28}{names}   ratio")


def print_row(label: str, values: list[float]) -> None:
    """One figure for each tree, and the last tree's ratio to the first."""
    ratio = values[-1] / values[0] if values[0] > 0 else float("nan")
    print(f"{label:<28}" + "".join(f"{value:16.2f}" for value in values) + f"{ratio:8.2f}")
