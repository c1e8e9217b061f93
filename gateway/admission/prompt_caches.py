"""What each backend's engine holds in its prompt cache, as far as the gateway can tell.

An engine keeps the prompts it evaluated: llama-server (and Ollama since 0.30, which runs
one per model) each slot's last prompt and more in host memory (``--cache-ram``); Ollama's
own runner, before 0.30, one prompt per parallel slot. A request
whose start matches one of them is evaluated only from where they part: a chat's later
turns, whose front end sends the same tools, system prompt and history again, cost the
engine their new suffix, not the whole prompt.

The gateway keeps, per backend, a bounded set of the prompt prefixes it has seen that
engine evaluate: the request's rendered prompt cut into blocks and each block hashed
together with everything before it (``intake/prefixes.py``), so that one hash stands for a
whole prefix, as llm-d's prefix-aware routing does. A prefix is held only once the engine
has answered it with its counts; a reply that says the cache read less than the gateway
thought forgets what it was wrong about. The hashes are keyed with a secret of this
process, so no client can write a prompt that passes for another's.

On llama-server the gateway also picks the slot (``id_slot``): each slot holds its last
prompt, and a free slot holding nothing of a conversation costs it a whole prefill where
the slot that holds it may free in a moment. A request goes to the slot where its wait and
its prefill together are shortest, the wait from the service time of what runs there, the
prefill from the rate the engine has shown; llama-server keeps a request for a busy slot
until that slot is free. Only where the server has said how many slots it has (``/props``).
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import NamedTuple

from gateway.admission.cache_contents import (
    BLOCK_BYTES,
    CHARS_PER_TOKEN,
    HostBlocks,
    RunnerSlots,
    common_blocks,
    through,
)
from gateway.backends import Backend
from gateway.config import BackendKind

__all__ = [
    "NO_PREFIX",
    "Pinned",
    "Prefix",
    "PromptCaches",
    "SlotCopy",
]

# How much of a prompt cache the gateway remembers, per slot, in blocks: llama-server
# keeps slots' prompts and as many again in host memory (8 GiB by default); another
# OpenAI-compatible server, as much as one prompt of 8,192 tokens a slot. An engine holding
# more than this is only cheaper than estimated; its counts settle the charge. (Ollama
# before 0.30 ran its own runners, which hold one prompt a slot: ``RunnerSlots``.)
_BLOCKS_PER_SLOT: dict[BackendKind, int] = {
    "llamacpp": 512,
    "llamacpp-router": 512,
    "ollama": 512,  # llama-server since 0.30, with its default host cache
}
_DEFAULT_BLOCKS_PER_SLOT = 128
# A slot's prompt is copied to an idle slot when evaluating it there would take at least
# this long (a pause a person notices) and several times what copying it takes: a copy
# stops the engine's loop while it writes and reads, and wears the disk.
_MIN_COPY_GAIN = 0.5
_COPY_GAIN_RATIO = 4.0
_COPIES_RETRY_SECONDS = 600.0  # a server that could not copy is asked again after this


class Prefix(NamedTuple):
    """A request's rendered prompt as the cache sees it."""

    blocks: tuple[int, ...]  # chained hashes, one per whole block, model and all before it
    size: int  # bytes of the whole rendered prompt (the last block is rarely whole)
    model: str = ""  # the model it is for: Ollama keeps a runner's cache per model
    # What the count weighs (characters) through the end of each whole block, and in all:
    # a share is of these, not of bytes, which the count does not see (keys, numbers).
    weights: tuple[int, ...] = ()
    weight: int = 0

    def share(self, held: int) -> float:
        """The part of the prompt that ``held`` leading bytes are, as the count weighs
        them (by bytes where no weights were given)."""
        if not self.size:
            return 0.0
        if held >= self.size or not self.weights:
            return min(1.0, held / self.size)
        whole = min(held // BLOCK_BYTES, len(self.weights))
        return self.weights[whole - 1] / self.weight if whole and self.weight else 0.0


NO_PREFIX = Prefix((), 0)


@dataclass(slots=True)
class _EngineSlot:
    """One of llama-server's slots, as the gateway has assigned it."""

    held: tuple[int, ...] = ()  # the blocks of the last prompt it answered
    size: int = 0  # that prompt's bytes
    assigned: int = 0  # requests sent to it, not yet ended (a second waits in the engine)
    free_at: float = 0.0  # when what is assigned to it likely ends
    last_used: int = 0
    filled: bool = False  # by a copy, and no request sent to it since


class Pinned(NamedTuple):
    """The llama-server slot chosen for a request."""

    slot: int
    taken: bool  # busy now: the request waits for it in the engine
    copy: SlotCopy | None  # to make before the request goes (``backends/watch/slot_copies.py``)
    starts: float  # when it likely starts in the engine: now, or when its slot frees


class SlotCopy(NamedTuple):
    source: int
    target: int
    tokens: int  # about as many as the source slot holds


class PromptCaches:
    """Every backend's remembered prompt prefixes (by backend name), and llama-server's
    slots as the gateway assigns them."""

    def __init__(self) -> None:
        self._by_backend: dict[str, HostBlocks | RunnerSlots] = {}
        self._slots: dict[str, list[_EngineSlot]] = {}
        self._uses = itertools.count(1)
        self._copy_rates: dict[str, float] = {}  # seconds a token, as copies took
        self._copies_off: dict[str, float] = {}  # backend -> until when (not started for them)
        self.copies: Counter[str] = Counter()  # made, by backend

    def pin(
        self,
        backend: Backend,
        prefix: Prefix,
        now: float,
        decode: float,
        rate: float,
    ) -> Pinned | None:
        """The llama-server slot for a request of ``prefix`` that decodes for ``decode``
        seconds on an engine that evaluates ``rate`` prompt tokens a second: where waiting
        and prefilling take least; whether it is taken now (the request waits for it in the
        engine); and a copy of its slot's prompt into an idle one, when that is worth it.
        (Sending a heavy request to a cold slot instead, to warm it for later turns, was
        measured worse on the real server: its prefill stalled the light turns beside it
        for seconds.) None: the backend is not a llama-server that said its slots, or the
        prompt is too short for a whole block (llama-server's own choice, by the longest
        common prefix in tokens, knows it better than the gateway could)."""
        if backend.kind != "llamacpp" or not backend.state.slots or not prefix.blocks:
            return None
        slots = self._slots.get(backend.name)
        if slots is None or len(slots) != backend.state.slots:  # first, or restarted
            slots = self._slots[backend.name] = [_EngineSlot() for _ in range(backend.state.slots)]
        tokens = prefix.size / CHARS_PER_TOKEN

        def prefill(slot: _EngineSlot) -> float:
            common = common_blocks(slot.held, prefix.blocks)
            held = through(common, slot.size if common == len(slot.held) else 0)
            return tokens * (1 - prefix.share(held)) / rate

        def cost(slot: _EngineSlot) -> tuple[float, int]:
            wait = max(0.0, slot.free_at - now) if slot.assigned else 0.0
            return wait + prefill(slot), slot.last_used

        chosen = min(range(len(slots)), key=lambda i: cost(slots[i]))
        slot = slots[chosen]
        taken = slot.assigned > 0
        copy = None if taken else self._copy_from(backend, chosen, slots, prefill, now)
        starts = max(now, slot.free_at) if taken else now
        slot.free_at = starts + prefill(slot) + decode
        slot.assigned += 1
        slot.filled = False
        return Pinned(chosen, taken, copy, starts)

    def _copy_from(
        self,
        backend: Backend,
        source: int,
        slots: list[_EngineSlot],
        prefill: Callable[[_EngineSlot], float],
        now: float,
    ) -> SlotCopy | None:
        """A copy of ``source``'s prompt into an idle slot that holds nothing it lacks
        (so nothing is lost), where a request like this one would spend far longer
        evaluating its prompt than the copy takes; the target is counted busy until
        ``copied``. Copies are planned one way only: to slots that then hold the same start,
        so they stop once every slot holds it; and not again into a slot that no request has
        used since its last copy (one person alone would have a copy every turn)."""
        if self._copies_off.get(backend.name, 0.0) > now:
            return None
        held, size = slots[source].held, slots[source].size
        tokens = size / CHARS_PER_TOKEN
        seconds = tokens * self._copy_rates.get(backend.name, 0.0)
        best, gain = None, max(_MIN_COPY_GAIN, _COPY_GAIN_RATIO * seconds)
        for index, other in enumerate(slots):
            if (
                index == source
                or other.assigned
                or other.filled
                or common_blocks(other.held, held) < len(other.held)
            ):
                continue
            saved = prefill(other) - prefill(slots[source])
            if saved >= gain:
                best, gain = index, saved
        if best is None:
            return None
        target = slots[best]
        target.held, target.size, target.assigned = held, size, target.assigned + 1
        target.filled = True
        target.free_at = now + seconds
        return SlotCopy(source, best, round(tokens))

    def copied(
        self, backend: Backend, copy: SlotCopy, seconds: float | None, unsupported: bool, now: float
    ) -> None:
        """The copy planned by ``pin`` took ``seconds``, or failed (None); ``unsupported``:
        the server cannot copy (not started with ``--slot-save-path``)."""
        slots = self._slots.get(backend.name)
        if slots is None or copy.target >= len(slots):  # the engine restarted meanwhile
            return
        target = slots[copy.target]
        target.assigned = max(0, target.assigned - 1)
        target.last_used = next(self._uses)
        if seconds is None:  # it holds what it held, or nothing: nothing, safely
            target.held, target.size = (), 0
            if unsupported:
                self._copies_off[backend.name] = now + _COPIES_RETRY_SECONDS
            return
        self.copies[backend.name] += 1
        rate = seconds / max(1, copy.tokens)
        known = self._copy_rates.get(backend.name)
        self._copy_rates[backend.name] = rate if known is None else 0.8 * known + 0.2 * rate

    def unpin(self, backend: Backend, chosen: int) -> None:
        """The request sent to slot ``chosen`` of ``backend`` ended."""
        slots = self._slots.get(backend.name)
        if slots is not None and chosen < len(slots):
            slot = slots[chosen]
            slot.assigned = max(0, slot.assigned - 1)
            slot.last_used = next(self._uses)

    def matched(self, backend: Backend, prefix: Prefix) -> tuple[int, int]:
        """Leading blocks of ``prefix`` that ``backend``'s engine likely holds, and bytes."""
        held = self._held(backend)
        if held is None or not prefix.blocks:
            return 0, 0
        return held.matched(prefix.model, prefix.blocks)

    def _held(self, backend: Backend) -> HostBlocks | RunnerSlots | None:
        """What is kept of ``backend``'s engine, if it still stands: not once its probes
        failed and passed again (a restart, likely), nor once it says it is an engine that
        keeps prompts otherwise (an Ollama upgraded between two probes)."""
        held = self._by_backend.get(backend.name)
        if held is None:
            return None
        if held.comebacks != backend.state.comebacks or not isinstance(held, _kept(backend)):
            self.emptied(backend)
            return None
        return held

    def cached_share(self, backends: Iterable[Backend], prefix: Prefix) -> float:
        """The part of ``prefix`` the best of ``backends`` likely holds (0 to 1)."""
        if not prefix.blocks:
            return 0.0
        return prefix.share(max((self.matched(b, prefix)[1] for b in backends), default=0))

    def holding_most(self, backends: list[Backend], prefix: Prefix) -> list[Backend]:
        """Those of ``backends`` that likely hold the most of ``prefix`` (all, if none does)."""
        if not prefix.blocks:
            return backends
        held = [self.matched(b, prefix)[1] for b in backends]
        most = max(held, default=0)
        return [b for b, n in zip(backends, held, strict=True) if n == most] if most else backends

    def evaluated(
        self,
        backend: Backend,
        prefix: Prefix,
        predicted: int,
        engine_share: float | None,
        slot: int | None = None,
    ) -> None:
        """``backend``'s engine answered ``prefix`` (``predicted`` blocks of it thought
        held), on ``slot`` if the gateway chose it; ``engine_share``: the part its counts
        say the cache read, if they say. Its engine holds the prompt now; what it did not
        hold of what was predicted is forgotten (another prompt evicted it), for every
        prompt that shares it."""
        if not prefix.blocks:
            return
        size = prefix.size
        pinned = self._slots.get(backend.name)
        if slot is not None and pinned is not None and slot < len(pinned):
            pinned[slot].held, pinned[slot].size = prefix.blocks, size
        held = self._held(backend)
        if held is None:
            held = self._by_backend[backend.name] = _kept(backend)(backend.state.comebacks)
        model, slots = prefix.model, max(1, backend.slots)
        if engine_share is not None:
            engine_blocks = int(engine_share * prefix.size) // BLOCK_BYTES
            if engine_blocks + 1 < predicted:  # a block's worth of tokenizing aside
                held.forget(model, prefix.blocks[engine_blocks:predicted])
        if isinstance(held, RunnerSlots):
            held.hold(model, prefix.blocks, size, slots)
        else:
            per_slot = _BLOCKS_PER_SLOT.get(backend.kind, _DEFAULT_BLOCKS_PER_SLOT)
            held.hold(model, prefix.blocks, size, slots * per_slot)

    def emptied(self, backend: Backend) -> None:
        """``backend``'s engine (re)loaded a model: what it held of that model is gone, and
        of any model the load evicted. All of that backend's are forgotten, Ollama's runners
        too (which are kept by model): a load that evicted nothing costs a model's next turn
        an estimate too heavy, where one that evicted a model would otherwise have its next
        request, the one that loads it again, taken for cached."""
        self._by_backend.pop(backend.name, None)
        for slot in self._slots.get(backend.name, ()):
            slot.held, slot.size = (), 0


def _kept(backend: Backend) -> type[HostBlocks] | type[RunnerSlots]:
    """How ``backend``'s engine keeps prompts: one a slot (Ollama's own runner, before
    0.30), or as llama-server does (every other, Ollama since 0.30 too)."""
    return RunnerSlots if backend.state.one_prompt_a_slot else HostBlocks
