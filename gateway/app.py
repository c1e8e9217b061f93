"""create_app(): routes, middlewares and the lifetime of shared resources; no request logic."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import aiohttp
import structlog
from aiohttp import web

from gateway.access import ON_FINISHED, RequestRecord, access_log_middleware
from gateway.admission import Admission
from gateway.backends import BackendMonitor
from gateway.keys import ADMISSION, LIVE, MONITOR, SESSION, SETTINGS, WARMTH
from gateway.live import LivePolicy
from gateway.metrics import METRICS, Metrics, add_metrics_route
from gateway.policy import Policy
from gateway.proxy import add_routes
from gateway.settings import Settings
from gateway.state.redis import RedisState
from gateway.status import add_status_route
from gateway.warmth import KeepWarm

__all__ = ["bound_url", "create_app", "run_app", "start_server"]

log = structlog.get_logger("fairgate")


def create_app(
    settings: Settings, policy: Policy, policy_path: Path | None = None
) -> web.Application:
    """The gateway; ``policy_path`` is watched and re-read (also on SIGHUP) when given."""
    app = web.Application(
        middlewares=[access_log_middleware], client_max_size=settings.max_body_bytes
    )
    live = LivePolicy(policy, {}, policy_path)
    admission = Admission(policy, live.current.pool)
    live.on_reload.append(admission.reconfigure)
    app[SETTINGS] = settings
    app[LIVE] = live
    app[ADMISSION] = admission
    app.cleanup_ctx.append(_shared_state)
    app.cleanup_ctx.append(_upstream_session)
    app.cleanup_ctx.append(_backend_monitor)
    app.cleanup_ctx.append(_policy_watcher)
    metrics = Metrics(app)
    app[METRICS] = metrics
    listeners: list[Callable[[RequestRecord], None]] = [metrics.observe]
    app[ON_FINISHED] = listeners
    add_routes(app)
    add_status_route(app)
    add_metrics_route(app)
    return app


async def _shared_state(app: web.Application) -> AsyncIterator[None]:
    """Redis when FAIRGATE_REDIS_URL is set (several replicas), else this process's memory."""
    settings, admission = app[SETTINGS], app[ADMISSION]
    sharing = None
    if settings.redis_url:
        admission.state = RedisState(settings.redis_url, settings.redis_lease_seconds)
        log.info("shared_state", kind="redis", lease_seconds=settings.redis_lease_seconds)
        sharing = asyncio.create_task(_share(admission, settings.redis_lease_seconds / 3))
    yield
    if sharing is not None:
        sharing.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sharing
    await admission.state.close()


async def _share(admission: Admission, every: float) -> None:
    """Fair-share counters and queue depths travel between replicas this often."""
    while True:
        await asyncio.sleep(every)
        await admission.share()


async def _upstream_session(app: web.Application) -> AsyncIterator[None]:
    """One pooled client session for every backend, closed on shutdown."""
    connector = aiohttp.TCPConnector(limit=app[SETTINGS].upstream_pool_size, ttl_dns_cache=300)
    async with aiohttp.ClientSession(
        connector=connector, auto_decompress=False, timeout=aiohttp.ClientTimeout(total=None)
    ) as session:
        app[SESSION] = session
        yield


async def _backend_monitor(app: web.Application) -> AsyncIterator[None]:
    """Probe every backend in the background; a change lets waiting requests be dispatched."""
    live, admission = app[LIVE], app[ADMISSION]
    monitor = BackendMonitor(app[SESSION], live.states, admission.wake)
    policy = live.current.policy
    await monitor.start(policy.backends, policy.monitoring)
    live.on_reload.append(
        lambda view: monitor.reconcile(view.policy.backends, view.policy.monitoring)
    )
    app[MONITOR] = monitor
    warmth = KeepWarm(app[SESSION], live.states)
    warmth.reconcile(policy.backends, policy.warmth)
    live.on_reload.append(lambda view: warmth.reconcile(view.policy.backends, view.policy.warmth))
    app[WARMTH] = warmth
    yield
    await warmth.close()
    await monitor.close()


async def _policy_watcher(app: web.Application) -> AsyncIterator[None]:
    live = app[LIVE]
    if live.path is None:
        yield
        return
    loop = asyncio.get_running_loop()
    with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
        # Only the main thread of a Unix process can take signals; elsewhere, watch only.
        loop.add_signal_handler(signal.SIGHUP, live.reload)
    watcher = asyncio.create_task(live.watch(app[SETTINGS].reload_interval))
    yield
    watcher.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await watcher
    with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
        loop.remove_signal_handler(signal.SIGHUP)


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
