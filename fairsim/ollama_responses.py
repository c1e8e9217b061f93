"""Ollama's OpenAI Responses API (/v1/responses), as its middleware/openai.go
(``ResponsesMiddleware``, ``ResponsesWriter``) and openai/responses.go write it: the request
run as a chat; a stream of named SSE events whose data are Go maps (``newEvent``: keys in
sorted order, each with its ``sequence_number``), a whole reply as ``ResponsesResponse``
(its struct's order), and errors in OpenAI's shape."""

from __future__ import annotations

import random
import time
from typing import Any

from aiohttp import web

from .config import GenJob, GenResult
from .ollama import OllamaAPI
from .ollama_common import RequestError, chat_text
from .ollama_v1_common import encoded, job_for, openai_error, read_v1_body, streamed_or_whole
from .recording import TapStream
from .wire import go_json

__all__ = ["responses"]


async def responses(native: OllamaAPI, request: web.Request) -> web.StreamResponse:
    """POST /v1/responses, run on the same engine as the native API."""
    engine = native.engine
    try:
        body = await read_v1_body(request, "openai.ResponsesRequest")
    except RequestError as exc:
        return openai_error(exc, from_middleware=True)
    name = str(body.get("model") or "")
    given = body.get("input")  # a string, or items (a message's content, as a chat's)
    items = [{"content": given}] if isinstance(given, str) else given
    prompt = chat_text(body.get("instructions"), items)
    if prompt:
        engine.record_prompt(prompt)
    job = job_for(native, body, prompt, body.get("max_output_tokens"), openai_error)
    if not isinstance(job, GenJob):
        return job
    stream = _Stream(request, name, body, engine.config.record_replies)
    streaming = body.get("stream") is True
    ran = await streamed_or_whole(engine, request, job, stream, streaming, openai_error)
    if not isinstance(ran, tuple):
        return ran  # streamed, refused or cut
    result, text = ran
    return encoded(stream.whole(text, _usage(job.prompt_tokens, result)))


def _usage(prompt_tokens: int, result: GenResult) -> dict[str, Any]:
    return {
        "input_tokens": prompt_tokens,
        "output_tokens": result.eval_count,
        "total_tokens": prompt_tokens + result.eval_count,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens_details": {"reasoning_tokens": 0},
    }


def _sorted(value: Any) -> Any:
    """A value as Go marshals a map[string]any: every object's keys in sorted order."""
    if isinstance(value, dict):
        return {key: _sorted(value[key]) for key in sorted(value)}
    if isinstance(value, list):
        return [_sorted(item) for item in value]
    return value


class _Stream:
    """One reply: its events as ``ResponsesStreamConverter`` makes them, or its whole
    ``ResponsesResponse``."""

    def __init__(self, request: web.Request, model: str, body: dict[str, Any], keep: bool) -> None:
        self.request = request
        self.response = TapStream("text/event-stream", keep=keep)
        self.response.headers["Cache-Control"] = "no-cache"
        self.ident = f"resp_{random.randrange(999999)}"
        self.item = f"msg_{random.randrange(999999)}"
        self.model = model
        self.body = body
        self.sequence = 0
        self.text = ""

    def _object(self, status: str, output: list[Any], usage: Any) -> dict[str, Any]:
        """``buildResponseObject``'s fields (the few the simulator fills in differently
        from Ollama's defaults are the request's own)."""
        instructions = self.body.get("instructions") or None
        return {
            "id": self.ident,
            "object": "response",
            "created_at": int(time.time()),
            "completed_at": None,
            "status": status,
            "incomplete_details": None,
            "model": self.model,
            "previous_response_id": None,
            "instructions": instructions,
            "output": output,
            "error": None,
            "tools": [],
            "tool_choice": "auto",
            "truncation": "disabled",
            "parallel_tool_calls": True,
            "text": {"format": {"type": "text"}},
            "top_p": 1.0,
            "presence_penalty": 0,
            "frequency_penalty": 0,
            "top_logprobs": 0,
            "temperature": 1.0,
            "reasoning": None,
            "usage": usage,
            "max_output_tokens": self.body.get("max_output_tokens"),
            "max_tool_calls": None,
            "store": False,
            "background": False,
            "service_tier": "default",
            "metadata": {},
            "safety_identifier": None,
            "prompt_cache_key": None,
        }

    def _message(self, status: str) -> dict[str, Any]:
        content = [{"type": "output_text", "text": self.text, "annotations": [], "logprobs": []}]
        item = {"id": self.item, "type": "message", "status": status, "role": "assistant"}
        return {**item, "content": content if status == "completed" else []}

    def whole(self, text: str, usage: dict[str, Any]) -> dict[str, Any]:
        self.text = text
        reply = self._object("completed", [self._message("completed")], usage)
        reply["completed_at"] = int(time.time())
        return reply

    async def send(self, event: str, data: dict[str, Any]) -> None:
        if not self.response.prepared:
            await self.response.prepare(self.request)
        data = _sorted({**data, "type": event, "sequence_number": self.sequence})
        self.sequence += 1
        await self.response.write(b"event: %s\ndata: %s\n\n" % (event.encode(), go_json(data)))

    async def _start(self) -> None:
        empty = self._object("in_progress", [], None)
        await self.send("response.created", {"response": empty})
        await self.send("response.in_progress", {"response": empty})

    async def token(self, text: str) -> None:
        if self.sequence == 0:
            await self._start()
            item = self._message("in_progress")
            await self.send("response.output_item.added", {"output_index": 0, "item": item})
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            added = {"item_id": self.item, "output_index": 0, "content_index": 0, "part": part}
            await self.send("response.content_part.added", added)
        self.text += text
        delta = {"item_id": self.item, "output_index": 0, "content_index": 0, "delta": text}
        await self.send("response.output_text.delta", {**delta, "logprobs": []})

    async def finish(self, result: GenResult, prompt_tokens: int) -> None:
        if self.sequence == 0:
            await self._start()
        else:
            where = {"item_id": self.item, "output_index": 0, "content_index": 0}
            done = {**where, "text": self.text, "logprobs": []}
            await self.send("response.output_text.done", done)
            part = {"type": "output_text", "text": self.text, "annotations": [], "logprobs": []}
            await self.send("response.content_part.done", {**where, "part": part})
            item = {"output_index": 0, "item": self._message("completed")}
            await self.send("response.output_item.done", item)
        output = [self._message("completed")] if self.text else []
        completed = self._object("completed", output, _usage(prompt_tokens, result))
        completed["completed_at"] = int(time.time())
        await self.send("response.completed", {"response": completed})
