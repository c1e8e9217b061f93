"""The options Ollama fixes when it loads a model, read from a request body as Ollama reads
them, and the admin's say over them.

Ollama starts a model's runner with the request's ``num_ctx`` (and a few more
``api.Runner`` options); a request whose ``num_ctx`` differs from the loaded runner's
reloads the model, holding every request that needs a load meanwhile
(server/sched.go ``needsReload``). Chat front ends set ``num_ctx`` per chat, so two people
whose clients ask for different sizes reload the model on every turn.
"""

from __future__ import annotations

from typing import Any

__all__ = ["num_ctx_of"]

_INT64 = 2**63


def num_ctx_of(fields: dict[str, Any]) -> int | None:
    """The ``num_ctx`` Ollama would load the model with for this body, or None for its
    default. ``Options.FromMap`` truncates a JSON number toward zero (Go's ``int64``
    conversion: out of range gives the smallest int64) and ``getRunner`` raises anything
    below 4 to 4. Another type fails the request in Ollama: nothing loads, None here."""
    options = fields.get("options")
    value = options.get("num_ctx") if isinstance(options, dict) else None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = int(value)
    return max(4, number if -_INT64 <= number < _INT64 else 4)
