"""`fairgate usage` against a known workload: the real command, reading what a gateway wrote
to SQLite or to Redis."""

from __future__ import annotations

import asyncio
import csv
import io
import json
import os
import sqlite3
import sys
from collections import Counter
from datetime import date, timedelta
from pathlib import Path
from typing import Any

import ollama
import pytest

from gateway.app import SERVICES, create_app
from gateway.config.policy import parse_policy
from gateway.config.settings import Settings
from gateway.edge.http.connections import Listener
from tests.conftest import StartSim
from tests.redis_server import redis_url  # noqa: F401 (fixture)
from tests.test_admission import idle, until

OTHER = "qwen2.5:7b"
MODEL = "llama3.2:3b"
WORKLOAD = [("alice", MODEL)] * 3 + [("alice", OTHER)] * 2 + [("bob", MODEL)] * 3


async def usage(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """`fairgate usage ARGS`: exit status, stdout and stderr."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway", "usage", *args,
        env={**os.environ, **(env or {})},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    async with asyncio.timeout(30):
        out, err = await process.communicate()
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def run_workload(sim_url: str, **settings: Any) -> dict[tuple[str, str], Counter[str]]:
    """Alice 3 + 2 chats on two models, bob 1 chat and 2 refusals (his budget is one an
    hour), on a gateway that is then stopped; the backend's own counts of each reply."""
    text = (
        "users:\n  alice: {keys: [alice-key]}\n"
        "  bob: {keys: [bob-key], budget: {requests_per_hour: 1}}\n"
        f"backends:\n  - {{name: sim, url: {sim_url}, kind: ollama, slots: 2}}\n"
    )
    app = create_app(Settings(**settings), parse_policy(text))
    services = app[SERVICES]
    listener = Listener(app, services.settings, services.connections)
    await listener.start(port=0)
    truth: dict[tuple[str, str], Counter[str]] = {}
    try:
        for n, (user, model) in enumerate(WORKLOAD):
            headers = {"Authorization": f"Bearer {user}-key"}
            async with ollama.AsyncClient(host=listener.url, headers=headers) as client:
                try:
                    reply = await client.generate(model=model, prompt="words " * n)
                except ollama.ResponseError as refused:
                    assert refused.status_code == 429
                    continue
            counts = truth.setdefault((user, model), Counter())
            counts["requests"] += 1
            counts["prompt_tokens"] += reply.prompt_eval_count or 0
            counts["completion_tokens"] += reply.eval_count or 0
            await until(services.admission, idle)
    finally:
        await listener.close()  # the last write happens here
    return truth


@pytest.fixture(params=["sqlite", "redis"])
def store_env(request: pytest.FixtureRequest, redis_url: str) -> dict[str, str]:  # noqa: F811
    """Where the gateway keeps usage and the command reads it: the file, or Redis."""
    return {} if request.param == "sqlite" else {"FAIRGATE_REDIS_URL": redis_url}


async def test_the_report_adds_up_a_known_workload_in_every_shape(
    start_sim: StartSim, store_env: dict[str, str]
) -> None:
    """By user (with refusals by reason), by model, by day, one user; JSON, CSV and text."""
    _, sim_url = await start_sim()
    settings = {"redis_url": store_env["FAIRGATE_REDIS_URL"]} if store_env else {}
    truth = await run_workload(sim_url, **settings)
    alice = truth[("alice", MODEL)] + truth[("alice", OTHER)]
    bob = truth[("bob", MODEL)]
    assert (alice["requests"], bob["requests"]) == (5, 1)

    status, out, err = await usage("--json", env=store_env)
    assert status == 0, err
    lines = {line["user"]: line for line in json.loads(out)["lines"]}
    assert set(lines) == {"alice", "bob"}
    for name, expected, refused in (("alice", alice, {}), ("bob", bob, {"budget_exhausted": 2})):
        line = lines[name]
        assert {k: line[k] for k in expected} == dict(expected)
        assert line["slot_seconds"] > 0
        assert (line["refused"], line["refusals"]) == (sum(refused.values()), refused)

    status, out, _ = await usage("--json", "--by", "model", env=store_env)
    by_model = {(x["user"], x["model"]): x["requests"] for x in json.loads(out)["lines"]}
    assert by_model == {key: counts["requests"] for key, counts in truth.items()}

    status, out, _ = await usage("--csv", "--by", "day", "--user", "bob", env=store_env)
    (row,) = list(csv.DictReader(io.StringIO(out)))
    assert (row["user"], row["day"], row["requests"], row["refused"]) == (
        "bob",
        date.today().isoformat(),
        "1",
        "2",
    )

    status, out, _ = await usage(env=store_env)
    assert out.splitlines()[1].split() == [
        "USER", "REQUESTS", "PROMPT", "GENERATED", "SLOT", "TIME", "REFUSED"
    ]  # fmt: skip
    assert out.splitlines()[-1].endswith("2 (budget_exhausted 2)")


async def test_since_keeps_the_hours_from_then_on(tmp_path: Path, usage_db: Path) -> None:
    """A row ten days old is outside --since 7d and inside --since 30d or a day before it."""
    old = (date.today() - timedelta(days=10)).isoformat()
    recent = date.today().isoformat()
    with sqlite3.connect(usage_db) as db:
        db.executescript(
            "CREATE TABLE usage (day, hour, user, model, requests, prompt_tokens, "
            "completion_tokens, slot_seconds); CREATE TABLE refusals (day, hour, user, reason, "
            "count); CREATE TABLE minutes (minute, user, requests);"
        )
        db.execute("INSERT INTO usage VALUES (?, 0, 'alice', 'm', 4, 1, 2, 3.0)", (old,))
        db.execute("INSERT INTO usage VALUES (?, 0, 'alice', 'm', 1, 1, 2, 3.0)", (recent,))
    for since, requests in (
        ("7d", 1),
        ("30d", 5),
        ((date.today() - timedelta(days=11)).isoformat(), 5),
    ):
        status, out, err = await usage("--json", "--since", since)
        assert status == 0, err
        assert json.loads(out)["lines"][0]["requests"] == requests, since


async def test_a_since_that_is_not_a_span_or_a_day_says_what_it_should_be() -> None:
    """Exit status 2 and the forms it takes."""
    status, _, err = await usage("--since", "last tuesday")
    assert status == 2
    assert "expected a span such as 7d, 12h or 90m, or a day such as 2025-03-01" in err
    status, _, err = await usage("--since", "99999999999999999999d")  # before year 1
    assert status == 2 and "goes back before any date" in err and "Traceback" not in err
