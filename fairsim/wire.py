"""Byte-level details shared by the simulated servers: Go's JSON and time formats, Go
durations and decoder errors, and the deterministic "model" text and embeddings."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import math
import struct
import time
from typing import Any

from gateway.core import fits_go_duration, parse_go_duration
from gateway.wire import go_type_name

__all__ = [
    "FOREVER",
    "embedding_for",
    "float32_widened",
    "go_expiry",
    "go_json",
    "go_time",
    "go_type_name",
    "json_error_message",
    "parse_keep_alive",
    "rendered",
    "token_id",
    "token_text",
    "tokens_in",
]

FOREVER = math.inf
"""Keep-alive for a model that never unloads (Ollama: any negative keep_alive)."""

_MAX_GO_DURATION_NS = 2**63 - 1

# Go's encoding/json escapes these even inside strings; the gateway's byte comparisons
# depend on the sim producing the same bytes Ollama would.
_GO_ESCAPES = str.maketrans(
    {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}
)


def go_json(value: Any) -> bytes:
    """Compact JSON as Go's json.Marshal writes it (HTML characters escaped, UTF-8 kept)."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return text.translate(_GO_ESCAPES).encode()


def go_time(unix_ns: int, *, utc: bool) -> str:
    """RFC 3339 with nanoseconds and trailing zeros trimmed, as Go formats time.Time."""
    seconds, nanos = divmod(unix_ns, 1_000_000_000)
    moment = dt.datetime.fromtimestamp(seconds, dt.UTC)
    if not utc:
        moment = moment.astimezone()
    text = moment.strftime("%Y-%m-%dT%H:%M:%S")
    if nanos:
        text += "." + f"{nanos:09d}".rstrip("0")
    offset = moment.utcoffset() or dt.timedelta(0)
    if not offset:
        return text + "Z"
    minutes = int(offset.total_seconds()) // 60
    sign = "+" if minutes >= 0 else "-"
    hours, mins = divmod(abs(minutes), 60)
    return f"{text}{sign}{hours:02d}:{mins:02d}"


def go_expiry(expires_monotonic: float, now_monotonic: float) -> str:
    """The wall-clock time a model unloads, formatted like Ollama's /api/ps ``expires_at``."""
    if expires_monotonic == FOREVER:
        # Ollama adds the largest time.Duration (about 292 years) for "forever".
        return go_time(time.time_ns() + _MAX_GO_DURATION_NS, utc=False)
    remaining_ns = int(max(0.0, expires_monotonic - now_monotonic) * 1e9)
    return go_time(time.time_ns() + remaining_ns, utc=False)


def parse_keep_alive(value: Any) -> float:
    """Seconds a model stays loaded from Ollama's ``keep_alive``: FOREVER when negative.

    A number too long for a Go ``time.Duration`` overflows in ``Duration.UnmarshalJSON``
    (api/types.go) to the most negative int64 on amd64, which the scheduler reads as "unload
    when idle": 0 here. A string that long is refused by ``time.ParseDuration``."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"Unsupported type: '{go_type_name(value)}'")
    try:
        seconds = parse_go_duration(value) if isinstance(value, str) else float(value)
    except OverflowError:  # Go's float64 cannot hold it either: strconv's range error
        raise ValueError(
            f"json: cannot unmarshal number {value} into Go value of type float64"
        ) from None
    if seconds < 0:
        return FOREVER
    return seconds if isinstance(value, str) or fits_go_duration(seconds) else 0.0


def json_error_message(body: str, error: json.JSONDecodeError) -> str:
    """Roughly the message Go's decoder gives for the same malformed body."""
    if error.pos >= len(body.rstrip()):
        return "unexpected EOF"
    char = body[error.pos]
    if error.msg.startswith("Expecting value"):
        return f"invalid character {_go_char(char)} looking for beginning of value"
    if error.msg.startswith("Expecting property name"):
        return f"invalid character {_go_char(char)} looking for beginning of object key string"
    if error.msg.startswith("Extra data"):
        return f"invalid character {_go_char(char)} after top-level value"
    if error.msg.startswith("Expecting ':'"):
        return f"invalid character {_go_char(char)} after object key"
    if "delimiter" in error.msg:
        context = "object key:value pair" if "','" in error.msg else "array element"
        return f"invalid character {_go_char(char)} after {context}"
    return f"invalid character {_go_char(char)} in string literal"


def _go_char(char: str) -> str:
    if char == "'":
        return "'\\''"
    if char == '"':
        return "'\"'"
    return f"'{char}'"


# One token = one word with a leading space, so token counts are visible in the text.
_WORDS = (
    " The", " quick", " brown", " fox", " jumps", " over", " the", " lazy", " dog.",
    " Fair", " queues", " keep", " every", " user", " moving.",
)  # fmt: skip


def token_text(index: int) -> str:
    """The deterministic text of output token ``index``."""
    return _WORDS[index % len(_WORDS)]


def token_id(index: int) -> int:
    """A stable vocabulary id for output token ``index``."""
    return 1000 + index % len(_WORDS)


def tokens_in(text: str) -> int:
    """About four characters per token, at least one."""
    return max(1, (len(text) + 3) // 4)


def embedding_for(text: str, dims: int) -> list[float]:
    """A unit vector derived from the text; values round-trip through float32 unchanged."""
    raw: list[float] = []
    counter = 0
    while len(raw) < dims:
        digest = hashlib.sha256(f"{counter}:{text}".encode()).digest()
        raw.extend((byte - 127.5) / 127.5 for byte in digest)
        counter += 1
    vector = raw[:dims]
    norm = math.sqrt(sum(x * x for x in vector)) or 1.0
    return [round(x / norm, 6) for x in vector]


def float32_widened(value: float) -> float:
    """``float64(float32(value))``: how Ollama's legacy /api/embeddings prints its numbers."""
    narrowed: float = struct.unpack("f", struct.pack("f", value))[0]
    return narrowed


def rendered(tools: object, prompt: str) -> str:
    """A chat's prompt as a template renders it: its tools first (as compact JSON: Qwen's
    and Llama 3's templates write them so), then its messages."""
    if not isinstance(tools, list) or not tools:
        return prompt
    return json.dumps(tools, separators=(",", ":")) + "\n" + prompt
