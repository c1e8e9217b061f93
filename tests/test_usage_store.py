"""One contract, two usage stores: SQLite (one gateway) and Redis (replicas sharing counters)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from gateway.core.calendar import Calendar, zone_named
from gateway.usage.stores.base import Batch, Counts, StoreError, UsageStore
from gateway.usage.stores.redis import APPLIED_SECONDS, DAYS, RedisUsage
from gateway.usage.stores.sqlite import SqliteUsage
from tests.redis_server import RedisServer, redis_server, redis_url  # noqa: F401 (fixtures)
from tests.tcp_relay import Relay

UTC = Calendar(zone_named("UTC"))
NOON = UTC.at(1741953600.0)  # 2025-03-14 12:00 UTC
ODD = 'a"b:c\tdé'  # a name with quotes, separators and more than ASCII


@pytest.fixture(params=["sqlite", "redis"])
async def store(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    redis_url: str,  # noqa: F811
) -> AsyncIterator[UsageStore]:
    chosen: UsageStore = (
        SqliteUsage(tmp_path / "usage.db") if request.param == "sqlite" else RedisUsage(redis_url)
    )
    await chosen.open(NOON)
    yield chosen
    await chosen.close()


def batch(
    day: str = "2025-03-14", hour: int = 12, user: str = "alice", model: str = "m", n: int = 1
) -> Batch:
    added = Batch()
    added.served[(day, hour, user, model)] = Counts(n, 10 * n, 20 * n, 1.5 * n)
    added.minutes[(f"{day}T{hour:02d}:00", user)] = n
    return added


class TestUsageStoreContract:
    async def test_batches_add_up_and_the_totals_come_back_with_each_write(
        self, store: UsageStore
    ) -> None:
        """Two writes for one user add; the totals after each include it."""
        first = await store.add(batch(n=2), NOON)
        assert first["alice"].requests == 2
        totals = await store.add(batch(n=3, model="other"), NOON)
        alice = totals["alice"]
        assert (alice.requests, alice.prompt_tokens, alice.completion_tokens) == (5, 50, 100)
        assert alice.slot_seconds == pytest.approx(7.5)
        assert (alice.hour_requests, alice.minute_requests) == (5, 5)
        assert (alice.day, alice.hour, alice.minute) == ("2025-03-14", "2025-03-14T12", NOON.minute)

    async def test_two_batches_alike_both_count(self, store: UsageStore) -> None:
        """A batch counts once by its id, not by what it holds: the same use twice is twice."""
        await store.add(batch(n=2), NOON)
        totals = await store.add(batch(n=2), NOON)
        assert (totals["alice"].requests, totals["alice"].minute_requests) == (4, 4)

    async def test_totals_count_only_the_windows_asked_for(self, store: UsageStore) -> None:
        """Use in an earlier hour counts for the day, not for this hour or minute."""
        await store.add(batch(hour=9, n=4), NOON)
        alice = (await store.add(batch(n=1), NOON))["alice"]
        assert (alice.requests, alice.hour_requests, alice.minute_requests) == (5, 1, 1)
        tomorrow = UTC.at(NOON.day_ends + 1)
        assert (await store.add(Batch(), tomorrow)).get("alice") is None

    async def test_refusals_count_per_user_and_reason_and_in_the_days_total(
        self, store: UsageStore
    ) -> None:
        """Refusals are rows of their own and the day's ``refused``."""
        refusals = Batch()
        refusals.refused[("2025-03-14", 12, "bob", "user_queue_full")] = 2
        refusals.refused[("2025-03-14", 12, "", "unauthorized")] = 1
        totals = await store.add(refusals, NOON)
        assert totals["bob"].refused == 2 and totals["bob"].requests == 0
        _, rows = await store.rows(("2025-03-14", 0))
        assert {(r.user, r.reason, r.count) for r in rows} == {
            ("bob", "user_queue_full", 2),
            ("", "unauthorized", 1),
        }

    async def test_rows_come_back_from_a_given_hour_with_any_names(self, store: UsageStore) -> None:
        """Rows since (day, hour), in order; names with quotes and colons survive."""
        for day, hour in (("2025-03-13", 23), ("2025-03-14", 8), ("2025-03-14", 12)):
            await store.add(batch(day, hour, user=ODD, model=ODD), NOON)
        rows, _ = await store.rows(("2025-03-14", 8))
        assert [(r.day, r.hour, r.user, r.model, r.requests) for r in rows] == [
            ("2025-03-14", 8, ODD, ODD, 1),
            ("2025-03-14", 12, ODD, ODD, 1),
        ]
        assert rows[0].slot_seconds == pytest.approx(1.5)


