"""The simulated inference server behind every flavour: slots, a FIFO queue, model loading
and keep-alive, and the timing of prefill and decode."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from .config import GenJob, GenResult, QueueFull, SimAbort, SimConfig, SimStats, SlotInfo
from .wire import FOREVER, token_text

__all__ = ["Emit", "Engine"]


Emit = Callable[[str], Awaitable[None]]


@dataclass
class _Loaded:
    expires: float
    active: int = 0


class Engine:
    """All mutable state of one simulated server; every change wakes Simulator.wait_for."""

    def __init__(self, config: SimConfig, clock: Callable[[], float]) -> None:
        self.config = config
        self.clock = clock
        self.stats = SimStats()
        self.slots = [SlotInfo(i) for i in range(max(1, config.parallel))]
        self.started_at = clock()
        self.prompt_tokens_total = 0
        self.prompt_seconds_total = 0.0
        self.tokens_predicted_total = 0
        self.predicted_seconds_total = 0.0
        self._free = [slot.id for slot in self.slots]
        self._waiters: deque[asyncio.Future[int]] = deque()
        self._watchers: list[asyncio.Future[None]] = []
        self._prefilling = 0
        self._no_prefill = asyncio.Event()
        self._no_prefill.set()
        self._models: dict[str, _Loaded] = {}
        self._loads: dict[str, asyncio.Task[None]] = {}
        self._task_ids = itertools.count(1)
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

    # -- models -------------------------------------------------------------------------

    def loaded_models(self) -> dict[str, float]:
        now = self.clock()
        for name, state in list(self._models.items()):
            if state.active == 0 and now >= state.expires:
                del self._models[name]
                self.changed()
        return {name: state.expires for name, state in self._models.items()}

    def expire_all(self) -> None:
        self._models.clear()
        self.changed()

    def unload(self, model: str) -> None:
        """keep_alive 0 on an empty request: unload now, or when its requests finish."""
        state = self._models.get(model)
        if state is None:
            return
        if state.active == 0:
            del self._models[model]
        else:
            state.expires = -FOREVER
        self.changed()

    async def use_model(self, model: str, keep_alive: float | None) -> None:
        """Load ``model`` if needed and pin it until release_model; loads outlive callers."""
        while model not in self.loaded_models():
            load = self._loads.get(model)
            if load is None:
                load = asyncio.create_task(self._load(model))
                self._loads[model] = load
            await asyncio.shield(load)
        state = self._models[model]
        state.active += 1
        state.expires = self._expiry(keep_alive)

    async def _load(self, model: str) -> None:
        try:
            self.stats.loads += 1
            self.changed()
            if self.config.load_seconds > 0:
                await asyncio.sleep(self.config.load_seconds)
            self._models[model] = _Loaded(self._expiry(None))
        finally:
            del self._loads[model]
            self.changed()

    def release_model(self, model: str, keep_alive: float | None) -> None:
        state = self._models.get(model)
        if state is None:
            return
        state.active -= 1
        if state.active == 0:
            if state.expires != -FOREVER:
                state.expires = self._expiry(keep_alive)
            if state.expires <= self.clock():
                del self._models[model]
        self.changed()

    def _expiry(self, keep_alive: float | None) -> float:
        seconds = self.config.default_keep_alive if keep_alive is None else keep_alive
        return FOREVER if seconds == FOREVER else self.clock() + seconds

    # -- slots --------------------------------------------------------------------------

    async def acquire(self, *, bounded: bool = True) -> SlotInfo:
        """A free slot, in arrival order; raises QueueFull past max_queue when bounded."""
        if self._free and not self._waiters:
            slot = self.slots[heapq.heappop(self._free)]
            self.stats.running += 1
            self.stats.max_running = max(self.stats.max_running, self.stats.running)
            return self._start_task(slot)
        if bounded and len(self._waiters) >= self.config.max_queue:
            raise QueueFull
        waiter: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        self.stats.queued += 1
        self.changed()
        try:
            return self.slots[await waiter]
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release(self.slots[waiter.result()])
            elif waiter in self._waiters:
                self._waiters.remove(waiter)
                self.stats.queued -= 1
                self.changed()
            raise

    def release(self, slot: SlotInfo) -> None:
        slot.busy = False
        while self._waiters:
            waiter = self._waiters.popleft()
            self.stats.queued -= 1
            if waiter.cancelled():
                # Its task is being cancelled and has not run its cleanup yet.
                continue
            # Hand the slot straight to the oldest waiter: `running` does not dip.
            self._start_task(slot)
            waiter.set_result(slot.id)
            return
        heapq.heappush(self._free, slot.id)
        self.stats.running -= 1
        self.changed()

    def _start_task(self, slot: SlotInfo) -> SlotInfo:
        slot.busy = True
        slot.id_task = next(self._task_ids)
        slot.n_prompt_tokens = slot.n_prompt_tokens_processed = slot.n_decoded = 0
        slot.n_predict = -1
        self.changed()
        return slot

    # -- work ---------------------------------------------------------------------------

    async def generate(self, job: GenJob, emit: Emit, *, bounded: bool = True) -> GenResult:
        """Queue for a slot, prefill, then emit each token; frees the slot however it ends."""
        start = time.perf_counter_ns()
        self._track_current_task()
        loads_model = self.config.flavor == "ollama"
        try:
            if loads_model:
                await self.use_model(job.model, job.keep_alive)
            try:
                loaded = time.perf_counter_ns()
                slot = await self.acquire(bounded=bounded)
                try:
                    return await self._run(job, slot, emit, start, loaded)
                finally:
                    self.release(slot)
            finally:
                if loads_model:
                    self.release_model(job.model, job.keep_alive)
        except (asyncio.CancelledError, ConnectionError):
            self.stats.disconnects += 1
            self.changed()
            raise

    async def _run(
        self, job: GenJob, slot: SlotInfo, emit: Emit, start: int, loaded: int
    ) -> GenResult:
        slot.n_prompt_tokens = job.prompt_tokens
        slot.n_predict = job.output_tokens if job.length_limited else -1
        if job.faults.first_byte_delay > 0:
            await asyncio.sleep(job.faults.first_byte_delay)
        prefill_start = time.perf_counter_ns()
        await self.prefill(job.prompt_tokens)
        slot.n_prompt_tokens_processed = job.prompt_tokens
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

    async def embed(self, model: str, tokens: int, keep_alive: float | None) -> tuple[int, int]:
        """An embedding request: load, hold a slot while prefilling; returns (total, load) ns."""
        start = time.perf_counter_ns()
        self._track_current_task()
        try:
            await self.use_model(model, keep_alive)
            loaded = time.perf_counter_ns()
            try:
                slot = await self.acquire()
                try:
                    await self.prefill(tokens)
                finally:
                    self.release(slot)
            finally:
                self.release_model(model, keep_alive)
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
        for task in list(self._jobs) + list(self._loads.values()):
            task.cancel()
