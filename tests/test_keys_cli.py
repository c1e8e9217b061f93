"""`fairgate keys new` and `fairgate keys hash`, run as the admin runs them: a key made by
one, pasted into a policy as its digest, lets its user in."""

from __future__ import annotations

import asyncio
import re
import sys
from pathlib import Path

import aiohttp

from tests.conftest import StartGateway, StartSim, one_backend


async def keys(*args: str, stdin: bytes = b"", cwd: Path) -> tuple[int, str, str]:
    """`fairgate keys ARGS` with ``stdin``: exit status, stdout, stderr."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway", "keys", *args, cwd=cwd,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    async with asyncio.timeout(30):
        out, err = await process.communicate(stdin)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def me(url: str, key: str) -> tuple[int, str | None]:
    headers = {"Authorization": f"Bearer {key}"}
    async with (
        aiohttp.ClientSession() as session,
        session.get(url + "/ui/me.json", headers=headers) as reply,
    ):
        body = await reply.json()
        return reply.status, body.get("user")


class TestKeysNew:
    async def test_a_new_key_pasted_as_printed_lets_its_user_in(
        self, start_sim: StartSim, start_gateway: StartGateway, tmp_path: Path
    ) -> None:
        """The printed policy line holds the key's digest, not the key, and admits the key."""
        status, out, _ = await keys("new", "no", cwd=tmp_path)  # "no" is false in bare YAML
        assert status == 0
        key = re.search(r"^    (fg-[A-Za-z0-9_-]{43})$", out, re.MULTILINE)
        entry = re.search(r"^  (.+: \{keys: .+\})$", out, re.MULTILINE)
        assert key and entry
        assert key.group(1) not in entry.group(1) and "sha256:" in entry.group(1)
        _, sim_url = await start_sim()
        policy = one_backend(sim_url, extra=f"users:\n  {entry.group(1)}\n")
        gateway = await start_gateway(policy)
        assert await me(gateway.url, key.group(1)) == (200, "no")
        assert (await me(gateway.url, key.group(1) + "x"))[0] == 401

    async def test_two_new_keys_differ(self, tmp_path: Path) -> None:
        """Each key is drawn afresh."""
        first, second = [(await keys("new", "alice", cwd=tmp_path))[1] for _ in range(2)]
        assert first != second

    async def test_unknown_is_refused_as_a_name(self, tmp_path: Path) -> None:
        """The name metrics give strangers cannot be made a user."""
        status, out, err = await keys("new", "unknown", cwd=tmp_path)
        assert status == 2 and out == "" and "unknown" in err


class TestKeysHash:
    async def test_the_hash_of_a_key_from_stdin_is_the_digest_new_printed(
        self, tmp_path: Path
    ) -> None:
        """hash reads the key from stdin (a trailing newline is not part of it)."""
        _, out, _ = await keys("new", "alice", cwd=tmp_path)
        key = re.search(r"(fg-\S+)", out)
        digest = re.search(r"(sha256:[0-9a-f]{64})", out)
        assert key and digest
        status, hashed, _ = await keys("hash", stdin=key.group(1).encode() + b"\n", cwd=tmp_path)
        assert (status, hashed) == (0, digest.group(1) + "\n")

    async def test_no_key_on_stdin_is_an_error(self, tmp_path: Path) -> None:
        """An empty stdin prints no digest (the digest of nothing would admit nothing)."""
        status, out, err = await keys("hash", cwd=tmp_path)
        assert status == 1 and out == "" and "no key" in err
