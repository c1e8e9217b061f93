"""Everything a gateway holds, built once in ``create_app`` and handed to whoever needs it.

No key hub, no lookups by name: route groups and collectors receive the services they use.
Construction needs no running loop; ``start`` and ``close`` bracket the serving life.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import structlog
from aiohttp import web

from gateway.admission import Admission, HoldStore, RedisHolds
from gateway.backends import BackendStates
from gateway.backends.watch import BackendMonitor, KeepWarm, SlotCopies
from gateway.config import Policy, Settings
from gateway.core import Background, Calendar, repeat, zone_named
from gateway.edge import Caller, Client, RecordListener, names_gateway, refuse_unknown_host
from gateway.edge.http import RECORD, Connections, Cors, ReplyHeaders
from gateway.observe import GatewaySnapshot, History, UserUsage, take
from gateway.relay import Relay, Upstream
from gateway.reload import LivePolicy, PolicyView
from gateway.usage import Ledger, RedisUsage, Spending, SqliteUsage, UsageStore

__all__ = ["Services"]

log = structlog.get_logger("fairgate")


@dataclass(eq=False)
class Services:
    """The gateway's parts, each with one owner: this object."""

    settings: Settings
    policy: LivePolicy
    backends: BackendStates
    admission: Admission
    upstream: Upstream
    monitor: BackendMonitor
    warmth: KeepWarm
    slot_copies: SlotCopies  # a llama-server slot's prompt into another (admission decides)
    usage: Ledger  # who used what, kept across restarts; budgets read it
    spending: Spending  # budgets as each request asks them: its 429, its count in flight
    cors: Cors  # browser apps on other origins
    reply_headers: ReplyHeaders  # what the gateway says on every reply (relays say it too)
    on_finished: list[RecordListener] = field(default_factory=list)  # told of each request's end
    connections: Connections = field(default_factory=Connections)
    streams: set[Relay] = field(default_factory=set)  # generation replies under way
    history: History = field(default_factory=History)  # the last hour, for the house page
    loops: Background = field(default_factory=lambda: Background("gateway"))
    # Big request bodies are parsed here, one at a time, beside the event loop (intake/bodies.py).
    parsing: Executor = field(default_factory=lambda: ThreadPoolExecutor(1, "fairgate-parse"))

    @classmethod
    def build(
        cls,
        settings: Settings,
        policy: Policy,
        path: Path | None,
        clock: Callable[[], float] = time.time,
    ) -> Services:
        """The parts; ``clock`` (wall-clock seconds) places usage in its day and hour."""
        backends = BackendStates()
        live = LivePolicy(policy, backends, path)
        view = live.current
        upstream = Upstream(settings.upstream_pool_size)
        admission = Admission(policy, view.pool, holds=_hold_store(settings))
        cors = Cors(lambda: live.current.policy.cors)
        ledger = Ledger(
            _usage_store(settings),
            Calendar(zone_named(settings.time_zone), clock),
            settings.usage_flush_seconds,
        )
        return cls(
            settings=settings,
            policy=live,
            backends=backends,
            admission=admission,
            upstream=upstream,
            monitor=BackendMonitor(upstream, backends, admission.wake),
            warmth=KeepWarm(upstream, backends),
            slot_copies=SlotCopies(upstream),
            usage=ledger,
            spending=Spending(ledger, admission),
            cors=cors,
            reply_headers=ReplyHeaders(cors),
            history=History(clock),
        )

    async def start(self) -> None:
        """Open the usage store, the upstream client, share holds, probe every backend
        once, then watch."""
        await self.usage.start()  # first: a file that cannot be opened stops the start
        await self.upstream.open()
        holds = self.admission.holds
        if holds is not None:
            holds.start()
            # Often: the house's order compares finish tags that each replica computes
            # from these counters, so a replica's view may lag by what is charged meanwhile.
            every = min(self.settings.redis_lease_seconds / 3, _SHARE_SECONDS)
            self.loops.start("share", repeat(every, self.admission.share))
        policy = self.policy.current.policy
        await self.monitor.start(policy.backends, policy.monitoring)
        self.warmth.reconcile(policy.backends, policy.warmth)
        self.policy.on_reload.append(self._reconfigure)

    async def close(self) -> None:
        await self.loops.close()
        await self.usage.close()  # the last counts: requests have all ended by now
        await self.warmth.close()
        await self.monitor.close()
        await self.slot_copies.close()
        if self.admission.holds is not None:
            await self.admission.holds.close()
        await self.upstream.close()
        self.parsing.shutdown(wait=False, cancel_futures=True)

    def _reconfigure(self, view: PolicyView) -> None:
        policy = view.policy
        self.admission.reconfigure(policy, view.pool)
        # A key or user taken out of the policy stops waiting at once, not when its turn comes.
        self.admission.revoke(view.directory.admits)
        self.monitor.reconcile(policy.backends, policy.monitoring)
        self.warmth.reconcile(policy.backends, policy.warmth)

    def snapshot(self, whole_house: bool = True) -> GatewaySnapshot:
        """The one reading that /status, the house page and the metrics render; with
        replicas, the whole house's unless ``whole_house`` is False (the metrics')."""
        view = self.policy.current
        return take(
            view.pool,
            room=self.admission.snapshot(whole_house),
            warmth=self.warmth.snapshot(),
            holds=self.admission.holds,
            reloads=self.policy.snapshot(),
            policy=view.policy,
            hold_seconds=self.admission.hold_seconds,
            history=self.history.snapshot(),
            usage=self._usage(view.policy),
        )

    def locate(self, request: web.Request) -> Client:
        """Where the request comes from: the peer, or behind a trusted proxy its client."""
        return self.policy.current.directory.proxies.client_of(request.remote, request.headers)

    def _usage(self, policy: Policy) -> dict[str, UserUsage]:
        ledger, admission = self.usage, self.admission
        used = ledger.snapshot()
        return {
            user: UserUsage(
                used.get(user) or ledger.used(user),
                tuple(ledger.budgets(user, policy.budget_of(user), admission.in_flight(user))),
            )
            for user in sorted({*policy.users, *used} - {""})  # "": refused unidentified
        }

    def caller(self, request: web.Request, view: PolicyView) -> Caller:
        """Who is asking, from the request's credentials (401 if nobody), noted in its record."""
        record = request[RECORD]
        caller = view.directory.identify(request.headers, record.client.address)
        if not caller.by_key:  # what a page's browser carries by itself (edge/host_names.py)
            refuse_unknown_host(request.headers, view.policy.hosts)
        self.cors.refuse_pages_without_key(request, caller)
        record.user = caller.user
        return caller

    def is_admin(self, request: web.Request, view: PolicyView) -> bool:
        """Clients on this machine and admin keys may read the gateway's state."""
        # Loopback is no key: under a name a site could own, only a key says who asks; and a
        # fetch that says its Origin (the house page's own GETs do not) is some page's, a
        # chat app's the policy lists perhaps, run in a browser here: not the admin.
        if (
            request[RECORD].client.is_local
            and "Origin" not in request.headers
            and names_gateway(request.headers, view.policy.hosts)
        ):
            return True
        return self.caller(request, view).user in view.directory.admins


# How often a replica's fair-share charges are pooled with the others'.
_SHARE_SECONDS = 0.25


def _hold_store(settings: Settings) -> HoldStore | None:
    """Redis when FAIRGATE_REDIS_URL is set (several replicas); a single replica needs none."""
    if not settings.redis_url:
        return None
    log.info("shared_state", kind="redis", lease_seconds=settings.redis_lease_seconds)
    return RedisHolds(settings.redis_url, settings.redis_lease_seconds)


def _usage_store(settings: Settings) -> UsageStore:
    """Redis when replicas share it (one set of counters); else the SQLite file."""
    if settings.redis_url:
        return RedisUsage(settings.redis_url)
    return SqliteUsage(settings.usage_db)
