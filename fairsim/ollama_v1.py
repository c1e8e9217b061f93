"""Ollama's OpenAI-compatible API (/v1/*), as its middleware/openai.go and openai/openai.go
write it: the chat/completions, embeddings and models routes, SSE chunks and ``fp_ollama``.
The request and error plumbing these routes share with the Anthropic and Responses routes
lives in ``ollama_v1_common``."""

from __future__ import annotations

import random
import time
from typing import Any

from aiohttp import web

from .catalog import MODIFIED_AT_NS
from .config import GenJob, GenResult, LoadOptions, QueueFull, faults_from
from .ollama import OllamaAPI
from .ollama_common import (
    MAX_QUEUE_MESSAGE,
    RequestError,
    embed_text,
    message_text,
    output_budget,
)
from .ollama_v1_common import encoded, generated, openai_error, read_v1_body
from .recording import TapStream
from .wire import go_json, tokens_in

__all__ = ["OpenAICompatAPI"]


class OpenAICompatAPI:
    """Handlers for /v1/* in front of the same engine as the native API."""

    def __init__(self, native: OllamaAPI) -> None:
        self.native = native
        self.engine = native.engine

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/chat/completions", self.chat_completions)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/embeddings", self.embeddings)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/v1/models/{model}", self.model)

    async def models(self, request: web.Request) -> web.Response:
        data = [model_entry(name) for name in self.engine.config.models]
        return encoded({"object": "list", "data": data})

    async def model(self, request: web.Request) -> web.Response:
        name = request.match_info["model"]
        if self.native.resolve(name) is None:
            return openai_error(RequestError(404, f"model '{name}' not found"))
        return encoded(model_entry(name))

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await read_v1_body(request, "openai.ChatCompletionRequest")
        except RequestError as exc:
            return openai_error(exc, from_middleware=True)
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return openai_error(
                RequestError(400, "[] is too short - 'messages'"), from_middleware=True
            )
        prompt = "\n".join(message_text(m.get("content")) for m in messages if isinstance(m, dict))
        return await self._generate(request, body, prompt, chat=True)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await read_v1_body(request, "openai.CompletionRequest")
        except RequestError as exc:
            return openai_error(exc, from_middleware=True)
        prompt = body.get("prompt")
        return await self._generate(
            request, body, prompt if isinstance(prompt, str) else "", chat=False
        )

    async def _generate(
        self, request: web.Request, body: dict[str, Any], prompt: str, *, chat: bool
    ) -> web.StreamResponse:
        name = str(body.get("model") or "")
        if prompt:
            self.engine.record_prompt(prompt)
        faults = faults_from(body, native=False)
        if faults.status is not None:
            return openai_error(RequestError(faults.status, "simulated failure"))
        model = self.native.resolve(name)
        if model is None:
            return openai_error(RequestError(404, f"model '{name}' not found"))
        limit = body.get("max_tokens")
        if limit is None:
            limit = body.get("max_completion_tokens")
        tokens, limited = output_budget(limit, self.engine.config.default_output_tokens)
        job = GenJob(model, tokens_in(prompt), tokens, limited, None, faults)
        options = body.get("stream_options")
        usage_wanted = isinstance(options, dict) and options.get("include_usage") is True
        ident = f"{'chatcmpl' if chat else 'cmpl'}-{random.randrange(999)}"
        keep = self.engine.config.record_replies
        sse = SSE(request, ident, name, chat=chat, include_usage=usage_wanted, keep=keep)
        streaming = body.get("stream") is True
        parts: list[str] = []
        emit = sse.token if streaming else None
        result = await generated(self.engine, request, job, sse.response, emit, parts, openai_error)
        if not isinstance(result, GenResult):
            return result  # refused, or cut
        if streaming:
            await sse.finish(result, job.prompt_tokens)
            return sse.response
        usage = usage_of(job.prompt_tokens, result)
        created = int(time.time())
        head = {
            "id": ident,
            "object": "chat.completion" if chat else "text_completion",
            "created": created,
            "model": name,
            "system_fingerprint": "fp_ollama",
        }
        text = "".join(parts)
        if chat:
            choice: dict[str, Any] = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": result.done_reason,
            }
        else:
            choice = {"text": text, "index": 0, "finish_reason": result.done_reason}
        return encoded(dict(head, choices=[choice], usage=usage))

    async def embeddings(self, request: web.Request) -> web.Response:
        try:
            body = await read_v1_body(request, "openai.EmbedRequest")
        except RequestError as exc:
            return openai_error(exc, from_middleware=True)
        raw = body.get("input")
        inputs = [raw] if isinstance(raw, str) else raw
        if not isinstance(inputs, list) or not inputs:
            return openai_error(RequestError(400, "invalid input"), from_middleware=True)
        if not all(isinstance(text, str) for text in inputs):
            return openai_error(RequestError(400, "invalid input type"))
        name = str(body.get("model") or "")
        faults = faults_from(body, native=False)
        if faults.status is not None:
            return openai_error(RequestError(faults.status, "simulated failure"))
        model = self.native.resolve(name)
        if model is None:
            message = f'model "{name}" not found, try pulling it first'
            return openai_error(RequestError(404, message))
        tokens = sum(tokens_in(text) for text in inputs)
        try:
            await self.engine.embed(model, tokens, None, LoadOptions())
        except QueueFull:
            return openai_error(RequestError(503, MAX_QUEUE_MESSAGE))
        dims = self.engine.config.embedding_dims
        data = [
            {
                "object": "embedding",
                "embedding": embed_text(text, dims, body.get("dimensions")),
                "index": index,
            }
            for index, text in enumerate(inputs)
        ]
        usage = {"prompt_tokens": tokens, "total_tokens": tokens}
        return encoded({"object": "list", "data": data, "model": name, "usage": usage})


