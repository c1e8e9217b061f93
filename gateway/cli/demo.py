"""``fairgate demo``: a simulated Ollama with the gateway in front, and one reply streamed."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys

import aiohttp

from fairsim import SimConfig, Simulator
from gateway.app import bound_url, create_app, start_server
from gateway.config import IN_MEMORY, BackendConfig, Policy, Settings
from gateway.core import configure_logging

__all__ = ["run_demo"]


def run_demo(gateway_port: int, backend_port: int) -> None:
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_demo(gateway_port, backend_port))


async def _demo(gateway_port: int, backend_port: int) -> None:
    # Warnings only: the access log would interleave with the streamed reply.
    settings = Settings(
        listen=f"127.0.0.1:{gateway_port}",
        log_format="console",
        log_level="WARNING",
        usage_db=IN_MEMORY,  # a demo's usage is not worth a file in the working directory
    )
    configure_logging(settings.log_format, settings.log_level)
    simulator = Simulator(SimConfig(parallel=2, decode_tokens_per_s=15.0, default_output_tokens=40))
    backend = await start_server(simulator.make_app(), "127.0.0.1", backend_port)
    backend_url = bound_url(backend)
    policy = Policy(backends=[BackendConfig(name="sim", url=backend_url, kind="ollama", slots=2)])
    gateway = await start_server(create_app(settings, policy), settings.host, settings.port)
    url = bound_url(gateway)
    try:
        print(f"simulated Ollama at {backend_url}; the gateway at {url}\n", file=sys.stderr)
        await _stream_one_reply(url)
        print(
            f"\n\nTry it yourself:\n"
            f"  OLLAMA_HOST={url} ollama run llama3.2:3b\n"
            f"  curl {url}/api/chat -d "
            """'{"model": "llama3.2:3b", "messages": [{"role": "user", "content": "hi"}]}'\n"""
            "Ctrl-C stops.",
            file=sys.stderr,
        )
        await asyncio.Event().wait()
    finally:
        await gateway.cleanup()
        await backend.cleanup()


async def _stream_one_reply(url: str) -> None:
    request = {"model": "llama3.2:3b", "messages": [{"role": "user", "content": "Say hello."}]}
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{url}/api/chat", json=request) as response,
    ):
        async for line in response.content:
            chunk = json.loads(line)
            print(chunk.get("message", {}).get("content", ""), end="", flush=True)
