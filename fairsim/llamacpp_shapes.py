"""llama-server's JSON shapes, copied from real captures (shared/samples/llama-server):
sampling params, slots, timings and its error object."""

from __future__ import annotations

import json
import time
from typing import Any, Protocol

from aiohttp import web

from .catalog import model_spec
from .config import GenJob, GenResult, SlotInfo
from .engine import Engine
from .recording import TapStream

__all__ = [
    "CHUNK",
    "FINGERPRINT",
    "METRICS_TYPE",
    "N_CTX",
    "LlamaServer",
    "Writer",
    "dumps",
    "error",
    "metrics_text",
    "model_entry",
    "named_slot",
    "params",
    "props_payload",
    "reply",
    "slot_view",
    "timings",
]

CHUNK = "chat.completion.chunk"
METRICS_TYPE = "text/plain; version=0.0.4"
JSON_UTF8 = "application/json; charset=utf-8"
FINGERPRINT = "b0-unknown"
N_CTX = 4096
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    501: "not_supported_error",
    503: "unavailable_error",
}
# Sampling settings as llama-server echoes them (floats are float32 widened, as it prints them).
_SAMPLING: dict[str, Any] = json.loads(
    '{"seed":4294967295,"temperature":0.800000011920929,"dynatemp_range":0.0,'
    '"dynatemp_exponent":1.0,"top_k":40,"top_p":0.949999988079071,"min_p":0.05000000074505806,'
    '"top_n_sigma":-1.0,"xtc_probability":0.0,"xtc_threshold":0.10000000149011612,'
    '"typical_p":1.0,"repeat_last_n":64,"repeat_penalty":1.0,"presence_penalty":0.0,'
    '"frequency_penalty":0.0,"dry_multiplier":0.0,"dry_base":1.75,"dry_allowed_length":2,'
    '"dry_penalty_last_n":64}'
)
_SAMPLERS = [
    "penalties",
    "dry",
    "top_n_sigma",
    "top_k",
    "typ_p",
    "top_p",
    "min_p",
    "xtc",
    "temperature",
]
_TAIL: dict[str, Any] = {
    "chat_format": "Content-only",
    "reasoning_format": "deepseek",
    "reasoning_in_content": False,
    "generation_prompt": "",
    "samplers": _SAMPLERS,
    "speculative.types": "none",
    "timings_per_token": False,
    "post_sampling_probs": False,
    "backend_sampling": False,
    "lora": [],
}


def params(n_predict: int, stream: bool, *, completion: bool) -> dict[str, Any]:
    """A slot's ``params`` (or, with ``completion``, /completion's generation_settings)."""
    out = dict(_SAMPLING)
    if completion:
        out["dry_sequence_breakers"] = ["\n", ":", '"', "*"]
    out.update(mirostat=0, mirostat_tau=5.0, mirostat_eta=0.10000000149011612)
    out.update(adaptive_target=-1.0, adaptive_decay=0.8999999761581421)
    if completion:
        out["stop"] = []
    out.update(max_tokens=n_predict, n_predict=n_predict, n_keep=0, n_discard=0)
    out.update(ignore_eos=False, stream=stream)
    if completion:
        out["logit_bias"] = []
    out.update(n_probs=0, min_keep=0)
    if completion:
        out.update(grammar="", grammar_lazy=False, grammar_triggers=[], preserved_tokens=[])
    out.update(_TAIL)
    return out


def named_slot(body: dict[str, Any]) -> int | None:
    """The slot a request names (``id_slot``): read from chat, completion and Responses
    bodies alike (params_from_json_cmpl, which the Responses route's conversion feeds)."""
    named = body.get("id_slot")
    return named if isinstance(named, int) and not isinstance(named, bool) else None


def dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def reply(value: Any, status: int = 200) -> web.Response:
    return web.Response(status=status, body=dumps(value), headers={"Content-Type": JSON_UTF8})


def error(status: int, message: str) -> web.Response:
    kind = _ERROR_TYPES.get(status, "server_error")
    return reply({"error": {"code": status, "message": message, "type": kind}}, status)


def timings(prompt_tokens: int, result: GenResult) -> dict[str, Any]:
    def rate(count: int, ms: float) -> float | None:
        return count * 1000 / ms if ms else None

    def per(ms: float, count: int) -> float | None:
        return ms / count if count else None

    prompt_ms, predicted_ms = result.prompt_ns / 1e6, result.eval_ns / 1e6
    prompt_tokens = result.evaluated(prompt_tokens)  # prompt_n: what it evaluated
    return {
        "cache_n": result.cached_tokens,
        "prompt_n": prompt_tokens,
        "prompt_ms": prompt_ms,
        "prompt_per_token_ms": per(prompt_ms, prompt_tokens),
        "prompt_per_second": rate(prompt_tokens, prompt_ms),
        "predicted_n": result.eval_count,
        "predicted_ms": predicted_ms,
        "predicted_per_token_ms": per(predicted_ms, result.eval_count),
        "predicted_per_second": rate(result.eval_count, predicted_ms),
    }


