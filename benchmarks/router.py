"""Two models on llama-server's router, for real: a family chatting on one, a coder on the
other, memory (``--models-max 1``) for one at a time. Straight to the router, then through
the gateway (``kind: llamacpp-router``), each on a fresh router, side by side in one run.

The router on its own switches at every change of model: a coder's request stops the
family's child (it finishes what it runs) and loads the coder's, and the family's next
question loads theirs back. Through the gateway, swaps are rationed (``swap_due``): while
the family's model is in use, the coder's request waits what the switch would cost the
house (the two loads), and whatever gathered for either model meanwhile goes in one load.

Prints, per run: requests, the family's light TTFT p50/p95, the coder's TTFT p95 and
replies, 5xx reaching a client, and the router's loads (its log's "spawning server
instance" lines); then the ratios. SmolLM2-135M on the CPU, 2 slots per child. With
SWAP_AFTER (``40s``), a third run through a gateway whose backend holds a switch that
long (``swap_after``) while the family's model is in use: what a longer hold buys. A
person waits at most 40 s for a swap here (a third of ``max_wait``, 120 s); a hold that
long wants a run of a few minutes, so that the visits it rations are not all past the end.

    .venv/bin/python -m benchmarks.router [SECONDS [SWAP_AFTER]]
"""

from __future__ import annotations

import asyncio
import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from benchmarks.household import p95
from gateway.app import bound_url, create_app, start_server
from gateway.config.policy import parse_policy
from gateway.config.settings import Settings
from gateway.core.logs import configure_logging
from tests.llama_server import running_llama_router

__all__ = ["Person", "main", "run"]

FAMILY, CODER = "family", "coder"


@dataclass(frozen=True)
class Person:
    name: str
    model: str
    tokens: int
    think: tuple[float, float]  # seconds between a reply and the next question


PEOPLE = (
    Person("mum", FAMILY, 16, (0.5, 2.0)),
    Person("dad", FAMILY, 16, (0.5, 2.0)),
    Person("kid", FAMILY, 16, (0.5, 2.0)),
    Person("coder", CODER, 48, (1.0, 3.0)),
)


@dataclass
class Seen:
    person: Person
    ttft: list[float] = field(default_factory=list)
    failed: list[int] = field(default_factory=list)  # statuses of replies that were not 200


@dataclass
class Run:
    name: str
    seen: list[Seen]
    loads: int

    def of(self, model: str) -> list[float]:
        return [t for s in self.seen if s.person.model == model for t in s.ttft]

    def server_errors(self) -> int:
        return sum(1 for s in self.seen for status in s.failed if status >= 500)


def _policy(url: str, swap_after: str | None) -> str:
    users = "".join(f"  {p.name}: {{keys: [{p.name}-key]}}\n" for p in PEOPLE)
    return (
        "monitoring: {interval: 500ms}\n"
        "defaults: {max_concurrent: 1, max_queued: 2}\n"
        "queue: {max_depth: 16, max_wait: 120s}\n"
        "timeouts: {first_byte: 60s}\n"
        f"users:\n{users}"
        f"backends:\n  - {{name: router, url: {url}, kind: llamacpp-router"
        + (f", swap_after: {swap_after}}}\n" if swap_after else "}\n")
    )


async def _person(
    session: aiohttp.ClientSession, url: str, seen: Seen, keyed: bool, until: float, seed: int
) -> None:
    person, rng = seen.person, random.Random(seed)
    headers = {"Authorization": f"Bearer {person.name}-key"} if keyed else {}
    turn = 0
    while time.perf_counter() < until:
        body = {
            "model": person.model,
            "messages": [{"role": "user", "content": f"{person.name} {turn}: tell me a story"}],
            "max_tokens": person.tokens,
            "ignore_eos": True,
            "stream": True,
        }
        sent = time.perf_counter()
        async with session.post(url + "/v1/chat/completions", json=body, headers=headers) as reply:
            if reply.status != 200:
                seen.failed.append(reply.status)
                await reply.read()
            else:
                first = True
                async for line in reply.content:
                    if first and line.startswith(b"data: {") and b'"content"' in line:
                        seen.ttft.append(time.perf_counter() - sent)
                        first = False
        turn += 1
        await asyncio.sleep(rng.uniform(*person.think))


