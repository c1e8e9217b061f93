"""The one pooled HTTP client to every backend: built with the app, opened at start-up (a
client session needs a running loop), closed at shutdown."""

from __future__ import annotations

import aiohttp

__all__ = ["Upstream"]


class Upstream:
    def __init__(self, pool_size: int) -> None:
        self._pool_size = pool_size
        self._session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("the upstream client is used before start-up or after shutdown")
        return self._session

    async def open(self) -> None:
        connector = aiohttp.TCPConnector(limit=self._pool_size, ttl_dns_cache=300)
        self._session = aiohttp.ClientSession(
            connector=connector, auto_decompress=False, timeout=aiohttp.ClientTimeout(total=None)
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
