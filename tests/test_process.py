"""The process explains itself: settings checked at start, a busy port in one line, `serve`
flags and help, readiness, backend failures in words, and keys everybody knows.

Where the behaviour is the command's (exit status, what reaches stderr), the real command
runs as a child process; the rest runs against real gateways and simulators on loopback.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import socket
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from fairsim import SimConfig, Simulator, add_sim_arguments, sim_config_from_args
from gateway.app import bound_url, start_server
from gateway.backends.watch.probes import ProbeFailed, probe
from gateway.cli.first_run import EXAMPLE_KEYS, weak_keys
from gateway.config.policy import parse_policy
from gateway.config.settings import Settings
from tests.conftest import Gateway, StartGateway, StartSim, one_backend
from tests.processes import free_port, serve_on_a_full_disk, stop, until_answers
from tests.test_admission import MODEL
from tests.test_backends import FAST_MONITOR, wait_backend

REPO = Path(__file__).resolve().parent.parent
DEPLOY = REPO / "deploy"
EXAMPLE = DEPLOY / "fairgate.example.yaml"
CHAT = {"model": "llama3.2:3b", "messages": [{"role": "user", "content": "hi"}]}


def gpu_backend(url: str, extra: str = "") -> str:
    """Policy YAML with one Ollama backend named gpu, as in the example policy."""
    return f"{extra}backends:\n  - {{name: gpu, url: '{url}', kind: ollama, slots: 2}}\n"


async def fairgate(
    *args: str, cwd: Path, env: dict[str, str] | None = None
) -> asyncio.subprocess.Process:
    """`fairgate ARGS` in ``cwd`` (away from any .env), JSON logs, no inherited FAIRGATE_*."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("FAIRGATE_")}
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gateway",
        *args,
        cwd=cwd,
        env={**clean, "FAIRGATE_LOG_FORMAT": "json", **(env or {})},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


async def finished(process: asyncio.subprocess.Process) -> tuple[int, list[str]]:
    """Exit status and stderr lines of a command expected to end by itself."""
    async with asyncio.timeout(30):
        _, stderr = await process.communicate()
    assert process.returncode is not None
    return process.returncode, stderr.decode().splitlines()


async def logged(process: asyncio.subprocess.Process, event: str) -> dict[str, Any]:
    """The next JSON log line of ``process`` with this event (lines arrive as written)."""
    assert process.stderr is not None
    async with asyncio.timeout(20):
        while line := await process.stderr.readline():
            entry: dict[str, Any] = json.loads(line)
            if entry.get("event") == event:
                return entry
    raise AssertionError(f"the process ended without logging {event}")


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


