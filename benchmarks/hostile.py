"""Big bodies from a user at cap: what they cost the gateway and the other users.

A user whose one place is taken (max_concurrent 1, max_queued 0) sends 8 requests at once,
each declaring and sending a 30 MiB body. The gateway can refuse each from its headers, so
it should answer 503 at once, hold none of the bodies, and leave another user's stream
undisturbed. Printed: the gateway's RSS before, at its peak during the flood and after;
the time from each request's head to its 503; and bob's inter-token gaps (p50/p99) in a
quiet window and during the flood.

The simulator and the gateway each run in their own process (so the flood's client does
not slow the backend's decode), on the same loopback.

    .venv/bin/python -m benchmarks.hostile [--bodies 8] [--mib 30]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp

from tests.processes import free_port, stop, until_answers

MODEL = "llama3.2:3b"
_PIECE = b" " * 65536  # the body is whitespace before "{}": any JSON reader would take it


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


async def _stream_gaps(url: str, key: str, stop_at: asyncio.Event) -> list[tuple[float, float]]:
    """(arrival time, gap) for every line of one long stream, until ``stop_at``."""
    body = {"model": MODEL, "prompt": "talk", "options": {"num_predict": 1_000_000}}
    gaps: list[tuple[float, float]] = []
    headers = {"Authorization": f"Bearer {key}"}
    async with (
        aiohttp.ClientSession() as session,
        session.post(url + "/api/generate", json=body, headers=headers) as reply,
    ):
        last = time.monotonic()
        while not stop_at.is_set():
            if not await reply.content.readline():
                break
            now = time.monotonic()
            gaps.append((now, now - last))
            last = now
    return gaps


async def _big_request(host: str, port: int, size: int) -> float:
    """Send one head declaring ``size`` bytes, then the body; seconds until the status line."""
    reader, writer = await asyncio.open_connection(host, port)
    head = (
        f"POST /api/generate HTTP/1.1\r\nHost: g\r\nAuthorization: Bearer alice-key\r\n"
        f"Content-Type: application/json\r\nContent-Length: {size}\r\n\r\n"
    ).encode()
    started = time.monotonic()
    writer.write(head)
    status = asyncio.ensure_future(reader.readline())
    status.add_done_callback(lambda _: answered.append(time.monotonic() - started))
    answered: list[float] = []
    sent = 0
    # As an attacker would: the whole body, whatever the answer says.
    with contextlib.suppress(ConnectionError):
        while sent < size - 2:
            piece = min(len(_PIECE), size - 2 - sent)
            writer.write(_PIECE[:piece])
            sent += piece
            await writer.drain()
        writer.write(b"{}")
        await writer.drain()
    line = await status
    elapsed = answered[0]
    if not line.startswith(b"HTTP/1.1 503"):
        raise RuntimeError(f"expected a 503, got {line!r}")
    writer.close()
    return elapsed


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _run(args: argparse.Namespace, workdir: Path) -> None:
    users = (
        "defaults: {max_concurrent: 1, max_queued: 0}\n"
        "users:\n  alice: {keys: [alice-key]}\n  bob: {keys: [bob-key]}\n"
    )
    env = {"FAIRGATE_MAX_BODY_BYTES": str(args.mib * 2 * 1024 * 1024)}
    async with gateway_and_sim(workdir, users, ["--decode-tps", "50"], env) as (pid, port):
        await _measure(args, f"http://127.0.0.1:{port}", pid, port)


@contextlib.asynccontextmanager
async def gateway_and_sim(
    workdir: Path, users: str, sim_options: list[str], env: dict[str, str]
) -> AsyncIterator[tuple[int, int]]:
    """A simulated Ollama with 2 slots and a gateway in front of it (``users``: the
    policy's users and defaults, ``env``: more settings), each in its own process; the
    gateway's pid and port."""
    sim_port, port = free_port(), free_port()
    python = sys.executable
    sim = await asyncio.create_subprocess_exec(
        python, "-m", "gateway", "sim", "--port", str(sim_port), "--parallel", "2",
        *sim_options, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    policy = workdir / "fairgate.yaml"
    backend = f"http://127.0.0.1:{sim_port}"
    policy.write_text(
        f"{users}backends:\n  - {{name: sim, url: {backend}, kind: ollama, slots: 2}}\n"
    )
    settings = {"FAIRGATE_CONFIG": str(policy), "FAIRGATE_LOG_LEVEL": "WARNING"}
    settings["FAIRGATE_USAGE_DB"] = str(workdir / "usage.db")
    settings["FAIRGATE_LISTEN"] = f"127.0.0.1:{port}"
    gateway = await asyncio.create_subprocess_exec(
        python, "-m", "gateway", "serve", env={**os.environ, **settings, **env},
        stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    try:
        await until_answers(backend + "/", 20)
        await until_answers(f"http://127.0.0.1:{port}/", 20)
        yield gateway.pid, port
    finally:
        await stop(gateway)
        await stop(sim)


async def _measure(args: argparse.Namespace, url: str, pid: int, port: int) -> None:
    done = asyncio.Event()
    alice = asyncio.create_task(_stream_gaps(url, "alice-key", done))  # alice at her cap
    bob = asyncio.create_task(_stream_gaps(url, "bob-key", done))
    await asyncio.sleep(args.quiet)  # a quiet window for bob's baseline
    rss_before, flood_started = rss_mib(pid), time.monotonic()
    peak = rss_before

    async def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, rss_mib(pid))
            await asyncio.sleep(0.01)

    sampler = asyncio.create_task(sample())
    # The flood from its own process, so that sending 240 MiB does not slow bob's reader.
    flooder = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "benchmarks.hostile", "--flood", str(port),
        "--bodies", str(args.bodies), "--mib", str(args.mib), stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    output, _ = await flooder.communicate()
    latencies: list[float] = json.loads(output)
    flood_ended = time.monotonic()
    await asyncio.sleep(1.0)
    rss_after = rss_mib(pid)
    done.set()
    await sampler
    gaps = await bob
    alice.cancel()
    quiet = [gap for at, gap in gaps[1:] if at < flood_started]
    flood = [gap for at, gap in gaps if flood_started <= at <= flood_ended + 0.2]
    print(f"{args.bodies} bodies of {args.mib} MiB from a user at cap, through the gateway")
    print(f"  gateway RSS: before {rss_before:.1f} MiB, peak {peak:.1f} MiB "
          f"(+{peak - rss_before:.1f}), after {rss_after:.1f} MiB")  # fmt: skip
    print(f"  503 after the head: max {max(latencies) * 1000:.1f} ms, "
          f"median {_quantile(latencies, 0.5) * 1000:.1f} ms")  # fmt: skip
    for name, values in (("quiet", quiet), ("during the flood", flood)):
        if values:
            print(f"  bob's inter-token gap, {name}: p50 {_quantile(values, 0.5) * 1000:.1f} ms, "
                  f"p99 {_quantile(values, 0.99) * 1000:.1f} ms ({len(values)} gaps)")  # fmt: skip


async def _flood(port: int, bodies: int, size: int) -> list[float]:
    return list(
        await asyncio.gather(*(_big_request("127.0.0.1", port, size) for _ in range(bodies)))
    )


def flood_arguments(doc: str | None, bodies: int) -> argparse.ArgumentParser:
    """The options of a benchmark whose bodies come from a child process of its own."""
    parser = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0])
    parser.add_argument("--bodies", type=int, default=bodies)
    parser.add_argument("--mib", type=int, default=30)
    parser.add_argument("--flood", type=int, metavar="PORT", help=argparse.SUPPRESS)
    return parser


def main() -> None:
    parser = flood_arguments(__doc__, bodies=8)
    parser.add_argument("--quiet", type=float, default=3.0, help="seconds of baseline")
    args = parser.parse_args()
    if args.flood:  # the child that sends the bodies; prints its latencies
        print(json.dumps(asyncio.run(_flood(args.flood, args.bodies, args.mib * 1024 * 1024))))
        return
    with tempfile.TemporaryDirectory() as workdir:
        asyncio.run(_run(args, Path(workdir)))


if __name__ == "__main__":
    main()
