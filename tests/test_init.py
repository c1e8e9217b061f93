"""``fairgate init``: from a running server to a policy the gateway serves, and the first chat.

The command runs as an admin runs it (its ``main``, in a thread: it asks the server over
plain HTTP while the simulated server answers on this test's event loop), against a real
loopback simulator; then a gateway is started on the file it wrote and a person chats with
the key it printed.
"""

from __future__ import annotations

import asyncio
import os
import re
import stat
from pathlib import Path

import aiohttp
import ollama
import pytest
import yaml

from gateway.__main__ import main
from tests.conftest import StartGateway, StartSim


async def init(*argv: str) -> int:
    return await asyncio.to_thread(main, ["init", *argv])


def printed_keys(out: str) -> dict[str, str]:
    return dict(re.findall(r"^  (\S+)\s+(fg-\S+)$", out, re.MULTILINE))


async def test_a_first_policy_from_the_local_ollama_to_the_first_chat(
    start_sim: StartSim,
    start_gateway: StartGateway,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The models are read from the server; each person gets a key, printed once and kept
    as a digest; the file is the admin's alone; the gateway serves it and a person chats."""
    _, url = await start_sim(models=["llama3.2:3b", "qwen2.5:7b"])
    policy = tmp_path / "fairgate.yaml"
    code = await init(
        "--backend", url, "--person", "alice", "--person", "bob", "--open-webui",
        "--output", str(policy),
    )  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0, out
    keys = printed_keys(out)
    assert set(keys) == {"alice", "bob", "owui"}
    assert "llama3.2:3b, qwen2.5:7b" in out and "ENABLE_FORWARD_USER_INFO_HEADERS" in out
    text = policy.read_text()
    assert all(key not in text for key in keys.values())  # digests only
    assert stat.S_IMODE(policy.stat().st_mode) == 0o600
    written = yaml.safe_load(text)
    assert written["users"]["alice"]["admin"] is True
    assert written["backends"][0]["url"] == url

    gateway = await start_gateway(policy)
    async with ollama.AsyncClient(
        host=gateway.url, headers={"Authorization": f"Bearer {keys['bob']}"}
    ) as client:
        reply = await client.chat(model="llama3.2:3b", messages=[{"role": "user", "content": "hi"}])
    assert reply.done
    chat = {"model": "llama3.2:3b", "messages": [{"role": "user", "content": "hi"}]}
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            gateway.url + "/api/chat", json=chat, headers={"Authorization": "Bearer wrong"}
        ) as bad,
    ):
        assert bad.status == 401


async def test_a_llama_server_says_its_slots(
    start_sim: StartSim, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, url = await start_sim(flavor="llamacpp", parallel=3)
    policy = tmp_path / "fairgate.yaml"
    assert await init("--backend", url, "--person", "ann", "--output", str(policy)) == 0
    backend = yaml.safe_load(policy.read_text())["backends"][0]
    assert backend["kind"] == "llamacpp" and "slots" not in backend
    assert "its 3 slots" in policy.read_text()
    assert "in front of llamacpp" in capsys.readouterr().out


async def test_it_never_overwrites_nor_writes_a_policy_for_nobody(
    start_sim: StartSim, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, url = await start_sim()
    policy = tmp_path / "fairgate.yaml"
    policy.write_text("mine\n")
    assert await init("--backend", url, "--person", "ann", "--output", str(policy)) == 1
    assert "exists; --force" in capsys.readouterr().err
    assert policy.read_text() == "mine\n"
    assert await init("--backend", url, "--person", "Ann Smith", "--output", str(policy),
                      "--force") == 1  # fmt: skip
    assert "not a name: Ann Smith" in capsys.readouterr().err
    assert policy.read_text() == "mine\n"
    assert await init("--backend", url, "--person", "ann", "--output", str(policy), "--force") == 0
    assert "ann" in yaml.safe_load(policy.read_text())["users"]
    assert os.listdir(tmp_path) == ["fairgate.yaml"]  # nothing left beside it


async def test_no_server_is_said_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = tmp_path / "fairgate.yaml"
    code = await init("--backend", "http://127.0.0.1:9", "--person", "a", "--output", str(policy))
    assert code == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no Ollama or llama-server answered" in err
    assert not policy.exists()


async def test_names_and_places_it_cannot_use_are_said_in_one_line(
    start_sim: StartSim, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`anonymous` is whoever brings no key (an admin of that name would open /status to
    the network), `unknown` is how metrics count unknown keys, `owui` the front end's own
    name: each refused before anything is written; so is a directory that does not exist.
    An address without its scheme is the server's all the same."""
    _, url = await start_sim()
    policy = tmp_path / "fairgate.yaml"
    for name, flags in (("anonymous", ()), ("unknown", ()), ("owui", ("--open-webui",))):
        code = await init("--backend", url, "--person", name, *flags, "--output", str(policy))
        err = capsys.readouterr().err
        assert code == 1 and err.count("\n") == 1 and "a name the gateway gives" in err, err
    nowhere = tmp_path / "nowhere" / "fairgate.yaml"
    assert await init("--backend", url, "--person", "ann", "--output", str(nowhere)) == 1
    assert f"no directory {nowhere.parent}" in capsys.readouterr().err
    assert not policy.exists() and os.listdir(tmp_path) == []
    bare = url.removeprefix("http://")
    assert await init("--backend", bare, "--person", "ann", "--output", str(policy)) == 0
    assert yaml.safe_load(policy.read_text())["backends"][0]["url"] == url


async def test_a_gateway_is_not_taken_for_the_server_behind_it(
    start_sim: StartSim,
    start_gateway: StartGateway,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The gateway relays Ollama's /api/version: asked of it, init would write a policy
    whose backend is the gateway itself. It says no server answered there instead."""
    _, url = await start_sim()
    gateway = await start_gateway(f"backends: [{{name: b, url: {url}, slots: 1}}]\n")
    policy = tmp_path / "fairgate.yaml"
    code = await init("--backend", gateway.url, "--person", "ann", "--output", str(policy))
    assert code == 1 and "a gateway is not one" in capsys.readouterr().err
    assert not policy.exists()


async def test_its_next_steps_name_the_port_the_gateway_will_listen_on(
    start_sim: StartSim,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """FAIRGATE_LISTEN says 8123: the clients are pointed there, not at 8080, and told how
    the gateway reaches other machines."""
    monkeypatch.setenv("FAIRGATE_LISTEN", "127.0.0.1:8123")
    _, url = await start_sim()
    policy = tmp_path / "fairgate.yaml"
    assert await init("--backend", url, "--person", "ann", "--output", str(policy)) == 0
    out = capsys.readouterr().out
    assert "OLLAMA_HOST=http://THIS-MACHINE:8123" in out and ":8080" not in out
    assert "FAIRGATE_LISTEN=0.0.0.0:8123" in out
