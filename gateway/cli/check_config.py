"""``fairgate check-config FILE [--env-file ENVFILE]``: would the service start with these?

It checks what the service would read at start: the policy file, and the ``FAIRGATE_*``
settings, both from one set of variables. Without ``--env-file`` that is the environment
over ``./.env``, as for ``fairgate serve`` run here. With it, it is what systemd gives the
unit: the file read with systemd's own syntax (``config/environment_file.py``), its values over the
environment's. Under systemd, EnvironmentFile= overrides Environment= (systemd.exec(5):
"Settings from these files override settings made with Environment="), and the unit runs
in ``/``, so no ``./.env`` is read; here the environment stands in for the unit's
Environment= lines.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from pathlib import Path

import yaml
from pydantic import ValidationError

from gateway.cli.first_run import weak_keys
from gateway.cli.status import duration_text
from gateway.config import (
    EnvironmentFileError,
    KeyVariables,
    Policy,
    PolicyError,
    dotenv_problems,
    environment,
    load_policy,
    read_environment_file,
    settings_errors,
    settings_from,
    unknown_variables,
    variable,
)
from gateway.usage import usage_file_problem

__all__ = ["add_check_arguments"]


def add_check_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", type=Path, help="the YAML file to check")
    parser.add_argument(
        "--env-file",
        type=Path,
        metavar="FILE",
        help="systemd's EnvironmentFile=, read as systemd reads it: its variables (FAIRGATE_* "
        "settings, env:NAME keys) win over the environment's, as over the unit's Environment=",
    )
    parser.set_defaults(run=_check_config)


def _check_config(args: argparse.Namespace) -> int:
    try:
        variables, places = _service_variables(args.env_file)
    except EnvironmentFileError as exc:
        print(f"{args.env_file}: {exc}", file=sys.stderr)
        return 1
    for sentence in unknown_variables(variables.values):
        print(f"warning: {sentence}", file=sys.stderr)
    if other := _other_policy(args.file, variables.values, under_systemd=bool(args.env_file)):
        print(f"warning: {other}", file=sys.stderr)
    problems = _settings_problems(variables.values, places)
    try:
        policy = load_policy(args.file, variables)
    except PolicyError as exc:
        problems.append(str(exc))
    if problems:
        print("\n".join(problems), file=sys.stderr)
        return 1
    for sentence in _unlikely_waits(policy, yaml.safe_load(args.file.read_text(encoding="utf-8"))):
        print(f"warning: {sentence}", file=sys.stderr)
    weak = list(weak_keys(policy))
    for key in weak:  # served all the same, as serve does, with a warning
        print(f"warning: users.{key.user}: {key.why}", file=sys.stderr)
    known = sum(1 for key in weak if key.example)
    counts = [f"{known} key(s) anyone may know"] if known else []
    counts += [f"{len(weak) - known} short key(s)"] if len(weak) > known else []
    but = f", but {' and '.join(counts)}" if counts else ""
    print(f"{args.file}: ok ({len(policy.backends)} backend(s){but})")
    return 0


def _service_variables(env_file: Path | None) -> tuple[KeyVariables, dict[str, str]]:
    """The variables the service would get, and the env file's ``path:line`` of each set
    there; the lines systemd would ignore are warned about on the way."""
    if env_file is None:
        for sentence in dotenv_problems():
            print(f"warning: {sentence}", file=sys.stderr)
        return KeyVariables(environment()), {}
    read = read_environment_file(env_file)
    for line, sentence in read.warnings:
        print(f"warning: {env_file}:{line}: {sentence}", file=sys.stderr)
    places = {name: f"{env_file}:{line}" for name, line in read.lines.items()}
    where = f"{env_file} nor in the environment"
    return KeyVariables(dict(os.environ) | read.variables, where), places


def _other_policy(file: Path, variables: Mapping[str, str], *, under_systemd: bool) -> str | None:
    """A sentence when FAIRGATE_CONFIG sends the service to another policy file than the
    one checked (relative to ``/`` under systemd, where the unit runs)."""
    named = variable(variables, "FAIRGATE_CONFIG")
    base = Path("/") if under_systemd else Path.cwd()
    if named is None or (base / named).resolve() == file.resolve():
        return None
    return f"the service would read FAIRGATE_CONFIG={named}, not {file}"


def _settings_problems(variables: Mapping[str, str], places: Mapping[str, str]) -> list[str]:
    """A line for each setting the service would refuse to start with, at its place in the
    env file when it was set there (``places``: by variable name)."""
    try:
        settings = settings_from(variables)
    except ValidationError as exc:
        prefix = "fairgate_"
        by_field = {
            name.lower().removeprefix(prefix): place
            for name, place in places.items()
            if name.lower().startswith(prefix)
        }
        return settings_errors(exc, places=by_field)
    # Usage in Redis with replicas; else the SQLite file, which serve would refuse to start
    # without (the file itself is made by the first serve: nothing is written here).
    problem = None if settings.redis_url else usage_file_problem(settings.usage_db)
    if problem is None:
        return []
    place = variable(places, "FAIRGATE_USAGE_DB")
    return [f"{place + ': ' if place else ''}FAIRGATE_USAGE_DB: {problem}"]


# Waits past which a value is likelier a number of milliseconds written without its unit
# (``max_wait: 30000``, 8 h 20 min) than a household's intent: said, not refused.
_LONGEST = {
    "queue.max_wait": 3600.0,
    "lanes.interactive.max_wait": 3600.0,
    "lanes.background.max_wait": 3600.0,
    "timeouts.connect": 300.0,
    "timeouts.first_byte": 3600.0,
    "timeouts.idle": 3600.0,
    "monitoring.interval": 600.0,
}


def _unlikely_waits(policy: Policy, written: object) -> list[str]:
    """A sentence for each wait so long it was likely meant in milliseconds: written as a
    bare number (in ``written``, the file as YAML reads it), not with its unit (``2h``)."""
    said = []
    for name, longest in _LONGEST.items():
        seconds, as_written = policy, written
        for part in name.split("."):
            seconds = getattr(seconds, part)
            as_written = as_written.get(part) if isinstance(as_written, dict) else None
        bare = isinstance(as_written, int | float) and not isinstance(as_written, bool)
        if bare and isinstance(seconds, int | float) and seconds > longest:
            said.append(
                f"{name} is {duration_text(seconds)}: a number without a unit is seconds; "
                f"if {seconds:g} was meant in milliseconds, write {seconds / 1000:g}s"
            )
    return said