class TestListenSetting:
    @pytest.mark.parametrize(
        ("value", "host", "port"),
        [
            ("127.0.0.1:8080", "127.0.0.1", 8080),
            ("0.0.0.0:80", "0.0.0.0", 80),
            ("localhost:11000", "localhost", 11000),
            ("8081", "127.0.0.1", 8081),  # a bare port stays on loopback
            (":8082", "127.0.0.1", 8082),
            ("[::1]:8083", "::1", 8083),
            ("[::]:65535", "::", 65535),
        ],
    )
    def test_a_listen_address_gives_the_host_and_port_that_are_bound(
        self, value: str, host: str, port: int
    ) -> None:
        """Each accepted form of FAIRGATE_LISTEN names one host and one port."""
        settings = Settings(listen=value)
        assert (settings.host, settings.port) == (host, port)

    @pytest.mark.parametrize(
        ("value", "reason"),
        [
            ("localhost:99999", "port 99999 is out of range (1-65535)"),
            ("127.0.0.1:0", "port 0 is out of range (1-65535)"),
            ("localhost", "expected HOST:PORT, e.g. 127.0.0.1:8080, or a bare PORT"),
            ("localhost:http", "the port 'http' is not a number"),
            ("http://0.0.0.0:8080", "write HOST:PORT without a scheme, e.g. 0.0.0.0:8080"),
            ("::1:8080", "an IPv6 address goes in brackets, e.g. [::1]:8080"),
            ("[::1]8080", "expected [IPv6]:PORT, e.g. [::]:8080"),
            ("my host:8080", "'my host' is not a host name or address"),
        ],
    )
    async def test_an_unusable_listen_address_stops_the_command_with_one_line(
        self, value: str, reason: str, tmp_path: Path
    ) -> None:
        """`fairgate serve` exits 2 with one line naming the setting, its value and why."""
        process = await fairgate("serve", cwd=tmp_path, env={"FAIRGATE_LISTEN": value})
        status, lines = await finished(process)
        assert (status, lines) == (2, [f"fairgate: FAIRGATE_LISTEN={value!r}: {reason}"])

    async def test_an_unknown_log_level_names_the_allowed_levels(self, tmp_path: Path) -> None:
        """FAIRGATE_LOG_LEVEL=verbose: one line with the value and the four levels, exit 2."""
        process = await fairgate("serve", cwd=tmp_path, env={"FAIRGATE_LOG_LEVEL": "verbose"})
        status, lines = await finished(process)
        expected = "must be 'DEBUG', 'INFO', 'WARNING' or 'ERROR'"
        assert (status, lines) == (2, [f"fairgate: FAIRGATE_LOG_LEVEL='verbose': {expected}"])

    async def test_an_endless_timeout_is_refused_with_one_line(self, tmp_path: Path) -> None:
        """FAIRGATE_BODY_TIMEOUT=inf would be a wait without a deadline: exit 2, one line."""
        process = await fairgate("serve", cwd=tmp_path, env={"FAIRGATE_BODY_TIMEOUT": "inf"})
        status, lines = await finished(process)
        expected = "fairgate: FAIRGATE_BODY_TIMEOUT='inf': input should be a finite number"
        assert (status, lines) == (2, [expected])

    async def test_a_bad_flag_value_is_named_as_the_flag(self, tmp_path: Path) -> None:
        """A value given with --listen is reported as --listen, not as the variable."""
        process = await fairgate("serve", "--listen", "localhost:70000", cwd=tmp_path)
        status, lines = await finished(process)
        expected = "fairgate: --listen='localhost:70000': port 70000 is out of range (1-65535)"
        assert (status, lines) == (2, [expected])


