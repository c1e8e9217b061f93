"""A throwaway redis-server on a free loopback port, for tests that need a real Redis.

FAIRGATE_TEST_REDIS_URL points the tests at an existing server instead (then the tests
that stop and restart Redis are skipped: they need a server of their own).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from tests.processes import free_port, required_binary, stop


class RedisServer:
    """redis-server as a child process that a test may stop and start again."""

    def __init__(self, binary: str, workdir: Path) -> None:
        self.binary, self.workdir, self.port = binary, workdir, free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._process: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        self._process = await asyncio.create_subprocess_exec(
            self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
            "--appendonly", "no", "--dir", str(self.workdir),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        client = aioredis.Redis.from_url(self.url)
        deadline = time.monotonic() + 10
        try:
            while True:  # an external process: poll its port until it answers
                try:
                    await client.ping()
                    return
                except (RedisError, OSError):
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.05)
        finally:
            await client.aclose()

    async def stop(self) -> None:
        if self._process is not None:
            await stop(self._process)
        self._process = None


@pytest.fixture
async def redis_server(tmp_path: Path) -> AsyncIterator[RedisServer]:
    """A fresh redis-server for this test (Debian's, installed by `make test`)."""
    server = RedisServer(required_binary("redis-server", "redis-server"), tmp_path)
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


@pytest.fixture
async def redis_url(tmp_path: Path) -> AsyncIterator[str]:
    """FAIRGATE_TEST_REDIS_URL if set (flushed first), else a throwaway server's URL."""
    given = os.environ.get("FAIRGATE_TEST_REDIS_URL")
    if given:
        client = aioredis.Redis.from_url(given)
        await client.flushdb()
        await client.aclose()
        yield given
        return
    server = RedisServer(required_binary("redis-server", "redis-server"), tmp_path)
    await server.start()
    try:
        yield server.url
    finally:
        await server.stop()
