"""A household chatting with a real OpenAI-compatible server, on a clock, for a fixed time.

Light users ask a short question, read the answer, think a few seconds, ask again. A polite
heavy user sends one long prompt (about 1,200 tokens) at a time; a flooder sends bursts of
four at once and waits for the whole burst. Nobody starts a request after ``load_seconds``;
the run ends when every reply in flight has ended (the drain). Think times and prompts come
from one seed, so every run of a comparison sends the same words at the same moments of its
users' own timelines. Prompts are random words: no prompt cache can serve one from another.

Each reply is streamed (``/v1/chat/completions``, ``stream: true``) and timed: time to first
token from sending, the end, output tokens (the server's own count). Used by the real-engine
mode of benchmarks/fairness.py.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass, field

import aiohttp

__all__ = ["Household", "Reply", "run_household"]

_VOCABULARY = (
    "river stone cloud table window garden engine paper letter music silver orange forest "
    "bridge candle winter summer valley ocean market doctor pocket ladder basket kettle "
    "mirror button pillow rabbit tiger lemon carpet harbor island meadow planet rocket "
    "saddle tunnel violin wagon yellow zebra anchor barrel cactus dragon falcon"
)
_WORDS = _VOCABULARY.split()


@dataclass(frozen=True)
class Household:
    """Who is in the house and how they behave."""

    light_users: int = 3
    polite_heavy: bool = True  # one long prompt at a time
    flooder: bool = True  # bursts of long prompts
    burst: int = 4
    load_seconds: float = 60.0
    seed: int = 23
    think_seconds: tuple[float, float] = (2.0, 6.0)  # a light user reads and thinks
    light_words: int = 24  # with the chat template, about 60 prompt tokens
    light_output: int = 24
    heavy_words: int = 400  # a word and a number each: about 1,200 prompt tokens
    heavy_output: int = 32
    model: str = "smollm2"

    def users(self) -> list[str]:
        users = [f"light{n}" for n in range(self.light_users)]
        return users + ["polite"] * self.polite_heavy + ["flooder"] * self.flooder


@dataclass
class Reply:
    """One request as its client saw it; times in seconds from the start of the run."""

    user: str
    heavy: bool
    sent: float
    first_token: float | None = None
    ended: float | None = None
    status: int = 0
    output_tokens: int = 0
    prompt_tokens: int = 0

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.sent

    @property
    def served(self) -> bool:
        return self.status == 200 and self.first_token is not None


@dataclass
class _Run:
    url: str
    household: Household
    keys: dict[str, str] | None
    session: aiohttp.ClientSession
    started: float = field(default_factory=time.perf_counter)
    replies: list[Reply] = field(default_factory=list)

    def now(self) -> float:
        return time.perf_counter() - self.started

    def open(self) -> bool:
        return self.now() < self.household.load_seconds


async def run_household(url: str, household: Household, keys: dict[str, str] | None) -> list[Reply]:
    """Run ``household`` against ``url``; ``keys`` maps user names to API keys (None: none)."""
    # A connection per request: llama-server closes its end after a streamed reply, and a
    # request sent on a connection it just closed would fail.
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        run = _Run(url, household, keys, session)
        users = [_light(run, n) for n in range(household.light_users)]
        if household.polite_heavy:
            users.append(_polite(run))
        if household.flooder:
            users.append(_flooder(run))
        await asyncio.gather(*users)
    return run.replies


def _rng(household: Household, user: str) -> random.Random:
    return random.Random(f"{household.seed}:{user}")


def _text(rng: random.Random, words: int, numbered: bool) -> str:
    if numbered:
        return " ".join(f"{rng.choice(_WORDS)}{rng.randrange(100)}" for _ in range(words))
    return " ".join(rng.choice(_WORDS) for _ in range(words))


async def _light(run: _Run, n: int) -> None:
    house, user = run.household, f"light{n}"
    rng = _rng(house, user)
    await asyncio.sleep(rng.uniform(0, house.think_seconds[0]))  # not all at once
    while run.open():
        question = "In one sentence, what links these words? " + _text(
            rng, house.light_words, False
        )
        await _ask(run, user, False, question, house.light_output)
        await asyncio.sleep(rng.uniform(*house.think_seconds))


async def _polite(run: _Run) -> None:
    house, rng = run.household, _rng(run.household, "polite")
    while run.open():
        await _ask(run, "polite", True, _summary(rng, house), house.heavy_output)


async def _flooder(run: _Run) -> None:
    house, rng = run.household, _rng(run.household, "flooder")
    while run.open():
        burst = [_summary(rng, house) for _ in range(house.burst)]
        await asyncio.gather(*(_ask(run, "flooder", True, p, house.heavy_output) for p in burst))


def _summary(rng: random.Random, house: Household) -> str:
    return "Summarise this list: " + _text(rng, house.heavy_words, True)


async def _ask(run: _Run, user: str, heavy: bool, prompt: str, output: int) -> None:
    body = {
        "model": run.household.model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": output,
        "ignore_eos": True,  # llama-server's: every reply as long as asked, in every run
        "stream": True,
        "stream_options": {"include_usage": True},  # the server's own token counts
    }
    headers = {"Authorization": f"Bearer {run.keys[user]}"} if run.keys else {}
    reply = Reply(user, heavy, run.now())
    run.replies.append(reply)
    async with run.session.post(
        run.url + "/v1/chat/completions", json=body, headers=headers
    ) as response:
        reply.status = response.status
        if response.status != 200:
            await response.read()
            reply.ended = run.now()
            return
        async for line in response.content:
            if not line.startswith(b"data: {"):
                continue
            chunk = json.loads(line[6:])
            usage = chunk.get("usage")
            if usage:
                reply.output_tokens = usage.get("completion_tokens", 0)
                reply.prompt_tokens = usage.get("prompt_tokens", 0)
            for choice in chunk.get("choices", ()):
                if choice.get("delta", {}).get("content") and reply.first_token is None:
                    reply.first_token = run.now()
    reply.ended = run.now()
