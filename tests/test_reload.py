"""The policy file reloads live: caps change, broken files are refused, keys rotate, and the
log line says what changed."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Callable
from pathlib import Path

from structlog.testing import capture_logs

from gateway.backends.pool import BackendStates
from gateway.cli.status import render_text
from gateway.config.policy import load_policy
from gateway.reload import LivePolicy, PolicyView
from gateway.routes.status import render
from tests.conftest import Gateway, StartGateway, StartSim
from tests.test_admission import generate_status, held, idle, queued, until


def policy_text(sim_url: str, alice: str = "{keys: [alice-key]}") -> str:
    return (
        "defaults: {max_concurrent: 1, max_queued: 4}\n"
        f"users:\n  alice: {alice}\n"
        f"backends:\n  - {{name: sim, url: {sim_url}, kind: ollama, slots: 4}}\n"
    )


async def rewrite(gateway: Gateway, path: Path, text: str, *, valid: bool = True) -> None:
    """Replace the policy file and wait for the watcher to apply (or refuse) it."""
    live = gateway.services.policy
    done = asyncio.get_running_loop().create_future()
    listeners: list[Callable[..., None]] = live.on_reload if valid else live.on_reload_failed  # type: ignore[assignment]
    listener: Callable[..., None] = lambda _: done.done() or done.set_result(None)  # noqa: E731
    listeners.append(listener)
    staged = path.with_suffix(".new")
    staged.write_text(text)
    staged.replace(path)  # an atomic rename, as editors and config managers do
    try:
        await asyncio.wait_for(done, timeout=5)
    finally:
        listeners.remove(listener)


class TestLiveReload:
    async def test_a_raised_cap_lets_a_waiting_request_run_at_once(
        self, start_sim: StartSim, start_gateway: StartGateway, tmp_path: Path
    ) -> None:
        """Raising max_concurrent in the file dispatches the request that was waiting."""
        _, sim_url = await start_sim(parallel=8)
        path = tmp_path / "fairgate.yaml"
        path.write_text(policy_text(sim_url))
        gateway = await start_gateway(path, reload_interval=0.05)
        admission = gateway.services.admission
        async with held(gateway, "alice-key", "one"):
            second = asyncio.create_task(generate_status(gateway, "alice-key"))
            await until(admission, queued("alice", 1))
            await rewrite(
                gateway, path, policy_text(sim_url, "{keys: [alice-key], max_concurrent: 2}")
            )
            assert await asyncio.wait_for(second, timeout=5) == 200
        await until(admission, idle)

    async def test_a_lowered_cap_applies_as_running_requests_finish(
        self, start_sim: StartSim, start_gateway: StartGateway, tmp_path: Path
    ) -> None:
        """Lowering the cap keeps running requests and holds new ones back until below it."""
        _, sim_url = await start_sim(parallel=8)
        path = tmp_path / "fairgate.yaml"
        path.write_text(policy_text(sim_url, "{keys: [alice-key], max_concurrent: 2}"))
        gateway = await start_gateway(path, reload_interval=0.05)
        admission = gateway.services.admission
        async with held(gateway, "alice-key", "one"):
            async with held(gateway, "alice-key", "two"):
                await rewrite(gateway, path, policy_text(sim_url))
                third = asyncio.create_task(generate_status(gateway, "alice-key"))
                await until(admission, queued("alice", 1))
            # One finished, but alice still runs one: at the new cap of 1, the third waits.
            await until(admission, lambda snap: snap.users["alice"] != (2, 1))
            assert admission.snapshot().users["alice"] == (1, 1)
        assert await asyncio.wait_for(third, timeout=5) == 200
        await until(admission, idle)

    async def test_a_broken_file_keeps_the_old_policy(
        self, start_sim: StartSim, start_gateway: StartGateway, tmp_path: Path
    ) -> None:
        """An invalid file is refused, counted, and the gateway goes on with the old rules."""
        _, sim_url = await start_sim()
        path = tmp_path / "fairgate.yaml"
        path.write_text(policy_text(sim_url))
        gateway = await start_gateway(path, reload_interval=0.05)
        await rewrite(gateway, path, "users: [broken\n", valid=False)
        live = gateway.services.policy
        assert live.reloads_failed == 1 and live.last_error and "invalid YAML" in live.last_error
        assert await generate_status(gateway, "alice-key") == 200
        # Said where the admin looks, not only in the log: `fairgate status` first of all.
        text = render_text(render(gateway.services.snapshot()))
        assert "the policy file's last edit was refused (still serving the one before)" in text
        assert "invalid YAML" in text.split("\n\n")[0]

    async def test_a_rotated_key_works_and_the_old_one_stops(
        self, start_sim: StartSim, start_gateway: StartGateway, tmp_path: Path
    ) -> None:
        """After SIGHUP with a new key in the file, only the new key is accepted."""
        _, sim_url = await start_sim()
        path = tmp_path / "fairgate.yaml"
        path.write_text(policy_text(sim_url))
        gateway = await start_gateway(path, reload_interval=3600)
        assert await generate_status(gateway, "alice-key") == 200
        reloaded: asyncio.Future[PolicyView] = asyncio.get_running_loop().create_future()
        gateway.services.policy.on_reload.append(reloaded.set_result)
        path.write_text(policy_text(sim_url, "{keys: [alice-new-key]}"))
        os.kill(os.getpid(), signal.SIGHUP)
        await asyncio.wait_for(reloaded, timeout=5)
        assert await generate_status(gateway, "alice-new-key") == 200
        assert await generate_status(gateway, "alice-key") == 401

    async def test_a_key_revoked_while_its_body_arrives_is_refused_before_it_runs(
        self, start_sim: StartSim, start_gateway: StartGateway, tmp_path: Path
    ) -> None:
        """A request whose key is removed from the file while its body is still coming
        gets 401 key_revoked, as one waiting for a turn then would: not a reply."""
        sim, sim_url = await start_sim()
        path = tmp_path / "fairgate.yaml"
        path.write_text(policy_text(sim_url))
        gateway = await start_gateway(path, reload_interval=3600)
        host, _, port = gateway.url.removeprefix("http://").rpartition(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        body = b'{"model": "llama3.2:3b", "prompt": "hi", "stream": false}'
        writer.write(
            b"POST /api/generate HTTP/1.1\r\nHost: localhost\r\n"
            b"Authorization: Bearer alice-key\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\nExpect: 100-continue\r\n\r\n" % len(body)
        )
        assert await reader.readuntil(b"\r\n\r\n") == b"HTTP/1.1 100 Continue\r\n\r\n"
        path.write_text(policy_text(sim_url, "{keys: [alice-new-key]}"))
        assert gateway.services.policy.reload() is True  # what SIGHUP does
        writer.write(body)
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=5)
        writer.close()
        assert head.startswith(b"HTTP/1.1 401")
        assert sim.stats.prompts == []


HOUSE = (
    "users:\n"
    "  alice: {keys: [alice-key], max_concurrent: 2}\n"
    "  bob: {keys: [bob-key]}\n"
    "  carol: {keys: [carol-key]}\n"
    "backends:\n"
    "  - {name: gpu, url: http://127.0.0.1:11434, slots: 2}\n"
    "  - {name: cpu, url: http://127.0.0.1:11435, slots: 1}\n"
)


class TestReloadLog:
    def reload_events(self, path: Path, before: str, after: str) -> list[dict[str, object]]:
        """The policy_reloaded events logged when the file goes from ``before`` to ``after``."""
        path.write_text(before)
        live = LivePolicy(load_policy(path), BackendStates(), path)
        path.write_text(after)
        with capture_logs() as logs:
            assert live.reload() is True
        return [entry for entry in logs if entry["event"] == "policy_reloaded"]

    def test_policy_reloaded_names_the_users_and_backends_that_changed(
        self, tmp_path: Path
    ) -> None:
        """The log line lists users and backends added, removed and changed, by name."""
        after = (
            "users:\n"
            "  alice: {keys: [alice-key], max_concurrent: 3}\n"
            "  bob: {keys: [bob-key]}\n"
            "  dave: {keys: [dave-key]}\n"
            "backends:\n"
            "  - {name: spare, url: http://127.0.0.1:11436, slots: 1}\n"
            "  - {name: gpu, url: http://127.0.0.1:11434, slots: 2}\n"
            "  - {name: cpu, url: http://127.0.0.1:11435, slots: 2}\n"
            "queue: {max_depth: 4}\n"
        )
        [event] = self.reload_events(tmp_path / "fairgate.yaml", HOUSE, after)
        assert event == {
            "event": "policy_reloaded",
            "log_level": "info",
            "path": str(tmp_path / "fairgate.yaml"),
            "users": 3,
            "users_added": ["dave"],
            "users_removed": ["carol"],
            "users_changed": ["alice"],
            "backends_added": ["spare"],
            "backends_changed": ["cpu"],
            "sections_changed": ["queue"],
        }

    def test_a_rotated_key_counts_as_a_changed_user(self, tmp_path: Path) -> None:
        """A new key for bob is a change to bob, and to nothing else."""
        after = HOUSE.replace("bob-key", "bob-new-key")
        [event] = self.reload_events(tmp_path / "fairgate.yaml", HOUSE, after)
        assert event["users_changed"] == ["bob"]
        assert not {"users_added", "users_removed", "backends_changed"} & event.keys()

    def test_a_reload_that_leaves_no_users_warns_that_the_gateway_is_open(
        self, tmp_path: Path
    ) -> None:
        """A file without its users (half written, or cut by mistake) opens the gateway to
        anyone: the reload says so as the start does, with a warning."""
        path = tmp_path / "fairgate.yaml"
        path.write_text(HOUSE)
        live = LivePolicy(load_policy(path), BackendStates(), path)
        path.write_text("backends:" + HOUSE.split("backends:")[1])  # its users gone
        with capture_logs() as logs:
            assert live.reload() is True
        assert [e["log_level"] for e in logs if e["event"] == "open_gateway"] == ["warning"]

    def test_a_reload_that_changes_nothing_says_so(self, tmp_path: Path) -> None:
        """Editing only a comment still reloads, and the log line says nothing changed."""
        [event] = self.reload_events(tmp_path / "fairgate.yaml", HOUSE, "# hello\n" + HOUSE)
        assert event["unchanged"] is True
        assert not any(key.endswith(("_added", "_removed", "_changed")) for key in event)


def backends_text(*backends: tuple[str, str, int]) -> str:
    """Policy YAML for alice (max_concurrent 4) and the given (name, url, slots)."""
    lines = "".join(
        f"  - {{name: {name}, url: {url}, kind: ollama, slots: {slots}}}\n"
        for name, url, slots in backends
    )
    return (
        "defaults: {max_concurrent: 4, max_queued: 4}\n"
        "users:\n  alice: {keys: [alice-key]}\n"
        f"backends:\n{lines}"
    )


class TestWatchFromTheStart:
    async def test_an_edit_saved_between_the_start_read_and_the_watch_is_applied(
        self, tmp_path: Path
    ) -> None:
        """The policy is read at start before the app is built; a key rotated in that gap
        is read by the watch, not lost until the next edit."""
        path = tmp_path / "fairgate.yaml"
        path.write_text(HOUSE)
        policy = load_policy(path)  # as `fairgate serve` reads it, before create_app
        path.write_text(HOUSE.replace("bob-key", "bob-new-key"))
        live = LivePolicy(policy, BackendStates(), path)
        applied = asyncio.get_running_loop().create_future()
        live.on_reload.append(lambda view: applied.done() or applied.set_result(view))
        watch = asyncio.create_task(live.watch(0.01))
        try:
            view = await asyncio.wait_for(applied, timeout=5)
        finally:
            watch.cancel()
        assert view.policy.users["bob"] != policy.users["bob"]


class TestBackendsChangedUnderLoad:
    async def test_a_renamed_backend_keeps_counting_what_runs_on_it(
        self, start_sim: StartSim, start_gateway: StartGateway, tmp_path: Path
    ) -> None:
        """Renaming a busy backend does not free its slots: the server never runs more than
        its slots (the simulator's own count), and newcomers wait for a real release."""
        sim, url = await start_sim(parallel=2)
        path = tmp_path / "fairgate.yaml"
        path.write_text(backends_text(("gpu", url, 2)))
        gateway = await start_gateway(path, reload_interval=0.05)
        admission = gateway.services.admission
        async with held(gateway, "alice-key", "one"), held(gateway, "alice-key", "two"):
            await rewrite(gateway, path, backends_text(("renamed", url, 2)))
            third = asyncio.create_task(generate_status(gateway, "alice-key"))
            await until(admission, queued("alice", 1))
            assert admission.snapshot().backends == {"renamed": (2, 2)}
            assert (sim.engine.stats.running, sim.engine.stats.queued) == (2, 0)
        assert await asyncio.wait_for(third, timeout=5) == 200
        assert sim.engine.stats.max_running == 2
        await until(admission, idle)

    async def test_a_shrunk_backend_takes_no_one_until_below_its_new_slots(
        self, start_sim: StartSim, start_gateway: StartGateway, tmp_path: Path
    ) -> None:
        """Resizing a busy backend from 2 slots to 1: a newcomer waits until both running
        requests have finished, not just one."""
        sim, url = await start_sim(parallel=2)
        path = tmp_path / "fairgate.yaml"
        path.write_text(backends_text(("gpu", url, 2)))
        gateway = await start_gateway(path, reload_interval=0.05)
        admission = gateway.services.admission
        async with held(gateway, "alice-key", "one"):
            async with held(gateway, "alice-key", "two"):
                await rewrite(gateway, path, backends_text(("gpu", url, 1)))
                third = asyncio.create_task(generate_status(gateway, "alice-key"))
                await until(admission, queued("alice", 1))
            await until(admission, lambda snap: snap.users["alice"] == (1, 1))
            assert admission.snapshot().backends == {"gpu": (1, 1)}
        assert await asyncio.wait_for(third, timeout=5) == 200
        assert sim.engine.stats.max_running == 2 and sim.engine.stats.queued == 0
        await until(admission, idle)

    async def test_a_repointed_backend_starts_empty_and_the_old_server_drains(
        self, start_sim: StartSim, start_gateway: StartGateway, tmp_path: Path
    ) -> None:
        """Pointing a busy backend at another server: the new server is free at once, and
        the requests still running on the old one finish there."""
        old, old_url = await start_sim(parallel=1)
        new, new_url = await start_sim(parallel=1)
        path = tmp_path / "fairgate.yaml"
        path.write_text(backends_text(("gpu", old_url, 1)))
        gateway = await start_gateway(path, reload_interval=0.05)
        admission = gateway.services.admission
        async with held(gateway, "alice-key", "one"):
            await rewrite(gateway, path, backends_text(("gpu", new_url, 1)))
            assert await asyncio.wait_for(generate_status(gateway, "alice-key"), 5) == 200
            assert (old.engine.stats.running, new.engine.stats.completed) == (1, 1)
        await until(admission, idle)
        assert old.engine.stats.max_running == 1 and new.engine.stats.max_running == 1
