"""Parallel slots with a FIFO queue behind them: llama-server's ``-np`` slots, or one Ollama
runner's ``OLLAMA_NUM_PARALLEL`` (its ``semaphore.Weighted``, which is FIFO and unbounded:
llm/llama_server.go ``s.sem.Acquire``)."""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections import deque
from collections.abc import Callable

from .config import SimStats, SlotInfo

__all__ = ["SlotPool"]


class SlotPool:
    """``parallel`` slots; every change is counted in the shared ``stats`` and announced."""

    def __init__(self, parallel: int, stats: SimStats, changed: Callable[[], None]) -> None:
        self.slots = [SlotInfo(i) for i in range(max(1, parallel))]
        self._stats = stats
        self._changed = changed
        self._free = [slot.id for slot in self.slots]
        self._waiters: deque[asyncio.Future[int]] = deque()
        self._task_ids = itertools.count(1)

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    @property
    def busy(self) -> int:
        return sum(1 for slot in self.slots if slot.busy)

    async def acquire(self) -> SlotInfo:
        """A free slot, in arrival order."""
        if self._free and not self._waiters:
            slot = self.slots[heapq.heappop(self._free)]
            self._stats.running += 1
            self._stats.max_running = max(self._stats.max_running, self._stats.running)
            return self._start_task(slot)
        waiter: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        self._stats.queued += 1
        self._changed()
        try:
            return self.slots[await waiter]
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release(self.slots[waiter.result()])
            elif waiter in self._waiters:
                self._waiters.remove(waiter)
                self._stats.queued -= 1
                self._changed()
            raise

    def release(self, slot: SlotInfo) -> None:
        slot.busy = False
        while self._waiters:
            waiter = self._waiters.popleft()
            self._stats.queued -= 1
            if waiter.cancelled():
                # Its task is being cancelled and has not run its cleanup yet.
                continue
            # Hand the slot straight to the oldest waiter: `running` does not dip.
            self._start_task(slot)
            waiter.set_result(slot.id)
            return
        heapq.heappush(self._free, slot.id)
        self._stats.running -= 1
        self._changed()

    def _start_task(self, slot: SlotInfo) -> SlotInfo:
        slot.busy = True
        slot.id_task = next(self._task_ids)
        slot.n_prompt_tokens = slot.n_prompt_tokens_processed = slot.n_decoded = 0
        slot.n_predict = -1
        self._changed()
        return slot