async def run(
    seconds: float, through_gateway: bool, workdir: Path, swap_after: str | None = None
) -> Run:
    """One run on a fresh router: ``seconds`` of the household, direct or through a gateway
    (with the backend's ``swap_after``, if given)."""
    name = "through the gateway" if through_gateway else "direct to the router"
    if swap_after:
        name = f"swap_after: {swap_after}"
    directory = workdir / (f"gateway{swap_after or ''}" if through_gateway else "direct")
    async with running_llama_router(directory) as router:
        url, runner = router.url, None
        if through_gateway:
            app = create_app(Settings(log_level="ERROR"), parse_policy(_policy(url, swap_after)))
            runner = await start_server(app, "127.0.0.1", 0)
            url = bound_url(runner)
        seen = [Seen(p) for p in PEOPLE]
        try:
            async with aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0),
                timeout=aiohttp.ClientTimeout(total=120),
            ) as session:
                # The family's model is loaded before the clock starts, in both runs alike.
                warm = {"model": FAMILY, "messages": [{"role": "user", "content": "hi"}]}
                headers = {"Authorization": "Bearer mum-key"} if through_gateway else {}
                async with session.post(
                    url + "/v1/chat/completions", json=warm | {"max_tokens": 1}, headers=headers
                ) as reply:
                    await reply.read()
                until = time.perf_counter() + seconds
                await asyncio.gather(
                    *(
                        _person(session, url, s, through_gateway, until, n)
                        for n, s in enumerate(seen)
                    )
                )
        finally:
            if runner is not None:
                await runner.cleanup()
        log = (directory / "router.log").read_text(errors="replace")
    return Run(name, seen, log.count("spawning server instance with name=") - 1)  # not the warm-up


def _ms(values: list[float], q: str) -> str:
    if not values:
        return "     -"
    return f"{(statistics.median(values) if q == 'p50' else p95(values)) * 1000:6.0f}"


def report(runs: list[Run]) -> str:
    lines = []
    for r in runs:
        family, coder = r.of(FAMILY), r.of(CODER)
        coder_seen = next(s for s in r.seen if s.person.model == CODER)
        lines.append(
            f"  {r.name:22} family light TTFT p50 {_ms(family, 'p50')} ms p95 "
            f"{_ms(family, 'p95')} ms ({len(family)} replies); coder TTFT p95 "
            f"{_ms(coder, 'p95')} ms ({len(coder)} replies, {len(coder_seen.failed)} not "
            f"served); 5xx {r.server_errors()}; the router's loads {r.loads}"
        )
    direct = runs[0]
    for gate in runs[1:]:
        lines.append(
            f"  => {gate.name}: the family's light p95 "
            f"{p95(direct.of(FAMILY)) / p95(gate.of(FAMILY)):.1f}x lower than direct; "
            f"loads {gate.loads / max(1, direct.loads):.2f}x direct's"
        )
    return "\n".join(lines)


async def compare(seconds: float, swap_after: str | None) -> str:
    with tempfile.TemporaryDirectory(prefix="fairgate-router-") as workdir:
        runs = [
            await run(seconds, through_gateway=False, workdir=Path(workdir)),
            await run(seconds, through_gateway=True, workdir=Path(workdir)),
        ]
        if swap_after:
            runs.append(await run(seconds, True, Path(workdir), swap_after))
    return report(runs)


def main() -> None:
    configure_logging("json", "ERROR")
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 60.0
    swap_after = sys.argv[2] if len(sys.argv) > 2 else None
    print(__doc__.split("\n\n")[0])
    print(f"{seconds:g} s per run", flush=True)
    print(asyncio.run(compare(seconds, swap_after)))


if __name__ == "__main__":
    main()