class TestServeCommand:
    async def test_a_busy_port_stops_the_command_with_one_line(self, tmp_path: Path) -> None:
        """Listening on a port another socket holds: exit 2 and one line, no traceback."""
        policy = tmp_path / "fairgate.yaml"
        policy.write_text(gpu_backend(f"http://127.0.0.1:{free_port()}"))
        with socket.socket() as holder:
            holder.bind(("127.0.0.1", 0))
            holder.listen()
            listen = f"127.0.0.1:{holder.getsockname()[1]}"
            process = await fairgate(
                "serve", "--config", str(policy), "--listen", listen, cwd=tmp_path
            )
            status, lines = await finished(process)
        assert status == 2
        assert lines[-1] == f"fairgate: cannot listen on {listen}: address already in use"
        assert not any("Traceback" in line for line in lines)

    async def test_a_full_disk_under_stderr_stops_no_route_and_no_budget(
        self, start_sim: StartSim, tmp_path: Path
    ) -> None:
        """stderr on /dev/full (every write fails: no space left): the access log is lost,
        nothing else is. Every route answers, and carol's budget binds as it would."""
        _, sim_url = await start_sim()
        policy = tmp_path / "fairgate.yaml"
        budgeted = "users:\n  carol: {keys: [carol-key], budget: {requests_per_hour: 2}}\n"
        policy.write_text(budgeted + gpu_backend(sim_url))
        process, url = await serve_on_a_full_disk(policy, tmp_path)
        chat = {"model": MODEL, "prompt": "hi", "stream": False, "options": {"num_predict": 2}}
        carol = {"Authorization": "Bearer carol-key"}
        try:
            async with aiohttp.ClientSession() as session:
                statuses = []
                for _ in range(4):
                    async with session.post(url + "/api/generate", json=chat, headers=carol) as r:
                        await r.read()
                        statuses.append(r.status)
                assert statuses == [200, 200, 429, 429]
                for path in ("/healthz", "/readyz", "/status", "/metrics"):
                    async with session.get(url + path) as reply:
                        assert reply.status in (200, 503), path  # answered, not hung
                wrong = {"Authorization": "Bearer nobody-key"}
                async with session.post(url + "/api/generate", json=chat, headers=wrong) as r:
                    assert r.status == 401
        finally:
            await stop(process)

    async def test_a_sighup_while_the_gateway_is_imported_does_not_end_it(
        self, tmp_path: Path
    ) -> None:
        """The entry point notes SIGHUP before its own imports (most of a second): one
        sent then (logrotate, a reload racing a restart) no longer ends the process."""
        program = (
            "import os, signal\n"
            "import gateway.__main__\n"
            "os.kill(os.getpid(), signal.SIGHUP)\n"
            "print('alive')\n"
        )
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-c", program, cwd=tmp_path, stdout=asyncio.subprocess.PIPE
        )
        out, _ = await asyncio.wait_for(process.communicate(), timeout=60)
        assert (process.returncode, out.decode().strip()) == (0, "alive")

    async def test_the_demo_beside_a_running_gateway_says_so_in_one_line(
        self, tmp_path: Path
    ) -> None:
        """`fairgate demo` on a port `make run` holds: exit 2, one line naming the ports and
        the options that choose others, no traceback."""
        with socket.socket() as holder:
            holder.bind(("127.0.0.1", 0))
            holder.listen()
            port = holder.getsockname()[1]
            backend_port = free_port()
            process = await fairgate(
                "demo", "--port", str(port), "--backend-port", str(backend_port), cwd=tmp_path
            )
            status, lines = await finished(process)
        assert status == 2
        assert lines[-1] == (
            f"fairgate demo: cannot listen on port {port} or {backend_port}: address already "
            "in use (another gateway or simulator running? choose others with --port and "
            "--backend-port)"
        )
        assert not any("Traceback" in line for line in lines)

    async def test_help_lists_every_setting_with_its_default(self, tmp_path: Path) -> None:
        """`fairgate serve --help` names each FAIRGATE_* variable, its default and purpose."""
        process = await fairgate("serve", "--help", cwd=tmp_path)
        async with asyncio.timeout(30):
            stdout, _ = await process.communicate()
        text = " ".join(stdout.decode().split())  # descriptions are wrapped
        assert process.returncode == 0 and "--config FILE" in text and "--listen HOST:PORT" in text
        for name, field in Settings.model_fields.items():
            default = "unset" if field.default is None else str(field.default)
            assert f"FAIRGATE_{name.upper()} (default: {default})" in text
            assert field.description and " ".join(field.description.split()) in text

    async def test_flags_win_over_the_environment_and_the_env_file(
        self, tmp_path: Path, processes: list[asyncio.subprocess.Process]
    ) -> None:
        """--config beats .env's FAIRGATE_CONFIG, --listen beats the FAIRGATE_LISTEN variable."""
        policy = tmp_path / "mine.yaml"
        policy.write_text(gpu_backend(f"http://127.0.0.1:{free_port()}"))
        (tmp_path / ".env").write_text(f"FAIRGATE_CONFIG={tmp_path / 'missing.yaml'}\n")
        port = free_port()
        process = await fairgate(
            "serve",
            "--config",
            str(policy),
            "--listen",
            f"127.0.0.1:{port}",
            cwd=tmp_path,
            env={"FAIRGATE_LISTEN": f"127.0.0.1:{free_port()}"},
        )
        processes.append(process)
        # Started at all: the .env's policy file does not exist. Answering: on the flag's port.
        await until_answers(f"http://127.0.0.1:{port}/", 20, process)

    async def test_a_line_logged_while_a_request_is_handled_names_the_request(
        self,
        tmp_path: Path,
        processes: list[asyncio.subprocess.Process],
        http: aiohttp.ClientSession,
    ) -> None:
        """A warning logged on a request's way (its model's cold start) carries the request's
        id, as its access line does; a line logged outside any request carries none."""
        runner = await start_server(
            Simulator(SimConfig(load_seconds=0.05)).make_app(), "127.0.0.1", 0
        )
        try:
            policy = tmp_path / "fairgate.yaml"
            cold = "warmth: {cold_start_after: 0s}\n"
            policy.write_text(gpu_backend(bound_url(runner), extra=cold))
            listen = f"127.0.0.1:{free_port()}"
            process = await fairgate(
                "serve", "--config", str(policy), "--listen", listen, cwd=tmp_path
            )
            processes.append(process)
            assert "request_id" not in await logged(process, "serving")
            headers = {"X-Request-Id": "trace-7"}
            async with http.post(f"http://{listen}/api/chat", json=CHAT, headers=headers) as reply:
                assert reply.status == 200
                await reply.read()
            warning, line = await logged(process, "cold_start"), await logged(process, "request")
        finally:
            await runner.cleanup()
        assert warning["request_id"] == line["request_id"] == "trace-7"


