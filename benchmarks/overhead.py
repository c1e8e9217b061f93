"""What the gateway adds to every streamed reply: direct vs through the gateway (vs nginx).

A fast Ollama stand-in (``benchmarks.wire_stub``) and a fast client (``benchmarks.wire_client``)
run on core 1; the gateway runs on core 0 (taskset), and so do three relays with no logic
(``benchmarks.bare_relay``: aiohttp's server and client; aiohttp's server and the gateway's
backend client, the gateway's stack without its logic; an asyncio protocol on httptools and
that client) and nginx (one worker, ``proxy_buffering off``, upstream keep-alive) when it is
installed.
Four loads, each against every target in turn, in the same run:

- one stream at a time: what the path adds to a request when nothing else is happening,
  and which part of it is on the way in and which on the way back (``benchmarks.timeline``).
- zero-delay: the backend streams its tokens as fast as it can, ``--concurrency`` clients in
  a closed loop. This finds the most requests per second the path can relay; its latencies
  rise with that throughput (the stub shares core 1 with the client).
- rate: the same ``--concurrency`` clients, zero-delay backend, ``--rate`` requests a second
  in all on a schedule: one load for every path, below what any saturates at, so that their
  latencies under concurrency compare.
- paced: ``--paced`` streams each get a token per decode step (``--interval``, as a GPU's
  batched decode does), so nothing is saturated and the added TTFT and ITL are the path's own.
  The streams start evenly over one stream's length (``--together``: all at once, so that
  every 64 ticks all of them end and ask again in the same millisecond).

Prints TTFT and ITL p50/p99, requests/s, chunks/s, the CPU per request of the gateway, the
bare relays and nginx, and the gateway's figures over nginx's. ``--rounds`` measures every
target again in the same processes, to show the noise; ``--before DIR`` also measures the
gateway of another tree (``git archive REV | tar -x -C DIR``), so that what a change did is
seen in one run.

    make bench   # or: .venv/bin/python -m benchmarks.overhead [--concurrency 16] [--paced 100]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.bare_relay import STACKS
from benchmarks.timeline import stub_stamps, ways
from tests.processes import free_port, stop, until_answers

WARMUP = 1.0  # seconds each client runs before it starts counting

NGINX_CONF = """
worker_processes 1;
daemon off;
pid {dir}/nginx.pid;
error_log {dir}/error.log;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  client_body_temp_path {dir}; proxy_temp_path {dir};
  upstream stub {{ server 127.0.0.1:{stub}; keepalive 256; }}
  server {{
    listen 127.0.0.1:{port};
    location / {{
      proxy_pass http://stub; proxy_http_version 1.1; proxy_set_header Connection "";
      proxy_buffering off;
    }}
  }}
}}
"""


def _pinned(core: int, command: list[str]) -> list[str]:
    return ["taskset", "-c", str(core), *command] if shutil.which("taskset") else command


async def spawn_pinned(
    core: int, *command: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> Any:
    """Start ``command`` on one core (when taskset is there), its output discarded."""
    return await asyncio.create_subprocess_exec(
        *_pinned(core, list(command)), env=env, cwd=cwd, stdout=subprocess.DEVNULL
    )


def _cpu_seconds(pid: int) -> float:
    """CPU seconds of a process and its children (nginx's worker is its master's child)."""
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    own = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return own + sum(_cpu_seconds(int(child)) for child in children)


async def client_figures(
    url: str,
    concurrency: int,
    seconds: float,
    keys: list[str] | None = None,
    pause: float = 0.0,
    spread: float = 0.0,
    rate: float = 0.0,
    timeline: bool = False,
) -> dict[str, Any]:
    """Run ``benchmarks.wire_client`` on core 1 against ``url``; its figures. ``spread``:
    the connections start evenly over that many seconds, all before the counting does;
    ``rate``: requests a second on a schedule (0: a closed loop); ``timeline``: with each
    request's send and first line."""
    command = [sys.executable, "-m", "benchmarks.wire_client", "--url", url]
    command += ["--concurrency", str(concurrency), "--seconds", str(seconds)]
    command += ["--warmup", str(WARMUP + spread), "--spread", str(spread)]
    command += ["--keys", ",".join(keys or []), "--pause", str(pause), "--rate", str(rate)]
    command += ["--timeline"] if timeline else []
    process = await asyncio.create_subprocess_exec(*_pinned(1, command), stdout=subprocess.PIPE)
    output, _ = await process.communicate()
    if process.returncode:
        raise RuntimeError(f"the client failed against {url}")
    figures: dict[str, Any] = json.loads(output)
    return figures


