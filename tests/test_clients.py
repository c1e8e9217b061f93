"""Which user each client ends up as, for each way it can carry a key.

The real client packages (ollama, openai, langchain-ollama, llama-index) and curl talk to the
gateway here; the clients that cannot run in the tests (the ollama CLI, Open WebUI, Continue,
a TV app) are sent the headers they send, as read in their sources. docs/clients.md's table
of clients is rendered from ``WAYS`` and checked against it: print it with
``python -m tests.test_clients``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import ollama
import openai
import pytest

from tests.conftest import Finished, StartGateway, StartSim

PAGE = Path(__file__).resolve().parent.parent / "docs" / "clients.md"
MODEL = "llama3.2:3b"
KEY = "alice-key"
TV_ADDRESS = "127.0.0.2"  # loopback too, but not the address every other client comes from
MESSAGES = [{"role": "user", "content": "hi"}]
CHAT_PATHS = ("/api/chat", "/v1/chat/completions", "/v1/messages")


def household(sim_url: str) -> str:
    return f"""\
users:
  anonymous: {{}}
  alice: {{keys: [{KEY}]}}
  bob: {{keys: [bob-key]}}
  tv: {{clients: [{TV_ADDRESS}/32]}}
backends:
  - {{name: gpu, url: {sim_url}, kind: ollama, slots: 2}}
