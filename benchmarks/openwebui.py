"""Open WebUI's traffic, replayed: two people chatting, each message with its background tasks.

Per message Open WebUI sends the person's chat (streamed, with ~25 KB of tool schemas) and,
after the reply, a follow-ups task; on a chat's first message also a title task, sent at the
same moment as the chat and usually arriving first, and a tags task after the reply (see
the captures in ../shared/samples/open-webui/). The task bodies here are those captures.

Two people at ``max_concurrent: 1, max_queued: 1`` on a backend of 2 slots, 2 chats of 5
messages each per person (20 messages), a few seconds of reading between messages. Four
runs, one after another:

1. tasks off: the chats alone, the reference;
2. tasks on, no lanes setting at all: the defaults (the open-webui preset is on, and
   background work gives its slot to a person who would wait for it);
3. tasks on, the Open WebUI lanes setting of docs/open-webui.md;
4. tasks on, lanes turned off (``presets: []``): what the defaults spare the people.

Printed per run: the people's chats answered and refused, their TTFT p50/p95 against the
reference (and whether p95 is within 1.2x + 50 ms of it); the tasks done and refused; how
often background work gave its slot up, the slot time that threw away and the prompt
tokens the engine read again.

``--engine sim`` (the default) runs the simulated Ollama on ``/api/chat`` with Open WebUI's
36 tool schemas in every chat; ``--engine llama-server`` the real llama-server
(SmolLM2-135M, 2 slots, on the CPU) on ``/v1/chat/completions``, without the tools (its
4096 tokens of context would not hold them).

    .venv/bin/python -m benchmarks.openwebui [--engine llama-server] [--no-tools]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import aiohttp

from fairsim import SimConfig, Simulator
from gateway.app import SERVICES, bound_url, create_app, start_server
from gateway.config.policy import parse_policy
from gateway.config.settings import Settings
from gateway.core.logs import configure_logging
from gateway.edge.http.connections import Listener
from tests.llama_server import MODEL_ALIAS, running_llama_server

MODEL = "llama3.2:3b"
SAMPLES = Path(__file__).resolve().parents[1] / "tests" / "samples" / "open-webui"
PEOPLE = ("alice", "bob")
CHATS, MESSAGES = 2, 5
READING_SECONDS = 3.0  # between a reply and the person's next message
TASK_TOKENS = 30  # a title or tag list: the simulator has no end-of-text, so it is capped
SIM = SimConfig(parallel=2, prefill_tokens_per_s=4000.0, decode_tokens_per_s=40.0)


@dataclass(frozen=True)
class Engine:
    """Where the replay runs: its model, its route, and what a chat carries."""

    name: str
    model: str
    path: str
    kind: str
    tools: bool


SIM_ENGINE = Engine("the simulator", MODEL, "/api/chat", "ollama", tools=True)
LLAMA_ENGINE = Engine("llama-server", MODEL_ALIAS, "/v1/chat/completions", "llamacpp", False)

# docs/open-webui.md's Open WebUI example (its lanes part), as an admin would copy it.
DOCUMENTED_LANES = (
    "lanes:\n"
    "  presets: [open-webui]\n"
    "  interactive: {max_wait: 20s}\n"
    "  background: {max_concurrent: 1, max_queued: 8, max_wait: 120s}\n"
)


@dataclass
class Tally:
    chat_ttft: list[float] = field(default_factory=list)
    chats_refused: int = 0
    tasks_done: int = 0
    tasks_refused: int = 0
    tasks_refused_with_nobody_waiting: int = 0
    restarts: int = 0
    wasted_slot_seconds: float = 0.0
    wasted_prompt_tokens: float = 0.0
    estimate_error: float | None = None  # the waiting estimates' median error (/status)
    estimated_waits: int = 0


def _task(name: str) -> dict[str, Any]:
    body: dict[str, Any] = json.loads((SAMPLES / f"{name}-request.json").read_text())
    body["options"] = {**body.get("options", {}), "num_predict": TASK_TOKENS}
    return body


def _tools() -> list[dict[str, Any]]:
    """36 tool schemas of Open WebUI's size and shape."""
    parameters = {
        "type": "object",
        "properties": {
            "query": {"type": "string", "description": "what to look for"},
            "count": {"type": "integer", "description": "how many results to return"},
        },
        "required": ["query"],
    }
    description = "Search the knowledge base and the web and return the relevant passages. " * 4
    return [
        {"type": "function", "function": {"name": f"tool_{n}", "description": description,
                                          "parameters": parameters}}
        for n in range(36)
    ]  # fmt: skip


