"""Conversations that carry tool schemas, classed and charged by what the engine evaluates.

Three people each hold a five-turn conversation at once, OpenAI-style (streamed
``/v1/chat/completions``), every turn sending the whole history again with 18 tool schemas
(about 2,500 tokens), reading a second between turns; an engine of 2 slots. Three runs,
one after another, each on a fresh engine:

1. with the tools, through the gateway;
2. without them, through the gateway;
3. with the tools, straight to the engine.

Printed per run: TTFT p50 and p95 of turns 2-5 (people's). For run 1: the classes of turns
2-5; the gateway's estimate of what the engine would evaluate, against what it evaluated
(its ``timings``: ``prompt_n``, the cache read ``cache_n``), and the charge the fair
scheduler kept; the most people running at once; the waiting estimates' median error
(``/status``'s ``queue.estimates``).

``--engine llama-server`` (the default) runs the real one: SmolLM2-135M on the CPU,
``-np 2``, 16,384 tokens of context, and a ChatML template that renders the tools (SmolLM2's
own drops them). ``--engine sim``: fairsim's llama-server, whose slots keep their prompts.

    .venv/bin/python -m benchmarks.prompt_cache [--engine sim]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from benchmarks.openwebui import TOOLS
from fairsim import SimConfig, Simulator
from gateway.app import SERVICES, bound_url, create_app, start_server
from gateway.config.policy import parse_policy
from gateway.config.settings import Settings
from gateway.core import Lane
from gateway.core.logs import configure_logging
from gateway.edge import RequestRecord
from gateway.edge.http.connections import Listener
from tests.llama_server import MODEL_ALIAS, running_llama_server

PEOPLE, TURNS = ("alice", "bob", "carol"), 5
READING_SECONDS = 1.0
REPLY_TOKENS = 24
CHAT_TOOLS = TOOLS[:18]
SYSTEM = "You are a helpful assistant in a family's home. Answer briefly."
# SmolLM2's template drops tools; this one writes them into the system turn, as Qwen2.5's
# and Llama 3's do (compact JSON, one a line).
TEMPLATE = """\
{%- if messages[0].role == 'system' %}{%- set system = messages[0].content %}\
{%- set rest = messages[1:] %}{%- else %}{%- set system = '' %}{%- set rest = messages %}\
{%- endif %}
{%- if tools %}<|im_start|>system
{{ system }}

# Tools

