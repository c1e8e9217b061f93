"""The gateway process from start to stop: a SIGHUP at once, a bounded drain on SIGTERM,
and connections that cannot exhaust its descriptors. Real `fairgate serve` processes."""

from __future__ import annotations

import asyncio
import json
import os
import resource
import signal
import socket
import time
from pathlib import Path

import aiohttp
import pytest
import structlog

from gateway.edge.http.connections import descriptor_cap
from tests.conftest import StartSim
from tests.processes import free_port
from tests.test_admission import MODEL
from tests.test_process import fairgate, gpu_backend, logged

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGHUP"), reason="POSIX signals")


async def serving(process: asyncio.subprocess.Process) -> str:
    """The URL the process logs once it listens."""
    url: str = (await logged(process, "serving"))["listen"]
    return url


async def serve_policy(
    tmp_path: Path,
    processes: list[asyncio.subprocess.Process],
    policy: str,
    env: dict[str, str] | None = None,
) -> asyncio.subprocess.Process:
    """`fairgate serve` on a free port with ``policy`` written to a file in ``tmp_path``."""
    path = tmp_path / "fairgate.yaml"
    path.write_text(policy)
    listen = f"127.0.0.1:{free_port()}"
    process = await fairgate(
        "serve", "--config", str(path), "--listen", listen, cwd=tmp_path, env=env
    )
    processes.append(process)
    return process


async def raw_get(url: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, bytes]:
    """A keep-alive connection that has had one reply (GET /), left open."""
    host, _, port = url.removeprefix("http://").rpartition(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"GET / HTTP/1.1\r\nHost: g\r\n\r\n")
    head = await reader.readuntil(b"\r\n\r\n")
    await reader.readexactly(len(b"Ollama is running"))
    return reader, writer, head


class TestShutdown:
    async def test_sigterm_refuses_newcomers_then_ends_running_streams_in_band(
        self, tmp_path: Path, start_sim: StartSim, processes: list[asyncio.subprocess.Process]
    ) -> None:
        """During the drain a request on an open connection gets 503 shutting_down and a
        closed connection; a stream still running at the deadline ends with an error line,
        and the process exits by itself."""
        _, url = await start_sim(decode_tokens_per_s=20.0)
        env = {"FAIRGATE_DRAIN_TIMEOUT": "1"}
        process = await serve_policy(tmp_path, processes, gpu_backend(url), env)
        base = await serving(process)
        reader, writer, _ = await raw_get(base)
        body = {"model": MODEL, "prompt": "talk", "options": {"num_predict": 100000}}
        async with (
            aiohttp.ClientSession() as session,
            session.post(base + "/api/generate", json=body) as stream,
        ):
            await stream.content.readline()  # the stream runs
            process.send_signal(signal.SIGTERM)
            await logged(process, "draining")
            writer.write(b"GET / HTTP/1.1\r\nHost: g\r\n\r\n")
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 503") and b"Connection: close" in head
            lines = [line async for line in stream.content]
        assert json.loads(lines[-1]) == {"error": "the gateway is shutting down"}
        drained = await logged(process, "drained")
        assert drained["streams_cut"] == 1
        await logged(process, "stopped")
        assert await asyncio.wait_for(process.wait(), timeout=10) == 0
        writer.close()


