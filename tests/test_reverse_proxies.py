"""The proxies of docs/tls.md, for real: nginx and Caddy run the files in ``deploy/`` (over plain
HTTP; TLS is theirs, not ours) in front of a gateway that trusts them. Streams arrive token by
token, a client that hangs up frees its slot, the client's own address is the one used, and
/status is not open to remote clients of a proxy on the gateway's machine."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp
import pytest

from tests.conftest import Finished, Gateway, StartGateway, StartSim, one_backend
from tests.processes import free_port, required_binary, stop, until_answers
from tests.test_admission import MODEL, until

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
CLIENT = "127.0.0.3"  # the client's machine: a loopback address that is not the proxy's
TV = "192.168.1.50"


def household(sim_url: str) -> str:
    users = f"""\
trusted_proxies: [127.0.0.1/32]
users:
  alice: {{keys: [alice-key]}}
  laptop: {{clients: [{CLIENT}/32]}}
  tv: {{clients: [{TV}/32]}}
"""
    return one_backend(sim_url, slots=2, extra=users)


def replaced(text: str, old: str, new: str) -> str:
    """``text`` with ``old`` (which must be there: the file changed otherwise) as ``new``."""
    assert old in text, f"the deploy file no longer has {old!r}"
    return text.replace(old, new)


@asynccontextmanager
async def nginx(workdir: Path, host: str, gateway: Gateway) -> AsyncIterator[str]:
    """deploy/nginx/fairgate.conf listening on host, in front of ``gateway``; its URL."""
    binary = required_binary("nginx", "nginx-light")
    port = free_port()
    site = (DEPLOY / "nginx" / "fairgate.conf").read_text()
    site = replaced(site, "server 127.0.0.1:8080;", f"server {urlsplit(gateway.url).netloc};")
    site = replaced(
        site, "    listen 443 ssl;\n    listen [::]:443 ssl;\n", f"listen {host}:{port};"
    )
    site = "\n".join(line for line in site.splitlines() if "ssl_certificate" not in line)
    (workdir / "nginx.conf").write_text(
        f"daemon off;\nworker_processes 1;\npid {workdir}/nginx.pid;\n"
        f"error_log {workdir}/error.log;\nevents {{ worker_connections 64; }}\n"
        f"http {{\naccess_log off;\nclient_body_temp_path {workdir};\n"
        f"proxy_temp_path {workdir};\n{site}\n}}\n"
    )
    command = [binary, "-e", "stderr", "-p", str(workdir), "-c", str(workdir / "nginx.conf")]
    async with _running(command, os.environ, f"http://{host}:{port}", workdir) as url:
        yield url


@asynccontextmanager
async def caddy(workdir: Path, host: str, gateway: Gateway) -> AsyncIterator[str]:
    """deploy/caddy/Caddyfile over plain HTTP on host, in front of ``gateway``; its URL."""
    binary = required_binary("caddy", "caddy")
    port = free_port()
    site = (DEPLOY / "caddy" / "Caddyfile").read_text()
    site = replaced(site, "gpu.example.com {", f"http://{host}:{port} {{")
    site = replaced(site, "reverse_proxy 127.0.0.1:8080", f"reverse_proxy {gateway.url[7:]}")
    # No admin endpoint, certificates or state outside the test's directory.
    options = f"{{\n\tadmin off\n\tstorage file_system {workdir}\n}}\n"
    (workdir / "Caddyfile").write_text(options + site)
    environment = {**os.environ, "HOME": str(workdir), "XDG_DATA_HOME": str(workdir)}
    environment["XDG_CONFIG_HOME"] = str(workdir)
    command = [binary, "run", "--adapter", "caddyfile", "--config", str(workdir / "Caddyfile")]
    async with _running(command, environment, f"http://{host}:{port}", workdir) as url:
        yield url


@asynccontextmanager
async def _running(
    command: list[str], environment: Mapping[str, str], url: str, workdir: Path
) -> AsyncIterator[str]:
    """``command`` running until the block ends, once ``url`` answers through it."""
    log = workdir / "output.log"
    with log.open("w") as output:
        process = await asyncio.create_subprocess_exec(
            *command, env=environment, stdout=output, stderr=output
        )
    try:
        await until_answers(url + "/healthz", within=20, process=process, log=log)
        yield url
    finally:
        await stop(process)


PROXIES = {"nginx": nginx, "caddy": caddy}


@pytest.fixture(params=sorted(PROXIES))
def proxy_kind(request: pytest.FixtureRequest) -> str:
    kind: str = request.param
    return kind


async def started(
    kind: str, tmp_path: Path, host: str, start_sim: StartSim, start_gateway: StartGateway
) -> tuple[Gateway, contextlib.AbstractAsyncContextManager[str]]:
    _, sim_url = await start_sim(parallel=4)
    gateway = await start_gateway(household(sim_url))
    return gateway, PROXIES[kind](tmp_path, host, gateway)


def session_from(address: str) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(local_addr=(address, 0)))


STALLED = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}
STALLED["options"] = {"sim_stall_after": 1}  # one token, then the backend holds the slot


@pytest.mark.parametrize(
    ("path", "first"), [("/api/chat", b'{"model"'), ("/v1/chat/completions", b"data: ")]
)
async def test_a_stream_arrives_token_by_token_and_a_hang_up_frees_the_slot(
    proxy_kind: str,
    path: str,
    first: bytes,
    tmp_path: Path,
    start_sim: StartSim,
    start_gateway: StartGateway,
) -> None:
    """The first token reaches the client while the backend still holds the reply (no
    buffering); when the client hangs up, the gateway's slot is free again."""
    gateway, proxied = await started(proxy_kind, tmp_path, "127.0.0.1", start_sim, start_gateway)
    admission = gateway.services.admission
    async with proxied as url, session_from(CLIENT) as session:
        headers = {"Authorization": "Bearer alice-key"}
        async with session.post(url + path, json=STALLED, headers=headers) as reply:
            assert reply.status == 200
            async with asyncio.timeout(10):
                line = await reply.content.readline()
            assert line.startswith(first)
            assert [run.user for run in admission.snapshot().running] == ["alice"]
        await until(admission, lambda room: not room.running, within=10)


