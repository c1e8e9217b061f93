"""Where usage is kept: one contract, two implementations.

``SqliteUsage`` keeps it in a file beside a single gateway; ``RedisUsage`` keeps it in Redis
when several replicas share one set of counters (``FAIRGATE_REDIS_URL``). The ledger feeds
either, in batches, off the request path.

May import: what ``usage`` may.
"""
