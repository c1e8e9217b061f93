"""``fairgate usage``: who used the box, from the usage store itself.

It reads the store the gateway writes (the SQLite file of ``FAIRGATE_USAGE_DB``, or Redis
with ``FAIRGATE_REDIS_URL``), with the same settings and ``.env`` as ``fairgate serve``, so
it works while the gateway is stopped, and without a key: whoever can read the file may.
Rows are hours in the admin's time zone; ``--since 7d`` starts at the hour seven days ago.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from gateway.cli.status import duration_text, table
from gateway.config import Settings, settings_errors
from gateway.core import Calendar, zone_named
from gateway.usage import RedisUsage, RefusalRow, SqliteUsage, StoreError, UsageRow, UsageStore

__all__ = ["Line", "add_usage_arguments", "report", "run_usage"]

_SPAN = re.compile(r"(\d+)([dhm])")
_UNIT_SECONDS = {"d": 86400, "h": 3600, "m": 60}
NOBODY = "-"  # refusals of requests that named no known user


@dataclass(slots=True)
class Line:
    """One line of the report: a user, and a model or a day (or neither)."""

    user: str
    group: str | None
    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    slot_seconds: float = 0.0
    refused: int | None = None  # refusals have no model: None in the by-model report
    refusals: dict[str, int] = field(default_factory=dict)  # by reason

    def fields(self, by: str | None) -> dict[str, Any]:
        fields: dict[str, Any] = {"user": self.user}
        if by is not None:
            fields[by] = self.group
        fields.update(
            requests=self.requests,
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.completion_tokens,
            slot_seconds=round(self.slot_seconds, 3),
        )
        if by != "model":
            fields["refused"] = self.refused or 0
            fields["refusals"] = dict(sorted(self.refusals.items()))
        return fields


def add_usage_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--since",
        default="7d",
        help="how far back: 7d, 12h, 90m, or a day (2025-03-01); default: %(default)s",
    )
    parser.add_argument("--user", help="only this user")
    parser.add_argument("--by", choices=["model", "day"], help="a line per user and model, or day")
    shape = parser.add_mutually_exclusive_group()
    shape.add_argument("--json", action="store_true", help="JSON, for scripts")
    shape.add_argument("--csv", action="store_true", help="CSV, for spreadsheets")
    parser.add_argument("--db", type=Path, help="the SQLite file (default: FAIRGATE_USAGE_DB)")


def run_usage(args: argparse.Namespace) -> int:
    try:
        settings = Settings(**({"usage_db": args.db} if args.db else {}))
    except ValidationError as exc:
        for line in settings_errors(exc, {"usage_db": "--db"}):
            print(line, file=sys.stderr)
        return 2
    calendar = Calendar(zone_named(settings.time_zone))
    try:
        since = since_hour(args.since, calendar)
    except ValueError as exc:
        print(f"fairgate usage: --since {args.since!r}: {exc}", file=sys.stderr)
        return 2
    store: UsageStore = (
        RedisUsage(settings.redis_url)
        if settings.redis_url and not args.db
        else SqliteUsage(settings.usage_db, create=False)
    )
    try:
        rows, refusals = asyncio.run(_read(store, calendar, since))
    except StoreError as exc:
        print(f"fairgate usage: {exc}", file=sys.stderr)
        return 1
    lines = report(rows, refusals, args.by, args.user)
    _print(lines, args, since)
    return 0


def since_hour(text: str, calendar: Calendar) -> tuple[str, int]:
    """(day, hour) that ``--since`` starts at: a span back from now, or a day's first hour."""
    span = _SPAN.fullmatch(text.strip())
    if span is not None:
        back = int(span[1]) * _UNIT_SECONDS[span[2]]
        try:
            windows = calendar.at(calendar.clock() - back)
        except (OverflowError, ValueError, OSError):  # before any date there is
            raise ValueError(f"{text.strip()} goes back before any date") from None
        return windows.day, windows.hour
    try:
        return date.fromisoformat(text.strip()).isoformat(), 0
    except ValueError:
        message = "expected a span such as 7d, 12h or 90m, or a day such as 2025-03-01"
        raise ValueError(message) from None


async def _read(
    store: UsageStore, calendar: Calendar, since: tuple[str, int]
) -> tuple[list[UsageRow], list[RefusalRow]]:
    try:
        await store.open(calendar.now())
        return await store.rows(since)
    finally:
        await store.close()


def report(
    rows: Sequence[UsageRow], refusals: Sequence[RefusalRow], by: str | None, user: str | None
) -> list[Line]:
    """The rows summed per user, and per model or day when ``by`` says so; busiest first."""
    lines: dict[tuple[str, str | None], Line] = {}

    def line(name: str, group: str | None) -> Line:
        key = (name or NOBODY, group)
        found = lines.get(key)
        if found is None:
            found = lines[key] = Line(*key, refused=None if by == "model" else 0)
        return found

    for row in rows:
        if user is None or row.user == user:
            found = line(row.user, row.model if by == "model" else row.day if by == "day" else None)
            found.requests += row.requests
            found.prompt_tokens += row.prompt_tokens
            found.completion_tokens += row.completion_tokens
            found.slot_seconds += row.slot_seconds
    if by != "model":
        for refusal in refusals:
            if user is None or refusal.user == user:
                found = line(refusal.user, refusal.day if by == "day" else None)
                found.refused = (found.refused or 0) + refusal.count
                found.refusals[refusal.reason] = (
                    found.refusals.get(refusal.reason, 0) + refusal.count
                )
    if by == "day":
        return sorted(lines.values(), key=lambda x: (x.user, x.group or ""))
    return sorted(
        lines.values(), key=lambda x: (-x.slot_seconds, -x.requests, x.user, x.group or "")
    )


def _print(lines: list[Line], args: argparse.Namespace, since: tuple[str, int]) -> None:
    by = args.by
    if args.json:
        body = {"since": f"{since[0]}T{since[1]:02d}:00", "lines": [x.fields(by) for x in lines]}
        print(json.dumps(body, indent=2))
        return
    if args.csv:
        writer = csv.writer(sys.stdout, lineterminator="\n")
        names = [n for n in Line("", None).fields(by) if n != "refusals"]
        writer.writerow(names)
        for x in lines:
            writer.writerow(x.fields(by)[n] for n in names)
        return
    header = ["USER", *([by.upper()] if by else []), "REQUESTS", "PROMPT", "GENERATED"]
    header += ["SLOT TIME", *([] if by == "model" else ["REFUSED"])]
    rows = [
        [
            x.user,
            *([x.group or ""] if by else []),
            f"{x.requests:,}",
            f"{x.prompt_tokens:,}",
            f"{x.completion_tokens:,}",
            duration_text(x.slot_seconds),
            *([] if by == "model" else [_refused(x)]),
        ]
        for x in lines
    ]
    print(f"since {since[0]} {since[1]:02d}:00")
    print(table(header, rows) if rows else "no usage in that time")


def _refused(line: Line) -> str:
    if not line.refused:
        return "0"
    reasons = ", ".join(f"{reason} {n}" for reason, n in sorted(line.refusals.items()))
    return f"{line.refused} ({reasons})"