class TestExampleKeys:
    def test_the_example_key_list_matches_the_keys_in_the_shipped_files(self) -> None:
        """EXAMPLE_KEYS holds exactly the keys written in deploy/, plain or as sha256."""
        by_digest = {hashlib.sha256(key.encode()).hexdigest(): key for key in EXAMPLE_KEYS}
        found = set()
        for path in sorted(DEPLOY.rglob("*.y*ml")):
            document = yaml.safe_load(path.read_text())
            users = document.get("users") if isinstance(document, dict) else None
            for user in (users or {}).values():
                for key in user.get("keys", []):
                    assert not key.startswith("env:"), f"{path.name}: an env: key ships"
                    digest = key.removeprefix("sha256:")
                    found.add(by_digest.get(digest, key) if key.startswith("sha256:") else key)
        assert found == EXAMPLE_KEYS

    def test_an_example_key_is_found_however_it_is_written(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Plain, sha256: and env: forms of example keys are found; a real key is not."""
        monkeypatch.setenv("KIDS_KEY", "change-me-kids")
        digest = hashlib.sha256(b"change-me-bob").hexdigest()
        policy = parse_policy(
            "users:\n"
            "  alice: {keys: [change-me-alice]}\n"
            f"  bob: {{keys: ['sha256:{digest}']}}\n"
            "  kids: {keys: ['env:KIDS_KEY']}\n"
            "  carol: {keys: [a-long-random-key-of-her-own]}\n" + one_backend("http://127.0.0.1:9")
        )
        assert sorted((k.user, k.example) for k in weak_keys(policy)) == [
            ("alice", "change-me-alice"),
            ("bob", "change-me-bob"),
            ("kids", "change-me-kids"),
        ]

    async def test_serving_the_example_policy_warns_about_its_keys(
        self, tmp_path: Path, processes: list[asyncio.subprocess.Process]
    ) -> None:
        """`fairgate serve` on deploy/fairgate.example.yaml warns for alice's and kids' keys."""
        listen = f"127.0.0.1:{free_port()}"
        process = await fairgate(
            "serve", "--config", str(EXAMPLE), "--listen", listen, cwd=tmp_path
        )
        processes.append(process)
        warnings = [await logged(process, "example_key") for _ in range(2)]
        assert {(w["user"], w["key"]) for w in warnings} == {
            ("alice", "change-me-alice"),
            ("kids", "test"),
        }
        assert all(w["level"] == "warning" for w in warnings)


@contextlib.asynccontextmanager
async def serving(server: str) -> AsyncIterator[str]:
    """A loopback URL with ``nothing`` listening, a ``silent`` server that accepts and never
    answers, or a simulated ``llama-server``."""
    if server == "nothing":
        yield f"http://127.0.0.1:{free_port()}"
    elif server == "silent":
        accepted: list[asyncio.StreamWriter] = []
        silent = await asyncio.start_server(
            lambda _, writer: accepted.append(writer), "127.0.0.1", 0
        )
        try:
            yield f"http://127.0.0.1:{silent.sockets[0].getsockname()[1]}"
        finally:
            silent.close()
            for writer in accepted:
                writer.close()
            await silent.wait_closed()
    else:
        simulator = Simulator(SimConfig(flavor="llamacpp", models=["smollm2"]))
        runner = await start_server(simulator.make_app(), "127.0.0.1", 0)
        try:
            yield bound_url(runner)
        finally:
            await runner.cleanup()


class TestBackendFailures:
    async def test_a_backend_refusing_at_start_is_logged_at_once_as_a_sentence(
        self, tmp_path: Path, processes: list[asyncio.subprocess.Process], refusing_url: str
    ) -> None:
        """Nothing on the backend's port: one line at start says so and what to check."""
        backend = refusing_url
        policy = tmp_path / "fairgate.yaml"
        policy.write_text(gpu_backend(backend))
        listen = f"127.0.0.1:{free_port()}"
        process = await fairgate("serve", "--config", str(policy), "--listen", listen, cwd=tmp_path)
        processes.append(process)
        entry = await logged(process, "backend_unreachable")
        expected = f"backend gpu at {backend}: connection refused - is Ollama running?"
        assert (entry["level"], entry["reason"]) == ("warning", expected)

    @pytest.mark.parametrize(
        ("server", "kind", "cause"),
        [
            ("nothing", "ollama", "connection refused - is Ollama running?"),
            (
                "silent",
                "llamacpp",
                "no answer within 0.2s - is llama-server stuck, or the address wrong?",
            ),
            (
                "llama-server",
                "ollama",
                "GET /api/version answered HTTP 404: 404: Not Found - is it Ollama (kind: ollama)?",
            ),
        ],
    )
    async def test_a_failed_probe_says_what_failed_and_what_to_check(
        self, server: str, kind: str, cause: str, http: aiohttp.ClientSession
    ) -> None:
        """Refused, silent, or another kind of server: a phrase, never an exception's repr."""
        async with serving(server) as url:
            with pytest.raises(ProbeFailed) as failed:
                await probe(http, kind, url, 0.2)
        assert str(failed.value) == cause

    async def test_no_backend_names_each_backend_and_its_last_error(
        self, start_gateway: StartGateway, http: aiohttp.ClientSession, refusing_url: str
    ) -> None:
        """The 503 for a model whose backends are down says which, and what to check."""
        backend = refusing_url
        gateway = await start_gateway(gpu_backend(backend, extra=FAST_MONITOR))
        await wait_backend(gateway, "gpu", lambda b: not b.state.healthy)
        async with http.post(gateway.url + "/api/chat", json=CHAT) as reply:
            status, retry_after, body = (
                reply.status,
                reply.headers["Retry-After"],
                await reply.json(),
            )
        assert (status, retry_after) == (503, "10")
        assert body["error"] == (
            "no healthy backend serves 'llama3.2:3b' right now "
            "(backend gpu: connection refused - is Ollama running?)"
        )
        assert backend not in body["error"]  # the address is for the log only

    @pytest.mark.parametrize(
        ("method", "path", "body", "wanted"),
        [
            ("POST", "/api/show", {"model": "llama3.2:3b"}, "serves 'llama3.2:3b'"),
            ("GET", "/api/version", None, "can answer this request"),
            ("GET", "/api/tags", None, "can answer this request"),
            ("GET", "/api/ps", None, "can answer this request"),
            ("GET", "/v1/models", None, "can answer this request"),
        ],
    )
    async def test_reads_with_no_backend_say_which_is_down_and_when_to_retry(
        self,
        start_gateway: StartGateway,
        http: aiohttp.ClientSession,
        method: str,
        path: str,
        body: object,
        wanted: str,
        refusing_url: str,
    ) -> None:
        """show, version and the listings answer a down backend's 503 as a chat does: cause
        and Retry-After (an empty list would read as "no models")."""
        backend = refusing_url
        gateway = await start_gateway(gpu_backend(backend, extra=FAST_MONITOR))
        await wait_backend(gateway, "gpu", lambda b: not b.state.healthy)
        async with http.request(method, gateway.url + path, json=body) as reply:
            status, retry_after, error = (
                reply.status,
                reply.headers.get("Retry-After"),
                (await reply.json())["error"],
            )
        assert (status, retry_after) == (503, "10")
        if path.startswith("/v1/"):  # OpenAI's error shape
            error = error["message"]
        assert error == (
            f"no healthy backend {wanted} right now "
            "(backend gpu: connection refused - is Ollama running?)"
        )

    async def test_a_listing_no_healthy_backend_answers_is_a_503_not_an_empty_list(
        self, start_gateway: StartGateway, http: aiohttp.ClientSession
    ) -> None:
        """A backend that stops listing between probes (still healthy to the gateway):
        the listing says no backend answered, rather than "no models"."""
        listing = {"models": [{"name": "llama3.2:3b", "model": "llama3.2:3b"}]}
        broken: list[bool] = []

        async def tags(request: aiohttp.web.Request) -> aiohttp.web.Response:
            if broken:
                return aiohttp.web.json_response({"error": "disk gone"}, status=500)
            return aiohttp.web.json_response(listing)

        app = aiohttp.web.Application()
        app.router.add_get("/api/version", _answering({"version": "0.5.7"}))
        app.router.add_get("/api/tags", tags)
        app.router.add_get("/api/ps", _answering({"models": []}))
        runner = await start_server(app, "127.0.0.1", 0)
        try:
            gateway = await start_gateway(gpu_backend(bound_url(runner)))  # probes every 5 s
            async with http.get(gateway.url + "/api/tags") as reply:
                assert (reply.status, await reply.json()) == (200, {"models": listing["models"]})
            broken.append(True)
            async with http.get(gateway.url + "/api/tags") as reply:
                status, error = reply.status, (await reply.json())["error"]
        finally:
            await runner.cleanup()
        assert status == 503
        assert error.startswith("no backend answered /api/tags within")

    async def test_a_chat_at_a_first_run_without_ollama_learns_what_to_check(
        self, start_gateway: StartGateway, http: aiohttp.ClientSession, refusing_url: str
    ) -> None:
        """The first chat finds the backend refusing (502); the next is told what to check,
        in the probes' words rather than the relay's."""
        backend = refusing_url
        gateway = await start_gateway(gpu_backend(backend))  # probes every 5 s: none between
        statuses, errors = [], []
        for _ in range(2):
            async with http.post(gateway.url + "/api/chat", json=CHAT) as reply:
                statuses.append(reply.status)
                errors.append((await reply.json())["error"])
        assert statuses == [502, 503]
        assert errors[0] == "cannot reach the backend: connection refused"
        assert errors[1].endswith("(backend gpu: connection refused - is Ollama running?)")


class TestReadiness:
    async def test_readyz_follows_the_backend_down_and_up_and_healthz_stays_alive(
        self, start_gateway: StartGateway, http: aiohttp.ClientSession
    ) -> None:
        """/readyz is 200 with the backend, 503 once it is down, 200 again when it is back."""
        simulator = Simulator(SimConfig())
        runner = await start_server(simulator.make_app(), "127.0.0.1", 0)
        url = bound_url(runner)
        keyed = "users: {alice: {keys: [alice-key]}}\n" + FAST_MONITOR
        gateway = await start_gateway(gpu_backend(url, extra=keyed))
        assert await health(http, gateway) == (200, 200, {"status": "ready", **ONE_READY})
        await runner.cleanup()
        await wait_backend(gateway, "gpu", lambda b: not b.state.healthy)
        assert await health(http, gateway) == (200, 503, {"status": "not_ready", **NONE_READY})
        runner = await start_server(simulator.make_app(), "127.0.0.1", int(url.split(":")[-1]))
        try:
            await wait_backend(gateway, "gpu", lambda b: b.state.healthy)
            assert await health(http, gateway) == (200, 200, {"status": "ready", **ONE_READY})
        finally:
            await runner.cleanup()

    async def test_readyz_waits_for_a_backend_that_has_never_answered(
        self, start_gateway: StartGateway, http: aiohttp.ClientSession
    ) -> None:
        """A first run with nothing on the backend's port is not ready, though not yet down."""
        port = free_port()
        gateway = await start_gateway(gpu_backend(f"http://127.0.0.1:{port}", extra=FAST_MONITOR))
        assert await health(http, gateway) == (200, 503, {"status": "not_ready", **NONE_READY})
        runner = await start_server(Simulator(SimConfig()).make_app(), "127.0.0.1", port)
        try:
            # Healthy again and its models known: after failed probes the two can come a
            # probe apart, and /readyz wants both.
            await wait_backend(
                gateway, "gpu", lambda b: b.state.healthy and b.state.models is not None
            )
            assert (await health(http, gateway))[1] == 200
        finally:
            await runner.cleanup()


ONE_READY = {"backends_ready": 1, "backends": 1}
NONE_READY = {"backends_ready": 0, "backends": 1}


async def health(http: aiohttp.ClientSession, gateway: Gateway) -> tuple[int, int, dict[str, Any]]:
    """(/healthz status, /readyz status, /readyz body), asked without a key."""
    async with (
        http.get(gateway.url + "/healthz") as alive,
        http.get(gateway.url + "/readyz") as ready,
    ):
        return alive.status, ready.status, await ready.json()


class TestFirstRun:
    def test_fairgate_sim_without_flags_stands_in_for_the_example_policys_backend(self) -> None:
        """`fairgate sim` (and so `make sim`) listens where the example's Ollama is, with its
        slots and a model the example's users may use."""
        parser = argparse.ArgumentParser()
        add_sim_arguments(parser)
        args = parser.parse_args([])
        config = sim_config_from_args(args)
        backend = yaml.safe_load(EXAMPLE.read_text())["backends"][0]
        assert backend["url"] == f"http://{args.host}:{args.port}"
        assert (backend["kind"], backend["slots"]) == (config.flavor, config.parallel)
        assert "llama3.2:3b" in config.models
        makefile = (REPO / "Makefile").read_text()
        assert "\t$(BIN)/fairgate sim\n" in makefile

    async def test_the_first_401_says_how_to_send_a_key(
        self, start_gateway: StartGateway, http: aiohttp.ClientSession
    ) -> None:
        """A request without a key is told the header to send and where keys are written."""
        policy = "users: {alice: {keys: [alice-key]}}\n" + one_backend("http://127.0.0.1:9")
        gateway = await start_gateway(policy)
        async with http.post(gateway.url + "/api/chat", json=CHAT) as reply:
            status, body = reply.status, await reply.json()
        assert status == 401
        assert "send Authorization: Bearer KEY" in body["error"]
        assert "users: in the gateway's policy file" in body["error"]


def _answering(document: object) -> Callable[[aiohttp.web.Request], Awaitable[Any]]:
    async def handler(request: aiohttp.web.Request) -> aiohttp.web.Response:
        return aiohttp.web.json_response(document)

    return handler
