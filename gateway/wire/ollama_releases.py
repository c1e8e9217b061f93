"""Which engine an Ollama release runs, from what ``GET /api/version`` says.

Ollama 0.30 (June 2026; its commit "use llama-server exclusively for GGML models") runs a
llama-server for each loaded model, whose slots and host-memory cache keep prompts as any
llama-server's do; the releases before, up to 0.24, ran Ollama's own runner, which keeps one
prompt a slot. A version that does not say (a build from source says 0.0.0; a body without
one) is taken for a current release.
"""

from __future__ import annotations

import re

__all__ = ["LLAMA_SERVER_SINCE", "runs_own_runner"]

LLAMA_SERVER_SINCE = (0, 30)

_RELEASE = re.compile(r"\s*v?(\d+)\.(\d+)")


def runs_own_runner(version: object) -> bool:
    """Whether an Ollama that says ``version`` runs its own runner (releases before 0.30)."""
    found = _RELEASE.match(version) if isinstance(version, str) else None
    if found is None:
        return False
    release = (int(found[1]), int(found[2]))
    return (0, 0) < release < LLAMA_SERVER_SINCE
