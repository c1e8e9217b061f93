"""What an engine's prompt cache holds, kept as each kind of engine keeps it.

- llama-server: each slot's last prompt, and many more in host memory (``--cache-ram``,
  8 GiB by default), any of which a request whose prompt starts alike reads back: a
  least-recently-used set of blocks, bounded per slot (``HostBlocks``).
- Ollama since 0.30: a llama-server per loaded model, kept as llama-server's (the host
  cache is llama-server's default: Ollama does not set ``--cache-ram``).
- Ollama before 0.30: one runner per loaded model, and in it one prompt per slot
  (``OLLAMA_NUM_PARALLEL``), whatever its length. A request takes the slot whose whole
  cache starts its prompt, else the least recently used one, after a copy into it of the
  longest prefix any slot shares (``InputCache.findBestCacheSlot``); either way that slot
  holds the request's prompt after it (``RunnerSlots``). So three conversations taking
  turns on two slots find their histories gone, however short they are.

Blocks are chained hashes (``intake/prefixes.py``): one stands for its whole prefix, and a
model's never equal another's.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

__all__ = [
    "BLOCK_BYTES",
    "CHARS_PER_TOKEN",
    "HostBlocks",
    "RunnerSlots",
    "common_blocks",
    "through",
]

BLOCK_BYTES = 256
"""A block of the rendered prompt: about 64 tokens, so that a cached prefix is known to
within a few dozen tokens and a 25 KB set of tools is a hundred hashes."""

CHARS_PER_TOKEN = 4
"""The count's characters a token: every estimate of a prompt's tokens divides by it."""

_MODELS_KEPT = 64  # runners remembered per backend: a model is the client's to name


def through(blocks: int, ends: int) -> int:
    """Bytes held through ``blocks`` whole blocks, the last of which ends a prompt the
    engine holds of ``ends`` bytes (0: none ends there)."""
    return max(blocks * BLOCK_BYTES, ends)


def common_blocks(held: tuple[int, ...], blocks: tuple[int, ...]) -> int:
    """How many leading blocks two prompts share."""
    count = 0
    for mine, theirs in zip(held, blocks, strict=False):
        if mine != theirs:
            break
        count += 1
    return count


class HostBlocks:
    """One llama-server's remembered prefixes: block hashes, least recently used first. A
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

    def matched(self, model: str, blocks: tuple[int, ...]) -> tuple[int, int]:
        """How many leading blocks of ``blocks`` are held, and how many bytes."""
        held, count, ends = self._blocks, 0, 0
        for block in blocks:
            found = held.get(block)
            if found is None:
                break
            count, ends = count + 1, found
        return count, through(count, ends)

    def hold(self, model: str, blocks: tuple[int, ...], size: int, capacity: int) -> None:
        """Hold ``blocks``, a prompt of ``size`` bytes; at most ``capacity`` blocks in all."""
        held = self._blocks
        for block in reversed(blocks):
            held[block] = held.get(block, 0)
            held.move_to_end(block)
        held[blocks[-1]] = max(held[blocks[-1]], size)
        while len(held) > capacity:
            held.popitem(last=False)

    def forget(self, model: str, blocks: tuple[int, ...]) -> None:
        for block in blocks:
            self._blocks.pop(block, None)


@dataclass(slots=True)
class _Slot:
    blocks: tuple[int, ...] = ()
    size: int = 0
    last_used: int = 0


@dataclass(slots=True)
class _Runner:
    slots: list[_Slot] = field(default_factory=list)
    uses: int = 0


class RunnerSlots:
    """One Ollama's runners, by model, each with one prompt per slot."""

    __slots__ = ("_runners", "comebacks")

    def __init__(self, comebacks: int) -> None:
        self._runners: OrderedDict[str, _Runner] = OrderedDict()
        self.comebacks = comebacks

    def matched(self, model: str, blocks: tuple[int, ...]) -> tuple[int, int]:
        """The most leading blocks of ``blocks`` any slot of ``model``'s runner holds, and
        bytes."""
        runner = self._runners.get(model)
        best = (0, 0)
        for slot in runner.slots if runner is not None else ():
            count = common_blocks(slot.blocks, blocks)
            ends = slot.size if count == len(slot.blocks) else 0
            best = max(best, (count, through(count, ends)))
        return best

    def hold(self, model: str, blocks: tuple[int, ...], size: int, capacity: int) -> None:
        """``model``'s runner ran ``blocks`` (a prompt of ``size`` bytes) on the slot it
        chooses; ``capacity``: its slots."""
        runner = self._runner(model, capacity)
        runner.uses += 1
        chosen = max(runner.slots, key=lambda slot: common_blocks(slot.blocks, blocks))
        if not chosen.blocks or common_blocks(chosen.blocks, blocks) < len(chosen.blocks):
            chosen = min(runner.slots, key=lambda slot: slot.last_used)  # not a whole start
        chosen.blocks, chosen.size, chosen.last_used = blocks, size, runner.uses

    def forget(self, model: str, blocks: tuple[int, ...]) -> None:
        """The engine read less than a slot was thought to hold: what held ``blocks`` keeps
        only what came before them."""
        runner = self._runners.get(model)
        gone = set(blocks)
        for slot in runner.slots if runner is not None else ():
            for index, block in enumerate(slot.blocks):
                if block in gone:
                    slot.blocks, slot.size = slot.blocks[:index], 0
                    break

    def _runner(self, model: str, slots: int) -> _Runner:
        runner = self._runners.get(model)
        if runner is None:
            runner = self._runners[model] = _Runner()
            if len(self._runners) > _MODELS_KEPT:
                self._runners.popitem(last=False)
        self._runners.move_to_end(model)
        wanted = max(1, slots)  # OLLAMA_NUM_PARALLEL, as the policy says
        runner.slots.extend(_Slot() for _ in range(wanted - len(runner.slots)))
        del runner.slots[wanted:]
        return runner
