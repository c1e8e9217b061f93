"""create_app(): routes, middlewares and the lifetime of shared resources; no request logic."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import structlog
from aiohttp import web

from gateway.access import access_log, add_request_id
from gateway.house import House
from gateway.listings import Reads
from gateway.metrics import Metrics
from gateway.policy import Policy
from gateway.proxy import Generation
from gateway.services import Services
from gateway.settings import Settings
from gateway.status import Status

__all__ = ["SERVICES", "bound_url", "create_app", "run_app", "start_server"]

log = structlog.get_logger("fairgate")

SERVICES = web.AppKey("services", Services)
"""The app's services, for tools and tests that hold only the app; the gateway's own code
receives them when it is built."""


def create_app(
    settings: Settings, policy: Policy, policy_path: Path | None = None
) -> web.Application:
    """The gateway; ``policy_path`` is watched and re-read (also on SIGHUP) when given."""
    services = Services.build(settings, policy, policy_path)
    metrics = Metrics(services.policy, services.snapshot)
    services.on_finished += [metrics.observe, services.history.observe]
    app = web.Application(
        middlewares=[access_log(services.on_finished)], client_max_size=settings.max_body_bytes
    )
    app[SERVICES] = services
    app.on_response_prepare.append(add_request_id)
    app.cleanup_ctx.append(lambda _: _lifetime(services))
    for routes in (
        Generation(services),
        Reads(services),
        Status(services),
        House(services),
        metrics,
    ):
        routes.add_routes(app)
    return app


async def _lifetime(services: Services) -> AsyncIterator[None]:
    await services.start()
    _watch_policy(services)
    try:
        yield
    finally:
        _unwatch_policy()
        await services.close()


def _watch_policy(services: Services) -> None:
    """Re-read the policy file when it changes, and on SIGHUP."""
    live = services.policy
    if live.path is None:
        return
    with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
        # Only the main thread of a Unix process can take signals; elsewhere, watch only.
        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, live.reload)
    services.loops.start("policy-watch", live.watch(services.settings.reload_interval))


def _unwatch_policy() -> None:
    with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
        asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)


def run_app(settings: Settings, policy: Policy) -> None:
    """Serve until interrupted; handlers are cancelled when their client disconnects."""
    loop = new_event_loop(settings.event_loop)
    log.info(
        "serving",
        listen=f"http://{settings.listen}",
        policy=str(settings.config),
        backends=[f"{b.name}={b.url}" for b in policy.backends],
        users=len(policy.users),
        scheduling=policy.scheduling,
        event_loop=type(loop).__module__.partition(".")[0],
    )
    if not policy.users:
        log.warning(
            "open_gateway", hint="no users in the policy: anyone who can reach it may use it"
        )
    web.run_app(
        create_app(settings, policy, settings.config),
        host=settings.host,
        port=settings.port,
        access_log=None,
        handler_cancellation=True,
        print=None,
        loop=loop,
    )


def new_event_loop(choice: str) -> asyncio.AbstractEventLoop:
    """uvloop when asked for, or when ``auto`` and it is installed; asyncio's otherwise."""
    if choice != "asyncio":
        try:
            import uvloop
        except ImportError:
            if choice == "uvloop":
                raise
        else:
            return uvloop.new_event_loop()
    return asyncio.new_event_loop()


async def start_server(app: web.Application, host: str, port: int) -> web.AppRunner:
    """Start ``app`` on host:port (0 picks a free port) and return its runner.

    Handlers are cancelled when their client disconnects: that cancellation is what closes
    the upstream request at once and frees the backend's slot.
    """
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner


def bound_url(runner: web.AppRunner) -> str:
    """http://host:port of the first address ``runner`` listens on."""
    host, port = runner.addresses[0][:2]
    return f"http://{host}:{port}"