class TestEarlySighup:
    async def test_a_sighup_while_starting_is_applied_once_ready(
        self, tmp_path: Path, processes: list[asyncio.subprocess.Process]
    ) -> None:
        """SIGHUP during the first backend probe (here a backend that never answers) does
        not kill the gateway; the policy re-read once it listens has the new key."""
        probed = asyncio.Event()

        async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            probed.set()
            await reader.read()  # never answers; the probe times out
            writer.close()

        backend = await asyncio.start_server(silent, "127.0.0.1", 0)
        port = backend.sockets[0].getsockname()[1]
        policy = tmp_path / "fairgate.yaml"
        monitoring = "monitoring: {timeout: 1s}\n"
        users = "users:\n  alice: {keys: [alice-key]}\n"
        env = {"FAIRGATE_RELOAD_INTERVAL": "3600"}  # only the signal may re-read the file
        first = monitoring + users + gpu_backend(f"http://127.0.0.1:{port}")
        process = await serve_policy(tmp_path, processes, first, env)
        async with backend:
            await asyncio.wait_for(probed.wait(), timeout=20)
            policy.write_text(
                monitoring
                + users
                + "  bob: {keys: [bob-key]}\n"
                + gpu_backend(f"http://127.0.0.1:{port}")
            )
            process.send_signal(signal.SIGHUP)
            reloaded = await logged(process, "policy_reloaded")  # once ready, before serving
            assert reloaded["users_added"] == ["bob"]
            base = await serving(process)
            async with aiohttp.ClientSession() as session:
                headers = {"Authorization": "Bearer bob-key"}
                async with session.get(base + "/api/tags", headers=headers) as reply:
                    # bob's key is known (a 401 comes first); the silent backend lists
                    # nothing, which the listing says with a 503.
                    assert reply.status == 503
            assert process.returncode is None
            backend.close()

    async def test_a_sighup_while_the_policy_is_read_is_applied_once_ready(
        self, tmp_path: Path, processes: list[asyncio.subprocess.Process]
    ) -> None:
        """The policy file is a pipe, so the process waits in the middle of reading it: a
        SIGHUP then does not end it, and once it listens it reads the file again."""
        policy = tmp_path / "fairgate.yaml"
        os.mkfifo(policy)
        env = {"FAIRGATE_RELOAD_INTERVAL": "3600", "FAIRGATE_CONFIG": str(policy)}
        process = await fairgate(
            "serve", "--listen", f"127.0.0.1:{free_port()}", cwd=tmp_path, env=env
        )
        processes.append(process)
        loop = asyncio.get_running_loop()
        users = "users:\n  alice: {keys: [alice-key]}\n"
        down = gpu_backend(f"http://127.0.0.1:{free_port()}")  # its start-up probe is logged
        # Opening a pipe to write waits until the gateway opens it to read: it is reading.
        writer = await loop.run_in_executor(None, policy.open, "w")
        process.send_signal(signal.SIGHUP)
        with writer:
            writer.write(users + down)
        await logged(process, "backend_unreachable")  # read whole, and starting
        again = await loop.run_in_executor(None, policy.open, "w")  # the re-read
        with again:
            again.write(users + "  bob: {keys: [bob-key]}\n" + down)
        reloaded = await logged(process, "policy_reloaded")
        assert reloaded["users_added"] == ["bob"]
        await serving(process)
        assert process.returncode is None