async def test_a_stopped_redis_is_a_store_error_and_a_restarted_one_serves_again(
    redis_server: RedisServer,  # noqa: F811
) -> None:
    """StoreError while Redis is away (the ledger keeps its batch); writes work once back."""
    store = RedisUsage(redis_server.url)
    await store.open(NOON)
    await redis_server.stop()
    with pytest.raises(StoreError):
        await store.add(batch(), NOON)
    await redis_server.start()
    assert (await store.add(batch(), NOON))["alice"].requests == 1
    await store.close()


async def test_a_batch_whose_reply_was_lost_is_counted_once_when_the_client_sends_it_again(
    redis_server: RedisServer,  # noqa: F811
) -> None:
    """Redis applies a batch but its reply never comes: the write fails (a timeout), and the
    same batch sent again, as the ledger sends it, counts nothing twice."""
    async with Relay(redis_server.port) as relay:
        store = RedisUsage(relay.url)
        await store.open(NOON)
        relay.hold_replies(1, marker=b"alice")
        sent = batch(n=2)
        with pytest.raises(StoreError):
            await store.add(sent, NOON)
        totals = await store.add(sent, NOON)
        await store.close()
    assert relay.held == 1  # applied, and its reply lost
    assert (totals["alice"].requests, totals["alice"].minute_requests) == (2, 2)
    direct = RedisUsage(redis_server.url)
    rows, _ = await direct.rows(("2025-03-14", 0))
    await direct.close()
    assert [(r.requests, r.prompt_tokens) for r in rows] == [(2, 20)]
    client = aioredis.Redis.from_url(redis_server.url)
    marks = [key async for key in client.scan_iter(match="fairgate:usage:applied:*")]
    ttls = [await client.ttl(key) for key in marks]
    await client.aclose()
    assert len(marks) == 1 and 0 < ttls[0] <= APPLIED_SECONDS  # one batch, one mark, expiring


async def _scans(client: aioredis.Redis) -> int:
    return int((await client.info("commandstats")).get("cmdstat_scan", {}).get("calls", 0))


async def test_a_report_reads_its_days_from_the_index_and_scans_for_older_rows_once(
    redis_url: str,  # noqa: F811
) -> None:
    """Rows an older gateway wrote (no day index) are found by one scan; after it, and for
    rows written since, a report reads the index and scans nothing, however large the
    keyspace the house's leases make."""
    client = aioredis.Redis.from_url(redis_url)
    older = json.dumps([9, "bob", "m", "requests"])
    await client.hset("fairgate:usage:rows:2025-03-13", older, 3)  # as an older gateway did
    store = RedisUsage(redis_url)
    await store.add(batch(), NOON)
    first, _ = await store.rows(("2025-03-13", 0))
    scans = await _scans(client)
    again, _ = await store.rows(("2025-03-13", 0))
    await store.add(batch(day="2025-03-15", hour=1), NOON)
    later, _ = await store.rows(("2025-03-14", 0))
    assert await _scans(client) == scans  # the index alone, once filled
    await store.close()
    await client.aclose()
    assert [(r.day, r.user, r.requests) for r in first] == [
        ("2025-03-13", "bob", 3),
        ("2025-03-14", "alice", 1),
    ]
    assert again == first
    assert [(r.day, r.hour) for r in later] == [("2025-03-14", 12), ("2025-03-15", 1)]


async def test_the_day_index_forgets_the_days_past_keeping(
    redis_url: str,  # noqa: F811
) -> None:
    """A day older than KEEP_DAYS leaves the index as the next batch is written, as its
    rows expire: the index grows by a day a day, and no further."""
    client = aioredis.Redis.from_url(redis_url)
    store = RedisUsage(redis_url)
    await store.add(batch(day="2023-12-01"), NOON)  # 469 days before NOON's
    await store.add(batch(), NOON)
    kept = [day.decode() for day in await client.zrange(DAYS, 0, -1)]
    await store.close()
    await client.aclose()
    assert kept == ["2025-03-14"]
