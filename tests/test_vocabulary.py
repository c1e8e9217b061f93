"""One vocabulary: every refusal reason is counted, docs/errors.md's table names each reason, and
the core (admission, scheduling, policy, tallies, holds, routing) loads without aiohttp."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from pathlib import Path

import aiohttp
from aiohttp import web
from aiohttp.typedefs import Handler

from gateway.app import create_app, drain
from gateway.config.policy import parse_policy
from gateway.config.settings import Settings
from gateway.core.vocabulary import REFUSALS, Reason
from tests.conftest import Gateway, StartGateway, StartSim, serve
from tests.processes import free_port
from tests.test_admission import MODEL, held, until
from tests.test_metrics import scrape

REPO = Path(__file__).resolve().parent.parent
OTHER = "qwen2.5:7b"
HOUSE = f"""\
defaults: {{max_concurrent: 1, max_queued: 0}}
queue: {{max_depth: 1, max_wait: 200ms}}
monitoring: {{unhealthy_after: 1}}
users:
  alice: {{keys: [alice-key], models: [{MODEL}]}}
  bob: {{keys: [bob-key], max_queued: 5}}
  carol: {{keys: [carol-key], max_queued: 5}}
  dave: {{keys: [dave-key], budget: {{requests_per_hour: 0}}}}
