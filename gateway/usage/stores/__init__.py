"""Where usage is kept: one interface, two implementations.

``SqliteUsage`` keeps it in a file beside a single gateway; ``RedisUsage`` keeps it in Redis
when several replicas share one set of counters (``FAIRGATE_REDIS_URL``). ``usage/ledger.py``
feeds either, in batches, off the request path.
"""

from gateway.usage.stores.base import (
    Batch,
    Counts,
    RefusalRow,
    StoreError,
    Tally,
    UsageRow,
    UsageStore,
)
from gateway.usage.stores.redis import RedisUsage
from gateway.usage.stores.sqlite import SqliteUsage

__all__ = [
    "Batch",
    "Counts",
    "RedisUsage",
    "RefusalRow",
    "SqliteUsage",
    "StoreError",
    "Tally",
    "UsageRow",
    "UsageStore",
]
