"""Token counts read from the end of a reply, where every API puts its final tally.

The relay keeps only the last few KiB of a reply and this looks for the tallies in them
once the reply has ended, without parsing the whole JSON: a batch of embeddings can be
megabytes of floats before its ``prompt_eval_count``, and ``json.loads`` of all of them
would hold the event loop (every other stream) for tens of milliseconds at its end.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import NamedTuple

__all__ = [
    "TALLY_WINDOW",
    "CountNames",
    "FinalCounts",
    "TokenEvents",
    "final_counts",
    "token_events",
]

TALLY_WINDOW = 16 * 1024
"""Bytes at the end of a reply that hold its tallies: Ollama's final line or fields,
OpenAI's ``usage``, llama.cpp's last event (its ``generation_settings`` run to a few KiB)."""

# A count of more digits is no count: no model reads or writes 10^15 tokens, nor loads for
# 10^15 ns, and a number past 64 bits would fail every write of usage after it.
_VALUE = re.compile(rb"\s*:\s*(\d{1,15})(?![\d.eE])")


@dataclass(frozen=True, slots=True)
class FinalCounts:
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    load_seconds: float | None = None  # Ollama's load_duration: time spent loading the model
    # Of ``prompt_tokens``, those the engine read from its prompt cache rather than
    # evaluated (None: the reply does not say; an older Ollama never does).
    cached_tokens: int | None = None

    @property
    def evaluated_tokens(self) -> int | None:
        """The prompt tokens the engine really evaluated: its prefill's work."""
        if self.prompt_tokens is None:
            return None
        return max(0, self.prompt_tokens - (self.cached_tokens or 0))


class CountNames(NamedTuple):
    """The names a route's replies give their final tallies."""

    prompt: bytes
    output: bytes
    load: bytes | None = None  # Ollama's load_duration
    cached: bytes | None = None  # prompt tokens read from a cache, left out of ``prompt``
    # Prompt tokens read from a cache, counted in ``prompt`` as well: the first name found.
    cached_within: tuple[bytes, ...] = ()
    # In a stream, the output's count is the one of the last such event: an earlier event
    # may say a count the stream's end would have replaced.
    final_event: bytes | None = None


# Ollama's prompt_eval_count is the whole prompt, cached or not (ollama/ollama#5371), and
# since ollama/ollama#17943 prompt_eval_cached_count says how much of it the cache read.
_OLLAMA = CountNames(
    b"prompt_eval_count",
    b"eval_count",
    load=b"load_duration",
    cached_within=(b"prompt_eval_cached_count",),
)
# usage.prompt_tokens is the whole prompt; prompt_tokens_details.cached_tokens (Ollama's,
# llama-server's) what the cache read, or else llama-server's timings.cache_n.
_OPENAI = CountNames(
    b"prompt_tokens", b"completion_tokens", cached_within=(b"cached_tokens", b"cache_n")
)
# llama-server's own, beside usage: its final event's timings always say what the cache
# read (cache_n) and what it evaluated (prompt_n), usage or not; tokens_evaluated is both.
_LLAMACPP = CountNames(b"tokens_evaluated", b"tokens_predicted", cached_within=(b"cache_n",))
# Anthropic's (Ollama's and llama-server's Messages replies): input_tokens leave out what
# the cache read (llama-server: 1 and 30 read). A stream's message_start says an output of
# 0; only its message_delta says the real one, and a stream cut before it (Ollama drops an
# error mid-stream and ends) has none: its relayed tokens count instead.
_ANTHROPIC_COUNTS = CountNames(
    b"input_tokens",
    b"output_tokens",
    cached=b"cache_read_input_tokens",
    final_event=b"\nevent: message_delta\n",
)
_RESPONSES_COUNTS = CountNames(
    b"input_tokens", b"output_tokens", cached_within=(b"cached_tokens", b"cache_n")
)
# A streamed chat without include_usage: only llama-server's timings tell the counts.
_TIMINGS = CountNames(b"prompt_n", b"predicted_n", cached=b"cache_n")
# Each route's names, and only those: a reply also carries what the client or the model
# wrote (a tool call's arguments as a JSON object, Ollama's echo of a request's tools),
# where another API's names would be taken for the tallies.
_COUNTS: dict[str, tuple[CountNames, ...]] = {
    "/v1/chat/completions": (_OPENAI, _LLAMACPP, _TIMINGS),
    "/v1/completions": (_OPENAI, _LLAMACPP, _TIMINGS),
    "/v1/embeddings": (_OPENAI,),
    "/v1/messages": (_ANTHROPIC_COUNTS,),
    "/v1/responses": (_RESPONSES_COUNTS,),
}