def slot_view(slot: SlotInfo) -> dict[str, Any]:
    view: dict[str, Any] = {"id": slot.id, "n_ctx": N_CTX, "speculative": False}
    view["is_processing"] = slot.busy
    if slot.id_task < 0:
        return view
    remain = slot.n_predict - slot.n_decoded if slot.busy and slot.n_predict >= 0 else -1
    view.update(
        id_task=slot.id_task,
        n_prompt_tokens=slot.n_prompt_tokens,
        n_prompt_tokens_processed=slot.n_prompt_tokens_processed,
        n_prompt_tokens_cache=0,
        params=params(slot.n_predict, True, completion=False),
        next_token=[
            {
                "has_next_token": slot.busy,
                "has_new_line": False,
                "n_remain": remain,
                "n_decoded": slot.n_decoded if slot.busy else 0,
            }
        ],
    )
    return view


def props_payload(total_slots: int, alias: str) -> dict[str, Any]:
    next_token: dict[str, Any] = {"has_next_token": True, "has_new_line": False}
    next_token.update(n_remain=-1, n_decoded=0, stopping_word="")
    settings: dict[str, Any] = {"id": 0, "id_task": -1, "n_ctx": N_CTX, "speculative": False}
    settings.update(is_processing=False, params=params(-1, True, completion=False))
    settings.update(prompt="", next_token=next_token)
    return {
        "default_generation_settings": settings,
        "total_slots": total_slots,
        "model_path": f"models/{alias}.gguf",
        "chat_template": "{% for message in messages %}{{ message.content }}{% endfor %}",
        "chat_template_caps": {},
        "modalities": {"vision": False, "audio": False},
        "build_info": FINGERPRINT,
        "is_sleeping": False,
    }


def model_entry(alias: str) -> dict[str, Any]:
    spec = model_spec(alias)
    meta = {"vocab_type": 2, "n_vocab": 128256, "n_ctx_train": spec.context_length}
    meta.update(n_embd=spec.embedding_length, n_params=spec.parameter_count, size=spec.size)
    modalities = {"input_modalities": ["text"], "output_modalities": ["text"]}
    return {
        "id": alias,
        "object": "model",
        "architecture": modalities,
        "created": int(time.time()),
        "owned_by": "llamacpp",
        "meta": meta,
    }


_METRICS = (
    ("prompt_tokens_total", "counter", "Number of prompt tokens processed."),
    ("prompt_seconds_total", "counter", "Prompt process time"),
    ("tokens_predicted_total", "counter", "Number of generation tokens processed."),
    ("tokens_predicted_seconds_total", "counter", "Predict process time"),
    ("prompt_tokens_seconds", "gauge", "Average prompt throughput in tokens/s."),
    ("predicted_tokens_seconds", "gauge", "Average generation throughput in tokens/s."),
    ("requests_processing", "gauge", "Number of requests processing."),
    ("requests_deferred", "gauge", "Number of requests deferred."),
)


def metrics_text(engine: Engine) -> str:
    """llama-server's Prometheus exposition of the engine's counters."""
    e = engine
    values = (
        e.prompt_tokens_total,
        e.prompt_seconds_total,
        e.tokens_predicted_total,
        e.predicted_seconds_total,
        e.prompt_tokens_total / e.prompt_seconds_total if e.prompt_seconds_total else 0.0,
        e.tokens_predicted_total / e.predicted_seconds_total if e.predicted_seconds_total else 0.0,
        e.stats.running,
        e.stats.queued,
    )
    return "".join(
        f"# HELP llamacpp:{name} {doc}\n# TYPE llamacpp:{name} {kind}\nllamacpp:{name} {value}\n"
        for (name, kind, doc), value in zip(_METRICS, values, strict=True)
    )


class Writer(Protocol):
    """What writes one reply: its stream, each token, and its end."""

    response: TapStream

    async def token(self, text: str) -> None: ...

    async def finish(self, result: GenResult) -> web.StreamResponse: ...


class LlamaServer(Protocol):
    """What the Messages and Responses routes need of the simulated llama-server
    (``LlamaCppAPI``): named here so that they and it import no cycle."""

    engine: Engine
    alias: str

    async def body(self, request: web.Request) -> dict[str, Any] | web.Response: ...

    async def generated(
        self, request: web.Request, job: GenJob, writer: Writer, stream: bool
    ) -> web.StreamResponse: ...
