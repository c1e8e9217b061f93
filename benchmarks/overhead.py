"""What the gateway adds to every streamed reply: direct vs through the gateway (vs nginx).

A zero-delay simulated Ollama (it streams its tokens as fast as it can) runs in its own
process; the gateway runs in another, pinned to one core with taskset when available; nginx
(`proxy_buffering off`) is measured too when it is installed (apt-get install nginx). This
process is the client: K concurrent streaming /api/chat requests, several rounds, against
each target in turn, in the same run. Prints added time to first chunk (p50/p99), total
time, requests/s, chunks/s, and the gateway's CPU seconds per request. When wrk is
installed (apt-get install wrk), it also drives each target for a few seconds with K
connections from core 1: a client fast enough to find the gateway's own limit.

    .venv/bin/python -m benchmarks.overhead [--concurrency 100] [--rounds 5] [--tokens 50]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

from tests.processes import free_port, stop, until_answers

MODEL = "llama3.2:3b"
NGINX_CONF = """
worker_processes 1;
daemon off;
pid {dir}/nginx.pid;
error_log {dir}/error.log;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  client_body_temp_path {dir}; proxy_temp_path {dir};
  upstream sim {{ server 127.0.0.1:{sim}; keepalive 256; }}
  server {{
    listen 127.0.0.1:{port};
    location / {{
      proxy_pass http://sim; proxy_http_version 1.1; proxy_set_header Connection "";
      proxy_buffering off;
    }}
  }}
}}
"""


async def _spawn(*command: str, env: dict[str, str] | None = None) -> asyncio.subprocess.Process:
    pinned = ["taskset", "-c", "0", *command] if shutil.which("taskset") else list(command)
    return await asyncio.create_subprocess_exec(
        *pinned, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )


async def _one(session: aiohttp.ClientSession, url: str, n: int) -> tuple[float, float, int]:
    body = {"model": MODEL, "messages": [{"role": "user", "content": f"bench {n}"}]}
    started = time.perf_counter()
    first, chunks = 0.0, 0
    async with session.post(url + "/api/chat", json=body) as reply:
        async for _ in reply.content:
            if not chunks:
                first = time.perf_counter() - started
            chunks += 1
    return first, time.perf_counter() - started, chunks


async def _measure(url: str, concurrency: int, rounds: int) -> dict[str, float]:
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        await asyncio.gather(*(_one(session, url, n) for n in range(concurrency)))  # warm up
        results: list[tuple[float, float, int]] = []
        started = time.perf_counter()
        for round_ in range(rounds):
            results += await asyncio.gather(
                *(_one(session, url, round_ * concurrency + n) for n in range(concurrency))
            )
        elapsed = time.perf_counter() - started
    firsts = [first for first, _, _ in results]
    cuts = statistics.quantiles(firsts, n=100)
    return {
        "ttft_p50": cuts[49],
        "ttft_p99": cuts[98],
        "seconds": elapsed,
        "requests_per_s": len(results) / elapsed,
        "chunks_per_s": sum(chunks for _, _, chunks in results) / elapsed,
    }


WRK_SCRIPT = """
wrk.method = "POST"
wrk.body = '{"model": "llama3.2:3b", "messages": [{"role": "user", "content": "bench"}]}'
wrk.headers["Content-Type"] = "application/json"
"""


async def _wrk(url: str, connections: int, workdir: Path) -> dict[str, float] | None:
    """Requests/s and whole-reply latency from wrk on core 1, or None without wrk."""
    if shutil.which("wrk") is None:
        return None
    script = workdir / "chat.lua"
    script.write_text(WRK_SCRIPT)
    command = ["wrk", "-t1", f"-c{connections}", "-d5s", "--latency", "-s", str(script)]
    if shutil.which("taskset"):
        command = ["taskset", "-c", "1", *command]
    process = await asyncio.create_subprocess_exec(
        *command, url + "/api/chat", stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )
    output = (await process.communicate())[0].decode()
    found: dict[str, float] = {}
    for line in output.splitlines():
        words = line.split()
        if line.startswith("Requests/sec:"):
            found["requests_per_s"] = float(words[1])
        elif len(words) == 2 and words[0] in ("50%", "99%"):
            found[words[0]] = _seconds(words[1])
    return found


def _seconds(text: str) -> float:
    for unit, scale in (("us", 1e-6), ("ms", 1e-3), ("s", 1.0), ("m", 60.0)):
        if text.endswith(unit):
            return float(text[: -len(unit)]) * scale
    return float(text)


def _report_wrk(loaded: dict[str, dict[str, float] | None], tokens: int) -> None:
    if not any(loaded.values()):
        return
    print("  wrk (core 1), whole replies:")
    for name, f in loaded.items():
        if f:
            print(
                f"  {name:7} {f.get('requests_per_s', 0):8.0f} requests/s "
                f"{f.get('requests_per_s', 0) * (tokens + 1):9.0f} chunks/s   "
                f"latency p50 {f.get('50%', 0) * 1e3:7.2f} ms  p99 {f.get('99%', 0) * 1e3:7.2f} ms"
            )


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def main(concurrency: int, rounds: int, tokens: int) -> None:
    workdir = Path(tempfile.mkdtemp(prefix="fairgate-bench-"))
    sim_port, gateway_port, nginx_port = free_port(), free_port(), free_port()
    processes = []
    try:
        sim = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gateway", "sim", "--port", str(sim_port),
            "--parallel", "100000", "--prefill-tps", "0", "--decode-tps", "0",
            "--output-tokens", str(tokens), stdout=subprocess.DEVNULL,
        )  # fmt: skip
        processes.append(sim)
        sim_url = f"http://127.0.0.1:{sim_port}"
        policy = workdir / "fairgate.yaml"
        policy.write_text(
            f"defaults: {{max_concurrent: {concurrency * 2}, max_queued: 0}}\n"
            f"backends:\n  - {{name: sim, url: {sim_url}, kind: ollama, slots: 100000}}\n"
        )
        env = {
            **os.environ,
            "FAIRGATE_CONFIG": str(policy),
            "FAIRGATE_LISTEN": f"127.0.0.1:{gateway_port}",
            "FAIRGATE_LOG_LEVEL": "WARNING",
        }
        gateway = await _spawn(sys.executable, "-m", "gateway", "serve", env=env)
        processes.append(gateway)
        targets = {"direct": sim_url, "gateway": f"http://127.0.0.1:{gateway_port}"}
        if shutil.which("nginx"):
            conf = workdir / "nginx.conf"
            conf.write_text(NGINX_CONF.format(dir=workdir, sim=sim_port, port=nginx_port))
            processes.append(await _spawn("nginx", "-c", str(conf)))
            targets["nginx"] = f"http://127.0.0.1:{nginx_port}"
        for url in targets.values():
            await until_answers(url + "/", 20)
        figures = {}
        for name, url in targets.items():
            cpu_before = _cpu_seconds(gateway.pid)
            figures[name] = await _measure(url, concurrency, rounds)
            figures[name]["gateway_cpu"] = _cpu_seconds(gateway.pid) - cpu_before
        loaded = {name: await _wrk(url, concurrency, workdir) for name, url in targets.items()}
    finally:
        for process in reversed(processes):
            await stop(process)
    _report(figures, concurrency, rounds, tokens)
    _report_wrk(loaded, tokens)


def _report(
    figures: dict[str, dict[str, float]], concurrency: int, rounds: int, tokens: int
) -> None:
    requests = concurrency * rounds
    print(
        f"overhead: {concurrency} concurrent streaming chats x {rounds} rounds, {tokens} tokens "
        f"each, zero-delay backend; {os.cpu_count()} cores; gateway pinned to core 0"
    )
    print("  target   TTFT p50   TTFT p99    total s   requests/s     chunks/s")
    for name, f in figures.items():
        print(
            f"  {name:7} {f['ttft_p50'] * 1e3:8.2f}ms {f['ttft_p99'] * 1e3:8.2f}ms "
            f"{f['seconds']:9.2f} {f['requests_per_s']:11.0f} {f['chunks_per_s']:12.0f}"
        )
    direct = figures["direct"]
    for name in ("gateway", "nginx"):
        if name in figures:
            added = figures[name]
            print(
                f"  {name} adds TTFT p50 {(added['ttft_p50'] - direct['ttft_p50']) * 1e3:+.2f} ms, "
                f"p99 {(added['ttft_p99'] - direct['ttft_p99']) * 1e3:+.2f} ms"
            )
    cpu = figures["gateway"]["gateway_cpu"]
    print(
        f"  gateway CPU: {cpu:.2f} s for {requests} requests = {cpu / requests * 1e3:.2f} ms each"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=50)
    args = parser.parse_args()
    asyncio.run(main(args.concurrency, args.rounds, args.tokens))