"""
# Every module of the packages the import contracts keep free of aiohttp (pyproject.toml),
# and the faces that routing, the caller's identity and a request's reading need.
_FREE_OF_AIOHTTP = ("core", "wire", "config", "swaps", "admission")
CORE = (
    *(
        "gateway." + p.relative_to(REPO / "gateway").with_suffix("").as_posix().replace("/", ".")
        for package in _FREE_OF_AIOHTTP
        for p in sorted((REPO / "gateway" / package).rglob("*.py"))
        if p.name != "__init__.py"
    ),
    "gateway.backends",
    "gateway.edge",
    "gateway.intake",
)


@web.middleware
async def peer_from_header(request: web.Request, handler: Handler) -> web.StreamResponse:
    """As a reverse proxy on another host would: the peer named in X-Test-Peer."""
    peer = request.headers.get("X-Test-Peer")
    return await handler(request.clone(remote=peer) if peer else request)


async def status_of(
    session: aiohttp.ClientSession, method: str, url: str, key: str | None = None, **kw: object
) -> int:
    headers = dict(kw.pop("headers", {}) or {})  # type: ignore[call-overload]
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    async with session.request(method, url, headers=headers, **kw) as reply:  # type: ignore[arg-type]
        await reply.read()
        return reply.status


async def rejection_reasons(gateway: Gateway) -> set[str]:
    families = await scrape(gateway)
    return {labels["reason"] for name, labels, value in families["fairgate_rejections"] if value}


async def provoke_request_refusals(gateway: Gateway) -> None:
    """Each reason a request can be refused for before it waits."""
    url = gateway.url
    async with aiohttp.ClientSession() as session:
        chat = {"model": MODEL, "prompt": "hi", "stream": False}
        assert await status_of(session, "POST", url + "/api/generate", "bob-key", data="{") == 400
        assert await status_of(session, "POST", url + "/api/generate", json=chat) == 401
        twice = '{"model": "a", "MODEL": "b"}'
        assert await status_of(session, "POST", url + "/api/generate", "bob-key", data=twice) == 400
        forbidden = {**chat, "model": OTHER}
        assert (
            await status_of(session, "POST", url + "/api/generate", "alice-key", json=forbidden)
            == 403
        )
        assert await status_of(session, "POST", url + "/api/pull", "bob-key", json=chat) == 403
        assert await status_of(session, "POST", url + "/api/generate", "dave-key", json=chat) == 429
        peer = {"X-Test-Peer": "192.0.2.7"}
        assert await status_of(session, "GET", url + "/status", "bob-key", headers=peer) == 403
        missing = {**chat, "model": "nope:1b"}
        assert (
            await status_of(session, "POST", url + "/api/generate", "bob-key", json=missing) == 404
        )
        preflight = {"Origin": "https://elsewhere.example", "Access-Control-Request-Method": "POST"}
        assert await status_of(session, "OPTIONS", url + "/api/chat", headers=preflight) == 403
        rebound = {"Host": "rebind.example"}  # a site's name, without a key
        assert await status_of(session, "GET", url + "/metrics", headers=rebound) == 403
        assert await status_of(session, "GET", url + "/nowhere") == 404
        assert await status_of(session, "GET", url + "/api/generate") == 405
        big = {**chat, "prompt": "x" * 5000}
        assert await status_of(session, "POST", url + "/api/generate", "bob-key", json=big) == 413
        await provoke_read_refusals(gateway, session)
        # Only the dead OpenAI-kind backend might serve it: no healthy backend, but not unknown.
        served_by_dead = {"model": "dead-only:1b", "messages": [{"role": "user", "content": "hi"}]}
        path = url + "/v1/chat/completions"
        assert await status_of(session, "POST", path, "bob-key", json=served_by_dead) == 503


async def provoke_read_refusals(gateway: Gateway, session: aiohttp.ClientSession) -> None:
    """A body that never comes holds bob's one read: the next read gets 429, the first 408."""
    host, _, port = gateway.url.removeprefix("http://").rpartition(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(
        b"POST /api/show HTTP/1.1\r\nHost: g\r\nAuthorization: Bearer bob-key\r\n"
        b"Content-Length: 50\r\nExpect: 100-continue\r\n\r\n"
    )
    # The interim reply goes out once the read is counted, just before the body is awaited.
    assert await reader.readuntil(b"\r\n\r\n") == b"HTTP/1.1 100 Continue\r\n\r\n"
    writer.write(b"{")
    show = {"model": MODEL}
    assert await status_of(session, "POST", gateway.url + "/api/show", "bob-key", json=show) == 429
    assert (await reader.readline()).startswith(b"HTTP/1.1 408")  # body_timeout
    writer.close()


async def provoke_room_refusals(gateway: Gateway) -> None:
    """The waiting room's refusals: the user's queue, the room's depth, the wait."""
    url = gateway.url + "/api/generate"
    chat = {"model": MODEL, "prompt": "hi", "stream": False}
    async with held(gateway, "alice-key", "holding the only slot"), aiohttp.ClientSession() as s:
        waiting = asyncio.create_task(status_of(s, "POST", url, "bob-key", json=chat))
        await until(gateway.services.admission, lambda snap: snap.queue_depth == 1)
        assert await status_of(s, "POST", url, "carol-key", json=chat) == 503  # gateway_busy
        assert await status_of(s, "POST", url, "alice-key", json=chat) == 503  # user_queue_full
        assert await waiting == 503  # wait_timeout
        revoked = asyncio.create_task(status_of(s, "POST", url, "bob-key", json=chat))
        await until(gateway.services.admission, lambda snap: snap.queue_depth == 1)
        # What a reload that takes bob's key out of the file does to his waiting request.
        gateway.services.admission.revoke(lambda user, credential: user != "bob")
        assert await revoked == 401  # key_revoked


async def test_every_refusal_reason_is_counted_in_fairgate_rejections_total(
    start_sim: StartSim, start_gateway: StartGateway, servers: object
) -> None:
    """Each reason the gateway refuses for, provoked once, shows in the rejections counter."""
    _, sim_url = await start_sim(models=[MODEL, OTHER])
    dead = f"http://127.0.0.1:{free_port()}"
    backends = (
        f"backends:\n  - {{name: sim, url: {sim_url}, kind: ollama, slots: 1}}\n"
        f"  - {{name: dead, url: {dead}, kind: openai, slots: 1}}\n"
    )
    settings = Settings(max_body_bytes=2000, body_timeout=0.3, max_reads_per_user=1)
    app = create_app(settings, parse_policy(HOUSE + backends))
    app.middlewares.insert(0, peer_from_header)
    gateway = Gateway(await serve(servers, app), app)  # type: ignore[arg-type]
    await provoke_request_refusals(gateway)
    await provoke_room_refusals(gateway)

    closed = HOUSE + "redis: {on_failure: closed}\n" + backends
    no_redis = f"redis://127.0.0.1:{free_port()}"
    shared = await start_gateway(closed, redis_url=no_redis)
    async with aiohttp.ClientSession() as session:
        chat = {"model": MODEL, "prompt": "hi", "stream": False}
        path = shared.url + "/api/generate"
        assert await status_of(session, "POST", path, "bob-key", json=chat) == 503

    await drain(gateway.services, within=0)  # what SIGTERM starts
    async with aiohttp.ClientSession() as session:
        chat = {"model": MODEL, "prompt": "hi", "stream": False}
        assert (
            await status_of(session, "POST", gateway.url + "/api/generate", "bob-key", json=chat)
            == 503
        )

    counted = await rejection_reasons(gateway) | await rejection_reasons(shared)
    assert counted == {str(reason) for reason in REFUSALS}


def test_the_error_table_of_the_docs_names_every_reason_and_no_other() -> None:
    """docs/errors.md's table (the whole page) is the Reason enum, no more, no less."""
    table = (REPO / "docs" / "errors.md").read_text()
    rows = [line for line in table.splitlines() if line.startswith("| ") and "`" in line]
    named = {name for row in rows for name in re.findall(r"`([a-z_]+)`", row.split("|")[2])}
    assert named == {str(reason) for reason in Reason}


def test_the_core_imports_no_aiohttp() -> None:
    """Admission, scheduling, policy, tallies, holds and routing load without the web stack."""
    program = (
        "import sys\n"
        + "".join(f"import {module}\n" for module in CORE)
        + "print(sorted(m for m in sys.modules if m.split('.')[0] in ('aiohttp', 'multidict')))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert loaded == "[]"
