"""Token counts read from the end of a reply, where every API puts its final tally.

Only the last few chunks are kept and parsed once, after the stream ends: the relay does no
per-chunk parsing for this.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

__all__ = ["FinalCounts", "final_counts"]


@dataclass(frozen=True, slots=True)
class FinalCounts:
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    load_seconds: float | None = None  # Ollama's load_duration: time spent loading the model


def final_counts(content_type: str, tail: bytes) -> FinalCounts:
    """The backend's own tallies, from the final chunk of a reply, when it has them."""
    is_sse = content_type.startswith("text/event-stream")
    for line in reversed(tail.splitlines()):
        payload = line.removeprefix(b"data:").strip() if is_sse else line.strip()
        if not payload.startswith(b"{"):
            continue
        try:
            chunk = json.loads(payload)
        except ValueError:
            continue
        counts = _counts(chunk) if isinstance(chunk, dict) else None
        if counts is not None:
            return counts
    return FinalCounts()


def _counts(chunk: dict[str, Any]) -> FinalCounts | None:
    if "prompt_eval_count" in chunk or "eval_count" in chunk or "load_duration" in chunk:
        load = _int(chunk.get("load_duration"))  # Ollama native; nanoseconds
        return FinalCounts(
            _int(chunk.get("prompt_eval_count")),
            _int(chunk.get("eval_count")),
            None if load is None else load / 1e9,
        )
    usage = chunk.get("usage")
    if isinstance(usage, dict):  # OpenAI-compatible
        return FinalCounts(_int(usage.get("prompt_tokens")), _int(usage.get("completion_tokens")))
    if "tokens_evaluated" in chunk and chunk.get("stop"):  # llama.cpp native /completion
        return FinalCounts(_int(chunk.get("tokens_evaluated")), _int(chunk.get("tokens_predicted")))
    return None


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