async def _load(
    workdir: Path,
    args: argparse.Namespace,
    interval: float,
    concurrency: int,
    spread: float = 0.0,
    rate: float = 0.0,
    timeline: bool = False,
) -> list[dict[str, dict[str, Any]]]:
    """Start the stub, the gateway, the bare relays and nginx; measure each, ``--rounds``
    times (``timeline``: with each one's way in and way back); stop them."""
    stub_port, gateway_port, nginx_port = free_port(), free_port(), free_port()
    processes = []
    try:
        stub = ["benchmarks.wire_stub", "--port", str(stub_port), "--tokens", str(args.tokens)]
        stub += ["--interval", str(interval)]
        # A backend never waits for its clients' CPU; here the two share core 1, and a
        # negative nice lets the stub go first, as a server with cores of its own would.
        niced = ["nice", "-n", str(args.backend_nice)] if args.backend_nice else []
        processes.append(await spawn_pinned(1, *niced, sys.executable, "-m", *stub))
        stub_url = f"http://127.0.0.1:{stub_port}"
        policy = workdir / "fairgate.yaml"
        policy.write_text(
            f"defaults: {{max_concurrent: {max(args.concurrency, args.paced) * 2}, "
            "max_queued: 0}\n"
            f"backends:\n  - {{name: stub, url: {stub_url}, kind: ollama, slots: 100000}}\n"
        )
        env = {
            **os.environ,
            "FAIRGATE_CONFIG": str(policy),
            "FAIRGATE_LISTEN": f"127.0.0.1:{gateway_port}",
            "FAIRGATE_LOG_LEVEL": "WARNING",
            # A real file: what the gateway adds includes counting usage and writing it.
            "FAIRGATE_USAGE_DB": str(workdir / "usage.db"),
        }
        gateway = await spawn_pinned(0, sys.executable, "-m", "gateway", "serve", env=env)
        processes.append(gateway)
        pids = {"gateway": gateway.pid}
        targets = {"direct": stub_url, "gateway": f"http://127.0.0.1:{gateway_port}"}
        if args.before is not None:
            # The same gateway from another tree (an exported older commit), side by side.
            port = free_port()
            older = {
                **env,
                "FAIRGATE_LISTEN": f"127.0.0.1:{port}",
                "FAIRGATE_USAGE_DB": str(workdir / "usage-before.db"),
            }
            # Run in that tree: ``python -m`` looks in the working directory first.
            before = await spawn_pinned(
                0, sys.executable, "-m", "gateway", "serve", env=older, cwd=args.before
            )
            processes.append(before)
            pids["before"] = before.pid
            targets["before"] = f"http://127.0.0.1:{port}"
        for stack in STACKS:
            port = free_port()
            bare = ["benchmarks.bare_relay", "--stack", stack, "--port", str(port)]
            relay = await spawn_pinned(0, sys.executable, "-m", *bare, "--upstream", stub_url)
            processes.append(relay)
            pids[stack] = relay.pid
            targets[stack] = f"http://127.0.0.1:{port}"
        if shutil.which("nginx"):
            conf = workdir / "nginx.conf"
            conf.write_text(NGINX_CONF.format(dir=workdir, stub=stub_port, port=nginx_port))
            nginx = await spawn_pinned(0, "nginx", "-c", str(conf))
            processes.append(nginx)
            pids["nginx"] = nginx.pid
            targets["nginx"] = f"http://127.0.0.1:{nginx_port}"
        for url in targets.values():
            await until_answers(url + "/", 20)
        rounds = []
        for _ in range(args.rounds):
            figures = {}
            for name, url in targets.items():
                pid = pids.get(name)
                cpu_before = _cpu_seconds(pid) if pid else 0.0
                if timeline:  # the stub forgets what it stamped for the last target
                    await asyncio.to_thread(stub_stamps, stub_url)
                figures[name] = await client_figures(
                    url, concurrency, args.seconds, spread=spread, rate=rate, timeline=timeline
                )
                figures[name]["cpu"] = _cpu_seconds(pid) - cpu_before if pid else None
                if timeline:
                    stamps = await asyncio.to_thread(stub_stamps, stub_url)
                    figures[name]["ways"] = ways(figures[name].pop("sends"), stamps)
                figures[name]["counted"] = WARMUP + spread + args.seconds
            rounds.append(figures)
        return rounds
    finally:
        for process in reversed(processes):
            await stop(process)


def _report(title: str, rounds: list[dict[str, dict[str, Any]]]) -> None:
    print(title)
    for number, figures in enumerate(rounds, 1):
        if len(rounds) > 1:
            print(f" round {number}")
        _figures(figures)


