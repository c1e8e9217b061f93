"""Slow big bodies from a user with room: what the gateway holds of them.

bob has places free (max_concurrent 1, max_queued 2) and opens 16 requests at once, each
declaring a body of 30 MiB and sending all of it but the last byte, then holding the
connection open as a slow client would (until the body timeout). Until a body has arrived
the gateway holds what came of it; bounded per user, the second and later bodies are
refused from their heads and their bytes are read and dropped, not kept. Printed: how many
were refused from the head, and the gateway's RSS before and at its peak.

The gateway runs in its own process (its RSS is its own), the bodies come from another.

    .venv/bin/python -m benchmarks.slow_bodies [--bodies 16] [--mib 30]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.hostile import flood_arguments, gateway_and_sim, rss_mib

_PIECE = b" " * 65536


async def _slow_request(port: int, size: int, hold: float) -> str:
    """One head declaring ``size`` bytes, all of them but the last sent; the status line
    if one came within ``hold`` seconds, else "held" (the body is still being waited for)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        f"POST /api/generate HTTP/1.1\r\nHost: g\r\nAuthorization: Bearer bob-key\r\n"
        f"Content-Type: application/json\r\nContent-Length: {size}\r\n\r\n".encode()
    )
    status = asyncio.ensure_future(reader.readline())
    with contextlib.suppress(ConnectionError):
        sent = 0
        while sent < size - 1 and not status.done():
            piece = min(len(_PIECE), size - 1 - sent)
            writer.write(_PIECE[:piece])
            sent += piece
            await writer.drain()
    try:
        line = await asyncio.wait_for(status, hold)
    except TimeoutError:
        line = b"held"
    writer.close()
    return line.decode(errors="replace").strip()


async def _flood(port: int, bodies: int, size: int, hold: float) -> list[str]:
    return list(await asyncio.gather(*(_slow_request(port, size, hold) for _ in range(bodies))))


async def _run(args: argparse.Namespace, workdir: Path) -> None:
    users = "defaults: {max_concurrent: 1, max_queued: 2}\nusers:\n  bob: {keys: [bob-key]}\n"
    async with gateway_and_sim(workdir, users, [], {}) as (pid, port):
        await _measure(args, pid, port)


async def _measure(args: argparse.Namespace, pid: int, port: int) -> None:
    before = peak = rss_mib(pid)
    flooder = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "benchmarks.slow_bodies", "--flood", str(port),
        "--bodies", str(args.bodies), "--mib", str(args.mib), "--hold", str(args.hold),
        stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    communicating = asyncio.ensure_future(flooder.communicate())
    started = time.monotonic()
    while not communicating.done():
        peak = max(peak, rss_mib(pid))
        await asyncio.wait({communicating}, timeout=0.05)
    lines: list[str] = json.loads((await communicating)[0])
    refused = sum(line.startswith("HTTP/1.1 503") for line in lines)
    held = lines.count("held")
    print(f"{args.bodies} bodies of {args.mib} MiB less one byte from bob, at once")
    print(f"  refused from the head: {refused}; held waiting for their last byte: {held}; "
          f"other: {len(lines) - refused - held}")  # fmt: skip
    print(f"  gateway RSS: before {before:.1f} MiB, peak {peak:.1f} MiB "
          f"(+{peak - before:.1f}) over {time.monotonic() - started:.1f} s")  # fmt: skip


def main() -> None:
    parser = flood_arguments(__doc__, bodies=16)
    parser.add_argument("--hold", type=float, default=3.0, help="seconds each body is held")
    args = parser.parse_args()
    if args.flood:  # the child that sends the bodies; prints each one's status line
        size = args.mib * 1024 * 1024
        print(json.dumps(asyncio.run(_flood(args.flood, args.bodies, size, args.hold))))
        return
    with tempfile.TemporaryDirectory() as workdir:
        asyncio.run(_run(args, Path(workdir)))


if __name__ == "__main__":
    main()