You may call one or more functions to assist with the user query. The function signatures \
are within <tools></tools>:
<tools>
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}
</tools><|im_end|>
{% elif system %}<|im_start|>system
{{ system }}<|im_end|>
{% endif %}
{%- for message in rest %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}
"""
SIM = SimConfig(
    flavor="llamacpp",
    parallel=2,
    models=[MODEL_ALIAS],
    prefill_tokens_per_s=270.0,  # this machine's llama-server, SmolLM2-135M on 2 cores
    decode_tokens_per_s=50.0,
    slot_save=True,
)


@dataclass
class Turn:
    person: str
    number: int  # 1 to TURNS
    ttft: float
    timings: dict[str, Any] = field(default_factory=dict)  # the engine's, from its last event


@dataclass
class Run:
    name: str
    turns: list[Turn] = field(default_factory=list)
    records: list[RequestRecord] = field(default_factory=list)  # the gateway's, if any
    most_people_running: int = 0  # in the gateway's books
    most_slots_processing: int = 0  # in the engine's own (its /slots, sampled)
    samples_busy: int = 0  # of those samples, with any slot processing
    samples_both: int = 0  # with two
    copies: int = 0  # of a slot's prompt into another, by the gateway
    median_error: float | None = None
    error_samples: int = 0

    def later_ttft(self) -> list[float]:
        return [t.ttft for t in self.turns if t.number > 1]


async def _conversation(
    session: aiohttp.ClientSession, url: str, person: str, tools: bool, run: Run
) -> None:
    messages: list[dict[str, str]] = [{"role": "system", "content": SYSTEM}]
    for number in range(1, TURNS + 1):
        messages.append({"role": "user", "content": f"{person} asks question {number}."})
        body: dict[str, Any] = {
            "model": MODEL_ALIAS,
            "messages": messages,
            "stream": True,
            "max_tokens": REPLY_TOKENS,
        }
        if tools:
            body["tools"] = CHAT_TOOLS
        headers = {"Authorization": f"Bearer {person}-key"}
        started = time.monotonic()
        ttft, text, timings = None, [], {}
        async with session.post(url + "/v1/chat/completions", json=body, headers=headers) as reply:
            assert reply.status == 200, await reply.text()
            async for line in reply.content:
                if not line.startswith(b"data: {"):
                    continue
                if ttft is None:
                    ttft = time.monotonic() - started
                event = json.loads(line[6:])
                timings = event.get("timings", timings)
                for choice in event["choices"]:
                    text.append(choice.get("delta", {}).get("content") or "")
        run.turns.append(Turn(person, number, ttft or float("nan"), timings))
        messages.append({"role": "assistant", "content": "".join(text)})
        await asyncio.sleep(READING_SECONDS)


@asynccontextmanager
async def _engine(kind: str, workdir: Path) -> AsyncIterator[str]:
    if kind == "sim":
        runner = await start_server(Simulator(SIM).make_app(), "127.0.0.1", 0)
        try:
            yield bound_url(runner)
        finally:
            await runner.cleanup()
        return
    template = workdir / "chatml-tools.jinja"
    template.write_text(TEMPLATE)
    saved = workdir / "slots"  # where the gateway copies a warm slot's prompt to a cold one
    saved.mkdir(exist_ok=True)
    extra = ("--jinja", "--chat-template-file", str(template), "--slot-save-path", str(saved))
    async with running_llama_server(
        workdir / "llama-server.log", slots=2, context=16384, extra=extra
    ) as server:
        yield server.url


def _policy(url: str) -> str:
    users = "".join(f"  {name}: {{keys: [{name}-key]}}\n" for name in PEOPLE)
    return (
        "defaults: {max_concurrent: 1, max_queued: 2}\n"
        "timeouts: {first_byte: 300s}\nqueue: {max_wait: 300s}\n"
        f"users:\n{users}backends:\n  - {{name: cpp, url: {url}, kind: llamacpp}}\n"
    )


async def _run(name: str, kind: str, workdir: Path, *, tools: bool, direct: bool) -> Run:
    run = Run(name)
    async with (
        _engine(kind, workdir) as engine_url,
        aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(force_close=True),
            timeout=aiohttp.ClientTimeout(total=None),
        ) as session,
    ):
        sampling = asyncio.ensure_future(_sample_slots(session, engine_url, run))
        try:
            if direct:
                await asyncio.gather(
                    *(_conversation(session, engine_url, p, tools, run) for p in PEOPLE)
                )
            else:
                await _through_gateway(session, engine_url, tools, run)
        finally:
            sampling.cancel()
    return run


async def _through_gateway(
    session: aiohttp.ClientSession, engine_url: str, tools: bool, run: Run
) -> None:
    app = create_app(Settings(log_level="WARNING"), parse_policy(_policy(engine_url)))
    services = app[SERVICES]
    services.on_finished.append(run.records.append)
    listener = Listener(app, services.settings, services.connections)
    await listener.start(port=0)
    admission = services.admission
    people = admission.room.runs(Lane.INTERACTIVE)
    watch = asyncio.ensure_future(_watch(admission.changed, people, run))
    try:
        await asyncio.gather(*(_conversation(session, listener.url, p, tools, run) for p in PEOPLE))
    finally:
        watch.cancel()
        estimates = admission.snapshot().estimates
        run.median_error, run.error_samples = estimates.median_error, estimates.samples
        run.copies = admission.room.prompts.copies["cpp"]
        await listener.close()


async def _sample_slots(session: aiohttp.ClientSession, url: str, run: Run) -> None:
    """How many of the engine's slots process at once, by its own /slots, every 100 ms (a
    sample, not every moment)."""
    while True:
        async with session.get(url + "/slots") as reply:
            slots = await reply.json() if reply.status == 200 else []
        busy = sum(1 for slot in slots if slot.get("is_processing"))
        run.most_slots_processing = max(run.most_slots_processing, busy)
        run.samples_busy += busy > 0
        run.samples_both += busy > 1
        await asyncio.sleep(0.1)


async def _watch(changed: Callable[[], asyncio.Future[None]], people: Any, run: Run) -> None:
    """The most people running at once, at every change of the room's counts."""
    while True:
        await changed()
        run.most_people_running = max(run.most_people_running, sum(people.values()))


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def report(runs: list[Run]) -> str:
    lines = []
    for run in runs:
        later = run.later_ttft()
        lines.append(
            f"{run.name}: TTFT of turns 2-{TURNS}: p50 {_p(later, 0.5):.2f} s, "
            f"p95 {_p(later, 0.95):.2f} s ({len(later)} turns); the engine's slots "
            f"processing at once, at most {run.most_slots_processing} (both in "
            f"{run.samples_both} of the {run.samples_busy} samples with any)"
        )
    tools, bare, direct = runs
    slower = max(_p(bare.later_ttft(), 0.95), _p(direct.later_ttft(), 0.95))
    ratio = _p(tools.later_ttft(), 0.95) / slower
    lines.append(
        f"  with tools through the gateway / the slower of the other two (p95): {ratio:.2f}x "
        f"({'within' if ratio <= 1.5 else 'NOT within'} 1.5x)"
    )
    lines += _costs(tools)
    return "\n".join(lines)


