"""Usage in a SQLite file beside the gateway (``FAIRGATE_USAGE_DB``): the standard library's
``sqlite3``, in a thread of its own so that no write ever holds the event loop.

WAL mode with ``synchronous=NORMAL``: a batch is one transaction, so a process killed
mid-write leaves the file as it was before that batch (https://sqlite.org/wal.html); only
a power cut can lose the last batches, never corrupt the file. Readers (``fairgate
usage``) do not block the writer. Rows are upserted, so a batch adds to what is there.

A batch's id is not needed here: nothing sends a write twice (no client retry), and a
StoreError means the batch left nothing, since a failed commit is rolled back
(https://bugs.python.org/issue27334), so the ledger's retry of it counts once.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from gateway.core import Windows
from gateway.usage.stores.base import Batch, RefusalRow, StoreError, Tally, Totals, UsageRow

__all__ = ["SqliteUsage", "usage_file_problem"]

T = TypeVar("T")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS usage (
    day TEXT NOT NULL, hour INTEGER NOT NULL, user TEXT NOT NULL, model TEXT NOT NULL,
    requests INTEGER NOT NULL, prompt_tokens INTEGER NOT NULL,
    completion_tokens INTEGER NOT NULL, slot_seconds REAL NOT NULL,
    PRIMARY KEY (day, hour, user, model)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS refusals (
    day TEXT NOT NULL, hour INTEGER NOT NULL, user TEXT NOT NULL, reason TEXT NOT NULL,
    count INTEGER NOT NULL,
    PRIMARY KEY (day, hour, user, reason)
) WITHOUT ROWID;
-- Requests per user in the last minutes, for requests_per_minute budgets across a restart.
CREATE TABLE IF NOT EXISTS minutes (
    minute TEXT NOT NULL, user TEXT NOT NULL, requests INTEGER NOT NULL,
    PRIMARY KEY (minute, user)
) WITHOUT ROWID;
PRAGMA user_version = 1;
"""
_ADD_USAGE = """
INSERT INTO usage VALUES (?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (day, hour, user, model) DO UPDATE SET
    requests = requests + excluded.requests,
    prompt_tokens = prompt_tokens + excluded.prompt_tokens,
    completion_tokens = completion_tokens + excluded.completion_tokens,
    slot_seconds = slot_seconds + excluded.slot_seconds
"""
_ADD_REFUSALS = """
INSERT INTO refusals VALUES (?, ?, ?, ?, ?)
ON CONFLICT (day, hour, user, reason) DO UPDATE SET count = count + excluded.count
"""
_ADD_MINUTES = """
INSERT INTO minutes VALUES (?, ?, ?)
ON CONFLICT (minute, user) DO UPDATE SET requests = requests + excluded.requests
"""