TOOLS = _tools()


class Replay:
    def __init__(self, url: str, engine: Engine, tasks: bool, room: Any) -> None:
        self.url, self.engine, self.tasks, self.room = url, engine, tasks, room
        self.tally = Tally()

    async def person(self, session: aiohttp.ClientSession, name: str) -> None:
        headers = {"Authorization": f"Bearer {name}-key"}
        background: list[asyncio.Task[None]] = []
        for chat in range(CHATS):
            for message in range(MESSAGES):
                first = message == 0
                if self.tasks and first:
                    background.append(asyncio.create_task(self.task(session, "title", headers)))
                    await asyncio.sleep(0)  # the title usually reaches the server first
                await self.chat(session, headers, f"{name}, chat {chat}, message {message}")
                if self.tasks:
                    names = ("follow-ups", "tags") if first else ("follow-ups",)
                    background += [
                        asyncio.create_task(self.task(session, task, headers)) for task in names
                    ]
                await asyncio.sleep(READING_SECONDS)
        await asyncio.gather(*background)

    async def chat(
        self, session: aiohttp.ClientSession, headers: dict[str, str], text: str
    ) -> None:
        engine = self.engine
        body: dict[str, Any] = {
            "model": engine.model,
            "messages": [{"role": "user", "content": text}],
            "stream": True,
        }
        if engine.tools:
            body["tools"] = TOOLS
        _limit(body, engine, 60)
        started = time.monotonic()
        async with session.post(self.url + engine.path, json=body, headers=headers) as reply:
            if reply.status != 200:
                self.tally.chats_refused += 1
                await reply.read()
                return
            await reply.content.readline()
            self.tally.chat_ttft.append(time.monotonic() - started)
            await reply.read()

    async def task(
        self, session: aiohttp.ClientSession, name: str, headers: dict[str, str]
    ) -> None:
        body = _task(name)
        body["model"] = self.engine.model
        body.pop("options", None)
        _limit(body, self.engine, TASK_TOKENS)
        url = self.url + self.engine.path
        async with session.post(url, json=body, headers=headers) as reply:
            await reply.read()
            if reply.status == 200:
                self.tally.tasks_done += 1
                return
            self.tally.tasks_refused += 1
            if self.room is not None and not any(self.room.waiting.values()):
                self.tally.tasks_refused_with_nobody_waiting += 1


def _limit(body: dict[str, Any], engine: Engine, tokens: int) -> None:
    """At most ``tokens`` generated: the simulator has no end of text, and a real model's
    replies should be of the same length in every run."""
    if engine.kind == "ollama":
        body["options"] = {**body.get("options", {}), "num_predict": tokens}
    else:
        body["max_tokens"] = tokens


def _policy(backend_url: str, engine: Engine, lanes: str) -> str:
    users = "".join(f"  {name}: {{keys: [{name}-key]}}\n" for name in PEOPLE)
    return (
        "defaults: {max_concurrent: 1, max_queued: 1}\n"
        + lanes
        + f"users:\n{users}"
        + f"backends:\n  - {{name: gpu, url: {backend_url}, kind: {engine.kind}, slots: 2}}\n"
    )


@asynccontextmanager
async def _backend(engine: Engine, workdir: Path) -> AsyncIterator[str]:
    """A fresh backend for one run: the simulator, or a real llama-server of 2 slots."""
    if engine.kind == "ollama":
        simulator = Simulator(SIM)
        runner = await start_server(simulator.make_app(), "127.0.0.1", 0)
        try:
            yield bound_url(runner)
        finally:
            await runner.cleanup()
        return
    async with running_llama_server(workdir / "llama-server.log", slots=2) as server:
        yield server.url