def final_counts(tail: bytes, path: str) -> FinalCounts:
    """The backend's own tallies from the end of a reply to ``path`` (the last of each
    wins: they come after what the reply says)."""
    tail = tail[-TALLY_WINDOW:]
    for names in _COUNTS.get(path, (_OLLAMA,)):
        counts = _counts(tail, names)
        if counts != _NONE:
            return counts
    return _NONE


def _counts(tail: bytes, names: CountNames) -> FinalCounts:
    prompt = _last(tail, names.prompt)
    output_from = tail
    if names.final_event is not None and b"\nevent: " in tail:  # a stream, not a whole reply
        at = tail.rfind(names.final_event)
        output_from = tail[at:] if at >= 0 else b""
    output = _last(output_from, names.output)
    load = None if names.load is None else _last(tail, names.load)
    cached = None
    if prompt is not None and names.cached is not None:
        cached = _last(tail, names.cached)
        prompt += cached or 0
    elif prompt is not None:
        for name in names.cached_within:
            if (cached := _last(tail, name)) is not None:
                cached = min(cached, prompt)
                break
    return FinalCounts(prompt, output, _seconds(load), cached)


_NONE = FinalCounts()


class TokenEvents(NamedTuple):
    """A stream of named SSE events (Anthropic's, the Responses API's): the line that
    starts an event carrying one token, and whether the prompt's count comes only in the
    stream's first event."""

    token: bytes
    prompt_at_start: bool


# Ollama writes one content_block_delta a token (anthropic.StreamConverter); llama-server
# too. Its message_start says the prompt's count, and llama-server's message_delta says
# only the output's: in a long stream the start is long gone from the tail. The newline
# before: inside an event's JSON a newline is escaped, so a text cannot count as a token.
_ANTHROPIC = TokenEvents(b"\nevent: content_block_delta\n", prompt_at_start=True)
# The Responses API (Ollama's ResponsesStreamConverter, llama-server's): one
# response.output_text.delta a token; its counts in response.completed, at the end.
_RESPONSES = TokenEvents(b"\nevent: response.output_text.delta\n", prompt_at_start=False)
_BY_PATH = {"/v1/messages": _ANTHROPIC, "/v1/responses": _RESPONSES}


def token_events(path: str) -> TokenEvents | None:
    """How a stream of ``path`` says its tokens, when not one line (or SSE event) each."""
    return _BY_PATH.get(path)


def _last(tail: bytes, name: bytes) -> int | None:
    """The last ``"name": number`` in ``tail``.

    Searched from the end with ``rfind``, where the tallies are, rather than with a regular
    expression over the window, which would try a match at every quote in it, every reply.
    Inside a JSON string every quote is escaped, so a text that merely mentions
    "eval_count" cannot match a quoted name followed by a colon.
    """
    quoted = b'"' + name + b'"'
    end = len(tail)
    while (at := tail.rfind(quoted, 0, end)) >= 0:
        value = _VALUE.match(tail, at + len(quoted))
        if value is not None:
            return int(value[1])
        end = at
    return None


def _seconds(nanoseconds: int | None) -> float | None:
    return None if nanoseconds is None else nanoseconds / 1e9
