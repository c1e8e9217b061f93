"""create_app(): routes, middlewares and the lifetime of shared resources; no request logic."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import structlog
from aiohttp import web

from gateway.admission import Refusal
from gateway.config import Policy, Settings
from gateway.core import STOPPING_MESSAGE, STOPPING_RETRY_AFTER, Reason
from gateway.edge.http import Listener, access_log
from gateway.observe import Metrics
from gateway.reload import OPEN_GATEWAY
from gateway.routes import Generation, House, Reads, Status
from gateway.services import Services

__all__ = ["SERVICES", "bound_url", "create_app", "drain", "run_app", "serve", "start_server"]

log = structlog.get_logger("fairgate")

# After the drain, how long interrupted streams have to write their last line.
_LAST_WORDS_SECONDS = 2.0
# Closing the connection, as every other answer of a drain does.
SHUTTING_DOWN = Refusal(Reason.SHUTTING_DOWN, STOPPING_MESSAGE, STOPPING_RETRY_AFTER, close=True)

SERVICES = web.AppKey("services", Services)
"""The app's services, for tools and tests that hold only the app; the gateway's own code
receives them when it is built."""


def create_app(
    settings: Settings,
    policy: Policy,
    policy_path: Path | None = None,
    clock: Callable[[], float] = time.time,
) -> web.Application:
    """The gateway; ``policy_path`` is watched and re-read (also on SIGHUP) when given;
    ``clock`` is the wall clock that days, hours and budgets' windows follow."""
    services = Services.build(settings, policy, policy_path, clock)
    # Each replica's own figures: Prometheus sums the replicas.
    metrics = Metrics(services.policy, lambda: services.snapshot(whole_house=False))
    services.on_finished += [metrics.observe, services.history.observe, services.usage.observe]
    middleware = access_log(
        services.on_finished, services.locate, services.connections, services.cors
    )
    app = web.Application(
        middlewares=[middleware],
        client_max_size=settings.max_body_bytes,
    )
    app[SERVICES] = services
    # The one hook: relayed replies are built with its headers and prepared without the
    # hooks (relay._Relayed), so a header for every reply belongs in ReplyHeaders.add.
    app.on_response_prepare.append(services.reply_headers.hook)
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
    # Not removed: SIGHUP's default action ends the process, and a reload asked for now,
    # as the gateway stops, would end it before its last usage is written (services.close).
    with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, _too_late)


def _too_late() -> None:
    log.info("reload_ignored", why="the gateway is stopping")


def run_app(
    settings: Settings, policy: Policy, sighup_before: Callable[[], bool] = lambda: False
) -> None:
    """Serve until SIGTERM or SIGINT, then drain; OSError if the address cannot be bound.
    ``sighup_before``: whether a SIGHUP came before the loop took the signal over."""
    loop = new_event_loop(settings.event_loop)
    try:
        loop.run_until_complete(serve(settings, policy, sighup_before))
    finally:
        loop.close()


async def serve(
    settings: Settings, policy: Policy, sighup_before: Callable[[], bool] = lambda: False
) -> None:
    """The gateway's life: listen, say so, wait for a stop signal, drain, close."""
    loop = asyncio.get_running_loop()
    stop, early_reload = asyncio.Event(), asyncio.Event()
    # From the first instant: a SIGHUP before the policy watch is up (the first backend
    # probe can take seconds) is noted and applied once ready, instead of killing the
    # process (SIGHUP's default action), which systemd would not restart.
    loop.add_signal_handler(signal.SIGHUP, early_reload.set)
    if sighup_before():
        early_reload.set()
    for stopping in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(stopping, stop.set)
    app = create_app(settings, policy, settings.config)
    services = app[SERVICES]
    listener = Listener(app, settings, services.connections)
    try:
        await listener.start()
        if early_reload.is_set():
            services.policy.reload()
        _log_serving(listener.url, settings, policy, loop)
        notify_systemd("READY=1")
        await stop.wait()
        notify_systemd("STOPPING=1")
        await drain(services, settings.drain_timeout)
    finally:
        await listener.close()
        # SIGHUP keeps a handler (_unwatch_policy's) until the loop closes: its default
        # action would end the process before its last line.
        for handled in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(handled)
    log.info("stopped")


async def drain(services: Services, within: float) -> None:
    """Let running requests finish for up to ``within`` seconds while new ones get 503
    shutting_down; then end the streams still running with an in-band error."""
    connections = services.connections
    connections.draining = True
    running = connections.in_request
    log.info("draining", running=running, drain_timeout=within)
    services.admission.turn_away_all(SHUTTING_DOWN)
    if await connections.until_idle(within):
        log.info("drained")
        return
    # A reply under way ends with an in-band error; a request whose reply has not begun
    # is answered 503, as one arriving now would be (not closed on unanswered).
    cut = [relay for relay in services.streams if relay.started]
    for relay in cut:
        relay.interrupt(Reason.SHUTTING_DOWN, "the gateway is shutting down")
    refused = connections.cut_unanswered()
    # The interrupted streams write their last line; whatever is left is closed after.
    await connections.until_idle(_LAST_WORDS_SECONDS)
    log.info("drained", streams_cut=len(cut), refused=refused, left=connections.in_request)


def _log_serving(
    url: str, settings: Settings, policy: Policy, loop: asyncio.AbstractEventLoop
) -> None:
    log.info(
        "serving",
        listen=url,
        policy=str(settings.config),
        backends=[f"{b.name}={b.url}" for b in policy.backends],
        users=len(policy.users),
        scheduling=policy.scheduling,
        event_loop=type(loop).__module__.partition(".")[0],
    )
    if not policy.users:
        log.warning("open_gateway", hint=OPEN_GATEWAY)


def notify_systemd(state: str) -> None:
    """Tell systemd (Type=notify) that the gateway is ready or stopping; a no-op elsewhere.
    With it, `systemctl start` returns once the gateway listens, and a reload is not sent
    before then."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return
    if address.startswith("@"):  # an abstract socket
        address = "\0" + address[1:]
    with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.sendto(state.encode(), address)


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
