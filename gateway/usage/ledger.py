"""Who used the box: every finished request counted per user, model and hour, kept across
restarts, and each user's figures in the current day, hour and minute for budgets.

Fed once per finished request by the access log (``Services.on_finished``) at a fixed cost,
a few dictionary additions; nothing on the request path waits for storage. Every
``FAIRGATE_USAGE_FLUSH_SECONDS`` a background loop hands what accumulated to the store
(SQLite in a thread of its own, or Redis) as one batch and takes back each user's totals,
which with Redis include every replica's. So a crash loses at most one interval, a failed
write keeps its batch and sends that same batch again (Redis may have applied it: the store
counts a batch's id once), and a budget sees the other replicas' use within one interval.

Tokens are the backend's own counts. When a reply carries none (an OpenAI stream without
``stream_options.include_usage``), the prompt is the gateway's estimate and the reply's
tokens are those counted as they streamed: a client cannot spend tokens unseen by leaving
the counts out.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter

import structlog

from gateway.admission import Refusal
from gateway.config import (
    PERSON_SEPARATOR,
    Budget,
    background_account,
    is_together_account,
    key_of,
    model_key,
)
from gateway.core import API_PREFIXES, REFUSALS, Background, Calendar, Lane, Windows, repeat
from gateway.edge import RequestRecord
from gateway.usage.budgets import BudgetState, budget_states, over_budget, requests_room
from gateway.usage.stores.base import Batch, Counts, StoreError, Tally, UsageStore

__all__ = ["Ledger"]

log = structlog.get_logger("fairgate.usage")

# Rows waiting for a write, at most, in each of the two batches an outage of the store
# holds in memory (the one its write failed with, and the one filling behind it). A model
# name comes from the client; past this, new rows go under OTHER_MODEL.
MAX_PENDING_ROWS = 10_000
OTHER_MODEL = "(other)"
# The tokens a reply that says no limit is taken to generate, until its user's replies tell.
UNBOUNDED_OUTPUT = 512
_MODEL_CHARS = 200


class Ledger:
    """Counts in memory since the last write, the store's totals as of that write, and the
    loop that writes one to the other."""

    def __init__(self, store: UsageStore, calendar: Calendar, flush_seconds: float) -> None:
        self.store = store
        self.calendar = calendar
        self._every = flush_seconds
        self._batch = Batch()
        self._since: dict[str, Tally] = {}  # by user: what ``_batch`` holds
        # The batch taken for a write, and by user what it carries, until the store has it:
        # after a StoreError, the very same batch goes again (the store counts its id once).
        self._unsent: tuple[Batch, dict[str, Tally]] | None = None
        self._base: dict[str, Tally] = {}  # by user: the store's totals after the last write
        self._lock = asyncio.Lock()
        self._writing: asyncio.Task[None] | None = None
        self._loops = Background("usage")
        # By user: tokens reserved by requests running or waiting (``reserve``), counted
        # against tokens_per_day until they end, so that a burst cannot pass the budget.
        self.reserved: Counter[str] = Counter()
        self.failing = False

    async def start(self) -> None:
        """Open the store and read today's totals; then write every interval."""
        try:
            self._base = await self.store.open(self.calendar.now())
        except StoreError as exc:
            if not self.store.shared:
                raise  # a file that cannot be opened is the admin's to fix before serving
            self._failed(exc)  # Redis away: count in memory until it is back
        self._loops.start("flush", repeat(self._every, self.flush))

    def observe(self, record: RequestRecord) -> None:
        """Count one finished request (a listener of the access log)."""
        if record.dispatched_at is not None:  # it held a slot, whatever became of it
            self._served(record, record.dispatched_at)
        elif record.reason in REFUSALS and record.path.startswith(API_PREFIXES):
            windows = self.calendar.now()
            user = self._refused_as(_account_of(record))
            self._batch.refused[(windows.day, windows.hour, user, str(record.reason))] += 1
            self._tally(user, windows).refused += 1

    def _refused_as(self, user: str) -> str:
        """Whom a refusal counts under. A person a front end names has figures of their own
        once served; refusals alone (a made-up model, a full queue) count under the front
        end, so that a header naming ever new people cannot grow the day's rows, which
        every view of the usage walks."""
        front_end, separator, _ = user.partition(PERSON_SEPARATOR)
        if separator and not any(user in part for part in self._parts()):
            return front_end
        return user

    def _served(self, record: RequestRecord, dispatched_at: float) -> None:
        windows = self.calendar.now()
        user = _account_of(record)
        prompt = record.prompt_tokens
        completion = record.completion_tokens
        if prompt is None:
            prompt = record.input_estimate or 0
        if completion is None:
            completion = record.streamed_tokens
        seconds = max(0.0, record.finished - dispatched_at)
        batch = self._batch
        # One row per model, however each client spelt it (as the metrics' labels do).
        model = model_key(record.model) if record.model else ""
        self._row(windows, user, model).count(prompt, completion, seconds)
        batch.minutes[(windows.minute, user)] += 1
        tally = self._tally(user, windows)
        tally.requests += 1
        tally.hour_requests += 1
        tally.minute_requests += 1
        tally.prompt_tokens += prompt
        tally.completion_tokens += completion
        tally.slot_seconds += seconds

    def _row(self, windows: Windows, user: str, model: str) -> Counts:
        """The counts of ``user``'s hour with ``model`` (OTHER_MODEL once rows are many)."""
        served = self._batch.served
        key = (windows.day, windows.hour, user, model[:_MODEL_CHARS])
        counts = served.get(key)
        if counts is None:
            if len(served) >= MAX_PENDING_ROWS:
                key = (windows.day, windows.hour, user, OTHER_MODEL)
            counts = served.get(key)
            if counts is None:
                counts = served[key] = Counts()
        return counts

    def _tally(self, user: str, windows: Windows) -> Tally:
        tally = self._since.get(user)
        if tally is None:
            tally = self._since[user] = Tally()
        tally.roll(windows)
        return tally

    def used(self, user: str) -> Tally:
        """``user``'s figures in the current windows: the store's, and what came since."""
        figures = Tally()
        figures.roll(self.calendar.now())
        # What a write carries counts until the store's totals include it: a store that is
        # slow to answer or away (a stalled Redis, a locked file) must not hide it from budgets.
        if is_together_account(user):  # a front end's people together: the sum of theirs
            front_end = key_of(user)
            for part in self._parts():
                for name, theirs in part.items():
                    if key_of(name) == front_end:
                        figures.absorb(theirs)
            return figures
        for part in self._parts():
            tally = part.get(user)
            if tally is not None:
                figures.absorb(tally)
        return figures

    def _parts(self) -> tuple[dict[str, Tally], ...]:
        """The figures by user: the store's totals, what the batch not yet written carries,
        and what came since it was taken."""
        return self._base, self._unsent[1] if self._unsent else {}, self._since

    def budgets(
        self, user: str, budget: Budget, in_flight: int, reserved: int | None = None
    ) -> list[BudgetState]:
        """Each of ``budget``'s limits against what ``user`` has used (and has running or
        waiting, ``in_flight``, and the tokens those reserved, here unless ``reserved``
        says: they will count when they end)."""
        if reserved is None:
            reserved = self.reserved.get(user, 0)
        return budget_states(budget, self.used(user), in_flight, self.calendar.now(), reserved)

    def tokens_room(self, user: str, budget: Budget) -> int | None:
        """The tokens ``user``'s requests in flight may reserve under ``budget`` now (None:
        no tokens limit)."""
        if budget.tokens_per_day is None:
            return None
        return max(0, int(budget.tokens_per_day) - self.used(user).tokens)

    def reserve(self, user: str, tokens: int) -> None:
        """A request of ``user`` that may use about ``tokens`` joins: counted until it ends
        (``unreserve``)."""
        self.reserved[user] += tokens

    def expected_output(self, user: str) -> int:
        """What a reply of ``user``'s may generate when the request does not bound it: what
        their replies took on average today, else ``UNBOUNDED_OUTPUT``."""
        used = self.used(user)
        if not used.requests:
            return UNBOUNDED_OUTPUT
        return max(1, used.completion_tokens // used.requests)

    def unreserve(self, user: str, tokens: int) -> None:
        """The request that reserved ``tokens`` for ``user`` ended (its use counts now)."""
        left = self.reserved[user] - tokens
        if left > 0:
            self.reserved[user] = left
        else:
            del self.reserved[user]

    def requests_room(self, user: str, budget: Budget) -> int | None:
        """How many of ``user``'s requests may be in flight now (None: no requests limit)."""
        return requests_room(budget, self.used(user))

    def refusal(
        self, user: str, budget: Budget, in_flight: int, reserved: int | None = None
    ) -> Refusal | None:
        """The 429 for a request of ``user`` now, or None while every budget has room;
        ``reserved``: the tokens reserved by requests in flight, if more than this
        replica's (other replicas' too)."""
        if not budget:
            return None
        states = self.budgets(user, budget, in_flight, reserved)
        return over_budget(user, states, self.calendar)

    def snapshot(self) -> dict[str, Tally]:
        """Every user with figures in the current windows."""
        return {user: self.used(user) for user in sorted(set().union(*self._parts()))}

    async def flush(self) -> None:
        """Write what accumulated; the write finishes even if the caller is cancelled."""
        self._writing = asyncio.ensure_future(self._write())
        await asyncio.shield(self._writing)

    async def _write(self) -> None:
        async with self._lock:  # one write at a time: the loop's, and the last one at close
            if self._unsent is not None:  # the last write failed: first the same batch again
                if not await self._send(self._unsent) or not self._batch:
                    return  # what came since waits behind it (and still counts)
            elif not self._batch and not self.store.shared:
                return  # nothing new, and nobody else writes: the totals stand
            # Taken whole, never merged with another: a batch Redis may have applied is
            # sent again only as itself, under its own id.
            self._unsent = (self._batch, self._since)
            self._batch, self._since = Batch(), {}
            await self._send(self._unsent)

    async def _send(self, unsent: tuple[Batch, dict[str, Tally]]) -> bool:
        """Write ``unsent``; True once the store has it (and its totals replace the old)."""
        try:
            self._base = await self.store.add(unsent[0], self.calendar.now())
        except StoreError as exc:
            self._failed(exc)
            return False
        self._unsent = None  # with the new totals, in one step: counted once, never twice
        if self.failing:
            self.failing = False
            log.info("usage_store_restored")
        return True

    async def close(self) -> None:
        """Stop the loop, then write what is left (a drained gateway loses nothing)."""
        await self._loops.close()
        if self._writing is not None:
            with contextlib.suppress(Exception):
                await self._writing
        await self.flush()
        if self.failing:
            log.error("usage_lost_at_close", rows=self._pending_rows())
        await self.store.close()

    def _failed(self, exc: StoreError) -> None:
        if not self.failing:
            log.error("usage_store_unavailable", error=str(exc), kept=self._pending_rows())
        self.failing = True

    def _pending_rows(self) -> int:
        unsent = len(self._unsent[0].served) if self._unsent else 0
        return unsent + len(self._batch.served)


def _account_of(record: RequestRecord) -> str:
    """Whom a request counts under: its user, or for background work the front end's
    background account (its own rows and budget, never the person's)."""
    user = record.user or ""
    return background_account(user) if record.lane is Lane.BACKGROUND else user
