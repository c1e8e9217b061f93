"""llama-server's Anthropic Messages API (/v1/messages, /v1/messages/count_tokens), as the
pinned llama-server the tests build writes it (checked against its replies): the stream's
message_start carries the prompt's count (``input_tokens`` beside ``cache_read_input_tokens``)
and its message_delta the output's alone; a whole reply says both in its ``usage``."""

from __future__ import annotations

import asyncio
import random
import string
from typing import Any

from aiohttp import web

from .config import GenJob, GenResult, faults_from
from .llamacpp_shapes import LlamaServer, dumps, error, reply
from .ollama_common import chat_text, output_budget
from .recording import TapStream
from .wire import tokens_in

__all__ = ["count_tokens", "messages"]

_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens"}


async def count_tokens(api: LlamaServer, request: web.Request) -> web.Response:
    body = await api.body(request)
    if isinstance(body, web.Response):
        return body
    stats = api.engine.stats
    stats.counting += 1
    stats.max_counting = max(stats.max_counting, stats.counting)
    api.engine.changed()
    try:
        # As long as the tokenizer takes, when a test says (sim_first_byte_delay).
        delay = faults_from(body, native=False).first_byte_delay
        if delay > 0:
            await asyncio.sleep(delay)
    finally:
        stats.counting -= 1
        api.engine.changed()
    return reply({"input_tokens": tokens_in(chat_text(body.get("system"), body.get("messages")))})


async def messages(api: LlamaServer, request: web.Request) -> web.StreamResponse:
    body = await api.body(request)
    if isinstance(body, web.Response):
        return body
    prompt = chat_text(body.get("system"), body.get("messages"))
    api.engine.record_prompt(prompt)
    faults = faults_from(body, native=False)
    if faults.status is not None:
        return error(faults.status, "simulated failure")
    tokens, limited = output_budget(body.get("max_tokens"), api.engine.config.default_output_tokens)
    job = GenJob(api.alias, tokens_in(prompt), tokens, limited, None, faults)
    streaming = body.get("stream") is True
    return await api.generated(request, job, _Writer(api, request, job, streaming), streaming)


class _Writer:
    def __init__(self, api: LlamaServer, request: web.Request, job: GenJob, stream: bool) -> None:
        self.api, self.request, self.job, self.stream = api, request, job, stream
        self.response = TapStream(
            "text/event-stream", keep=api.engine.config.record_replies, head_first=True
        )
        alphabet = string.ascii_letters + string.digits
        self.ident = "chatcmpl-" + "".join(random.choices(alphabet, k=32))
        self.parts: list[str] = []

    def message(self, content: list[Any], stop: str | None, output: int) -> dict[str, Any]:
        # Its jobs carry no text for a slot's cache (GenJob.text): nothing is read from it.
        usage = {"cache_read_input_tokens": 0, "input_tokens": self.job.prompt_tokens}
        return {
            "id": self.ident,
            "type": "message",
            "role": "assistant",
            "content": content,
            "model": self.api.alias,
            "stop_reason": stop,
            "stop_sequence": None,
            "usage": {**usage, "output_tokens": output},
        }

    async def send(self, event: str, data: dict[str, Any]) -> None:
        await self.response.write(b"event: %s\ndata: %s\n\n" % (event.encode(), dumps(data)))

    async def _start(self) -> None:
        start = {"type": "message_start", "message": self.message([], None, 0)}
        await self.send("message_start", start)
        block = {
            "type": "content_block_start",
            "index": 0,
            "content_block": {"type": "text", "text": ""},
        }
        await self.send("content_block_start", block)

    async def token(self, text: str) -> None:
        self.parts.append(text)
        if not self.stream:
            return
        if len(self.parts) == 1:
            await self._start()
        delta = {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "text_delta", "text": text},
        }
        await self.send("content_block_delta", delta)

    async def finish(self, result: GenResult) -> web.StreamResponse:
        stop = _STOP_REASONS[result.done_reason]
        if not self.stream:
            text = [{"type": "text", "text": "".join(self.parts)}]
            return reply(self.message(text, stop, result.eval_count))
        if not self.parts:
            await self._start()
        await self.send("content_block_stop", {"type": "content_block_stop", "index": 0})
        delta = {"stop_reason": stop, "stop_sequence": None}
        usage = {"output_tokens": result.eval_count}
        await self.send("message_delta", {"type": "message_delta", "delta": delta, "usage": usage})
        await self.send("message_stop", {"type": "message_stop"})
        return self.response