"""


Send = Callable[[str, pytest.MonkeyPatch], Awaitable[None]]


@dataclass(frozen=True)
class Way:
    """One way a client can be told the key, and who the gateway then says is asking."""

    client: str
    how: str  # Markdown, as docs/clients.md shows it
    runs_as: str  # alice (the key's user), anonymous (no key arrived), tv, or 401
    send: Send
    checked: str  # what the test runs: the client itself, or the headers it sends


def with_userinfo(url: str, userinfo: str) -> str:
    return url.replace("http://", f"http://{userinfo}@", 1)


# The ollama package --------------------------------------------------------------------


async def ollama_chat(host: str, **options: object) -> None:
    async with ollama.AsyncClient(host=host, **options) as client:
        # A 401 is an answer: the record says who it was refused to.
        with contextlib.suppress(ollama.ResponseError):
            await client.chat(model=MODEL, messages=MESSAGES)


async def ollama_environment(url: str, env: pytest.MonkeyPatch) -> None:
    env.setenv("OLLAMA_API_KEY", KEY)
    await ollama_chat(url)


async def ollama_headers(url: str, env: pytest.MonkeyPatch) -> None:
    await ollama_chat(url, headers={"Authorization": f"Bearer {KEY}"})


async def ollama_userinfo(url: str, env: pytest.MonkeyPatch) -> None:
    await ollama_chat(with_userinfo(url, f"alice:{KEY}"))


# openai ---------------------------------------------------------------------------------


async def openai_api_key(url: str, env: pytest.MonkeyPatch) -> None:
    async with openai.AsyncOpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0) as client:
        await client.chat.completions.create(model=MODEL, messages=[*MESSAGES])  # type: ignore[list-item]


# anthropic (what Claude Code's ANTHROPIC_API_KEY and ANTHROPIC_AUTH_TOKEN send) ---------


async def anthropic_api_key(url: str, env: pytest.MonkeyPatch) -> None:
    import anthropic

    async with anthropic.AsyncAnthropic(base_url=url, api_key=KEY, max_retries=0) as client:
        await client.messages.create(model=MODEL, max_tokens=3, messages=[*MESSAGES])  # type: ignore[list-item]


async def anthropic_auth_token(url: str, env: pytest.MonkeyPatch) -> None:
    import anthropic

    async with anthropic.AsyncAnthropic(base_url=url, auth_token=KEY, max_retries=0) as client:
        await client.messages.create(model=MODEL, max_tokens=3, messages=[*MESSAGES])  # type: ignore[list-item]


# langchain-ollama and llama-index: their synchronous calls in a thread, since llama-index
# blocks on /api/show (the context window) even from its async methods.


def langchain_chat(base_url: str) -> None:
    from langchain_ollama import ChatOllama

    chat = ChatOllama(model=MODEL, base_url=base_url)
    try:
        chat.invoke("hi")
    finally:
        chat._client.close()  # type: ignore[union-attr]  # no public close


async def langchain_userinfo(url: str, env: pytest.MonkeyPatch) -> None:
    await asyncio.to_thread(langchain_chat, with_userinfo(url, f"alice:{KEY}"))


async def langchain_environment(url: str, env: pytest.MonkeyPatch) -> None:
    env.setenv("OLLAMA_API_KEY", KEY)
    await asyncio.to_thread(langchain_chat, url)


def llama_index_chat(base_url: str, headers: dict[str, str] | None = None) -> None:
    from llama_index.core.llms import ChatMessage
    from llama_index.llms.ollama import Ollama

    llm = Ollama(model=MODEL, base_url=base_url, request_timeout=30.0, headers=headers)
    try:
        with contextlib.suppress(ollama.ResponseError):
            llm.chat([ChatMessage(role="user", content="hi")])
    finally:
        llm.client.close()


async def llama_index_headers(url: str, env: pytest.MonkeyPatch) -> None:
    await asyncio.to_thread(llama_index_chat, url, {"Authorization": f"Bearer {KEY}"})


async def llama_index_environment(url: str, env: pytest.MonkeyPatch) -> None:
    env.setenv("OLLAMA_API_KEY", KEY)
    await asyncio.to_thread(llama_index_chat, url)


async def llama_index_userinfo(url: str, env: pytest.MonkeyPatch) -> None:
    await asyncio.to_thread(llama_index_chat, with_userinfo(url, f"alice:{KEY}"))


# curl -----------------------------------------------------------------------------------


async def curl(url: str, *arguments: str) -> None:
    body = json.dumps({"model": MODEL, "messages": MESSAGES})
    process = await asyncio.create_subprocess_exec(
        "curl", "-sS", "-o", "/dev/null", "--max-time", "30", *arguments, "-d", body,
        url + "/api/chat",
    )  # fmt: skip
    assert await process.wait() == 0


async def curl_bearer(url: str, env: pytest.MonkeyPatch) -> None:
    await curl(url, "-H", f"Authorization: Bearer {KEY}")


async def curl_api_key(url: str, env: pytest.MonkeyPatch) -> None:
    await curl(url, "-H", f"X-API-Key: {KEY}")


async def curl_userinfo(url: str, env: pytest.MonkeyPatch) -> None:
    await curl(with_userinfo(url, f"alice:{KEY}"))


async def curl_key_as_user(url: str, env: pytest.MonkeyPatch) -> None:
    await curl(with_userinfo(url, KEY))


async def curl_another_name(url: str, env: pytest.MonkeyPatch) -> None:
    await curl(with_userinfo(url, f"bob:{KEY}"))


# Clients that cannot run here: the headers they send -----------------------------------


async def post_chat(url: str, headers: dict[str, str], local_address: str | None = None) -> None:
    local = (local_address, 0) if local_address else None
    connector = aiohttp.TCPConnector(local_addr=local)
    body = {"model": MODEL, "messages": MESSAGES}
    async with (
        aiohttp.ClientSession(connector=connector) as session,
        session.post(url + "/api/chat", json=body, headers=headers) as reply,
    ):
        await reply.read()


async def ollama_cli(url: str, env: pytest.MonkeyPatch) -> None:
    # cmd/ and api/client.go: OLLAMA_HOST is parsed to scheme, host and port (userinfo does
    # not survive), and only ollama.com (or OLLAMA_AUTH) gets an Authorization header.
    await post_chat(url, {"User-Agent": "ollama/0.12.0 (amd64 linux) Go/go1.24.0"})


async def bearer_json(url: str, env: pytest.MonkeyPatch) -> None:
    # Open WebUI (backend/open_webui/routers/ollama.py) sends the connection's key, Continue
    # (core/llm/llms/Ollama.ts) its apiKey, both as a bearer token beside the JSON type.
    await post_chat(url, {"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"})


async def tv_app(url: str, env: pytest.MonkeyPatch) -> None:
    await post_chat(url, {}, local_address=TV_ADDRESS)


PACKAGE, CURL, HEADERS = "the package", "curl", "the headers it sends"
WAYS = [
    Way("`ollama` (Python)", "`OLLAMA_API_KEY=KEY` in the environment", "alice",
        ollama_environment, PACKAGE),
    Way("`ollama` (Python)", '`Client(headers={"Authorization": "Bearer KEY"})`', "alice",
        ollama_headers, PACKAGE),
    Way("`ollama` (Python)", "`Client(host=\"http://alice:KEY@gpu-box:8080\")`", "anonymous",
        ollama_userinfo, PACKAGE),
    Way("`openai` (Python)", '`OpenAI(base_url="http://gpu-box:8080/v1", api_key="KEY")`',
        "alice", openai_api_key, PACKAGE),
    Way("`anthropic` (Python), Claude Code", '`Anthropic(base_url="http://gpu-box:8080", '
        'api_key="KEY")`, `ANTHROPIC_API_KEY=KEY` (sent as `X-API-Key`)', "alice",
        anthropic_api_key, PACKAGE),
    Way("`anthropic` (Python), Claude Code", '`Anthropic(auth_token="KEY")`, '
        "`ANTHROPIC_AUTH_TOKEN=KEY` (sent as `Bearer`)", "alice", anthropic_auth_token, PACKAGE),
    Way("langchain-ollama", '`ChatOllama(base_url="http://alice:KEY@gpu-box:8080")`', "alice",
        langchain_userinfo, PACKAGE),
    Way("langchain-ollama", "`OLLAMA_API_KEY=KEY` in the environment", "alice",
        langchain_environment, PACKAGE),
    Way("llama-index-llms-ollama", '`Ollama(headers={"Authorization": "Bearer KEY"})`',
        "alice", llama_index_headers, PACKAGE),
    Way("llama-index-llms-ollama", "`OLLAMA_API_KEY=KEY` in the environment", "alice",
        llama_index_environment, PACKAGE),
    Way("llama-index-llms-ollama", '`Ollama(base_url="http://alice:KEY@gpu-box:8080")`',
        "anonymous", llama_index_userinfo, PACKAGE),
    Way("curl", "`-H 'Authorization: Bearer KEY'`", "alice", curl_bearer, CURL),
    Way("curl", "`-H 'X-API-Key: KEY'`", "alice", curl_api_key, CURL),
    Way("curl", "`http://alice:KEY@gpu-box:8080` (or `-u alice:KEY`)", "alice",
        curl_userinfo, CURL),
    Way("curl", "`http://KEY@gpu-box:8080`", "alice", curl_key_as_user, CURL),
    Way("curl", "`http://bob:KEY@gpu-box:8080` with alice's key", "401",
        curl_another_name, CURL),
    Way("`ollama` CLI", "none: `OLLAMA_HOST` carries no key", "anonymous", ollama_cli, HEADERS),
    Way("Open WebUI", "the connection's API key (sent as `Bearer`)", "alice", bearer_json,
        HEADERS),
    Way("Continue", "`apiKey` in its model config (sent as `Bearer`)", "alice", bearer_json,
        HEADERS),
    Way("a TV app", "none: its address is under the user's `clients:`", "tv", tv_app, HEADERS),
]  # fmt: skip

_OUTCOMES = {
    "alice": "alice, the key's user",
    "anonymous": "**no key arrives**: `anonymous` if defined, else 401",
    "tv": "tv, by its address",
    "401": "401: the name is a user's, and not the key's",
}


@pytest.mark.parametrize("way", WAYS, ids=lambda way: f"{way.client} {way.how}")
async def test_each_client_runs_as_the_user_the_docs_say(
    way: Way, start_sim: StartSim, start_gateway: StartGateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The client, given the key this way, is served as the user the table names (or 401)."""
    monkeypatch.delenv("OLLAMA_API_KEY", raising=False)
    _, sim_url = await start_sim()
    gateway = await start_gateway(household(sim_url))
    finished = Finished(gateway)
    await way.send(gateway.url, monkeypatch)
    record = await finished.first(CHAT_PATHS)
    assert ("401" if record.status == 401 else record.user) == way.runs_as
    if way.runs_as != "401":
        assert record.status == 200


def clients_table() -> str:
    lines = [
        "| client | how it is given the key | the gateway serves it as | tested with |",
        "| --- | --- | --- | --- |",
    ]
    for way in WAYS:
        lines.append(f"| {way.client} | {way.how} | {_OUTCOMES[way.runs_as]} | {way.checked} |")
    return "\n".join(lines)


_TABLE = re.compile(r"<!-- clients: .*? -->\n(.*?)\n<!-- /clients -->", re.DOTALL)


def test_the_table_of_clients_in_the_docs_is_the_one_tested_here() -> None:
    """docs/clients.md's table is rendered from WAYS (python -m tests.test_clients prints it)."""
    found = _TABLE.search(PAGE.read_text())
    assert found is not None, "docs/clients.md has no <!-- clients: ... --> block"
    assert found.group(1) == clients_table()


if __name__ == "__main__":
    print(clients_table())
