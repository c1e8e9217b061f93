"""The one way the gateway connects to Redis (holds and usage each keep a client)."""

from __future__ import annotations

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError

__all__ = ["connect"]


def connect(url: str) -> aioredis.Redis:
    """A client that fails within seconds when Redis is away, rather than hanging a caller.

    One retry covers a pooled connection that died with a restarted Redis (its reset is a
    connection error); callers make their commands idempotent or accept the rare repeat. A
    Redis that does not answer in time (frozen, swapping) is not asked again: a second wait
    as long would only double what each request waits before the gateway goes on without it.
    """
    return aioredis.Redis.from_url(
        url,
        socket_connect_timeout=1.0,
        socket_timeout=2.0,
        health_check_interval=10,
        retry=Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
        retry_on_error=[RedisConnectionError],
    )