async def _run(engine: Engine, workdir: Path, tasks: bool, lanes: str) -> Tally:
    async with _backend(engine, workdir) as backend_url:
        policy = parse_policy(_policy(backend_url, engine, lanes))
        app = create_app(Settings(log_level="WARNING"), policy)
        services = app[SERVICES]
        listener = Listener(app, services.settings, services.connections)
        await listener.start(port=0)
        replay = Replay(listener.url, engine, tasks, services.admission.room)
        try:
            async with aiohttp.ClientSession() as session:
                await asyncio.gather(*(replay.person(session, name) for name in PEOPLE))
        finally:
            snapshot = services.admission.snapshot()
            given_way, estimates = snapshot.given_way, snapshot.estimates
            await listener.close()
    replay.tally.restarts = given_way.restarts
    replay.tally.wasted_slot_seconds = given_way.slot_seconds
    replay.tally.wasted_prompt_tokens = given_way.prompt_tokens
    replay.tally.estimate_error = estimates.median_error
    replay.tally.estimated_waits = estimates.samples
    return replay.tally


def _p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))] if ordered else float("nan")


def within_bound(p95: float, reference: float) -> bool:
    """The issue's bound: people's p95 with tasks at most 1.2x without, plus 50 ms."""
    return p95 <= 1.2 * reference + 0.05


def report(runs: list[tuple[str, Tally]]) -> str:
    lines = []
    reference = _p95(runs[0][1].chat_ttft)
    for name, tally in runs:
        ttft = tally.chat_ttft
        median = statistics.median(ttft) if ttft else float("nan")
        p95 = _p95(ttft)
        bound = "within" if within_bound(p95, reference) else "NOT within"
        lines.append(f"\n{name}")
        lines.append(
            f"  people's chats: {len(ttft)} answered, {tally.chats_refused} refused; TTFT p50 "
            f"{median:.2f} s, p95 {p95:.2f} s = {p95 / reference:.2f}x tasks off "
            f"({bound} 1.2x + 50 ms)"
        )
        error = tally.estimate_error
        lines.append(
            "  waiting estimates (people's): "
            + ("no wait measured" if error is None else f"median error {error:.0%}")
            + f" over {tally.estimated_waits} waits"
        )
        if tally.tasks_done or tally.tasks_refused:
            lines.append(
                f"  tasks: {tally.tasks_done} done, {tally.tasks_refused} refused "
                f"({tally.tasks_refused_with_nobody_waiting} of those with no person waiting); "
                f"gave way {tally.restarts} times, wasting {tally.wasted_slot_seconds:.1f} "
                f"slot-s and {tally.wasted_prompt_tokens:.0f} prompt tokens read again"
            )
    return "\n".join(lines)


async def compare(engine: Engine) -> list[tuple[str, Tally]]:
    with tempfile.TemporaryDirectory(prefix="fairgate-openwebui-") as folder:
        workdir = Path(folder)
        return [
            ("tasks off (the reference)", await _run(engine, workdir, False, "")),
            ("tasks on, no lanes setting (the defaults)", await _run(engine, workdir, True, "")),
            ("tasks on, the documented lanes setting", await _run(engine, workdir, True,
                                                                    DOCUMENTED_LANES)),
            ("tasks on, lanes off (presets: [])", await _run(engine, workdir, True,
                                                            "lanes: {presets: []}\n")),
        ]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=("sim", "llama-server"), default="sim")
    parser.add_argument(
        "--no-tools", action="store_true", help="light chats: without Open WebUI's tool schemas"
    )
    args = parser.parse_args()
    engine = LLAMA_ENGINE if args.engine == "llama-server" else SIM_ENGINE
    if args.no_tools:
        engine = replace(engine, name=engine.name + ", chats without tools", tools=False)
    configure_logging("json", "WARNING")
    print(__doc__.split("\n\n")[0])
    print(f"on {engine.name}:")
    print(report(asyncio.run(compare(engine))))


if __name__ == "__main__":
    main()
