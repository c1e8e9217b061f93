"""/metrics label values stay bounded by the policy whatever clients send: people behind a
front end count under its account, made-up models under ``other``."""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack

import aiohttp
from aiohttp import web
from aiohttp.typedefs import Handler

from fairsim import SimConfig, Simulator
from gateway.observe.labels import OTHER
from tests.conftest import StartGateway, StartSim, one_backend, serve
from tests.test_admission import until
from tests.test_lanes import ask, running
from tests.test_metrics import MODEL, scrape

Families = dict[str, list[tuple[str, dict[str, str], float]]]
PEOPLE = 50
FRONT_END = """\
scheduling: fair
queue: {max_depth: 64, max_wait: 60s}
defaults: {max_concurrent: 1, max_queued: 1}
users:
  owui: {keys: [owui-key], on_behalf: {header: X-OpenWebUI-User-Email}}
"""


def person(n: int) -> dict[str, str]:
    return {"X-OpenWebUI-User-Email": f"person{n}@example.com"}


def label_values(label: str, *scrapes: Families) -> dict[str, set[str]]:
    """The values of ``label`` in each fairgate_* family that has it, over ``scrapes``."""
    found: dict[str, set[str]] = {}
    for families in scrapes:
        for name, samples in families.items():
            for _, labels, _ in samples:
                if name.startswith("fairgate_") and label in labels:
                    found.setdefault(name, set()).add(labels[label])
    return found


async def test_people_behind_a_front_end_count_under_its_account_in_every_series(
    start_sim: StartSim, start_gateway: StartGateway
) -> None:
    """Fifty people through one on_behalf key, one running and the rest queued, give one
    user label value (the front end's) in every fairgate_* family."""
    _, url = await start_sim(parallel=1)
    gateway = await start_gateway(FRONT_END + one_backend(url, slots=1))
    admission = gateway.services.admission
    async with running(gateway, "owui-key", "hold the slot", person(0)):
        asking = [
            asyncio.create_task(ask(gateway, "owui-key", f"q{n}", person(n)))
            for n in range(1, PEOPLE)
        ]
        await until(admission, lambda room: room.queue_depth == PEOPLE - 1, within=30)
        assert (await ask(gateway, "owui-key", "again", person(1)))[0] == 503
        while_queued = await scrape(gateway)
    assert [status for status, _ in await asyncio.gather(*asking)] == [200] * (PEOPLE - 1)
    after = await scrape(gateway)
    depth = [(labels, value) for _, labels, value in while_queued["fairgate_queue_depth"]]
    assert depth == [({"user": "owui", "class": "light"}, PEOPLE - 1)]
    share = [labels for _, labels, _ in after["fairgate_fair_share_virtual_tokens"]]
    assert share == [{"user": "owui"}]
    users = label_values("user", while_queued, after)
    assert {"fairgate_queue_depth", "fairgate_requests", "fairgate_rejections"} <= set(users)
    strays = {name: extra for name, values in users.items() if (extra := values - {"owui"})}
    assert not strays, strays


async def test_made_up_models_are_one_label_value_in_every_series(
    start_sim: StartSim, start_gateway: StartGateway, servers: AsyncExitStack
) -> None:
    """Fifty model names no backend lists, sent while one backend's list is unknown (so
    each is sent to it, loaded, and counted as a cold start), give the model label value
    other, never the names."""
    made_up = [f"made-up-{n}" for n in range(PEOPLE)]
    _, listed_url = await start_sim()
    unlisted = Simulator(SimConfig(models=made_up, decode_tokens_per_s=500.0))
    app = unlisted.make_app()
    app.middlewares.append(_no_listing)
    unlisted_url = await serve(servers, app)
    gateway = await start_gateway(
        "monitoring: {unhealthy_after: 1000}\n"
        "warmth: {cold_start_after: 0s}\n"
        "backends:\n"
        f"  - {{name: listed, url: {listed_url}, kind: ollama, slots: 2}}\n"
        f"  - {{name: unlisted, url: {unlisted_url}, kind: ollama, slots: 2}}\n"
    )
    async with aiohttp.ClientSession() as session:
        for model in [*made_up, MODEL]:
            body = {"model": model, "prompt": "hi", "stream": False}
            async with session.post(gateway.url + "/api/generate", json=body) as reply:
                assert reply.status == 200
    models = label_values("model", await scrape(gateway))
    counted = {"fairgate_requests", "fairgate_cold_starts", "fairgate_model_loads"}
    assert counted <= set(models)
    strays = {name: extra for name, values in models.items() if (extra := values - {MODEL, OTHER})}
    assert not strays, strays
    assert models["fairgate_requests"] == models["fairgate_cold_starts"] == {MODEL, OTHER}


async def test_a_model_written_with_or_without_its_default_tag_is_one_label_value(
    start_sim: StartSim, start_gateway: StartGateway
) -> None:
    """Requests for ``llama3.2`` and for ``llama3.2:latest`` (one model to Ollama) count
    under one model label value, the one Ollama lists, in every fairgate_* family."""
    _, url = await start_sim(models=["llama3.2:latest"])
    gateway = await start_gateway(one_backend(url, slots=2))
    async with aiohttp.ClientSession() as session:
        for model in ["llama3.2", "llama3.2:latest"]:
            body = {"model": model, "prompt": "hi", "stream": False}
            async with session.post(gateway.url + "/api/generate", json=body) as reply:
                assert reply.status == 200
    models = label_values("model", await scrape(gateway))
    assert models["fairgate_requests"] == {"llama3.2:latest"}, models
    strays = {name: values for name, values in models.items() if values != {"llama3.2:latest"}}
    assert not strays, strays


@web.middleware
async def _no_listing(request: web.Request, handler: Handler) -> web.StreamResponse:
    """An Ollama whose model list fails (a disk it cannot read, say): it still generates."""
    if request.path == "/api/tags":
        return web.json_response({"error": "simulated failure"}, status=500)
    return await handler(request)
