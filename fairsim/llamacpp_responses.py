"""llama-server's OpenAI Responses API (/v1/responses), as the pinned llama-server the tests
build writes it (checked against its replies): response.* events, one output_text.delta a
token, the usage in response.completed (and ``timings`` after it)."""

from __future__ import annotations

import random
import string
import time
from typing import Any

from aiohttp import web

from .config import GenJob, GenResult, faults_from
from .llamacpp_shapes import LlamaServer, dumps, error, named_slot, reply, timings
from .ollama_common import chat_text, output_budget
from .recording import TapStream
from .wire import tokens_in

__all__ = ["responses"]


async def responses(api: LlamaServer, request: web.Request) -> web.StreamResponse:
    body = await api.body(request)
    if isinstance(body, web.Response):
        return body
    given = body.get("input")  # a string, or items (a message's content, as a chat's)
    prompt = chat_text(
        body.get("instructions"), [{"content": given}] if isinstance(given, str) else given
    )
    api.engine.record_prompt(prompt)
    faults = faults_from(body, native=False)
    if faults.status is not None:
        return error(faults.status, "simulated failure")
    limit = body.get("max_output_tokens")
    tokens, limited = output_budget(limit, api.engine.config.default_output_tokens)
    job = GenJob(api.alias, tokens_in(prompt), tokens, limited, None, faults, slot=named_slot(body))
    streaming = body.get("stream") is True
    return await api.generated(request, job, _Writer(api, request, job, streaming), streaming)


def _ident(prefix: str) -> str:
    return prefix + "".join(random.choices(string.ascii_letters + string.digits, k=32))


class _Writer:
    def __init__(self, api: LlamaServer, request: web.Request, job: GenJob, stream: bool) -> None:
        self.api, self.request, self.job, self.stream = api, request, job, stream
        self.response = TapStream(
            "text/event-stream", keep=api.engine.config.record_replies, head_first=True
        )
        self.ident, self.item = _ident("resp_"), _ident("msg_")
        self.parts: list[str] = []

    async def send(self, event: str, data: dict[str, Any]) -> None:
        data = {"type": event, **data}
        await self.response.write(b"event: %s\ndata: %s\n\n" % (event.encode(), dumps(data)))

    def _part(self, text: str) -> dict[str, Any]:
        return {"type": "output_text", "annotations": [], "logprobs": [], "text": text}

    def _item(self) -> dict[str, Any]:
        text = "".join(self.parts)
        item = {"type": "message", "status": "completed", "id": self.item}
        return {**item, "content": [self._part(text)], "role": "assistant"}

    async def token(self, text: str) -> None:
        self.parts.append(text)
        if not self.stream:
            return
        if len(self.parts) == 1:
            started = {"id": self.ident, "object": "response", "status": "in_progress"}
            await self.send("response.created", {"response": started})
            await self.send("response.in_progress", {"response": started})
            item = {"content": [], "id": self.item, "role": "assistant", "status": "in_progress"}
            await self.send("response.output_item.added", {"item": {**item, "type": "message"}})
            part = {"type": "output_text", "text": ""}
            await self.send("response.content_part.added", {"item_id": self.item, "part": part})
        await self.send("response.output_text.delta", {"item_id": self.item, "delta": text})

    async def finish(self, result: GenResult) -> web.StreamResponse:
        prompt = self.job.prompt_tokens
        usage = {
            "input_tokens": prompt,
            "output_tokens": result.eval_count,
            "total_tokens": prompt + result.eval_count,
            "input_tokens_details": {"cached_tokens": 0},
        }
        now = int(time.time())
        whole = {"id": self.ident, "object": "response", "created_at": now, "status": "completed"}
        whole.update(model=self.api.alias, output=[self._item()], usage=usage)
        if not self.stream:
            return reply({"completed_at": now, **whole})
        text = "".join(self.parts)
        await self.send("response.output_text.done", {"item_id": self.item, "text": text})
        done = {"item_id": self.item, "part": self._part(text)}
        await self.send("response.content_part.done", done)
        await self.send("response.output_item.done", {"item": self._item()})
        completed = {"response": whole, "timings": timings(prompt, result)}
        await self.send("response.completed", completed)
        return self.response
