"""The chaos suite: issue 41's attacks all at once, on one gateway in a process of its own
whose log is a full disk (stderr on /dev/full), in front of a simulated Ollama that decodes
JSON as Go does and reloads a model for a request with other runner options, as
server/sched.go does.

Each attack has its own test beside its fix; here they run together, so that the next
change cannot reopen one while the others are under way: the person at the table is served
throughout, no client's input gets a 5xx, and every bound holds (budgets, a front end's
total, bodies on their way, the model nobody may reload).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import StartSim
from tests.processes import serve_on_a_full_disk, stop
from tests.test_admission import MODEL
from tests.test_hostile_clients import head_of, request_head

HIDDEN = "hello " * 1500  # a tool's output: about 2,250 tokens the estimate once missed
POLICY = """\
defaults: {max_concurrent: 1, max_queued: 2}
queue: {max_depth: 32, max_wait: 20s}
classes: {heavy: {max_slots: 1}}
users:
  alice: {keys: [alice-key]}
  bob: {keys: [bob-key]}
  carol: {keys: [carol-key], max_queued: 6, budget: {tokens_per_day: 300}}
  mallory: {keys: [mallory-key], max_concurrent: 2}
  dave: {keys: [dave-key]}
  owui:
    keys: [owui-key]
    on_behalf:
      header: X-Person
      total: {max_concurrent: 1, max_queued: 1, budget: {requests_per_hour: 3}}
"""

Send = Callable[..., Awaitable[tuple[int, dict[str, Any]]]]


def sender(session: aiohttp.ClientSession, url: str) -> Send:
    async def send(
        path: str, key: str, body: object, headers: dict[str, str] | None = None
    ) -> tuple[int, dict[str, Any]]:
        """Status and JSON of a request of ``key``'s user, read whole."""
        sent = {"Authorization": f"Bearer {key}", **(headers or {})}
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        async with session.post(url + path, data=data, headers=sent) as reply:
            text = await reply.text()
            return reply.status, json.loads(text) if text.startswith("{") else {}

    return send


def chat(options: dict[str, Any] | None = None, prompt: str = "hi") -> dict[str, Any]:
    body: dict[str, Any] = {"model": MODEL, "prompt": prompt, "stream": False}
    return body | {"options": options} if options else body


async def alice(send: Send) -> list[int]:
    """The person at the table: six questions, one after another."""
    return [(await send("/api/generate", "alice-key", chat()))[0] for _ in range(6)]


async def bob(send: Send) -> list[int]:
    """Options that would reload the model under everyone: num_ctx, num_batch, num_thread."""
    statuses = []
    for turn in range(8):
        options = {"num_ctx": (2048, 8192)[turn % 2], "num_batch": (256, 1024)[turn % 2]}
        statuses.append(
            (await send("/api/generate", "bob-key", chat(options | {"num_thread": turn + 1})))[0]
        )
    return statuses


async def carol(send: Send) -> list[int]:
    """300 tokens a day, seven requests of ~100 at once."""
    body = chat({"num_predict": 100})
    replies = await asyncio.gather(*(send("/api/generate", "carol-key", body) for _ in range(7)))
    return [status for status, _ in replies]


async def mallory(send: Send) -> list[int]:
    """Two long prompts hidden in a tool's output, at once."""
    body = {
        "model": MODEL,
        "input": [
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": HIDDEN},
            {"role": "user", "content": "ok?"},
        ],
    }
    replies = await asyncio.gather(*(send("/v1/responses", "mallory-key", body) for _ in range(2)))
    return [status for status, _ in replies]


async def front_end(send: Send) -> list[int]:
    """A front end naming a new person each time: its total's 3 an hour, whatever names."""
    statuses = []
    for n in range(8):
        headers = {"X-Person": f"new{n}@example.com"}
        statuses.append((await send("/api/generate", "owui-key", chat(), headers))[0])
    return statuses


