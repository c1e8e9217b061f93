"""What each backend's engine holds in its prompt cache, as far as the gateway can tell.

An engine keeps the prompts it evaluated: llama-server each slot's last prompt (and more in
host memory, ``--cache-ram``), Ollama's runner one prompt per parallel slot. A request
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
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import NamedTuple

from gateway.backends import Backend
from gateway.config import BackendKind

__all__ = [
    "BLOCK_BYTES",
    "CHARS_PER_TOKEN",
    "NO_PREFIX",
    "Pinned",
    "Prefix",
    "PromptCaches",
    "SlotCopy",
    "common_blocks",
]

BLOCK_BYTES = 256
"""A block of the rendered prompt: about 64 tokens, so that a cached prefix is known to
within a few dozen tokens and a 25 KB set of tools is a hundred hashes."""

# How much of a prompt cache the gateway remembers, per slot, in blocks: llama-server
# keeps slots' prompts and as many again in host memory (8 GiB by default); Ollama's runner
# one prompt per slot, at most its context (8,192 tokens is the common num_ctx). An engine
# holding more than this is only cheaper than estimated; its counts settle the charge.
_BLOCKS_PER_SLOT: dict[BackendKind, int] = {"llamacpp": 512, "llamacpp-router": 512, "ollama": 128}
_DEFAULT_BLOCKS_PER_SLOT = 128
CHARS_PER_TOKEN = 4
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

    def share(self, held: int) -> float:
        """The part of the prompt that ``held`` leading bytes are."""
        return min(1.0, held / self.size) if self.size else 0.0


NO_PREFIX = Prefix((), 0)


def _through(blocks: int, ends: int) -> int:
    """Bytes held through ``blocks`` whole blocks, the last of which ends a prompt the
    engine holds of ``ends`` bytes (0: none ends there)."""
    return max(blocks * BLOCK_BYTES, ends)


class _Held:
    """One backend's remembered prefixes: block hashes, least recently used first. A
    prefix's blocks are touched from its end back to its start, so its start is always the
    more recent: the cache forgets the ends of prompts before their shared beginnings.

    The last whole block of a prompt the engine answered keeps that prompt's size: a
    conversation's next turn, which repeats it all, finds the engine holding everything up
    to the reply it got, not only the whole blocks. (The reply itself the engine holds as
    the tokens it generated; rendered by the template into the next turn they part from
    those early, and on llama-server it is evaluated again: measured, not assumed.)"""

    __slots__ = ("_blocks", "comebacks")

    def __init__(self, comebacks: int) -> None:
        self._blocks: OrderedDict[int, int] = OrderedDict()  # block -> bytes of a prompt ending
        self.comebacks = comebacks  # the backend's, when this began: another, a restart

    def matched(self, blocks: tuple[int, ...]) -> tuple[int, int]:
        """How many leading blocks of ``blocks`` are held, and how many bytes."""
        held, count, ends = self._blocks, 0, 0
        for block in blocks:
            found = held.get(block)
            if found is None:
                break
            count, ends = count + 1, found
        return count, _through(count, ends)

    def hold(self, blocks: tuple[int, ...], capacity: int, size: int) -> None:
        """Hold ``blocks``, a prompt of ``size`` bytes."""
        held = self._blocks
        for block in reversed(blocks):
            held[block] = held.get(block, 0)
            held.move_to_end(block)
        held[blocks[-1]] = max(held[blocks[-1]], size)
        while len(held) > capacity:
            held.popitem(last=False)

    def forget(self, blocks: Iterable[int]) -> None:
        for block in blocks:
            self._blocks.pop(block, None)

    def __len__(self) -> int:
        return len(self._blocks)


@dataclass(slots=True)
class _EngineSlot:
    """One of llama-server's slots, as the gateway has assigned it."""

    held: tuple[int, ...] = ()  # the blocks of the last prompt it answered
    size: int = 0  # that prompt's bytes
    assigned: int = 0  # requests sent to it, not yet ended (a second waits in the engine)
    free_at: float = 0.0  # when what is assigned to it likely ends
    last_used: int = 0
    filled: bool = False  # by a copy, and no request sent to it since


def common_blocks(held: tuple[int, ...], blocks: tuple[int, ...]) -> int:
    """How many leading blocks two prompts share."""
    count = 0
    for mine, theirs in zip(held, blocks, strict=False):
        if mine != theirs:
            break
        count += 1
    return count


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
        self._by_backend: dict[str, _Held] = {}
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
            held = _through(common, slot.size if common == len(slot.held) else 0)
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
        held = self._by_backend.get(backend.name)
        if held is not None and held.comebacks != backend.state.comebacks:
            self.emptied(backend)  # its probes failed and passed again: a restart, likely
            return 0, 0
        return (0, 0) if held is None or not prefix.blocks else held.matched(prefix.blocks)

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
        slots = self._slots.get(backend.name)
        if slot is not None and slots is not None and slot < len(slots):
            slots[slot].held, slots[slot].size = prefix.blocks, size
        held = self._by_backend.get(backend.name)
        if held is None or held.comebacks != backend.state.comebacks:
            held = self._by_backend[backend.name] = _Held(backend.state.comebacks)
        if engine_share is not None:
            engine_blocks = int(engine_share * prefix.size) // BLOCK_BYTES
            if engine_blocks + 1 < predicted:  # a block's worth of tokenizing aside
                held.forget(prefix.blocks[engine_blocks:predicted])
        per_slot = _BLOCKS_PER_SLOT.get(backend.kind, _DEFAULT_BLOCKS_PER_SLOT)
        held.hold(prefix.blocks, max(1, backend.slots) * per_slot, size)

    def emptied(self, backend: Backend) -> None:
        """``backend``'s engine (re)loaded a model: what it held of that model is gone;
        as the prefixes are not kept by model, all of that backend's are forgotten."""
        self._by_backend.pop(backend.name, None)
        for slot in self._slots.get(backend.name, ()):
            slot.held, slot.size = (), 0
