"""Ollama's Anthropic-compatible /v1/messages, as its middleware/anthropic.go and
anthropic/anthropic.go write it: the request checked by the middleware, then run as a chat;
a stream of named SSE events (``StreamConverter``), a whole reply as ``MessagesResponse``,
and errors in Anthropic's shape (``anthropic.NewError``)."""

from __future__ import annotations

import secrets
from typing import Any

from aiohttp import web

from .config import GenJob, GenResult
from .ollama import OllamaAPI
from .ollama_common import (
    JSON_UTF8,
    RequestError,
    chat_text,
)
from .ollama_v1_common import job_for, read_v1_body, streamed_or_whole
from .recording import TapStream
from .wire import go_json, tokens_in

__all__ = ["anthropic_error", "messages"]

# anthropic.NewError: the error type by status.
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}
# mapStopReason, without tool calls (the simulator makes none).
_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens"}


def _ident(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"  # generateID: 12 random bytes in hex


def anthropic_error(error: RequestError, *, from_middleware: bool = False) -> web.Response:
    """``anthropic.NewError``'s body: through gin's AbortWithStatusJSON from the middleware
    (charset, no newline), or through the AnthropicWriter from the handler (newline)."""
    body = {
        "type": "error",
        "error": {"type": _ERROR_TYPES.get(error.status, "api_error"), "message": error.message},
        "request_id": _ident("req"),
    }
    if from_middleware:
        return web.Response(
            status=error.status, body=go_json(body), headers={"Content-Type": JSON_UTF8}
        )
    return web.Response(
        status=error.status,
        body=go_json(body) + b"\n",
        headers={"Content-Type": "application/json"},
    )


async def messages(native: OllamaAPI, request: web.Request) -> web.StreamResponse:
    """POST /v1/messages, run on the same engine as the native API."""
    engine = native.engine
    try:
        body = await read_v1_body(request, "anthropic.MessagesRequest")
        _check(body)
    except RequestError as exc:
        return anthropic_error(exc, from_middleware=True)
    name = str(body["model"])
    prompt = chat_text(body.get("system"), body.get("messages"))
    engine.record_prompt(prompt)
    job = job_for(native, body, prompt, body.get("max_tokens"), anthropic_error)
    if not isinstance(job, GenJob):
        return job
    stream = _Stream(request, name, tokens_in(prompt), engine.config.record_replies)
    streaming = body.get("stream") is True
    ran = await streamed_or_whole(engine, request, job, stream, streaming, anthropic_error)
    if not isinstance(ran, tuple):
        return ran  # streamed, refused or cut
    result, text = ran
    reply = {
        **stream.message(job.prompt_tokens, result.eval_count),
        "content": [{"type": "text", "text": text}] if text else None,
        "stop_reason": _STOP_REASONS[result.done_reason],
    }
    return web.Response(body=go_json(reply) + b"\n", headers={"Content-Type": "application/json"})


def _check(body: dict[str, Any]) -> None:
    """The middleware's own checks, in its order (AnthropicMessagesMiddleware)."""
    if not body.get("model") or not isinstance(body.get("model"), str):
        raise RequestError(400, "model is required")
    max_tokens = body.get("max_tokens")
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens <= 0:
        raise RequestError(400, "max_tokens is required and must be positive")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError(400, "messages is required")


class _Stream:
    """One streamed reply, event by event as ``StreamConverter.Process`` writes them
    (``writeSSE``: ``event:`` and ``data:`` lines, each event flushed on its own)."""

    def __init__(self, request: web.Request, model: str, estimate: int, keep: bool) -> None:
        self.request = request
        self.response = TapStream("text/event-stream", keep=keep)
        self.response.headers["Cache-Control"] = "no-cache"
        self.ident = _ident("msg")
        self.model = model
        self.estimate = estimate  # the middleware's estimate: its first chunk has no counts
        self.started = False

    async def send(self, event: str, data: dict[str, Any]) -> None:
        if not self.response.prepared:
            await self.response.prepare(self.request)
        await self.response.write(b"event: %s\ndata: %s\n\n" % (event.encode(), go_json(data)))

    def message(self, input_tokens: int, output_tokens: int) -> dict[str, Any]:
        """A MessagesResponse, as message_start and a whole reply carry it."""
        return {
            "id": self.ident,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens},
        }

    async def _start(self, input_tokens: int) -> None:
        self.started = True
        start = {"type": "message_start", "message": self.message(input_tokens, 0)}
        await self.send("message_start", start)

    async def token(self, text: str) -> None:
        if not self.started:
            await self._start(self.estimate)
            block = {"type": "text", "text": ""}
            start = {"type": "content_block_start", "index": 0, "content_block": block}
            await self.send("content_block_start", start)
        delta = {"type": "text_delta", "text": text}
        await self.send(
            "content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}
        )

    async def finish(self, result: GenResult, prompt_tokens: int) -> None:
        if not self.started:  # no token: the final chunk opens the message, no text block
            await self._start(prompt_tokens)
        else:
            await self.send("content_block_stop", {"type": "content_block_stop", "index": 0})
        usage = {"input_tokens": prompt_tokens, "output_tokens": result.eval_count}
        delta = {"stop_reason": _STOP_REASONS[result.done_reason]}
        await self.send("message_delta", {"type": "message_delta", "delta": delta, "usage": usage})
        await self.send("message_stop", {"type": "message_stop"})
