"""What a simulator is told (SimConfig), what it counts (SimStats), and the records that
pass between the HTTP handlers and the engine."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = [
    "Faults",
    "GenJob",
    "GenResult",
    "QueueFull",
    "SimAbort",
    "SimConfig",
    "SimStats",
    "SlotInfo",
    "faults_from",
]


@dataclass
class SimConfig:
    """How the simulated server behaves; rates of 0 mean "instant"."""

    flavor: Literal["ollama", "llamacpp"] = "ollama"
    parallel: int = 1
    models: list[str] = field(default_factory=lambda: ["llama3.2:3b", "qwen2.5:7b"])
    prefill_tokens_per_s: float = 4000.0
    decode_tokens_per_s: float = 60.0
    decode_slowdown: float = 0.1
    prefill_blocks_decode: bool = True
    load_seconds: float = 0.0
    default_keep_alive: float = 300.0
    default_output_tokens: int = 12
    embedding_dims: int = 8
    max_queue: int = 512
    record_replies: bool = False
    """Keep every request's headers and every reply's bytes (Simulator.replies), for tests."""


@dataclass
class SimStats:
    """Live counters; tests wait on them with Simulator.wait_for."""

    running: int = 0
    queued: int = 0
    max_running: int = 0
    completed: int = 0
    disconnects: int = 0
    loads: int = 0
    aborted: int = 0
    prompts: list[str] = field(default_factory=list)


@dataclass
class SlotInfo:
    """One slot as llama-server's /slots shows it; ``id_task`` -1 means never used."""

    id: int
    busy: bool = False
    id_task: int = -1
    n_prompt_tokens: int = 0
    n_prompt_tokens_processed: int = 0
    n_predict: int = -1
    n_decoded: int = 0


@dataclass
class Faults:
    """Failure knobs read from a request (see the package docstring)."""

    first_byte_delay: float = 0.0
    stall_after: int | None = None
    die_after: int | None = None
    status: int | None = None


@dataclass
class GenJob:
    """One generation request, already parsed by a flavour's handler."""

    model: str
    prompt_tokens: int
    output_tokens: int
    length_limited: bool
    keep_alive: float | None = None
    faults: Faults = field(default_factory=Faults)


@dataclass
class GenResult:
    eval_count: int
    done_reason: Literal["stop", "length"]
    slot_id: int
    total_ns: int
    load_ns: int
    prompt_ns: int
    eval_ns: int


def faults_from(body: Mapping[str, Any], *, native: bool) -> Faults:
    """The sim_* knobs of a request: native Ollama requests carry them in ``options``, the
    others at the top level; the other place is read too, so a misplaced knob still works."""
    options = body.get("options")
    nested = options if isinstance(options, Mapping) else {}
    first, second = (nested, body) if native else (body, nested)

    def number(name: str) -> float | None:
        for source in (first, second):
            value = source.get(name)
            if isinstance(value, int | float) and not isinstance(value, bool):
                return value
        return None

    def count(name: str) -> int | None:
        value = number(name)
        return None if value is None else int(value)

    return Faults(
        first_byte_delay=float(number("sim_first_byte_delay") or 0.0),
        stall_after=count("sim_stall_after"),
        die_after=count("sim_die_after"),
        status=count("sim_status"),
    )


class QueueFull(Exception):
    """More requests are waiting than max_queue allows."""


class SimAbort(Exception):
    """sim_die_after fired: the handler must cut the connection without a final chunk."""
