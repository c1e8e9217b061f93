"""Ollama's OpenAI-compatible API (/v1/*), as its middleware/openai.go and openai/openai.go
write it: SSE chunks, ``fp_ollama``, and errors in OpenAI's shape."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any, Protocol

from aiohttp import web

from .catalog import MODIFIED_AT_NS
from .config import GenJob, GenResult, LoadOptions, QueueFull, SimAbort, faults_from
from .engine import Emit, Engine
from .ollama import OllamaAPI
from .ollama_common import (
    JSON_UTF8,
    MAX_QUEUE_MESSAGE,
    RequestError,
    cut_connection,
    embed_text,
    message_text,
    output_budget,
    read_body,
)
from .recording import TapStream
from .wire import go_json, tokens_in

__all__ = ["OpenAICompatAPI"]

_ERROR_TYPES = {400: "invalid_request_error", 404: "not_found_error"}


def openai_error(error: RequestError, *, from_middleware: bool = False) -> web.Response:
    """OpenAI's error shape. Ollama's middleware rejects bad requests through gin's c.JSON
    (charset, no newline); errors from the handlers pass through its writer (newline)."""
    body = {
        "error": {
            "message": error.message,
            "type": _ERROR_TYPES.get(error.status, "api_error"),
            "param": None,
            "code": None,
        }
    }
    if from_middleware:
        return web.Response(
            status=error.status, body=go_json(body), headers={"Content-Type": JSON_UTF8}
        )
    return encoded(body, error.status)


async def read_v1_body(request: web.Request, go_struct: str) -> dict[str, Any]:
    """Like read_body, but worded as gin's binding says it: an empty body is just "EOF"."""
    try:
        return await read_body(request, go_struct)
    except RequestError as exc:
        if exc.message == "missing request body":
            exc.message = "EOF"
        raise


def job_for(
    native: OllamaAPI,
    body: dict[str, Any],
    prompt: str,
    limit: Any,
    refused: Callable[[RequestError], web.Response],
) -> GenJob | web.Response:
    """The generation a request asks for (its model, prompt, output ``limit`` and the
    simulator's faults), or the reply that refuses it in the route's shape."""
    name = str(body.get("model") or "")
    faults = faults_from(body, native=False)
    if faults.status is not None:
        return refused(RequestError(faults.status, "simulated failure"))
    model = native.resolve(name)
    if model is None:
        return refused(RequestError(404, f"model '{name}' not found"))
    tokens, limited = output_budget(limit, native.engine.config.default_output_tokens)
    return GenJob(model, tokens_in(prompt), tokens, limited, None, faults)


async def generated(
    engine: Engine,
    request: web.Request,
    job: GenJob,
    stream: TapStream,
    emit: Emit | None,
    parts: list[str],
    refused: Callable[[RequestError], web.Response],
) -> GenResult | web.StreamResponse:
    """The job run, its tokens to ``emit`` (a stream's, writing to ``stream``) or, for a
    whole reply (None), collected into ``parts``; or the reply that ends the request: the
    queue full (503, ``refused`` in the route's shape), or cut as the job's faults say."""

    async def collect(text: str) -> None:
        parts.append(text)

    try:
        return await engine.generate(job, emit or collect)
    except QueueFull:
        return refused(RequestError(503, MAX_QUEUE_MESSAGE))
    except SimAbort:
        await cut_connection(request, stream if emit is not None else None)
        return stream
    except ConnectionError:
        return stream


class EventStream(Protocol):
    """A reply told as named events (Anthropic's, the Responses API's)."""

    response: TapStream

    async def token(self, text: str) -> None: ...

    async def finish(self, result: GenResult, prompt_tokens: int) -> None: ...


async def streamed_or_whole(
    engine: Engine,
    request: web.Request,
    job: GenJob,
    stream: EventStream,
    streaming: bool,
    refused: Callable[[RequestError], web.Response],
) -> tuple[GenResult, str] | web.StreamResponse:
    """``job`` run: streamed, its tokens as ``stream``'s events, then its end (the reply is
    returned); or whole, its result and text returned for the route to shape. Or the reply
    that ended it (``generated``)."""
    parts: list[str] = []
    emit = stream.token if streaming else None
    result = await generated(engine, request, job, stream.response, emit, parts, refused)
    if not isinstance(result, GenResult):
        return result  # refused, or cut
    if streaming:
        await stream.finish(result, job.prompt_tokens)
        return stream.response
    return result, "".join(parts)


def encoded(value: Any, status: int = 200) -> web.Response:
    """What Go's json.Encoder writes: compact JSON and a newline."""
    return web.Response(
        status=status, body=go_json(value) + b"\n", headers={"Content-Type": "application/json"}
    )


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