async def test_the_client_is_the_address_the_proxy_saw_not_the_one_it_claims(
    proxy_kind: str, tmp_path: Path, start_sim: StartSim, start_gateway: StartGateway
) -> None:
    """The laptop claiming to be the TV in X-Forwarded-For is served as the laptop, and
    logged at its own address through the proxy."""
    gateway, proxied = await started(proxy_kind, tmp_path, "127.0.0.1", start_sim, start_gateway)
    finished = Finished(gateway)
    async with (
        proxied as url,
        session_from(CLIENT) as session,
        session.get(url + "/api/tags", headers={"X-Forwarded-For": TV}) as reply,
    ):
        assert reply.status == 200
    record = await finished.first(("/api/tags",))
    assert record.user == "laptop"
    assert (str(record.client.address), str(record.client.proxy)) == (CLIENT, "127.0.0.1")


def test_the_docs_show_the_caddyfile_that_is_tested() -> None:
    """docs/tls.md's Caddy block is deploy/caddy/Caddyfile without its comments."""
    page = (DEPLOY.parent / "docs" / "tls.md").read_text()
    shown = page.split("[`deploy/caddy/Caddyfile`]", 1)[1].split("```\n", 2)[1]
    lines = (DEPLOY / "caddy" / "Caddyfile").read_text().splitlines()
    tested = [line for line in lines if line.strip() and not line.lstrip().startswith("#")]
    assert shown.splitlines() == tested


def this_machine_on_the_network() -> str:
    """An address of this machine that is not loopback (the one its default route uses)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.123", 9))  # UDP: nothing is sent
        except OSError:
            pytest.skip("this machine has no network address besides loopback")
        address: str = probe.getsockname()[0]
    if address.startswith("127."):
        pytest.skip("this machine has no network address besides loopback")
    return address


async def test_status_through_a_proxy_on_this_machine_is_refused_to_a_remote_client(
    proxy_kind: str, tmp_path: Path, start_sim: StartSim, start_gateway: StartGateway
) -> None:
    """Every request comes from the proxy on loopback, but /status without a key opens only
    to clients on this machine: a client from the network address gets 401."""
    network = this_machine_on_the_network()
    _, proxied = await started(proxy_kind, tmp_path, network, start_sim, start_gateway)
    async with proxied as url:
        async with session_from(network) as session, session.get(url + "/status") as reply:
            remote = reply.status
        async with session_from(CLIENT) as session, session.get(url + "/status") as reply:
            local = reply.status  # loopback behind the same proxy: this machine
    assert (remote, local) == (401, 200)
