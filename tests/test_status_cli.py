"""``fairgate status``, run as a command against a running gateway."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
from contextlib import AsyncExitStack

import aiohttp
import yarl

from gateway.app import create_app
from gateway.config.policy import parse_policy
from gateway.config.settings import Settings
from tests.conftest import Gateway, StartGateway, StartSim, serve
from tests.test_admission import MODEL, until
from tests.test_house import Stream, from_another_machine, house, open_stream
from tests.test_house import streams as streams  # the fixture


async def fairgate_status(*args: str, command: str = "status", **env: str) -> tuple[int, str, str]:
    """Run ``fairgate status ARGS`` (or another ``command``) to its end, with ``env`` added
    to the environment: exit code, stdout, stderr."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway", command, *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, **env},
    )  # fmt: skip
    out, err = await asyncio.wait_for(process.communicate(), timeout=30)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


def row_of(text: str, table: str, first: str) -> list[str]:
    """The cells of the row that starts with ``first`` in the table headed ``table ...``."""
    block = next(b for b in text.split("\n\n") if b.startswith(table + " "))
    return next(line.split() for line in block.splitlines() if line.split()[:1] == [first])


class TestStatusCommand:
    async def test_it_asks_the_gateway_at_fairgate_listen_and_refuses_a_bad_interval(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """Without --url it asks this machine's gateway where FAIRGATE_LISTEN puts it (on
        every address: loopback); a negative or not-a-number interval is refused in one
        line, not a traceback (nor 0, which redraws as fast as it can ask)."""
        _, url = await start_sim()
        gateway = await start_gateway(f"backends: [{{name: sim, url: {url}, slots: 1}}]\n")
        port = gateway.url.rsplit(":", 1)[1]
        code, out, err = await fairgate_status(FAIRGATE_LISTEN=f"0.0.0.0:{port}")
        assert code == 0 and "sim" in out, err
        # Named in any case, as the settings read it (serve listens there too).
        code, out, err = await fairgate_status(fairgate_listen=f"0.0.0.0:{port}")
        assert code == 0 and "sim" in out, err
        for interval in ("-1", "nan", "0"):
            code, _, err = await fairgate_status("--watch", "--interval", interval)
            assert code == 2 and "at least 0.1" in err and "Traceback" not in err, err

    async def test_the_simulator_on_a_taken_port_says_so_in_one_line(self) -> None:
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            port = str(taken.getsockname()[1])
            code, out, err = await fairgate_status("--port", port, command="sim")
        assert code == 2 and f"cannot listen on 127.0.0.1:{port}" in out + err, out + err
        assert "Traceback" not in err

    async def test_it_prints_the_slots_who_runs_and_who_waits(
        self, start_sim: StartSim, start_gateway: StartGateway, streams: list[Stream]
    ) -> None:
        """Bob runs and carol waits for the one slot: the table says so, like ollama ps."""
        _, sim_url = await start_sim(parallel=4)
        gateway = await start_gateway(house(sim_url, slots=1))
        await (await open_stream(streams, gateway, "bob-key")).started.wait()
        await open_stream(streams, gateway, "carol-key")
        await until(gateway.services.admission, lambda s: s.queue_depth == 1)

        code, out, err = await fairgate_status("--url", gateway.url)
        assert (code, err) == (0, "")
        assert out.startswith("1 of 1 slots busy, 1 waiting (oldest ")
        assert row_of(out, "BACKEND", "gpu")[:5] == ["gpu", "ollama", "up", "1/1", "0/1"]
        assert row_of(out, "BACKEND", "gpu")[5:7] == [MODEL, "(4k,"]  # in memory, its context
        assert row_of(out, "RUNNING", "bob")[:4] == ["bob", MODEL, "gpu", "light"]  # running
        assert row_of(out, "#", "1")[:4] == ["1", "carol", MODEL, "light"]  # waiting, first
        assert row_of(out, "USER", "carol")[:3] == ["carol", "0/1", "1/5"]  # against her limits
        assert row_of(out, "USER", "carol")[-1] == "-"  # no budget
        assert " ".join(row_of(out, "USER", "bob")).endswith("99/100 req/h")  # his one runs

    async def test_watch_redraws_until_interrupted(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """--watch clears the screen and redraws each interval; Ctrl-C ends it cleanly."""
        _, sim_url = await start_sim()
        gateway = await start_gateway(house(sim_url))
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gateway", "status", "--watch", "--interval", "0.1",
            "--url", gateway.url, stdout=asyncio.subprocess.PIPE,
            # A Ctrl-C it can receive: started in the background by a shell without job
            # control (a CI runner's `cmd &`), the tests inherit SIGINT ignored, and Python
            # then keeps it ignored (no KeyboardInterrupt), as a Ctrl-C should be there.
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )  # fmt: skip
        assert process.stdout is not None
        seen = b""
        async with asyncio.timeout(20):
            while seen.count(b"\x1b[H\x1b[2J") < 3:
                seen += await process.stdout.read(4096)
            process.send_signal(signal.SIGINT)
            await process.communicate()
        assert process.returncode == 0
        assert b"0 of 2 slots busy, 0 waiting" in seen

    async def test_a_strangers_escapes_reach_the_terminal_written_out(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """A keyless request whose path carries a terminal escape, and bob's chat naming a
        model with a right-to-left override, are refused and listed: the table writes both
        out as escapes instead of letting the terminal act on them."""
        _, sim_url = await start_sim()
        gateway = await start_gateway(house(sim_url))
        async with aiohttp.ClientSession() as session:
            hostile = gateway.url + "/api/%1b]0;pwned%07%1b[2J"
            async with session.get(yarl.URL(hostile, encoded=True)) as reply:
                assert reply.status == 404  # no such route, and no key: a stranger's
            chat = {"model": "llama\u202e3", "messages": []}
            bob = {"Authorization": "Bearer bob-key"}
            async with session.post(gateway.url + "/api/chat", json=chat, headers=bob) as reply:
                assert reply.status == 404

        code, out, err = await fairgate_status("--url", gateway.url)
        assert (code, err) == (0, "")
        assert "\x1b" not in out and "\x07" not in out and "\u202e" not in out
        assert "/api/\\x1b]0;pwned\\x07\\x1b[2J" in out
        assert "llama\\u202e3" in out

    async def test_a_key_is_needed_from_another_machine_and_must_be_an_admins(
        self, start_sim: StartSim, servers: AsyncExitStack
    ) -> None:
        """Off loopback, no key or bob's key is refused with the gateway's words; alice's
        admin key reads the table."""
        _, sim_url = await start_sim()
        app = create_app(Settings(), parse_policy(house(sim_url)))
        app.middlewares.insert(0, from_another_machine)
        gateway = Gateway(await serve(servers, app), app)

        code, out, err = await fairgate_status("--url", gateway.url)
        assert (code, out) == (1, "")
        assert "answered 401" in err
        code, out, err = await fairgate_status("--url", gateway.url, "--key", "bob-key")
        assert (code, out) == (1, "")
        assert "answered 403: /status needs an admin key or a loopback client" in err
        code, out, err = await fairgate_status("--url", gateway.url, "--key", "alice-key")
        assert (code, err) == (0, "")
        assert out.startswith("0 of 2 slots busy")