class SqliteUsage:
    """Usage rows in one SQLite file, written by one thread."""

    shared = False

    def __init__(self, path: Path, create: bool = True) -> None:
        self.path = path
        self._create = create  # False for readers: a missing file is an error, not made
        self._db: sqlite3.Connection | None = None
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fairgate-usage")

    async def open(self, windows: Windows) -> dict[str, Tally]:
        return await self._run(lambda: self._open(windows))

    async def add(self, batch: Batch, windows: Windows) -> dict[str, Tally]:
        return await self._run(lambda: self._add(batch, windows))

    async def rows(self, since: tuple[str, int]) -> tuple[list[UsageRow], list[RefusalRow]]:
        return await self._run(lambda: self._rows(since))

    async def close(self) -> None:
        if self._db is not None:
            await self._run(self._db.close)
            self._db = None
        self._thread.shutdown(wait=False)

    async def _run(self, work: Callable[[], T]) -> T:
        try:
            return await asyncio.get_running_loop().run_in_executor(self._thread, work)
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path}: {exc}") from exc

    def _open(self, windows: Windows) -> dict[str, Tally]:
        if not self._create and not self.path.exists():
            raise StoreError(f"{self.path}: no such file (is FAIRGATE_USAGE_DB set as for serve?)")
        db = sqlite3.connect(self.path, timeout=5.0)
        try:
            if self._create:
                db.execute("PRAGMA journal_mode = WAL")
                db.execute("PRAGMA synchronous = NORMAL")
                db.executescript(_SCHEMA)
            totals = _totals(db, windows)
        except BaseException:
            db.close()
            raise
        self._db = db
        return totals

    def _add(self, batch: Batch, windows: Windows) -> dict[str, Tally]:
        db = self._connection()
        served = [(*key, c.requests, c.prompt_tokens, c.completion_tokens, c.slot_seconds)
                  for key, c in batch.served.items()]  # fmt: skip
        # One transaction: all of the batch or none of it, and the totals read in it. Read
        # after the commit, a failure there put back a batch already written (twice counted).
        with db:
            db.executemany(_ADD_USAGE, served)
            db.executemany(_ADD_REFUSALS, [(*key, n) for key, n in batch.refused.items()])
            db.executemany(_ADD_MINUTES, [(*key, n) for key, n in batch.minutes.items()])
            # Only the current minute is ever read back.
            db.execute("DELETE FROM minutes WHERE minute < ?", (windows.minute,))
            return _totals(db, windows)

    def _rows(self, since: tuple[str, int]) -> tuple[list[UsageRow], list[RefusalRow]]:
        db = self._connection()
        where = "WHERE day > ? OR (day = ? AND hour >= ?) ORDER BY day, hour, user"
        day, hour = since
        usage = db.execute(f"SELECT * FROM usage {where}, model", (day, day, hour))
        refusals = db.execute(f"SELECT * FROM refusals {where}, reason", (day, day, hour))
        return [UsageRow(*row) for row in usage], [RefusalRow(*row) for row in refusals]

    def _connection(self) -> sqlite3.Connection:
        if self._db is None:
            raise StoreError(f"{self.path}: not open")
        return self._db


def _totals(db: sqlite3.Connection, windows: Windows) -> dict[str, Tally]:
    totals = Totals(windows)

    day = (windows.day,)
    for user, requests, prompt, completion, slot in db.execute(
        "SELECT user, SUM(requests), SUM(prompt_tokens), SUM(completion_tokens), "
        "SUM(slot_seconds) FROM usage WHERE day = ? GROUP BY user",
        day,
    ):
        figures = totals.of(user)
        figures.requests, figures.prompt_tokens = requests, prompt
        figures.completion_tokens, figures.slot_seconds = completion, slot
    for user, count in db.execute(
        "SELECT user, SUM(count) FROM refusals WHERE day = ? GROUP BY user", day
    ):
        totals.of(user).refused = count
    for user, requests in db.execute(
        "SELECT user, SUM(requests) FROM usage WHERE day = ? AND hour = ? GROUP BY user",
        (windows.day, windows.hour),
    ):
        totals.of(user).hour_requests = requests
    for user, requests in db.execute(
        "SELECT user, requests FROM minutes WHERE minute = ?", (windows.minute,)
    ):
        totals.of(user).minute_requests = requests
    return totals


def usage_file_problem(path: Path) -> str | None:
    """Why ``serve`` could not keep usage in the SQLite file ``path``, or None: asked by
    ``check-config``, which writes nothing (the file is made by the first ``serve``)."""
    if str(path) == ":memory:":
        return None
    if not path.exists():
        parent = path.parent
        if not parent.is_dir():
            return f"{path}: its directory {parent} does not exist"
        if not os.access(parent, os.W_OK | os.X_OK):
            return f"{path}: its directory {parent} is not writable: the file cannot be made"
        return None
    if not path.is_file():
        return f"{path}: not a file"
    if not os.access(path, os.R_OK | os.W_OK):
        return f"{path}: not readable and writable by this user"
    try:
        db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        try:
            db.execute("PRAGMA schema_version").fetchone()
        finally:
            db.close()
    except sqlite3.Error as exc:
        return f"{path}: {exc}"
    return None
