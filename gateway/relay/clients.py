"""The HTTP clients to every backend: built with the app, opened at start-up (they need a
running loop), closed at shutdown.

Replies are relayed through ``replies``, a lean client of our own
(gateway/relay/upstream_client.py);
probes, listings and keep-warm pings, a few a minute, use an aiohttp session.
"""

from __future__ import annotations

import aiohttp

from gateway.relay.upstream_client import BackendClient

__all__ = ["SIDE_CONNECTIONS", "Upstream"]

SIDE_CONNECTIONS = 16  # the aiohttp session's connections, beside the relay's pool


class Upstream:
    def __init__(self, pool_size: int) -> None:
        self._pool_size = pool_size
        self._session: aiohttp.ClientSession | None = None
        self._replies: BackendClient | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("the upstream client is used before start-up or after shutdown")
        return self._session

    @property
    def replies(self) -> BackendClient:
        if self._replies is None:
            raise RuntimeError("the upstream client is used before start-up or after shutdown")
        return self._replies

    async def open(self) -> None:
        connector = aiohttp.TCPConnector(limit=SIDE_CONNECTIONS, ttl_dns_cache=300)
        self._session = aiohttp.ClientSession(
            connector=connector, auto_decompress=False, timeout=aiohttp.ClientTimeout(total=None)
        )
        self._replies = BackendClient(self._pool_size)

    async def close(self) -> None:
        if self._replies is not None:
            await self._replies.close()
            self._replies = None
        if self._session is not None:
            await self._session.close()
            self._session = None
