"""The household on a real engine: llama-server (SmolLM2-135M, 2 slots, 2 CPU threads).

Four runs, one after another, each on a fresh server, the same seed for every one:

1. the light users alone, direct: what a quiet house gives them;
2. the light users and one polite heavy user, direct: the reference, what light users get
   beside heavy work that behaves;
3. the whole household (a flooder too), direct: llama.cpp's own first come, first served;
4. the whole household through the gateway (``fair``, heavy requests on at most 1 of the 2
   slots, caps that let the flooder keep its whole burst in flight or waiting).

The gateway runs as its own process (``fairgate serve``), writing its access log (JSON) to a
file whose path is printed: request by request, the class, the wait in the gateway, TTFT.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import aiohttp

from benchmarks.chat_household import Household, Reply, run_household
from tests.llama_server import running_llama_server
from tests.processes import free_port, stop, until_answers

__all__ = ["EngineRun", "compare_on_llama_server", "report_table"]


@dataclass
class EngineRun:
    name: str
    replies: list[Reply]
    seconds: float  # from the first request to the end of the last reply, over every round
    others_cpu: list[float]  # per round: the share of all cores other processes used
    access_log: Path | None = None

    def add(self, other: EngineRun) -> None:
        """Pool another round of the same run into this one."""
        self.replies += other.replies
        self.seconds += other.seconds
        self.others_cpu += other.others_cpu
        self.access_log = other.access_log or self.access_log

    def ttfts(self, heavy: bool) -> list[float]:
        return [r.ttft for r in self.replies if r.heavy == heavy and r.ttft is not None]

    def served(self, heavy: bool) -> int:
        return sum(1 for r in self.replies if r.heavy == heavy and r.served)

    def refused(self) -> int:
        return sum(1 for r in self.replies if r.status != 200)

    def tokens_per_s(self, heavy: bool | None = None) -> float:
        tokens = sum(r.output_tokens for r in self.replies if heavy in (None, r.heavy))
        return tokens / self.seconds


def _policy(backend_url: str, household: Household) -> str:
    users = "".join(f"  light{n}: {{keys: [light{n}-key]}}\n" for n in range(household.light_users))
    return (
        "scheduling: fair\n"
        # Light questions estimate at under 100 tokens, the long prompts at over 800.
        "classes: {heavy: {min_prompt_tokens: 400, max_slots: 1}}\n"
        "defaults: {max_concurrent: 1, max_queued: 1}\n"
        "queue: {max_depth: 32, max_wait: 600s}\n"
        "timeouts: {first_byte: 600s}\n"
        f"users:\n{users}"
        "  polite: {keys: [polite-key]}\n"
        f"  flooder: {{keys: [flooder-key], max_concurrent: {household.burst}, "
        f"max_queued: {household.burst}}}\n"
        f"backends:\n  - {{name: cpp, url: {backend_url}, kind: llamacpp}}\n"
    )


class OthersCpu:
    """How much of the machine's CPU other processes (not the engine, not the gateway, not
    this client) used from now until ``share()``: a 2-core machine shared with others gives
    the engine less in one run than in the next, and this says by how much."""

    def __init__(self, pids: list[int]) -> None:
        self._pids = [os.getpid(), *pids]
        self._start = self._sample()

    def _sample(self) -> tuple[int, int, int]:
        fields = [int(f) for f in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        busy = sum(fields) - fields[3] - fields[4]  # everything but idle and iowait
        ours = 0
        for pid in self._pids:
            stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            ours += int(stat[11]) + int(stat[12])  # utime, stime
        return sum(fields), busy, ours

    def share(self) -> float:
        (total, busy, ours), (total0, busy0, ours0) = self._sample(), self._start
        others = (busy - busy0) - (ours - ours0)
        return max(0.0, others) / (total - total0) if total > total0 else 0.0


@asynccontextmanager
async def _gateway(
    workdir: Path, backend_url: str, household: Household
) -> AsyncIterator[tuple[str, int]]:
    """``fairgate serve`` in front of ``backend_url``, once it knows the backend's slots."""
    policy = workdir / "fairgate.yaml"
    policy.write_text(_policy(backend_url, household))
    port = free_port()
    env = {
        **os.environ,
        "FAIRGATE_CONFIG": str(policy),
        "FAIRGATE_LISTEN": f"127.0.0.1:{port}",
        "FAIRGATE_LOG_FORMAT": "json",
        "FAIRGATE_LOG_LEVEL": "INFO",
    }
    log_path = workdir / "gateway.log"
    with log_path.open("wb") as log:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gateway", "serve", env=env,
            stdout=subprocess.DEVNULL, stderr=log,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        await until_answers(url + "/readyz", 60, process, log_path)
        await _until_slots_known(url)
        yield url, process.pid
    finally:
        await stop(process)


async def _until_slots_known(url: str) -> None:
    # The gateway reads llama-server's slots from /props at its first probe; a process in
    # another address space has no event to wait on but its /status.
    async with aiohttp.ClientSession() as session:
        for _ in range(600):
            async with session.get(url + "/status") as reply:
                backend = (await reply.json())["backends"]["cpp"]
            if backend["slots"]:
                return
            await asyncio.sleep(0.1)
    raise TimeoutError("the gateway did not learn llama-server's slots within 60 s")


