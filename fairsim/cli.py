"""Command-line flags of ``fairgate sim``."""

from __future__ import annotations

import argparse
import re

from gateway.core import parse_size

from .config import SimConfig
from .wire import parse_keep_alive

__all__ = ["add_sim_arguments", "sim_config_from_args"]

_DEFAULTS = SimConfig()
# `fairgate sim` with no flags stands in for the Ollama of deploy/fairgate.example.yaml
# (127.0.0.1:11434, 2 slots), so that the example policy works against it unchanged; `make
# sim` runs exactly this. SimConfig keeps 1 slot, the tests' default.
_PORT, _PARALLEL = 11434, 2


def _keep_alive(text: str) -> float:
    """Seconds, or a Go duration such as 5m; negative means forever."""
    try:
        return parse_keep_alive(float(text))
    except ValueError:
        pass
    try:
        return parse_keep_alive(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _models(text: str) -> list[str]:
    models = [name.strip() for name in text.split(",") if name.strip()]
    if not models:
        raise argparse.ArgumentTypeError("at least one model name")
    return models


def _version(text: str) -> str:
    # As Ollama says it: 0.24.0, 0.30.0-rc1, v0.32.15, 0.0.0 (a build from source).
    if re.fullmatch(r"v?\d+\.\d+(\.\d+)?(-[0-9A-Za-z.]+)?", text) is None:
        raise argparse.ArgumentTypeError(f"{text!r}: a release such as 0.24.0")
    return text


def add_sim_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the simulator's flags (and --host/--port) to ``parser``."""
    d = _DEFAULTS
    add = parser.add_argument
    add("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    add("--port", type=int, default=_PORT, help="port to listen on (default: %(default)s)")
    add(
        "--flavor",
        choices=["ollama", "llamacpp"],
        default=d.flavor,
        help="which server to imitate (default: %(default)s)",
    )
    add(
        "--parallel",
        type=int,
        default=_PARALLEL,
        help="slots, like OLLAMA_NUM_PARALLEL or llama-server -np (default: %(default)s)",
    )
    add(
        "--models",
        type=_models,
        default=",".join(d.models),
        help="comma-separated model names (default: %(default)s)",
    )
    add(
        "--prefill-tps",
        type=float,
        default=d.prefill_tokens_per_s,
        help="prompt tokens per second, 0 = instant (default: %(default)s)",
    )
    add(
        "--decode-tps",
        type=float,
        default=d.decode_tokens_per_s,
        help="output tokens per second of one stream, 0 = instant (default: %(default)s)",
    )
    add(
        "--decode-slowdown",
        type=float,
        default=d.decode_slowdown,
        help="each extra running stream slows every token by this fraction (default: %(default)s)",
    )
    add(
        "--prefill-blocks-decode",
        action=argparse.BooleanOptionalAction,
        default=d.prefill_blocks_decode,
        help="a prefilling prompt pauses every other stream (default: %(default)s)",
    )
    add(
        "--load-seconds",
        type=float,
        default=d.load_seconds,
        help="time to load a model that is not loaded (default: %(default)s)",
    )
    add(
        "--load-seconds-per-gib",
        type=float,
        default=d.load_seconds_per_gib,
        help="ollama: more load time per GiB of the model and its cache (default: %(default)s)",
    )
    add(
        "--memory",
        type=_size,
        default=d.memory,
        help="ollama: memory for loaded models (24GiB); unset: every model fits",
    )
    add(
        "--ollama-version",
        type=_version,
        default=d.ollama_version,
        help="ollama: the release to imitate; before 0.30 its own runner's prompt cache, one "
        "prompt a slot (default: %(default)s)",
    )
    add(
        "--max-loaded-models",
        type=int,
        default=d.max_loaded_models,
        help="ollama: OLLAMA_MAX_LOADED_MODELS; 0: its automatic 3 (default: %(default)s)",
    )
    add(
        "--context-length",
        type=int,
        default=d.context_length,
        help="ollama: num_ctx of a request that sets none, OLLAMA_CONTEXT_LENGTH "
        "(default: %(default)s)",
    )
    add(
        "--keep-alive",
        type=_keep_alive,
        default=d.default_keep_alive,
        help="seconds (or 5m, 1h) a model stays loaded after use; negative = forever "
        "(default: %(default)s)",
    )
    add(
        "--output-tokens",
        type=int,
        default=d.default_output_tokens,
        help="reply length when a request sets no limit (default: %(default)s)",
    )
    add(
        "--embedding-dims",
        type=int,
        default=d.embedding_dims,
        help="length of embedding vectors (default: %(default)s)",
    )
    add(
        "--max-queue",
        type=int,
        default=d.max_queue,
        help="waiting requests beyond which Ollama answers 503 (default: %(default)s)",
    )


def sim_config_from_args(args: argparse.Namespace) -> SimConfig:
    """The SimConfig that flags added by add_sim_arguments describe."""
    return SimConfig(
        flavor=args.flavor,
        parallel=args.parallel,
        models=list(args.models),
        prefill_tokens_per_s=args.prefill_tps,
        decode_tokens_per_s=args.decode_tps,
        decode_slowdown=args.decode_slowdown,
        prefill_blocks_decode=args.prefill_blocks_decode,
        load_seconds=args.load_seconds,
        load_seconds_per_gib=args.load_seconds_per_gib,
        memory=args.memory,
        ollama_version=args.ollama_version,
        max_loaded_models=args.max_loaded_models,
        context_length=args.context_length,
        default_keep_alive=args.keep_alive,
        default_output_tokens=args.output_tokens,
        embedding_dims=args.embedding_dims,
        max_queue=args.max_queue,
    )
