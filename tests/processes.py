"""Real servers started as child processes by the tests: ports, binaries, stopping."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import sys
import time
from pathlib import Path

import aiohttp
import pytest

__all__ = ["free_port", "required_binary", "serve_on_a_full_disk", "stop", "until_answers"]


# The checkout under test, first on the child's path: the venv's editable install may be
# another checkout's.
_REPO = str(Path(__file__).resolve().parent.parent)


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


async def until_answers(
    url: str,
    within: float,
    process: asyncio.subprocess.Process | None = None,
    log: Path | None = None,
) -> None:
    """Poll ``url`` until it answers 200: a server in another process has no event to wait
    on but its port. Fails at once if ``process`` exits, showing the end of its ``log``."""
    deadline = time.monotonic() + within
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            if process is not None and process.returncode is not None:
                detail = log.read_text(errors="replace")[-2000:] if log else ""  # noqa: ASYNC240
                raise RuntimeError(f"{url}: the server exited ({process.returncode}): {detail}")
            try:
                async with session.get(url) as reply:
                    if reply.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
    raise TimeoutError(f"{url} did not answer within {within:g} s")


async def serve_on_a_full_disk(policy: Path, cwd: Path) -> tuple[asyncio.subprocess.Process, str]:
    """``fairgate serve`` of ``policy`` in a process of its own whose stderr (its log) is
    /dev/full, where every write fails as on a full disk; its URL once it answers."""
    port = free_port()
    clean = {k: v for k, v in os.environ.items() if not k.startswith("FAIRGATE_")}
    full = os.open("/dev/full", os.O_WRONLY)
    try:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gateway", "serve", "--config", str(policy),
            "--listen", f"127.0.0.1:{port}", cwd=cwd, stdout=asyncio.subprocess.DEVNULL,
            stderr=full, env={**clean, "FAIRGATE_LOG_FORMAT": "json", "PYTHONPATH": _REPO},
        )  # fmt: skip
    finally:
        os.close(full)
    url = f"http://127.0.0.1:{port}"
    try:
        await until_answers(url + "/healthz", 30, process)
    except BaseException:
        await stop(process)
        raise
    return process, url
