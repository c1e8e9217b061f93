"""A real Prometheus scrapes the gateway; every dashboard and alert query must evaluate.

Debian's ``prometheus`` package provides the server and promtool; ``make test`` installs it
when missing. Grafana cannot run here, so its dashboard is checked through its queries.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from tests.conftest import Gateway, StartGateway, StartSim, one_backend
from tests.processes import free_port, required_binary, stop, until_answers
from tests.test_metrics import ALERTS, REPO, alert_queries, dashboard_queries, workload

PROMETHEUS_CONFIG = REPO / "deploy" / "prometheus" / "prometheus.yml"
# The panels that must show data after a short workload (the others may be legitimately
# empty: nothing queued at the moment, no cold start, no rejection of that kind).
MAIN_PANELS = (
    "fairgate_time_to_first_token_seconds_bucket",
    "fairgate_requests_running",
    "fairgate_backend_slots",
    "fairgate_completion_tokens_total",
    "fairgate_backend_up",
    "fairgate_requests_total",
)


def test_promtool_accepts_the_shipped_config_and_rules() -> None:
    """promtool check config / check rules pass on deploy/prometheus."""
    promtool = required_binary("promtool", "prometheus")
    for command in (["check", "config", str(PROMETHEUS_CONFIG)], ["check", "rules", str(ALERTS)]):
        result = subprocess.run([promtool, *command], capture_output=True, text=True, check=False)
        assert result.returncode == 0, result.stdout + result.stderr


@pytest.fixture
async def prometheus(tmp_path: Path) -> AsyncIterator[tuple[str, Path]]:
    """A Prometheus server on a free port; the test writes its config before reloading."""
    binary = required_binary("prometheus", "prometheus")
    port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text("global: {scrape_interval: 1s}\n")
    shutil.copy(ALERTS, tmp_path / "alerts.yml")
    log = (tmp_path / "prometheus.log").open("wb")
    process = await asyncio.create_subprocess_exec(
        binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}", "--web.enable-lifecycle",
        stdout=subprocess.DEVNULL, stderr=log,
    )  # fmt: skip
    try:
        yield f"http://127.0.0.1:{port}", config
    finally:
        await stop(process)
        log.close()


async def _query(session: aiohttp.ClientSession, url: str, expr: str) -> dict[str, object]:
    async with session.get(url + "/api/v1/query", params={"query": expr}) as reply:
        result: dict[str, object] = await reply.json()
        return result


async def test_every_dashboard_and_alert_query_evaluates_on_real_data(
    prometheus: tuple[str, Path], start_sim: StartSim, start_gateway: StartGateway
) -> None:
    """All queries parse; the main panels return series after a short workload."""
    url, config = prometheus
    _, sim_url = await start_sim()
    gateway: Gateway = await start_gateway(one_backend(sim_url, slots=2))
    target = gateway.url.removeprefix("http://")
    scraping = PROMETHEUS_CONFIG.read_text().replace("fairgate:8080", target)
    config.write_text(scraping.replace("scrape_interval: 15s", "scrape_interval: 1s"))
    async with aiohttp.ClientSession() as session:
        await until_answers(url + "/-/ready", 30)
        async with session.post(url + "/-/reload") as reply:
            assert reply.status == 200
        missing: list[str] = list(MAIN_PANELS)
        deadline = time.monotonic() + 60
        while missing and time.monotonic() < deadline:
            await workload(gateway, requests=2)  # keep traffic flowing across scrapes
            queries = [q for q in dashboard_queries() if any(name in q for name in missing)]
            for expr in queries:
                answer = await _query(session, url, expr)
                if answer.get("data", {}).get("result"):  # type: ignore[union-attr]
                    missing = [name for name in missing if name not in expr]
        assert not missing, f"no data for {missing}"
        for expr in dashboard_queries() + alert_queries():
            answer = await _query(session, url, expr)
            assert answer["status"] == "success", (expr, answer)
