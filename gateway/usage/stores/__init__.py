"""Where usage is kept: one interface, two implementations.

``SqliteUsage`` keeps it in a file beside a single gateway; ``RedisUsage`` keeps it in Redis
when several replicas share one set of counters (``FAIRGATE_REDIS_URL``). ``usage/ledger.py``
feeds either, in batches, off the request path.
"""
