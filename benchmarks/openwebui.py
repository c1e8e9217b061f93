"""Open WebUI's traffic, replayed: two people chatting, each message with its background tasks.

Per message Open WebUI sends the person's chat (streamed, with ~25 KB of tool schemas) and,
after the reply, a follow-ups task; on a chat's first message also a title task, sent at the
same moment as the chat and usually arriving first, and a tags task after the reply (see
the captures in ../shared/samples/open-webui/). The task bodies here are those captures.

Two people at ``max_concurrent: 1, max_queued: 1`` on a backend of 2 slots, 2 chats of 5
messages each per person (20 messages), a few seconds of reading between messages. Three
runs, one after another, against the simulator:

1. tasks off: the chats alone, the reference;
2. tasks on, no lanes: what a gateway without lanes does to the people;
3. tasks on, lanes (``presets: [open-webui]``).

Printed per run: the people's chats sent, refused, TTFT p50/p95; the tasks done and
refused, and how many of those refusals came while no person was waiting.

    .venv/bin/python -m benchmarks.openwebui
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from fairsim import SimConfig, Simulator
from gateway.app import SERVICES, bound_url, create_app, start_server
from gateway.config.policy import parse_policy
from gateway.config.settings import Settings
from gateway.core.logs import configure_logging
from gateway.edge.http.connections import Listener

MODEL = "llama3.2:3b"
SAMPLES = Path(__file__).resolve().parents[2] / "shared" / "samples" / "open-webui"
PEOPLE = ("alice", "bob")
CHATS, MESSAGES = 2, 5
READING_SECONDS = 3.0  # between a reply and the person's next message
TASK_TOKENS = 30  # a title or tag list: the simulator has no end-of-text, so it is capped
SIM = SimConfig(parallel=2, prefill_tokens_per_s=4000.0, decode_tokens_per_s=40.0)


@dataclass
class Tally:
    chat_ttft: list[float] = field(default_factory=list)
    chats_refused: int = 0
    tasks_done: int = 0
    tasks_refused: int = 0
    tasks_refused_with_nobody_waiting: int = 0


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
    def __init__(self, url: str, tasks: bool, room: Any) -> None:
        self.url, self.tasks, self.room = url, tasks, room
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
        body = {"model": MODEL, "messages": [{"role": "user", "content": text}], "stream": True,
                "tools": TOOLS, "options": {"num_predict": 60}}  # fmt: skip
        started = time.monotonic()
        async with session.post(self.url + "/api/chat", json=body, headers=headers) as reply:
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
        async with session.post(self.url + "/api/chat", json=_task(name), headers=headers) as reply:
            await reply.read()
            if reply.status == 200:
                self.tally.tasks_done += 1
                return
            self.tally.tasks_refused += 1
            if self.room is not None and not any(self.room.waiting.values()):
                self.tally.tasks_refused_with_nobody_waiting += 1


def _policy(sim_url: str, lanes: bool) -> str:
    users = "".join(f"  {name}: {{keys: [{name}-key]}}\n" for name in PEOPLE)
    return (
        "defaults: {max_concurrent: 1, max_queued: 1}\n"
        + ("lanes: {presets: [open-webui]}\n" if lanes else "")
        + f"users:\n{users}"
        + f"backends:\n  - {{name: sim, url: {sim_url}, kind: ollama, slots: 2}}\n"
    )


async def _run(tasks: bool, lanes: bool) -> Tally:
    simulator = Simulator(SIM)
    backend = await start_server(simulator.make_app(), "127.0.0.1", 0)
    app = create_app(
        Settings(log_level="WARNING"), parse_policy(_policy(bound_url(backend), lanes))
    )
    services = app[SERVICES]
    listener = Listener(app, services.settings, services.connections)
    await listener.start(port=0)
    replay = Replay(listener.url, tasks, services.admission.room)
    try:
        async with aiohttp.ClientSession() as session:
            await asyncio.gather(*(replay.person(session, name) for name in PEOPLE))
    finally:
        await listener.close()
        await backend.cleanup()
    return replay.tally


def _p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))] if ordered else float("nan")


def report(runs: list[tuple[str, Tally]]) -> str:
    lines = []
    reference = _p95(runs[0][1].chat_ttft)
    for name, tally in runs:
        ttft = tally.chat_ttft
        median = statistics.median(ttft) if ttft else float("nan")
        lines.append(f"\n{name}")
        lines.append(
            f"  people's chats: {len(ttft)} answered, {tally.chats_refused} refused; TTFT p50 "
            f"{median:.2f} s, p95 {_p95(ttft):.2f} s = {_p95(ttft) / reference:.2f}x tasks off"
        )
        lines.append(
            f"  tasks: {tally.tasks_done} done, {tally.tasks_refused} refused "
            f"({tally.tasks_refused_with_nobody_waiting} of those with no person waiting)"
        )
    return "\n".join(lines)


async def compare() -> list[tuple[str, Tally]]:
    return [
        ("tasks off (the reference)", await _run(tasks=False, lanes=False)),
        ("tasks on, no lanes", await _run(tasks=True, lanes=False)),
        ("tasks on, lanes: {presets: [open-webui]}", await _run(tasks=True, lanes=True)),
    ]


def main() -> None:
    configure_logging("json", "WARNING")
    print(__doc__.split("\n\n")[0])
    print(report(asyncio.run(compare())))


if __name__ == "__main__":
    main()