def model_entry(name: str) -> dict[str, Any]:
    return {
        "id": name,
        "object": "model",
        "created": MODIFIED_AT_NS // 10**9,
        "owned_by": "library",
    }


def usage_of(prompt_tokens: int, result: GenResult) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": result.eval_count,
        "total_tokens": prompt_tokens + result.eval_count,
    }


class SSE:
    """One streamed /v1 reply: chunk objects as Ollama's ChatWriter and CompleteWriter
    send them, each flushed on its own."""

    def __init__(
        self,
        request: web.Request,
        ident: str,
        model: str,
        *,
        chat: bool,
        include_usage: bool,
        keep: bool,
    ) -> None:
        self.request = request
        self.response = TapStream("text/event-stream", keep=keep)
        self.ident = ident
        self.model = model
        self.chat = chat
        self.include_usage = include_usage
        self.created: int | None = None

    async def send(self, value: dict[str, Any] | str) -> None:
        if not self.response.prepared:
            await self.response.prepare(self.request)
        data = value.encode() if isinstance(value, str) else go_json(value)
        await self.response.write(b"data: " + data + b"\n\n")

    def chunk(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        if not self.chat:
            # Completion chunks carry their own time and put choices before the model.
            return {
                "id": self.ident,
                "object": "text_completion",
                "created": int(time.time()),
                "choices": choices,
                "model": self.model,
                "system_fingerprint": "fp_ollama",
            }
        if self.created is None:
            # One created value for the whole stream, taken from the first response.
            self.created = int(time.time())
        return {
            "id": self.ident,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": "fp_ollama",
            "choices": choices,
        }

    async def token(self, text: str) -> None:
        if self.chat:
            delta = {"content": text}
            if self.created is None:
                delta = {"role": "assistant", "content": text}
            await self.send(self.chunk([{"index": 0, "delta": delta, "finish_reason": None}]))
            return
        choice = {"text": text, "index": 0, "finish_reason": None}
        await self.send(self._with_zero_usage(self.chunk([choice])))

    def _with_zero_usage(self, chunk: dict[str, Any]) -> dict[str, Any]:
        if self.include_usage:
            # Ollama's CompleteWriter puts an all-zero usage on every chunk.
            chunk["usage"] = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
        return chunk

    async def finish(self, result: GenResult, prompt_tokens: int) -> None:
        reason = result.done_reason
        if self.chat:
            if self.created is None:
                # A reply with no tokens still opens with a role chunk.
                await self.token("")
            last = self.chunk([{"index": 0, "delta": {}, "finish_reason": reason}])
        else:
            choice = {"text": "", "index": 0, "finish_reason": reason}
            last = self._with_zero_usage(self.chunk([choice]))
        await self.send(last)
        if self.include_usage:
            await self.send(dict(last, choices=[], usage=usage_of(prompt_tokens, result)))
        await self.send("[DONE]")