async def hostile(send: Send) -> list[int]:
    """Bodies no backend should see: each a 4xx."""
    bodies: list[object] = [
        b"{not json",
        b'{"model": "' + MODEL.encode() + b'", "MODEL": "other", "prompt": "x"}',
        b"[" * 5000 + b"]" * 5000,
        b'{"model": "\\ud800", "prompt": "x"}',
        b'{"model": "\xff\xfe", "prompt": "x"}',
        {"model": "no-such-model:1b", "prompt": "x"},
        {"model": MODEL, "prompt": 7},
    ]
    return [(await send("/api/generate", "dave-key", body))[0] for body in bodies]


async def slow_bodies(url: str) -> list[bytes]:
    """dave: five bodies of 20 MiB, each sent but for its last byte. The first is read; the
    others are refused from their heads (in bytes, one body of the largest size)."""
    host, _, port = url.removeprefix("http://").rpartition(":")
    size, heads, writers = 20 * 1024 * 1024, [], []
    first_reader, first = await asyncio.open_connection(host, int(port))
    first.write(
        request_head("/api/generate", size, key="dave-key", extra="Expect: 100-continue\r\n")
    )
    assert await head_of(first_reader) == b"HTTP/1.1 100 Continue\r\n\r\n"
    first.write(b" " * (size - 1))
    writers.append(first)
    for _ in range(4):
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(request_head("/api/generate", size, key="dave-key"))
        heads.append((await head_of(reader)).split(b"\r\n")[0])
        writers.append(writer)
    for writer in writers:
        writer.close()
    return heads


async def watcher(session: aiohttp.ClientSession, url: str, done: asyncio.Event) -> int:
    """Every route that is not a generation, asked over and over: each answers within 3 s."""
    asked = 0
    while not done.is_set():
        for path in ("/healthz", "/readyz", "/status", "/metrics", "/ui/me.json"):
            async with asyncio.timeout(3), session.get(url + path) as reply:
                assert reply.status in (200, 401), path
                await reply.read()
                asked += 1
    return asked


async def test_every_attack_at_once_leaves_the_house_standing(
    start_sim: StartSim, tmp_path: Path
) -> None:
    sim, sim_url = await start_sim(parallel=2)
    policy = tmp_path / "fairgate.yaml"
    policy.write_text(
        POLICY + "backends:\n"
        f"  - {{name: gpu, url: {sim_url}, kind: ollama, slots: 2, resident: [{MODEL}]}}\n"
    )
    process, url = await serve_on_a_full_disk(policy, tmp_path)
    try:
        async with aiohttp.ClientSession() as session:
            send, done = sender(session, url), asyncio.Event()
            watching = asyncio.create_task(watcher(session, url, done))
            attacks = await asyncio.gather(
                alice(send), bob(send), carol(send), mallory(send), front_end(send),
                hostile(send), slow_bodies(url),
            )  # fmt: skip
            done.set()
            assert await watching > 0
            people, thrash, race, hidden, names, bad, slow = attacks
            assert people == [200] * 6
            assert thrash == [200] * 8 and sim.stats.reloads == 0
            assert sorted(race) == [200] * 3 + [429] * 4
            assert hidden == [200, 200]
            assert sorted(names) == [200] * 3 + [429] * 5
            assert all(400 <= status < 500 for status in bad), bad
            assert slow == [b"HTTP/1.1 503 Service Unavailable"] * 4
            async with session.get(url + "/status") as reply:
                users = (await reply.json())["users"]
            tokens = users["carol"]["today"]
            # At most one request's estimate (its prompt and 100) over the budget.
            assert tokens["prompt_tokens"] + tokens["completion_tokens"] <= 300 + 110
            async with session.get(url + "/metrics") as reply:
                metrics = await reply.text()
            heavy = {"user": "mallory", "model": MODEL, "class": "heavy", "code": "200"}
            served = [
                sample.value
                for family in text_string_to_metric_families(metrics)
                for sample in family.samples
                if sample.name == "fairgate_requests_total" and sample.labels == heavy
            ]
            assert served == [2]
            assert process.returncode is None
    finally:
        await stop(process)
