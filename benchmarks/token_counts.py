"""Token counts beside a stream, on the real llama-server: what counting costs the others.

llama-server answers ``/v1/messages/count_tokens`` by rendering and tokenizing the whole
prompt in its HTTP threads, on the cores that decode. Issue 41: four clients counting
480 KB prompts in a loop took another user's token gap from 15 to 129 ms. Here one person
streams a long reply while four clients count 480 KB prompts, over and over, for a few
seconds: straight to the llama-server, then through the gateway (one count at a time per
backend), each with a quiet window first. Printed: the stream's inter-token gap p50/p95,
quiet and while counting, and how many counts were answered.

    .venv/bin/python -m benchmarks.token_counts [SECONDS]
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

from benchmarks.household import p95
from gateway.core.logs import configure_logging
from tests.llama_server import MODEL_ALIAS, running_llama_server
from tests.processes import free_port, stop, until_answers

__all__ = ["main"]

PROMPT = "count these words please " * 20_000  # 480 KB
HEADERS = {"Authorization": "Bearer key"}
COUNTERS = 4  # clients counting, each a user of its own (one count at a time each)


async def _gaps(session: aiohttp.ClientSession, url: str, stop: asyncio.Event) -> list[float]:
    """(arrival, gap) of each token of one long stream, until ``stop``."""
    body = {
        "model": MODEL_ALIAS,
        "messages": [{"role": "user", "content": "Tell a long story."}],
        "max_tokens": 100_000,
        "ignore_eos": True,
        "stream": True,
    }
    gaps, last = [], None
    async with session.post(url + "/v1/chat/completions", json=body, headers=HEADERS) as reply:
        async for line in reply.content:
            if not line.startswith(b"data: {"):
                continue  # the blank line after each event
            now = time.perf_counter()
            if last is not None:
                gaps.append((now, now - last))
            last = now
            if stop.is_set():
                break
    return gaps  # type: ignore[return-value]


async def _counting(session: aiohttp.ClientSession, url: str, until: float, n: int) -> int:
    body = {"model": MODEL_ALIAS, "messages": [{"role": "user", "content": PROMPT}]}
    headers = {"Authorization": f"Bearer counter{n}"}
    answered = 0
    while time.perf_counter() < until:
        async with session.post(
            url + "/v1/messages/count_tokens", json=body, headers=headers
        ) as reply:
            await reply.read()
            answered += reply.status == 200
    return answered


async def _run(url: str, seconds: float) -> str:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        stop = asyncio.Event()
        stream = asyncio.create_task(_gaps(session, url, stop))
        await asyncio.sleep(seconds)  # the quiet window
        started = time.perf_counter()
        until = started + seconds
        answered = await asyncio.gather(
            *(_counting(session, url, until, n) for n in range(COUNTERS))
        )
        ended = time.perf_counter()
        stop.set()
        gaps: list[tuple[float, float]] = await stream  # type: ignore[assignment]
    quiet = [gap for at, gap in gaps if at < started]
    busy = [gap for at, gap in gaps if started <= at <= ended]
    return (
        f"gap quiet p50 {statistics.median(quiet) * 1000:5.1f} ms p95 {p95(quiet) * 1000:6.1f} ms; "
        f"while counting p50 {statistics.median(busy) * 1000:5.1f} ms p95 "
        f"{p95(busy) * 1000:6.1f} ms; counts answered {sum(answered)}"
    )


async def compare(seconds: float, workdir: Path) -> list[str]:
    lines = []
    async with running_llama_server(workdir / "llama-server.log", slots=2) as server:
        lines.append(f"  direct             {await _run(server.url, seconds)}")
        policy = workdir / "fairgate.yaml"
        policy.write_text(
            "users:\n  reader: {keys: [key], max_concurrent: 2}\n"
            + "".join(f"  counter{n}: {{keys: [counter{n}]}}\n" for n in range(COUNTERS))
            + f"backends:\n  - {{name: cpp, url: {server.url}, kind: llamacpp}}\n"
        )
        # In a process of its own, as deployed: the clients' loop is not the gateway's.
        port = free_port()
        env = {**os.environ, "FAIRGATE_CONFIG": str(policy), "FAIRGATE_LOG_LEVEL": "WARNING"}
        env |= {"FAIRGATE_USAGE_DB": str(workdir / "usage.db")}
        env |= {"FAIRGATE_LISTEN": f"127.0.0.1:{port}"}
        gateway = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gateway", "serve", env=env, stderr=asyncio.subprocess.DEVNULL
        )
        url = f"http://127.0.0.1:{port}"
        try:
            await until_answers(url + "/readyz", 30, gateway)
            lines.append(f"  through the gateway {await _run(url, seconds)}")
        finally:
            await stop(gateway)
    return lines


def main() -> None:
    configure_logging("json", "ERROR")
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 8.0
    print(__doc__.split("\n\n")[0])
    with tempfile.TemporaryDirectory() as workdir:
        for line in asyncio.run(compare(seconds, Path(workdir))):
            print(line)


if __name__ == "__main__":
    main()
