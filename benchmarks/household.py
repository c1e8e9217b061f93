"""A household's mix of requests, driven against any Ollama-compatible URL and timed.

Light users chat one question at a time; a heavy user sends long prompts, either one at a
time (well behaved) or several at once (a flood). Each reply is streamed and timed: time to
first token (TTFT) from sending, gaps between tokens (ITL), tokens received. The heavy user
keeps going until every light user has finished, so the light users always share the box.
Used by benchmarks/fairness.py and by the end-to-end fairness test.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp

__all__ = ["Mix", "Outcome", "Route", "p95", "run_mix"]

MODEL = "llama3.2:3b"


@dataclass(frozen=True)
class Mix:
    light_users: int = 3
    light_chats: int = 8  # per light user, one after another
    light_prompt_chars: int = 160  # about 40 tokens
    light_output: int = 8
    heavy_streams: int = 6  # heavy requests the heavy user keeps in flight at once
    heavy_prompt_chars: int = 16_000  # about 4,000 tokens
    heavy_output: int = 16


@dataclass
class Outcome:
    """What one user saw."""

    user: str
    request_class: str
    ttft: list[float] = field(default_factory=list)
    gaps: list[float] = field(default_factory=list)
    tokens: int = 0
    refused: int = 0
    failed: int = 0


def p95(values: list[float]) -> float:
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=20, method="inclusive")[18]


# Where each request goes: one URL, or a user's name -> the URL of their next request (a
# household split across replicas, or a load balancer's round-robin).
Route = str | Callable[[str], str]


async def run_mix(url: Route, mix: Mix, keys: dict[str, str] | None = None) -> list[Outcome]:
    """Run the mix against ``url``; ``keys`` maps user names to API keys (None: no keys)."""
    lights = [Outcome(f"light{n}", "light") for n in range(mix.light_users)]
    heavy = Outcome("heavy", "heavy")
    done = asyncio.Event()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def light_user(outcome: Outcome, n: int) -> None:
            for chat in range(mix.light_chats):
                prompt = f"{outcome.user} question {chat}: " + "why " * (
                    mix.light_prompt_chars // 4
                )
                await _stream(session, url, outcome, prompt, mix.light_output, keys)

        async def heavy_stream(stream: int) -> None:
            turn = 0
            while not done.is_set():
                # Vary the prompt so no cache could serve it.
                prompt = f"summary {stream}.{turn}: " + "text " * (mix.heavy_prompt_chars // 5)
                await _stream(session, url, heavy, prompt, mix.heavy_output, keys)
                turn += 1

        flood = [asyncio.create_task(heavy_stream(n)) for n in range(mix.heavy_streams)]
        await asyncio.gather(*(light_user(outcome, n) for n, outcome in enumerate(lights)))
        done.set()
        await asyncio.gather(*flood)
    return [*lights, heavy]


async def _stream(
    session: aiohttp.ClientSession,
    route: Route,
    outcome: Outcome,
    prompt: str,
    output_tokens: int,
    keys: dict[str, str] | None,
) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": prompt}],
        "options": {"num_predict": output_tokens},
    }
    headers = {"Authorization": f"Bearer {keys[outcome.user]}"} if keys else {}
    url = route if isinstance(route, str) else route(outcome.user)
    sent = time.perf_counter()
    async with session.post(url + "/api/chat", json=body, headers=headers) as reply:
        if reply.status == 503:
            outcome.refused += 1
            await reply.read()
            return
        if reply.status != 200:
            outcome.failed += 1
            await reply.read()
            return
        last = None
        async for line in reply.content:
            chunk = json.loads(line)
            if chunk.get("error"):
                outcome.failed += 1
                return
            if chunk.get("done") or not chunk.get("message", {}).get("content"):
                continue
            now = time.perf_counter()
            if last is None:
                outcome.ttft.append(now - sent)
            else:
                outcome.gaps.append(now - last)
            last = now
            outcome.tokens += 1
