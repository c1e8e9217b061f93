"""/metrics: the names the dashboard and alerts use exist, and the TTFT histogram is right."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import aiohttp
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gateway.config.policy import load_policy
from gateway.config.settings import Settings
from gateway.core.vocabulary import Reason, RequestClass
from gateway.edge.record import RequestRecord
from gateway.observe.metrics import Metrics
from gateway.services import Services
from tests.conftest import Gateway, StartGateway, StartSim, one_backend
from tests.test_history import Clock

REPO = Path(__file__).resolve().parent.parent
DASHBOARD = REPO / "deploy" / "grafana" / "dashboards" / "fairgate.json"
ALERTS = REPO / "deploy" / "prometheus" / "alerts.yml"
MODEL = "llama3.2:3b"
# What prometheus_client's Counter and Histogram exposed for the records below.
EXPOSITION = REPO / "tests" / "samples" / "prometheus_client" / "finished_requests.txt"


def dashboard_queries() -> list[str]:
    document = json.loads(DASHBOARD.read_text())
    return [target["expr"] for panel in document["panels"] for target in panel["targets"]]


def alert_queries() -> list[str]:
    import yaml

    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    return [rule["expr"] for group in groups for rule in group["rules"]]


async def scrape(gateway: Gateway) -> dict[str, list[tuple[str, dict[str, str], float]]]:
    """Metric families by name, each a list of (sample name, labels, value)."""
    async with aiohttp.ClientSession() as session, session.get(gateway.url + "/metrics") as reply:
        assert reply.status == 200
        text = await reply.text()
    return {
        family.name: [(s.name, dict(s.labels), s.value) for s in family.samples]
        for family in text_string_to_metric_families(text)
    }


async def workload(gateway: Gateway, requests: int = 4) -> None:
    """A few chats, streamed and not, and one refusal (an unknown model)."""
    async with aiohttp.ClientSession() as session:
        for n in range(requests):
            body = {"model": MODEL, "prompt": f"question {n}", "stream": n % 2 == 0}
            async with session.post(gateway.url + "/api/generate", json=body) as reply:
                await reply.read()
        async with session.post(gateway.url + "/api/generate", json={"model": "nope"}) as reply:
            assert reply.status == 404


async def test_every_metric_the_dashboard_and_alerts_use_is_exposed(
    start_sim: StartSim, start_gateway: StartGateway
) -> None:
    """Each fairgate_* name in the dashboard JSON and the alert rules is in /metrics."""
    _, sim_url = await start_sim()
    gateway = await start_gateway(one_backend(sim_url, slots=2))
    await workload(gateway)
    exposed = set(await scrape(gateway))
    used = {
        re.sub(r"_(bucket|total|count|sum)$", "", name)
        for query in dashboard_queries() + alert_queries()
        for name in re.findall(r"fairgate_[a-z_]+", query)
    }
    assert used and used <= exposed, used - exposed


async def test_requests_rejections_and_tokens_are_counted(
    start_sim: StartSim, start_gateway: StartGateway
) -> None:
    """Counters carry bounded labels: configured user or anonymous, known model or other. A
    read that names a model (a model's listing, a count of tokens) is not a request for one."""
    _, sim_url = await start_sim()
    gateway = await start_gateway(one_backend(sim_url, slots=2))
    await workload(gateway)
    count = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{gateway.url}/v1/models/{MODEL}") as reply:
            assert reply.status == 200
        async with session.post(gateway.url + "/v1/messages/count_tokens", json=count) as reply:
            assert reply.status == 404  # only llama-server counts: refused, with why
    families = await scrape(gateway)
    requests = {
        (labels["model"], labels["code"]): value
        for name, labels, value in families["fairgate_requests"]
        if name.endswith("_total")
    }
    assert requests == {(MODEL, "200"): 4.0, ("other", "404"): 1.0}
    rejections = [
        (labels, value)
        for name, labels, value in families["fairgate_rejections"]
        if name.endswith("_total")
    ]
    assert rejections == [
        ({"user": "anonymous", "reason": "model_not_found"}, 1.0),
        ({"user": "anonymous", "reason": "not_found"}, 1.0),
    ]
    completion = [
        value
        for name, _, value in families["fairgate_completion_tokens"]
        if name.endswith("_total")
    ]
    assert completion and completion[0] > 0
    up = [value for _, labels, value in families["fairgate_backend_up"]]
    assert up == [1.0]


async def test_refusals_of_unknown_keys_are_counted_as_unknown_not_anonymous(
    start_sim: StartSim, start_gateway: StartGateway
) -> None:
    """A stranger's key is refused under user unknown; the anonymous user keeps its own count."""
    _, sim_url = await start_sim()
    users = "users:\n  anonymous: {}\n  alice: {keys: [alice-key]}\n"
    gateway = await start_gateway(one_backend(sim_url, extra=users))
    async with aiohttp.ClientSession() as session:
        for key in ("stranger", "another-stranger"):
            headers = {"Authorization": f"Bearer {key}"}
            async with session.post(
                gateway.url + "/api/generate", json={"model": MODEL}, headers=headers
            ) as reply:
                assert reply.status == 401
        async with session.post(gateway.url + "/api/generate", json={"model": "nope"}) as reply:
            assert reply.status == 404  # keyless: the anonymous user, refused on its own account
    rejections = {
        (labels["user"], labels["reason"]): value
        for name, labels, value in (await scrape(gateway))["fairgate_rejections"]
        if name.endswith("_total")
    }
    assert rejections == {("unknown", "unauthorized"): 2.0, ("anonymous", "model_not_found"): 1.0}


def bucket_counts(
    families: dict[str, list[tuple[str, dict[str, str], float]]], name: str
) -> dict[str, float]:
    return {
        labels["le"]: value
        for sample, labels, value in families[name]
        if sample.endswith("_bucket") and labels.get("class") == "light"
    }


async def test_the_ttft_histogram_measures_queue_wait_plus_prefill(
    start_sim: StartSim, start_gateway: StartGateway
) -> None:
    """With 0.1 s of prefill and one slot, the first request's TTFT is about 0.1 s and the
    second's, which waits for the first, about 0.3 s: each lands in its bucket."""
    # 100 prompt tokens at 1,000/s = 0.1 s prefill; 10 tokens at 100/s = 0.1 s decode.
    _, sim_url = await start_sim(
        parallel=1, prefill_tokens_per_s=1000.0, decode_tokens_per_s=100.0, decode_slowdown=0.0
    )
    gateway = await start_gateway(
        one_backend(sim_url, slots=1, extra="defaults: {max_concurrent: 2, max_queued: 2}\n")
    )
    # About 100 tokens in the simulator's count (4 characters a token); two prompts, as the
    # engine evaluates a prompt it holds in its cache only from where they part.
    async with aiohttp.ClientSession() as session:

        async def generate(prompt: str) -> None:
            body = {"model": MODEL, "prompt": prompt, "options": {"num_predict": 10}}
            async with session.post(gateway.url + "/api/generate", json=body) as reply:
                await reply.read()

        await asyncio.gather(generate("x" * 400), generate("y" * 400))
    families = await scrape(gateway)
    ttft = bucket_counts(families, "fairgate_time_to_first_token_seconds")
    assert (ttft["0.05"], ttft["0.25"], ttft["0.5"]) == (0.0, 1.0, 2.0)
    wait = bucket_counts(families, "fairgate_queue_wait_seconds")
    assert (wait["0.01"], wait["0.1"], wait["0.5"]) == (1.0, 1.0, 2.0)
    from_dispatch = bucket_counts(families, "fairgate_time_to_first_token_from_dispatch_seconds")
    assert (from_dispatch["0.05"], from_dispatch["0.25"]) == (0.0, 2.0)
    # Each reply streams 10 tokens 10 ms apart: its gaps add up to about 0.1 s.
    gaps = bucket_counts(families, "fairgate_inter_token_seconds")
    count, total = (
        sum(value for sample, labels, value in families["fairgate_inter_token_seconds"]
            if sample.endswith(suffix) and labels.get("class") == "light")
        for suffix in ("_count", "_sum")
    )  # fmt: skip
    assert count >= 2 and gaps["+Inf"] == count == gaps["1.0"]
    assert list(gaps.values()) == sorted(gaps.values())  # cumulative, as Prometheus reads it
    assert gaps["0.005"] < count  # most gaps are the 10 ms decode step, not coalesced reads
    assert 0.1 < total < 2.0


HOUSEHOLD = """\
users:
  anonymous: {}
  alice: {keys: [alice-key]}
  bob: {keys: [bob-key]}
  owui: {keys: [owui-key], on_behalf: {header: X-OpenWebUI-User-Email}}
backends:
  - {name: gpu, url: "http://127.0.0.1:9", kind: ollama, slots: 2, keep_warm: [warm]}
"""


def finished(user: str | None, model: str | None, **fields: object) -> RequestRecord:
    """A generation request that arrived at 0 and ended at 1.5 s, answered 200; ``fields``
    set the rest."""
    record = RequestRecord("r", "POST", "/api/chat", arrived=0.0, finished=1.5, status=200)
    record.user, record.model = user, model
    for name, value in fields.items():
        setattr(record, name, value)
    return record


def test_finished_requests_are_exposed_as_prometheus_client_exposed_them(tmp_path: Path) -> None:
    """Refusals, values on bucket bounds and past the last, people behind a front end, a
    reload that removes a user, then a model a backend starts listing give, byte for byte,
    the text prometheus_client's own Counter and Histogram gave for the same records."""
    path = tmp_path / "policy.yaml"
    path.write_text(HOUSEHOLD)
    services = Services.build(Settings(), load_policy(path), path)
    gpu = services.backends.of("gpu")
    gpu.models = frozenset({MODEL})
    clock = Clock(1_700_000_000.0)
    metrics = Metrics(services.policy, services.snapshot, clock)

    def observe(*records: RequestRecord) -> None:
        for record in records:
            metrics.observe(record)
            clock.now += 1

    observe(
        finished(None, MODEL, status=401, reason=Reason.UNAUTHORIZED),
        finished(
            "alice", MODEL, queue_wait=0.01, dispatched_at=0.01, first_byte_at=0.025,
            finished=300.0, gaps=[0.005, 0.01, 0.0101, 0.02, 5.0, 5.5],
            prompt_tokens=12, completion_tokens=6,
        ),
        finished(
            "owui/p@example.com", "warm", request_class=RequestClass.HEAVY, queue_wait=2.0,
            first_byte_at=0.4, gaps=[0.03, 0.03, 0.03], prompt_tokens=7,
        ),
        finished(
            "bob", "qwen3:4b", first_byte_at=0.2, backend="gpu",
            reason=Reason.BACKEND_FAILED_MID_STREAM,
        ),
        finished("alice", MODEL, first_byte_at=0.1, status=499, reason=Reason.CLIENT_STALLED),
        finished("mallory", None, path="/api/tags", status=401, reason=Reason.UNAUTHORIZED),
    )  # fmt: skip
    path.write_text(HOUSEHOLD.replace("  bob: {keys: [bob-key]}\n", ""))
    assert services.policy.reload()
    observe(finished("bob", "qwen3:4b", first_byte_at=0.05, completion_tokens=3))
    gpu.models = frozenset({MODEL, "qwen3:4b"})  # as the monitor's next probe would
    observe(finished("alice", "qwen3:4b", path="/v1/chat/completions", first_byte_at=60.0))
    text = generate_latest(metrics.registry).decode()
    per_request = text[: text.index("# HELP fairgate_queue_depth ")]  # then the gauges
    assert per_request == EXPOSITION.read_text()
