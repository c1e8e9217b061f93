"""The simulated inference server behind every flavour: slots (llama-server's, or each
Ollama runner's), Ollama's model scheduler, and the timing of prefill and decode."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from .config import GenJob, GenResult, LoadOptions, SimAbort, SimConfig, SimStats, SlotInfo
from .ollama_sched import OllamaScheduler, Runner
from .slots import HostCache, SlotPool, cached_tokens
from .wire import token_text

__all__ = ["Emit", "Engine"]


Emit = Callable[[str], Awaitable[None]]


class Engine:
    """All mutable state of one simulated server; every change wakes Simulator.wait_for."""

    def __init__(self, config: SimConfig, clock: Callable[[], float]) -> None:
        self.config = config
        self.clock = clock
        self.stats = SimStats()
        # llama-server's slots; an Ollama runner has slots of its own (scheduler.loaded).
        host_cache = HostCache() if config.flavor == "llamacpp" else None
        self.pool = SlotPool(config.parallel, self.stats, self.changed, host_cache=host_cache)
        self.slots = self.pool.slots
        self.saved_slots: dict[str, str] = {}  # --slot-save-path's files: the text they hold
        self.scheduler = OllamaScheduler(config, clock, self.stats, self.changed)
        self.started_at = clock()
        self.prompt_tokens_total = 0
        self.prompt_seconds_total = 0.0
        self.tokens_predicted_total = 0
        self.predicted_seconds_total = 0.0
        self._watchers: list[asyncio.Future[None]] = []
        self._prefilling = 0
        self._no_prefill = asyncio.Event()
        self._no_prefill.set()
        self._jobs: set[asyncio.Task[object]] = set()

    # -- notification -------------------------------------------------------------------

    def changed(self) -> None:
        """Wake every wait_for so it re-checks its predicate."""
        watchers, self._watchers = self._watchers, []
        for watcher in watchers:
            if not watcher.done():
                watcher.set_result(None)

    # Simulator.wait_for's public signature takes a timeout, hence the noqa.
    async def wait_for(
        self,
        predicate: Callable[[SimStats], bool],
        timeout: float,  # noqa: ASYNC109
    ) -> None:
        async with asyncio.timeout(timeout):
            while not predicate(self.stats):
                watcher = asyncio.get_running_loop().create_future()
                self._watchers.append(watcher)
                await watcher

    # -- models (Ollama) ----------------------------------------------------------------

    def loaded_models(self) -> dict[str, float]:
        """Loaded model -> when it unloads (a busy one: its keep-alive from now)."""
        self.scheduler.expire_idle()
        now = self.clock()
        return {
            name: runner.expires if runner.refs <= 0 else now + runner.session
            for name, runner in self.scheduler.loaded.items()
        }

    def expire_all(self) -> None:
        self.scheduler.expire_all()

    def unload(self, model: str) -> None:
        """keep_alive 0 on an empty request: unload now, or when its requests finish."""
        self.scheduler.expire(model)

    async def touch(self, model: str, load: LoadOptions, keep_alive: float | None) -> None:
        """An empty request: load the model (as ``load`` asks) without taking a slot."""
        runner = await self.scheduler.get_runner(model, load, keep_alive)
        self.scheduler.done(runner)

    # -- work ---------------------------------------------------------------------------

    async def generate(self, job: GenJob, emit: Emit) -> GenResult:
        """Queue for a slot, prefill, then emit each token; frees the slot however it ends."""
        start = time.perf_counter_ns()
        self._track_current_task()
        try:
            runner = await self._runner(job.model, job.load, job.keep_alive)
            try:
                loaded = time.perf_counter_ns()
                pool = self.pool if runner is None else runner.slots
                slot = await pool.acquire(job.text, job.slot)
                try:
                    return await self._run(job, pool, slot, emit, start, loaded)
                finally:
                    pool.release(slot)
            finally:
                if runner is not None:
                    self.scheduler.done(runner)
        except (asyncio.CancelledError, ConnectionError):
            self.stats.disconnects += 1
            self.changed()
            raise

    async def _runner(
        self, model: str, load: LoadOptions, keep_alive: float | None
    ) -> Runner | None:
        """Ollama's runner for the request; llama-server has its one model loaded."""
        if self.config.flavor != "ollama":
            return None
        return await self.scheduler.get_runner(model, load, keep_alive)

    async def _run(
        self, job: GenJob, pool: SlotPool, slot: SlotInfo, emit: Emit, start: int, loaded: int
    ) -> GenResult:
        slot.n_prompt_tokens = job.prompt_tokens
        slot.n_predict = job.output_tokens if job.length_limited else -1
        if job.faults.first_byte_delay > 0:
            await asyncio.sleep(job.faults.first_byte_delay)
        prefill_start = time.perf_counter_ns()
        # A slot named by id_slot is taken as it is: llama-server swaps prompts with its
        # host cache only for a slot it chose itself (get_available_slot's update_cache).
        named = job.slot is not None and 0 <= job.slot < len(pool.slots)
        if pool.host_cache is not None and job.text and not named:
            pool.host_cache.swap(slot, job.text)
        cached = cached_tokens(slot.cached, job) if job.reuse else 0
        slot.cached = ""  # overwritten from where the prompts part, as the engine does
        await self.prefill(job.prompt_tokens - cached)
        slot.cached = job.text
        slot.n_prompt_tokens_processed = job.prompt_tokens - cached
        decode_start = time.perf_counter_ns()
        base_step = 1 / self.config.decode_tokens_per_s if self.config.decode_tokens_per_s else 0
        for index in range(job.output_tokens):
            if index == job.faults.die_after:
                self.stats.aborted += 1
                raise SimAbort
            if index == job.faults.stall_after:
                await asyncio.get_running_loop().create_future()
            if self.config.prefill_blocks_decode and self._prefilling:
                await self._no_prefill.wait()
            step = base_step * (1 + self.config.decode_slowdown * (self.stats.running - 1))
            if step > 0:
                await asyncio.sleep(step)
            elif index % 16 == 15:
                # Zero-delay mode still yields now and then so disconnects are noticed.
                await asyncio.sleep(0)
            await emit(token_text(index))
            slot.n_decoded = index + 1
        # The reply is in the slot's cache too, as the tokens generated; a chat's next turn
        # renders it through the template, and llama-server evaluates it again (measured
        # with a ChatML template: the turn after a 24-token reply evaluated about 57).
        end = time.perf_counter_ns()
        self.tokens_predicted_total += job.output_tokens
        self.predicted_seconds_total += (end - decode_start) / 1e9
        self.stats.completed += 1
        self.changed()
        return GenResult(
            eval_count=job.output_tokens,
            done_reason="length" if job.length_limited else "stop",
            slot_id=slot.id,
            total_ns=max(1, end - start),
            load_ns=max(1, loaded - start),
            prompt_ns=max(1, decode_start - prefill_start),
            eval_ns=max(1, end - decode_start),
            cached_tokens=cached,
        )

    async def prefill(self, tokens: int) -> None:
        """Process a prompt; with prefill_blocks_decode, every decoding stream pauses meanwhile."""
        self.prompt_tokens_total += tokens
        rate = self.config.prefill_tokens_per_s
        if rate <= 0:
            return
        self._prefilling += 1
        self._no_prefill.clear()
        self.changed()
        try:
            await asyncio.sleep(tokens / rate)
            self.prompt_seconds_total += tokens / rate
        finally:
            self._prefilling -= 1
            if not self._prefilling:
                self._no_prefill.set()
            self.changed()

    async def embed(
        self, model: str, tokens: int, keep_alive: float | None, load: LoadOptions
    ) -> tuple[int, int]:
        """An embedding request: load, hold a slot while prefilling; returns (total, load) ns."""
        start = time.perf_counter_ns()
        self._track_current_task()
        try:
            runner = await self.scheduler.get_runner(model, load, keep_alive)
            loaded = time.perf_counter_ns()
            try:
                slot = await runner.slots.acquire()
                try:
                    await self.prefill(tokens)
                finally:
                    runner.slots.release(slot)
            finally:
                self.scheduler.done(runner)
        except (asyncio.CancelledError, ConnectionError):
            self.stats.disconnects += 1
            self.changed()
            raise
        self.stats.completed += 1
        self.changed()
        return max(1, time.perf_counter_ns() - start), max(1, loaded - start)

    def record_prompt(self, text: str) -> None:
        self.stats.prompts.append(text)
        self.changed()

    def _track_current_task(self) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._jobs.add(task)
            task.add_done_callback(self._jobs.discard)

    async def shutdown(self) -> None:
        """Cancel in-flight work (stalled streams would otherwise hold server shutdown)."""
        for task in [*self._jobs, *self.scheduler.tasks()]:
            task.cancel()