def _figures(figures: dict[str, dict[str, Any]]) -> None:
    print("  target          TTFT p50  TTFT p99   ITL p50   ITL p99  requests/s   chunks/s")
    for name, f in figures.items():
        print(
            f"  {name:14} {f['ttft_p50'] * 1e3:7.2f}ms {f['ttft_p99'] * 1e3:7.2f}ms "
            f"{f['itl_p50'] * 1e3:7.2f}ms {f['itl_p99'] * 1e3:7.2f}ms "
            f"{f['requests_per_s']:11.0f} {f['lines_per_s']:10.0f}"
        )
    direct = figures["direct"]
    for name in ("gateway", "before", *STACKS, "nginx"):
        if name in figures:
            f = figures[name]
            added = {key: (f[key] - direct[key]) * 1e3 for key in ("ttft_p50", "ttft_p99")}
            print(
                f"  {name} adds TTFT p50 {added['ttft_p50']:+.2f} ms, "
                f"p99 {added['ttft_p99']:+.2f} ms; ITL p99 "
                f"{(f['itl_p99'] - direct['itl_p99']) * 1e3:+.2f} ms"
            )
    _ways(figures)
    if "nginx" in figures:
        gateway, nginx = figures["gateway"], figures["nginx"]
        print(
            f"  gateway / nginx: TTFT p50 {gateway['ttft_p50'] / nginx['ttft_p50']:.2f}x, "
            f"requests/s {gateway['requests_per_s'] / nginx['requests_per_s']:.2f}x"
        )
    for name in ("gateway", "before", *STACKS, "nginx"):
        f = figures.get(name)
        if f is None:
            continue
        # The CPU was counted over the warm-up too, at about the same rate.
        requests = f["requests_per_s"] * f["counted"]
        chunks = f["lines_per_s"] * f["counted"]
        if requests:
            print(
                f"  {name} CPU: {f['cpu']:.2f} s for about {requests:.0f} requests = "
                f"{f['cpu'] / requests * 1e3:.2f} ms each, {f['cpu'] / chunks * 1e6:.1f} us "
                "per chunk"
            )


def _ways(figures: dict[str, dict[str, Any]]) -> None:
    """Each path's way in (client's send to the backend's read) and way back (backend's
    answer to the client's first line), medians, and what it adds to direct's."""
    direct = figures["direct"].get("ways")
    if direct is None:
        return
    for name, f in figures.items():
        if f.get("ways") is not None and name != "direct":
            (way_in, way_back), (direct_in, direct_back) = f["ways"], direct
            print(
                f"  {name} way in {way_in * 1e3:.2f} ms ({(way_in - direct_in) * 1e3:+.2f}), "
                f"way back {way_back * 1e3:.2f} ms ({(way_back - direct_back) * 1e3:+.2f})"
            )


async def main(args: argparse.Namespace) -> None:
    workdir = Path(tempfile.mkdtemp(prefix="fairgate-bench-"))
    print(
        f"overhead: streaming chats of {args.tokens} tokens, {args.seconds:g} s per target; "
        f"{os.cpu_count()} cores; gateway and nginx on core 0, backend stub and client on core 1"
        + (f" (the stub at nice {args.backend_nice})" if args.backend_nice else "")
    )
    loads = set(args.loads.split(","))
    if "one" in loads:
        one = await _load(workdir, args, 0.0, 1, timeline=True)
        _report("one stream at a time, zero-delay backend (the path's own latency):", one)
    if "zero" in loads:
        zero = await _load(workdir, args, 0.0, args.concurrency)
        title = f"{args.concurrency} streams, zero-delay backend (as many as the path can relay):"
        _report(title, zero)
    if "rate" in loads:
        # A closed loop finds each path's most requests a second, but its latencies then
        # depend on the throughput: the stub and the client share core 1, so a path that
        # relays more requests also waits longer for the stub. At one fixed load, below what
        # any of them saturates at, the latencies are the paths' own.
        steady = await _load(workdir, args, 0.0, args.concurrency, rate=args.rate)
        title = (
            f"{args.concurrency} streams, zero-delay backend, {args.rate:g} requests/s on a "
            "schedule (the same load on every path):"
        )
        _report(title, steady)
    if "paced" in loads:
        # Started evenly over one stream's length, as people arrive: all at once, the 100
        # come back together every 64 ticks, a burst that is no path's own latency.
        spread = 0.0 if args.together else args.tokens * args.interval
        paced = await _load(workdir, args, args.interval, args.paced, spread)
        start = "all started at once" if args.together else f"started over {spread:g} s"
        _report(
            f"{args.paced} streams, paced backend (a token per stream every "
            f"{args.interval * 1e3:g} ms; {start}):",
            paced,
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=16, help="zero-delay streams")
    parser.add_argument("--paced", type=int, default=100, help="paced streams")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--interval", type=float, default=0.02)
    parser.add_argument(
        "--rate", type=float, default=1000.0, help="the 'rate' load: requests a second in all"
    )
    parser.add_argument("--loads", default="one,zero,rate,paced", help="which loads to run")
    parser.add_argument(
        "--backend-nice",
        type=int,
        default=0,
        help="the stub's nice value (negative, as root: it goes ahead of the client on core 1)",
    )
    parser.add_argument(
        "--together", action="store_true", help="start the paced streams all at once"
    )
    parser.add_argument(
        "--before",
        type=Path,
        help="a tree of an older commit (git archive REV | tar -x -C DIR): its gateway is "
        "measured beside this one, as 'before'",
    )
    asyncio.run(main(parser.parse_args()))
