"""What is said of a backend in trouble, and the fix: for the log, /status, the house page
and a 503."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from gateway.backends.pool import Backend

__all__ = ["failed_to_load", "runs_fewer", "unavailable"]


def runs_fewer(backend: Backend) -> str | None:
    """What was found of ``backend`` running fewer requests at once than its slots, and
    the fix, in words for the log, /status and the house page; None when nothing was."""
    found, configured, reported = backend.state.runs_at_most, backend.configured_slots, None
    if backend.kind == "llamacpp" and configured and backend.state.slots != configured:
        reported = backend.state.slots
    if reported:
        sent = min(configured or reported, reported)
        return (
            f"its /props says {reported} slots (-np), its slots in the policy {configured}: "
            f"it is sent {sent} at a time; write slots: {reported}, or leave it out"
        )
    if found is None or found.slots != configured:
        return None
    knob = (
        f"OLLAMA_NUM_PARALLEL={found.slots} on it (and restart it)"
        if backend.kind == "ollama"
        else f"-np {found.slots} on it"
    )
    return (
        f"runs {found.runs} request{'s' if found.runs != 1 else ''} at once, not the "
        f"{found.slots} its slots say (requests waited inside it for one another): set "
        f"{knob}, or write slots: {found.runs}; until then it is sent {found.runs} at a time"
    )


def failed_to_load(failed: Mapping[str, int | None]) -> str | None:
    """A router's models whose process exited as they loaded (model -> its exit code), in
    words for /status, ``fairgate status``, the house page and a 503; None for none."""
    if not failed:
        return None
    said = ", ".join(
        model if code is None else f"{model} (its process exited with code {code})"
        for model, code in failed.items()
    )
    return f"failed to load {said}: the backend's log says why"


def unavailable(backends: Iterable[Backend]) -> str:
    """Each backend out of rotation with its last error, for a 503 that says what to check.
    By name only: any key holder reads this, and backend addresses stay in the log."""
    return "; ".join(
        f"backend {b.name}: {b.state.last_error or 'out of rotation until its probes pass'}"
        for b in backends
    )
