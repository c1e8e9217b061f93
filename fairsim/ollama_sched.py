"""Ollama's model scheduler, as server/sched.go runs it (v0.32.15; unchanged since 0.11.5).

- A loaded model is a *runner* with its own ``OLLAMA_NUM_PARALLEL`` slots (a FIFO, unbounded
  semaphore) and a KV cache of ``num_ctx`` tokens for each slot. Several runners stay loaded
  while they fit in memory, up to ``OLLAMA_MAX_LOADED_MODELS``.
- ``getRunner``: a request for a loaded model whose load-time options (``num_ctx``, ...)
  equal the runner's is handed the runner at once. Every other request goes to the one
  *pending* queue (bounded by ``OLLAMA_MAX_QUEUE``), served by ``processPending`` one request
  at a time.
- ``processPending`` loads the model if it fits beside the others; if it does not (or too
  many are loaded, or the same model is loaded with other options), it picks a runner to
  unload (an idle one first, in order of keep-alive then path), sets its keep-alive to 0 and
  waits until it has unloaded, which happens when its last request finishes. Meanwhile the
  queue is held: every request that needs a load waits, whatever its model. A load blocks
  the queue for its whole duration too. Requests for loaded models keep flowing, the
  victim's included, and each one of those delays the unload; one that sets ``keep_alive``
  even cancels it until that keep-alive runs out (``useLoadedRunner`` overwrites the zero).

Before 0.11.5 every request went through the pending queue, so an eviction held requests
for the other loaded models too ("we're queueing up all incoming requests, even if they
were for a different model that's loaded and not scheduled to be removed").
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from gateway.wire import runs_own_runner

from .catalog import model_path, model_spec, runner_size
from .config import LoadOptions, QueueFull, SimConfig, SimStats
from .slots import HostCache, SlotPool
from .wire import FOREVER

__all__ = ["OllamaScheduler", "Runner"]

_AUTOMATIC_MAX_LOADED = 3  # sched.go defaultModelsPerGPU, for one GPU
_MIN_NUM_CTX = 4
_LONGEST_TIMER = 86_400.0  # a keep-alive timer longer than this is checked lazily
_NUM_BATCH, _NUM_GPU, _NUM_THREAD = 512, -1, 0  # api.DefaultOptions


@dataclass(eq=False)
class Runner:
    """One loaded model: its options, size, slots and references."""

    model: str
    options: LoadOptions
    size: int
    slots: SlotPool
    session: float  # seconds it stays loaded after its last request (FOREVER; 0: unload)
    refs: int = 0  # requests holding it, running or waiting for a slot
    expires: float = FOREVER  # when it unloads, if idle
    evicted: bool = False  # chosen to make room for another model


@dataclass(eq=False)
class _Pending:
    model: str
    wanted: LoadOptions
    keep_alive: float | None
    arrived: float
    granted: asyncio.Future[Runner] = field(repr=False)
    drained_before: float = 0.0  # the scheduler's drain time when it arrived
    reload: bool = False


class OllamaScheduler:
    """The runners and the pending queue of one simulated Ollama."""

    def __init__(
        self,
        config: SimConfig,
        clock: Callable[[], float],
        stats: SimStats,
        changed: Callable[[], None],
    ) -> None:
        self.config = config
        self.clock = clock
        self.stats = stats
        self.changed = changed
        self.loaded: dict[str, Runner] = {}
        self._queue: deque[_Pending] = deque()
        self._outstanding: set[_Pending] = set()
        self._unloads: list[asyncio.Future[None]] = []
        self._worker: asyncio.Task[None] | None = None
        self._drained = 0.0  # seconds the queue has waited for victims, evictions finished
        self._draining_since: float | None = None

    # -- getRunner ------------------------------------------------------------------------

    async def get_runner(
        self, model: str, options: LoadOptions, keep_alive: float | None
    ) -> Runner:
        """A runner of ``model`` holding a reference for the caller; ``done`` gives it back."""
        self.expire_idle()
        wanted = self._normalized(model, options)
        runner = self.loaded.get(model)
        if runner is not None and not _needs_reload(runner, wanted):
            self._use(runner, keep_alive)
            return runner
        if len(self._queue) >= self.config.max_queue:
            raise QueueFull
        granted: asyncio.Future[Runner] = asyncio.get_running_loop().create_future()
        request = _Pending(model, wanted, keep_alive, self.clock(), granted, self._drain_time())
        self._queue.append(request)
        self._outstanding.add(request)
        self._count_pending()
        if self._worker is None:
            self._worker = asyncio.create_task(self._process_pending())
        try:
            return await granted
        except asyncio.CancelledError:
            if granted.done() and not granted.cancelled():
                self.done(granted.result())
            else:
                self._forget(request)
            raise

    def done(self, runner: Runner) -> None:
        """A request let go of its runner (processCompleted's finished event)."""
        runner.refs -= 1
        if runner.refs <= 0 and self.loaded.get(runner.model) is runner:
            if runner.session <= 0:
                self._unload(runner)
            else:
                runner.expires = self.clock() + runner.session
                self._timer(runner.session)
        self.changed()

    def expire(self, model: str) -> None:
        """``keep_alive: 0`` on an empty request: unload now, or when its requests finish."""
        runner = self.loaded.get(model)
        if runner is None:
            return
        runner.session, runner.expires = 0.0, self.clock()
        if runner.refs <= 0:
            self._unload(runner)
        self.changed()

    def expire_idle(self) -> None:
        """Unload idle runners whose keep-alive has run out (their expiry timers)."""
        now = self.clock()
        for runner in list(self.loaded.values()):
            if runner.refs <= 0 and now >= runner.expires:
                self._unload(runner)

    def expire_all(self) -> None:
        for runner in list(self.loaded.values()):
            self._unload(runner)

    def tasks(self) -> list[asyncio.Task[None]]:
        """The pending queue's worker, for a shutdown to cancel."""
        return [self._worker] if self._worker is not None else []

    # -- processPending -------------------------------------------------------------------

    async def _process_pending(self) -> None:
        try:
            while self._queue:
                request = self._queue.popleft()
                if not request.granted.done():
                    await self._schedule(request)
                self._forget(request)
        finally:
            self._worker = None

    async def _schedule(self, request: _Pending) -> None:
        while not request.granted.done():
            self.expire_idle()
            runner = self.loaded.get(request.model)
            if runner is not None:
                if not _needs_reload(runner, request.wanted):
                    self._grant(request, runner)
                    return
                victim, request.reload = runner, True
            elif len(self.loaded) >= (self.config.max_loaded_models or _AUTOMATIC_MAX_LOADED):
                victim = self._victim()
            elif not self.loaded or self._fits(request):
                await self._load(request)
                return
            else:
                victim = self._victim()
            await self._evict(victim, for_model=request.model)

    def _victim(self) -> Runner:
        """findRunnerToUnload: the first idle runner by keep-alive (shortest first) and then
        path, else the first of them all."""
        ordered = sorted(self.loaded.values(), key=lambda r: (r.session, model_path(r.model)))
        return next((r for r in ordered if r.refs <= 0), ordered[0])

    async def _evict(self, victim: Runner, for_model: str) -> None:
        unloaded: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._unloads.append(unloaded)
        victim.evicted = victim.model != for_model
        victim.session = 0.0
        if victim.refs <= 0:
            self._unload(victim)
        self.changed()
        # Any unload wakes the queue, as unloadedCh does; then it looks again.
        self._draining_since = self.clock()
        try:
            await unloaded
        finally:
            self._drained = self._drain_time()
            self._draining_since = None

    def _fits(self, request: _Pending) -> bool:
        if self.config.memory is None:
            return True
        used = sum(runner.size for runner in self.loaded.values())
        return used + self._size(request) <= self.config.memory

    async def _load(self, request: _Pending) -> None:
        size = self._size(request)
        self.stats.loads += 1
        self.stats.reloads += request.reload
        self.changed()
        seconds = self.config.load_seconds + self.config.load_seconds_per_gib * size / 2**30
        if seconds > 0:
            await asyncio.sleep(seconds)
        session = self.config.default_keep_alive
        runner = Runner(
            request.model,
            request.wanted,
            size,
            self._slots(),
            session if request.keep_alive is None else request.keep_alive,
        )
        self.loaded[request.model] = runner
        if not self._grant(request, runner):
            runner.refs = 1  # the caller left during the load: idle from now on
            self.done(runner)

    def _slots(self) -> SlotPool:
        """A new runner's slots: its own runner's before 0.30, a llama-server's since."""
        config = self.config
        if runs_own_runner(config.ollama_version):
            return SlotPool(config.parallel, self.stats, self.changed, forks=True)
        return SlotPool(config.parallel, self.stats, self.changed, host_cache=HostCache())

    def _size(self, request: _Pending) -> int:
        num_ctx = request.wanted.num_ctx or self.config.context_length  # set by _normalized
        return runner_size(request.model, num_ctx, self.config.parallel)

    # -- runners --------------------------------------------------------------------------

    def _grant(self, request: _Pending, runner: Runner) -> bool:
        if request.granted.done():
            return False
        self._use(runner, request.keep_alive)
        request.granted.set_result(runner)
        self._forget(request)
        return True

    def _use(self, runner: Runner, keep_alive: float | None) -> None:
        """useLoadedRunner: one more reference; a given keep_alive replaces the runner's."""
        runner.refs += 1
        runner.expires = FOREVER
        if keep_alive is not None:
            runner.session = keep_alive
        self.changed()

    def _unload(self, runner: Runner) -> None:
        if self.loaded.get(runner.model) is not runner:
            return
        del self.loaded[runner.model]
        self.stats.unloads += 1
        self.stats.unloaded.append(runner.model)
        self.stats.evictions += runner.evicted
        self.changed()
        if self.config.unload_seconds > 0:
            self._call_later(self.config.unload_seconds, self._announce_unload)
        else:
            self._announce_unload()

    def _announce_unload(self) -> None:
        waiters, self._unloads = self._unloads, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def _timer(self, seconds: float) -> None:
        if seconds < _LONGEST_TIMER:
            # Expired lazily too (expire_idle on every look), so that a test's clock can
            # jump; the timer is for a pending request waiting on this unload.
            self._call_later(seconds, self.expire_idle)

    @staticmethod
    def _call_later(seconds: float, callback: Callable[[], None]) -> None:
        with contextlib.suppress(RuntimeError):  # no running loop: nothing waits on it
            asyncio.get_running_loop().call_later(seconds, callback)

    def _normalized(self, model: str, options: LoadOptions) -> LoadOptions:
        """The options the runner would get: defaults filled in, num_ctx at least 4 and at
        most the model's trained context (sched.go getRunner, effectiveContext)."""
        num_ctx = options.num_ctx if options.num_ctx is not None else self.config.context_length
        num_ctx = min(max(num_ctx, _MIN_NUM_CTX), model_spec(model).context_length)
        return replace(
            options,
            num_ctx=num_ctx,
            num_batch=_NUM_BATCH if options.num_batch is None else options.num_batch,
            num_gpu=_NUM_GPU if options.num_gpu is None else options.num_gpu,
            num_thread=_NUM_THREAD if options.num_thread is None else options.num_thread,
        )

    def _forget(self, request: _Pending) -> None:
        if request in self._outstanding:
            self._outstanding.discard(request)
            self.stats.held_seconds += self.clock() - request.arrived
            self.stats.drain_held_seconds += self._drain_time() - request.drained_before
            if request in self._queue:
                self._queue.remove(request)
            self._count_pending()

    def _drain_time(self) -> float:
        """Seconds the queue has waited for victims to drain and unload, so far."""
        since = self._draining_since
        return self._drained + (0.0 if since is None else self.clock() - since)

    def _count_pending(self) -> None:
        self.stats.pending = len(self._outstanding)
        self.changed()


def _needs_reload(runner: Runner, wanted: LoadOptions) -> bool:
    """runnerRef.needsReload: any load-time option differs (num_gpu -1 matches any)."""
    have = runner.options
    if wanted.num_gpu is not None and wanted.num_gpu < 0:
        have = replace(have, num_gpu=wanted.num_gpu)
    return have != wanted
