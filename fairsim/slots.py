"""Parallel slots with a FIFO queue behind them: llama-server's ``-np`` slots, or one Ollama
runner's ``OLLAMA_NUM_PARALLEL`` (its ``semaphore.Weighted``, which is FIFO and unbounded:
llm/llama_server.go ``s.sem.Acquire``).

Each slot keeps the prompt it last ran as its prompt cache: a request that starts the same
way is evaluated only from where the two part. Which free slot a request takes:

- llama-server (``get_available_slot``), and Ollama since 0.30, which runs a llama-server
  per model: the one whose cache shares the most of its prompt (more than a tenth of it,
  ``--slot-prompt-similarity`` 0.1), else the least recently used; its host cache
  (``HostCache``) keeps the prompts slots let go of.
- Ollama's own runner, before 0.30 (``InputCache.findBestCacheSlot``): the slot whose whole
  cache starts the prompt, if free; else the least recently used free slot, into which the
  longest common prefix of any slot is first copied ("forking cache slot"), so that one
  conversation never overwrites another's."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import os
from collections import deque
from collections.abc import Callable

from .config import GenJob, SimStats, SlotInfo

__all__ = ["HostCache", "SlotPool", "cached_tokens"]

_SIMILARITY = 0.1  # llama-server's --slot-prompt-similarity default
_CHARS_PER_TOKEN = 4  # as wire.tokens_in counts


def _shared(held: str, text: str) -> int:
    """Characters at the start of ``text`` that ``held`` holds too."""
    # Character by character is what is meant: a prompt is text, not a path.
    return len(os.path.commonprefix([held, text])) if held and text else 0  # noqa: RUF071


def cached_tokens(held: str, job: GenJob) -> int:
    """Tokens of ``job``'s prompt a slot holding ``held`` reads from its cache: their
    common start; the prompt's last token is always evaluated (its logits start the reply)."""
    shared = _shared(held, job.text) // _CHARS_PER_TOKEN
    return max(0, min(shared, job.prompt_tokens - 1))


class SlotPool:
    """``parallel`` slots; every change is counted in the shared ``stats`` and announced."""

    def __init__(
        self,
        parallel: int,
        stats: SimStats,
        changed: Callable[[], None],
        forks: bool = False,
        host_cache: HostCache | None = None,
    ) -> None:
        """``forks``: choose and fill slots as Ollama's runner does, not llama-server;
        ``host_cache``: llama-server's, where its slots' prompts go and come back from."""
        self._forks = forks
        self.host_cache = host_cache
        self.slots = [SlotInfo(i) for i in range(max(1, parallel))]
        self._stats = stats
        self._changed = changed
        self._free = [slot.id for slot in self.slots]
        self._waiters: deque[asyncio.Future[int]] = deque()
        self._task_ids = itertools.count(1)
        # Requests that named their slot (llama-server's id_slot) and wait for that one.
        self._wanting: dict[int, deque[asyncio.Future[int]]] = {}

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    @property
    def busy(self) -> int:
        return sum(1 for slot in self.slots if slot.busy)

    async def acquire(self, text: str = "", wanted: int | None = None) -> SlotInfo:
        """A free slot, in arrival order; of several, the best for a prompt of ``text``.
        ``wanted``: the slot a request named (``id_slot``), kept for it until it is free;
        one past the slots is no slot named (llama-server then takes any)."""
        if wanted is not None and not 0 <= wanted < len(self.slots):
            wanted = None
        if wanted is not None and wanted in self._free:
            self._free.remove(wanted)
            heapq.heapify(self._free)
            return self._started(self.slots[wanted])
        if wanted is None and self._free and not self._waiters:
            return self._started(self.slots[self._take_free(text)])
        waiter: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        line = self._waiters if wanted is None else self._wanting.setdefault(wanted, deque())
        line.append(waiter)
        self._stats.queued += 1
        self._changed()
        try:
            return self.slots[await waiter]
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release(self.slots[waiter.result()])
            elif waiter in line:
                line.remove(waiter)
                self._stats.queued -= 1
                self._changed()
            raise

    def _started(self, slot: SlotInfo) -> SlotInfo:
        self._stats.running += 1
        self._stats.max_running = max(self._stats.max_running, self._stats.running)
        return self._start_task(slot)

    def release(self, slot: SlotInfo) -> None:
        slot.busy = False
        # Those that named this slot first, then the others in arrival order.
        for line in (self._wanting.get(slot.id, deque()), self._waiters):
            while line:
                waiter = line.popleft()
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

    def _take_free(self, text: str) -> int:
        if self._forks and text:
            return self._fork(text)
        free = self._free
        if len(free) > 1:
            similar = [(_shared(self.slots[i].cached, text), i) for i in free]
            best, chosen = max(similar)
            if not text or best <= _SIMILARITY * len(text):
                chosen = min(free, key=lambda i: (self.slots[i].last_used, i))
            free.remove(chosen)
            heapq.heapify(free)
            return chosen
        return heapq.heappop(free)

    def _fork(self, text: str) -> int:
        """Ollama's findBestCacheSlot: the free slot that holds a whole prefix of the
        prompt, else the oldest free one with the longest common prefix copied in."""
        longest = max(self.slots, key=lambda slot: _shared(slot.cached, text))
        common = _shared(longest.cached, text)
        free = self._free
        if common == len(longest.cached) and longest.id in free:
            chosen = longest.id
        else:
            chosen = min(free, key=lambda i: (self.slots[i].last_used, i))
            if common and longest.id != chosen:
                self.slots[chosen].cached = longest.cached[:common]
        free.remove(chosen)
        heapq.heapify(free)
        return chosen

    def _start_task(self, slot: SlotInfo) -> SlotInfo:
        slot.busy = True
        slot.id_task = next(self._task_ids)
        slot.last_used = slot.id_task
        slot.n_prompt_tokens = slot.n_prompt_tokens_processed = slot.n_decoded = 0
        slot.n_predict = -1
        self._changed()
        return slot


class HostCache:
    """llama-server's prompt cache in host memory (``--cache-ram``, on by default): a slot
    about to lose more than half of what it holds saves it there first, and loads instead
    the saved prompt that shares the most with the new one (``server_prompt_cache``: one
    that would keep at least a quarter of itself), which leaves the cache."""

    def __init__(self, entries: int = 32) -> None:
        self._prompts: deque[str] = deque(maxlen=entries)

    def swap(self, slot: SlotInfo, text: str) -> None:
        """What ``slot`` holds, before it takes a prompt of ``text``."""
        held = slot.cached
        if not held or _shared(held, text) >= len(held) / 2:
            return
        self._prompts.append(held)
        best, found = _shared(held, text), ""
        for saved in self._prompts:
            shared = _shared(saved, text)
            if shared > best and shared >= len(saved) / 4:
                best, found = shared, saved
        if found:
            self._prompts.remove(found)
        slot.cached = found or held