def _costs(run: Run) -> list[str]:
    # The gateway's records in the order the turns ended; the engine's timings by turn.
    later = [r for r in run.records if r.path == "/v1/chat/completions"]
    turns = sorted(run.turns, key=lambda t: (t.person, t.number))
    records = sorted(later, key=lambda r: (r.user or "", r.arrived))
    pairs = [(t, r) for t, r in zip(turns, records, strict=True) if t.number > 1]
    classes = statistics.multimode(str(r.request_class) for _, r in pairs)
    evaluated = [t.timings.get("prompt_n", 0) for t, _ in pairs]
    cached = [t.timings.get("cache_n", 0) for t, _ in pairs]
    estimated = [r.uncached_estimate or 0 for _, r in pairs]
    ratios = [e / max(1, v) for e, v in zip(estimated, evaluated, strict=True)]
    whole = [r.input_estimate or 0 for _, r in pairs]
    light = sum(str(r.request_class) == "light" for _, r in pairs)
    error = "none measured" if run.median_error is None else f"{run.median_error:.0%}"
    return [
        f"  turns 2-{TURNS} with tools: {light} of {len(pairs)} light (most: {classes}); the "
        f"engine evaluated {sum(evaluated):,} prompt tokens and read {sum(cached):,} from "
        f"its cache",
        f"  the gateway estimated {sum(estimated):,} to evaluate (per turn, median "
        f"{statistics.median(ratios):.2f}x, max {max(ratios):.2f}x the engine's count); without "
        f"the cache it would "
        f"have charged {sum(whole):,}; it charged the engine's count once each reply said it",
        f"  people running at once, at most: {run.most_people_running} in the gateway's books; "
        f"slot copies made: {run.copies}",
        f"  waiting estimates (people's): median error {error} over {run.error_samples} waits",
    ]


async def compare(kind: str) -> list[Run]:
    with tempfile.TemporaryDirectory(prefix="fairgate-prompt-cache-") as folder:
        workdir = Path(folder)
        return [
            await _run("with tools, through the gateway", kind, workdir, tools=True, direct=False),
            await _run("without tools, through the gateway", kind, workdir, tools=False,
                       direct=False),
            await _run("with tools, straight to the engine", kind, workdir, tools=True,
                       direct=True),
        ]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=("llama-server", "sim"), default="llama-server")
    args = parser.parse_args()
    configure_logging("json", "WARNING")
    print(f"engine: {args.engine}; {len(PEOPLE)} people, {TURNS} turns each, 2 slots")
    print(report(asyncio.run(compare(args.engine))))


if __name__ == "__main__":
    main()
