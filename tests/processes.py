"""Real servers started as child processes by the tests: ports, binaries, stopping."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket

import pytest

__all__ = ["free_port", "required_binary", "stop"]


def free_port() -> int:
    """A loopback port nothing listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def required_binary(name: str, package: str) -> str:
    """The path of ``name``; in CI its absence is an error, elsewhere the test is skipped."""
    path = shutil.which(name)
    if path is None:
        if os.environ.get("CI"):
            raise RuntimeError(f"{name} is not installed; `make test` installs {package}")
        pytest.skip(f"{name} is not installed (apt-get install {package})")
    return path


async def stop(process: asyncio.subprocess.Process) -> None:
    """SIGTERM, then SIGKILL if it has not exited within 10 s."""
    if process.returncode is not None:
        return
    process.terminate()
    try:
        await asyncio.wait_for(process.wait(), timeout=10)
    except TimeoutError:
        process.kill()
        await process.wait()
