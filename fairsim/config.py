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
    "LoadOptions",
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
    """Time to load any model (llama-server: its one model, at start)."""
    load_seconds_per_gib: float = 0.0
    """Ollama: more load time for each GiB a runner takes (weights and KV cache)."""
    unload_seconds: float = 0.0
    """Ollama: after an unload, how long its scheduler waits for the memory to come back
    (sched.go waitForVRAMRecovery; 0.5-1.5 s on a discrete GPU)."""
    memory: int | None = None
    """Ollama: bytes its runners may take together; None: every model fits."""
    ollama_version: str = "0.32.15"
    """Ollama: the release it says it is (``/api/version``; its wire formats are this
    one's), which decides its engine: before 0.30 its own runner (``SlotPool`` with
    ``forks``), since then a llama-server per model (slots by similarity, a host cache)."""
    max_loaded_models: int = 0
    """Ollama: OLLAMA_MAX_LOADED_MODELS; 0 is its automatic 3 (per GPU, one GPU here)."""
    context_length: int = 4096
    """Ollama: the num_ctx of a request that sets none (OLLAMA_CONTEXT_LENGTH, or the
    VRAM tier's default: 4096 under 23 GiB)."""
    default_keep_alive: float = 300.0
    default_output_tokens: int = 12
    embedding_dims: int = 8
    max_queue: int = 512
    slot_save: bool = False
    """llama-server: started with ``--slot-save-path``, so ``POST /slots/N?action=save`` and
    ``restore`` copy a slot's prompt (else 501, as the real one answers)."""
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
    pending: int = 0
    """Ollama: requests in its scheduler's queue (a model to load, reload or make room for)."""
    reloads: int = 0
    """Ollama: loads that replaced the same model loaded with other options (num_ctx)."""
    evictions: int = 0
    """Ollama: models unloaded to make room for another."""
    unloads: int = 0
    unloaded: list[str] = field(default_factory=list)
    """Ollama: the models unloaded, in order."""
    held_seconds: float = 0.0
    """Ollama: seconds requests spent in its scheduler's queue, held until a model was
    loaded for them (their own load, a reload, an eviction's drain, or others' before)."""
    drain_held_seconds: float = 0.0
    """Ollama: the part of held_seconds its scheduler spent waiting for a victim's requests
    to finish and the victim to unload (an eviction, or a reload), holding the queue."""
    prompts: list[str] = field(default_factory=list)
    counting: int = 0
    """llama-server: /v1/messages/count_tokens requests under way (it tokenizes them in its
    HTTP threads, beside the slots), and the most at once."""
    max_counting: int = 0


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
    # The prompt (and reply) its KV cache holds, as rendered text; when it was last used.
    cached: str = ""
    last_used: int = 0


@dataclass
class Faults:
    """Failure knobs read from a request (see the package docstring)."""

    first_byte_delay: float = 0.0
    stall_after: int | None = None
    die_after: int | None = None
    status: int | None = None


@dataclass(frozen=True)
class LoadOptions:
    """The options Ollama fixes when it starts a runner (api.Runner); a request whose
    values differ from the loaded runner's reloads the model. None: not given."""

    num_ctx: int | None = None
    num_batch: int | None = None
    num_gpu: int | None = None
    num_thread: int | None = None
    main_gpu: int | None = None
    use_mmap: bool | None = None


@dataclass
class GenJob:
    """One generation request, already parsed by a flavour's handler."""

    model: str
    prompt_tokens: int
    output_tokens: int
    length_limited: bool
    keep_alive: float | None = None
    faults: Faults = field(default_factory=Faults)
    load: LoadOptions = field(default_factory=LoadOptions)
    # The rendered prompt, as a slot's prompt cache holds it ("": not cached at all).
    text: str = ""
    slot: int | None = None  # the slot the request named (llama-server's id_slot)
    # llama-server's cache_prompt: false evaluates the whole prompt (the slot holds it after)
    reuse: bool = True


@dataclass
class GenResult:
    eval_count: int
    done_reason: Literal["stop", "length"]
    slot_id: int
    total_ns: int
    load_ns: int
    prompt_ns: int
    eval_ns: int
    cached_tokens: int = 0  # of the prompt's, read from the slot's cache, not evaluated

    def evaluated(self, prompt_tokens: int) -> int:
        return prompt_tokens - self.cached_tokens


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
    """More requests are waiting for Ollama's scheduler than max_queue allows."""


class SimAbort(Exception):
    """sim_die_after fired: the handler must cut the connection without a final chunk."""