async def _run(
    name: str, household: Household, parent: Path, gateway: bool, threads: int
) -> EngineRun:
    """One run on a fresh llama-server; its logs and the client's own record of each request
    (``replies.json``) are left in a directory of ``parent``."""
    workdir = Path(tempfile.mkdtemp(prefix="gateway-" if gateway else "direct-", dir=parent))
    async with running_llama_server(workdir / "llama-server.log", threads=threads) as server:
        if not gateway:
            others = OthersCpu([server.pid])
            run = _timed(name, await run_household(server.url, household, None), others.share())
        else:
            async with _gateway(workdir, server.url, household) as (url, pid):
                keys = {user: f"{user}-key" for user in household.users()}
                others = OthersCpu([server.pid, pid])
                run = _timed(name, await run_household(url, household, keys), others.share())
            run.access_log = workdir / "gateway.log"
    trace = json.dumps([asdict(reply) for reply in run.replies], indent=0)
    (workdir / "replies.json").write_text(trace)
    return run


def _timed(name: str, replies: list[Reply], others_cpu: float) -> EngineRun:
    ended = max((r.ended for r in replies if r.ended is not None), default=0.0)
    return EngineRun(name, replies, ended, [others_cpu])


async def compare_on_llama_server(
    household: Household, rounds: int = 1, threads: int = 2
) -> list[EngineRun]:
    """The four runs, one after another, each on a fresh llama-server; ``rounds`` times, each
    round with the next seed, the replies of each run pooled over the rounds (so that other
    load on the machine falls on all four alike)."""
    workdir = Path(tempfile.mkdtemp(prefix="fairgate-fairness-"))
    runs: list[EngineRun] = []
    for round_ in range(rounds):
        house = replace(household, seed=household.seed + round_)
        polite_only = replace(house, flooder=False)
        plan = [
            ("light users alone, direct", replace(polite_only, polite_heavy=False), False),
            ("light + one polite heavy user, direct (the reference)", polite_only, False),
            ("whole household, direct (llama.cpp FIFO)", house, False),
            (
                "whole household through the gateway (fair, heavy on at most 1 of 2 slots)",
                house,
                True,
            ),
        ]
        for index, (name, mix, gateway) in enumerate(plan):
            run = await _run(name, mix, workdir, gateway, threads)
            if round_ == 0:
                runs.append(run)
            else:
                runs[index].add(run)
    return runs


def _p(values: list[float], q: int) -> float:
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def _s(seconds: float) -> str:
    return "-" if seconds != seconds else f"{seconds:.2f} s"


def report_table(runs: list[EngineRun]) -> str:
    """The table of the four runs, then the ratios the acceptance is stated in."""
    lines = [
        "| run | light TTFT p50 | light p95 | light served | heavy TTFT p95 | heavy tokens/s "
        "| tokens/s | refused | others' CPU |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        light, heavy = run.ttfts(heavy=False), run.ttfts(heavy=True)
        lines.append(
            f"| {run.name} | {_s(_p(light, 50))} | {_s(_p(light, 95))} | "
            f"{run.served(heavy=False)} | {_s(_p(heavy, 95))} | "
            f"{run.tokens_per_s(heavy=True):.1f} | {run.tokens_per_s():.1f} | {run.refused()} | "
            f"{' '.join(f'{share:.0%}' for share in run.others_cpu)} |"
        )
    _, reference, fifo, gateway = runs
    light_p95 = {run.name: _p(run.ttfts(heavy=False), 95) for run in runs}
    lines += [
        "",
        "gateway light p95 / reference: "
        f"{_ratio(light_p95[gateway.name], light_p95[reference.name]):.2f}x (target <= 1.25)",
        "gateway light served / reference: "
        f"{_ratio(gateway.served(False), reference.served(False)):.0%} (target >= 90%)",
        "gateway heavy tokens/s / direct FIFO: "
        f"{_ratio(gateway.tokens_per_s(True), fifo.tokens_per_s(True)):.0%} (target >= 80%)",
        "direct FIFO light p95 / gateway: "
        f"{_ratio(light_p95[fifo.name], light_p95[gateway.name]):.2f}x (target >= 2)",
        f"gateway access log: {gateway.access_log}; each run's requests: replies.json beside",
    ]
    return "\n".join(lines)


def _ratio(value: float, reference: float) -> float:
    return value / reference if reference else float("nan")


def light_waits(access_log: Path) -> str:
    """The gateway's own account of where light requests waited (its access log)."""
    waits: dict[str, list[float]] = {"light": [], "heavy": []}
    for line in access_log.read_text().splitlines():
        entry = json.loads(line)
        if entry.get("event") == "request" and entry.get("queue_wait_s") is not None:
            waits.setdefault(entry["class"], []).append(entry["queue_wait_s"])
    return ", ".join(
        f"{name} waited in the gateway p50 {_s(_p(values, 50))}, p95 {_s(_p(values, 95))}"
        for name, values in waits.items()
        if values
    )


async def _until_done_or_terminated(
    household: Household, rounds: int, threads: int
) -> list[EngineRun]:
    # SIGTERM (and SIGINT, which a background job ignores) cancel the runs, so that the
    # servers they started are stopped on the way out, not left running.
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, task.cancel)
    return await compare_on_llama_server(household, rounds, threads)


def main(household: Household, rounds: int, threads: int) -> None:
    started = time.perf_counter()
    try:
        runs = asyncio.run(_until_done_or_terminated(household, rounds, threads))
    except asyncio.CancelledError:
        raise SystemExit("cancelled; the servers it started are stopped") from None
    print(report_table(runs))
    if runs[-1].access_log is not None:
        print(light_waits(runs[-1].access_log))
    print(f"({time.perf_counter() - started:.0f} s in all)")