class TestConnections:
    async def test_two_thousand_idle_connections_leave_room_for_a_real_request(
        self, tmp_path: Path, start_sim: StartSim, processes: list[asyncio.subprocess.Process]
    ) -> None:
        """With 2,000 idle connections open against a cap of 500, the oldest idle ones are
        closed for newcomers, a real request succeeds, and afterwards the process holds as
        many descriptors as before."""
        _, url = await start_sim()
        policy = "users:\n  alice: {keys: [alice-key]}\n" + gpu_backend(url)
        env = {"FAIRGATE_MAX_CONNECTIONS": "500"}
        process = await serve_policy(tmp_path, processes, policy, env)
        base = await serving(process)
        baseline = len(os.listdir(f"/proc/{process.pid}/fd"))
        host, _, port = base.removeprefix("http://").rpartition(":")
        idle = [await asyncio.open_connection(host, int(port)) for _ in range(2000)]
        headers = {"Authorization": "Bearer alice-key"}
        chat = {"model": MODEL, "prompt": "hi", "stream": False}
        async with (
            aiohttp.ClientSession() as session,
            session.post(base + "/api/generate", json=chat, headers=headers) as reply,
        ):
            assert reply.status == 200
        assert len(os.listdir(f"/proc/{process.pid}/fd")) <= baseline + 500 + 2
        for _, writer in idle:
            writer.close()
        await until_descriptors(process.pid, baseline)

    @pytest.mark.parametrize("event_loop", ["asyncio", "uvloop"])
    async def test_a_newcomer_when_every_connection_is_busy_gets_a_503_and_the_log_says_so(
        self,
        tmp_path: Path,
        start_sim: StartSim,
        processes: list[asyncio.subprocess.Process],
        event_loop: str,
    ) -> None:
        """At a cap of two, with both connections handling a request (each told to send its
        body, which does not come), a third gets 503 with Retry-After and is closed, on
        either event loop."""
        _, url = await start_sim()
        policy = "users:\n  alice: {keys: [alice-key]}\n" + gpu_backend(url)
        env = {"FAIRGATE_MAX_CONNECTIONS": "2", "FAIRGATE_EVENT_LOOP": event_loop}
        process = await serve_policy(tmp_path, processes, policy, env)
        base = await serving(process)
        host, _, port = base.removeprefix("http://").rpartition(":")
        busy = []
        for _ in range(2):
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(
                b"POST /api/generate HTTP/1.1\r\nHost: g\r\nAuthorization: Bearer alice-key\r\n"
                b"Expect: 100-continue\r\nContent-Length: 100\r\n\r\n"
            )
            busy.append(writer)
            # Said once the handler runs and waits for the body: the connection is busy.
            assert await reader.readuntil(b"\r\n\r\n") == b"HTTP/1.1 100 Continue\r\n\r\n"
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"GET / HTTP/1.1\r\nHost: g\r\n\r\n")
        async with asyncio.timeout(10):
            reply = await reader.read()
        assert reply.startswith(b"HTTP/1.1 503 "), reply
        assert b"Retry-After: 1\r\n" in reply
        assert (await logged(process, "connection_refused"))["max_connections"] == 2
        for open_writer in (*busy, writer):
            open_writer.close()


def test_the_connection_cap_fits_the_descriptors_the_process_may_have() -> None:
    """Asked for more connections than the hard descriptor limit allows, the cap is what
    fits, and the soft limit has been raised to the hard one (as systemd's 1,024 needs)."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard == resource.RLIM_INFINITY:
        pytest.skip("no hard descriptor limit to fit under")
    with structlog.testing.capture_logs() as logs:
        cap = descriptor_cap(hard + 10_000)
    assert cap < hard and resource.getrlimit(resource.RLIMIT_NOFILE)[0] == hard
    assert [entry["allowed"] for entry in logs if entry["event"] == "connections_limited"] == [cap]
    assert descriptor_cap(10) == 10


async def until_descriptors(pid: int, count: int, within: float = 20.0) -> None:
    """Poll the process's descriptor table (another process: no event to wait on) until it
    is back to ``count``."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if len(os.listdir(f"/proc/{pid}/fd")) <= count:
            return
        await asyncio.sleep(0.1)
    raise TimeoutError(f"process {pid} still holds more than {count} descriptors")


class TestSystemdNotify:
    async def test_the_gateway_tells_systemd_it_is_ready_then_stopping(
        self, tmp_path: Path, start_sim: StartSim, processes: list[asyncio.subprocess.Process]
    ) -> None:
        """With NOTIFY_SOCKET set (Type=notify), READY=1 arrives once the gateway listens,
        and STOPPING=1 when SIGTERM starts the drain."""
        _, url = await start_sim()
        notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        notify.bind(str(tmp_path / "notify.sock"))
        notify.setblocking(False)
        loop = asyncio.get_running_loop()
        env = {"NOTIFY_SOCKET": str(tmp_path / "notify.sock")}
        process = await serve_policy(tmp_path, processes, gpu_backend(url), env)
        with notify:
            assert await asyncio.wait_for(loop.sock_recv(notify, 64), timeout=20) == b"READY=1"
            base = await serving(process)
            async with aiohttp.ClientSession() as session, session.get(base + "/") as r:
                assert r.status == 200  # ready means listening
            process.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(loop.sock_recv(notify, 64), timeout=10) == b"STOPPING=1"
        assert await asyncio.wait_for(process.wait(), timeout=10) == 0
