"""Token counts read from the end of a reply, where every API puts its final tally.

The relay keeps only the last few KiB of a reply and this looks for the tallies in them
once the reply has ended, without parsing the whole JSON: a batch of embeddings can be
megabytes of floats before its ``prompt_eval_count``, and ``json.loads`` of 700 KB holds
the event loop (every other stream) for about 20 ms.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["TALLY_WINDOW", "FinalCounts", "final_counts"]

TALLY_WINDOW = 16 * 1024
"""Bytes at the end of a reply that hold its tallies: Ollama's final line or fields,
OpenAI's ``usage``, llama.cpp's last event (its ``generation_settings`` run to a few KiB)."""

# Inside a JSON string every quote is escaped, so a text that merely mentions
# "eval_count" cannot match a quoted key followed by a colon.
_TALLY = re.compile(
    rb'"(prompt_eval_count|eval_count|load_duration|prompt_tokens|completion_tokens'
    rb'|tokens_evaluated|tokens_predicted)"\s*:\s*(\d+)'
)


@dataclass(frozen=True, slots=True)
class FinalCounts:
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    load_seconds: float | None = None  # Ollama's load_duration: time spent loading the model


def final_counts(tail: bytes) -> FinalCounts:
    """The backend's own tallies from the end of a reply (the last of each wins)."""
    found = {match[1]: int(match[2]) for match in _TALLY.finditer(tail[-TALLY_WINDOW:])}
    if found.keys() & {b"eval_count", b"prompt_eval_count", b"load_duration"}:  # Ollama
        return FinalCounts(
            found.get(b"prompt_eval_count"),
            found.get(b"eval_count"),
            _seconds(found.get(b"load_duration")),
        )
    if b"prompt_tokens" in found or b"completion_tokens" in found:  # OpenAI-compatible
        return FinalCounts(found.get(b"prompt_tokens"), found.get(b"completion_tokens"))
    if b"tokens_evaluated" in found:  # llama.cpp native /completion
        return FinalCounts(found[b"tokens_evaluated"], found.get(b"tokens_predicted"))
    return FinalCounts()


def _seconds(nanoseconds: int | None) -> float | None:
    return None if nanoseconds is None else nanoseconds / 1e9
